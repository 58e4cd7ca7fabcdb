//! Chatbot behaviour over a real SQLite store: the seam (delivery, ingestion), the shared
//! commands, the CLI chatbot and its conformance run, cron.

#![allow(clippy::expect_used, clippy::panic)]

mod cli;
mod commands;
mod conformance;
mod cron;
mod delivery;
mod discord;
mod seam;
mod support;
