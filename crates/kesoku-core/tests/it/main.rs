//! Integration tests of the vocabulary: the spec's tables and examples as executable checks.

#![allow(clippy::expect_used)]

mod categories;
mod fixtures;
mod orchestration;
mod phased;
mod transitions;
