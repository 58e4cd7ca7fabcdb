//! Chatbot behaviour over a real SQLite store: delivery, the shared commands, the CLI chatbot.

#![allow(clippy::expect_used)]

mod cli;
mod commands;
mod cron;
mod delivery;
mod discord;
mod support;
