//! The Google Chat chatbot: a Chat app that receives events over Cloud Pub/Sub (no public
//! webhook) and answers through the Chat REST API.
//!
//! Modules: [`config`] (the `[[chatbots.google_chat]]` table).

pub mod config;

pub use self::config::{GoogleChatConfig, GoogleChatConfigError};
