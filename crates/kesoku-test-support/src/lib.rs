//! Test-only helpers shared by the crates' integration tests: a fresh database (SQLite file or
//! PostgreSQL schema) per test, mock vendor LLM servers speaking the real wire formats, a fake
//! Discord (gateway and REST), a fake Google Chat (token endpoint, Pub/Sub, Chat REST), a TCP
//! proxy to cut a real server off and restore it, fixtures.
//!
//! Never a dependency of production code.

pub mod db;
pub mod discord;
pub mod echo;
pub mod google_chat;
pub mod mock_llm;
pub mod proxy;
pub mod watched;
pub mod wechat;
