//! Chatbot behaviour over a real SQLite store: the seam (delivery, ingestion), the shared
//! commands, the CLI chatbot, the Discord and Google Chat adapters against their fakes, the conformance kit
//! run by both, cron.

#![allow(clippy::expect_used, clippy::panic)]

mod cli;
mod commands;
mod conformance;
mod cron;
mod delivery;
mod discord;
mod discord_catchup;
mod discord_conformance;
mod google_chat;
mod google_chat_conformance;
mod seam;
mod support;
mod wechat;
mod wechat_conformance;
