//! The agent end to end: a scripted model, real SQLite in a temp dir, real tools, and assertions
//! on the whole resulting trajectory (role, type, sender, status, parent, metadata), as in the
//! spec's examples.

#![allow(clippy::expect_used)]

mod access;
mod agents;
mod compaction;
mod followups;
mod harness;
mod intake;
mod interruption;
mod jobs;
mod kinds;
mod leases;
mod recovery;
mod subagents;
mod turns;
