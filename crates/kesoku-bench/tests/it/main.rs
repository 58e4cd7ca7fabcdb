//! The reliability suite: crash loops, provider faults, bad input, load and secrets, against
//! the real `kesoku` binary or the agent wired as it wires it. Everything stays on 127.0.0.1.

#![allow(clippy::expect_used)]

mod bad_input;
mod crash_loop;
mod load;
mod provider_faults;
mod security;
mod support;
