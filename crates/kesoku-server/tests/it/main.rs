//! Integration tests of the HTTP server: every route and its error cases through
//! `tower::ServiceExt::oneshot` (no network), against a real SQLite store in a temporary
//! directory, with a fake [`kesoku_server::AgentControl`]; plus the `api` chatbot's delivery and
//! its conformance run, the HTML export, the console files, and `serve` on a real loopback
//! socket.

// Tests say what they expected in the panic message of `expect`.
#![allow(clippy::expect_used)]

mod activations;
mod auth;
mod conformance;
mod console;
mod delivery;
mod errors;
mod events;
mod harness;
mod messages;
mod openapi;
mod ops;
mod outage;
mod serve;
mod sessions;
mod trajectory;
