//! Integration tests of the store. Most cases are written once against the traits and run on
//! both backends (`backend_tests!`, `place_tests!` in `harness`); PostgreSQL cases skip, saying
//! so, when `KESOKU_TEST_POSTGRES_URL` is unset (and fail when `KESOKU_REQUIRE_SERVERS=1`).

// Tests say what they expected in the panic message of `expect`.
#![allow(clippy::expect_used)]

mod chatbot_state;
mod claims;
mod corrupt;
mod deliveries;
mod grants;
mod harness;
mod history;
mod ledger;
mod messages;
mod opening;
mod sessions;
mod support;
mod work;
