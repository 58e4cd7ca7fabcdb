//! The WeChat chatbot: a personal-account bot on the iLink bot API (QR pairing, long-polled
//! updates, per-peer context tokens, encrypted CDN media).
//!
//! Modules: [`config`] (the `[[chatbots.wechat]]` table).

pub mod config;

pub use self::config::{WeChatConfig, WeChatConfigError};
