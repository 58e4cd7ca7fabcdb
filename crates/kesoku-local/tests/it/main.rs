//! Integration tests of kesoku-local: engine mechanics on synthetic GGUF models (always), pulls
//! against a local mock package index (always), and the real SmolLM2 model when
//! `KESOKU_TEST_LOCAL_MODEL=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf` is set (skipped otherwise,
//! failing loudly instead when `KESOKU_REQUIRE_LOCAL_MODEL=1`).

mod config;
mod engine;
mod files;
mod provider;
mod pull;
mod real_model;
mod support;
mod template;
mod tool_calls;
