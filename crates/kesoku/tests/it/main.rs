//! End-to-end tests: the real `kesoku` binary on a temp workspace, driven as a user would.

#![allow(clippy::expect_used)]

mod agents;
mod chat;
mod cluster;
mod discord;
mod followups;
mod google_chat;
mod grants;
mod jobs;
mod local;
mod outage;
mod repl;
mod service;
mod subagents;
mod support;
mod triggers;
mod wechat;
