//! Kesoku's benchmark harness and the shared parts of its reliability suite.
//!
//! The `kesoku-bench` binary measures Kesoku the way its users would (see `docs/BENCHMARKS.md`):
//! framework overhead per turn, throughput over 1,000 sessions, memory of the service, start-up
//! of `kesoku chat`, and loading a long history. Every measurement runs against local mock model
//! servers on 127.0.0.1, on the embedded SQLite store and, with `--postgres URL`, on PostgreSQL.
//! Start-up and memory are measured on the real release `kesoku` binary (`kesoku chat`,
//! `kesoku start`), which must be built first.
//!
//! This crate is dev tooling: nothing depends on it, and it holds no SQL beyond creating and
//! dropping a PostgreSQL schema for a run.

pub mod bench;
pub mod binaries;
pub mod mock;
pub mod models;
pub mod procfs;
pub mod stats;
pub mod system;
