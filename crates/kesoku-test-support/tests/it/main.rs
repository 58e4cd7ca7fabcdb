//! Integration tests.

// Tests may panic with a message on what they expected.
#![allow(clippy::expect_used)]

mod discord;
