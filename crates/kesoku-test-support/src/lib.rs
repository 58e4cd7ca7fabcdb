//! Test-only helpers shared by the crates' integration tests: a fresh database (SQLite file or
//! PostgreSQL schema) per test, mock vendor LLM servers speaking the real wire formats, fixtures.
//!
//! Never a dependency of production code.

pub mod db;
pub mod mock_llm;
