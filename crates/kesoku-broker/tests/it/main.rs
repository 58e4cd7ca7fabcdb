//! Broker and queue behaviour.

#![allow(clippy::expect_used)]

mod broker;
mod lease;
mod queue;
