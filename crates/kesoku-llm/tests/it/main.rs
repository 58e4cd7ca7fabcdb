//! Integration tests of the model layer: history transpilation tables, the wire bodies each
//! provider sends, each provider against its mock vendor server, retries, timeouts,
//! cancellation, fallback, the scripted model, and secrets never leaking.

// A failed expectation in a test should stop it with its message.
#![allow(clippy::expect_used)]

mod config;
mod fallback;
mod history;
mod mock_servers;
mod providers;
mod resilience;
mod scripted;
mod support;
mod thinking;
mod wire;
