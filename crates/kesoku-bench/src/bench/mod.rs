//! The seven measurements of `kesoku-bench`, one module each, and what they share: building a
//! model against a mock server, and the report rows they produce.

pub mod cluster;
pub mod first_answer;
pub mod history;
pub mod lanes;
pub mod memory;
pub mod overhead;
pub mod startup;
pub mod throughput;

use std::sync::Arc;
use std::time::Duration;

use kesoku_llm::{Model, ModelConfig, Provider, RetryPolicy};
use serde::Serialize;

use crate::models::{ModelClock, TimedModel};

/// How much work a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// A few seconds per measurement (CI, smoke runs).
    Quick,
    /// The figures reported in `docs/BENCHMARKS.md`.
    Full,
}

impl Scale {
    pub fn pick<T>(self, quick: T, full: T) -> T {
        match self {
            Scale::Quick => quick,
            Scale::Full => full,
        }
    }
}

/// The OpenAI-style provider pointed at a local mock (no key), clocked by `clock`.
pub fn mock_model(base_url: &str, clock: &ModelClock) -> anyhow::Result<Arc<dyn Model>> {
    let mut config = ModelConfig::new(Provider::OpenAi, "mock-model");
    config.base_url = Some(base_url.to_owned());
    config.retry = RetryPolicy { max_attempts: 2, base_delay_seconds: 0.05, max_delay_seconds: 0.1 };
    let model = kesoku_llm::build_model("mock", &config, None).map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok(Arc::new(TimedModel::new(model, clock.clone())))
}

/// One line of the results table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub measure: String,
    pub backend: String,
    pub value: String,
    pub target: String,
    pub verdict: Verdict,
    pub note: String,
}

/// How a figure compares with its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    Met,
    Missed,
    /// No target (context figures).
    Info,
}

impl Verdict {
    pub fn of(met: bool) -> Verdict {
        if met { Verdict::Met } else { Verdict::Missed }
    }

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "MISSED",
            Verdict::Info => "",
        }
    }
}

impl Row {
    pub fn new(measure: &str, backend: &str, value: String, target: &str, verdict: Verdict, note: String) -> Row {
        Row {
            measure: measure.to_owned(),
            backend: backend.to_owned(),
            value,
            target: target.to_owned(),
            verdict,
            note,
        }
    }
}

/// Median and p99 as `p50 X / p99 Y`.
pub fn p50_p99(summary: &crate::stats::Summary) -> String {
    format!("p50 {} / p99 {}", crate::stats::ms(summary.p50), crate::stats::ms(summary.p99))
}

/// Durations to milliseconds for serialising.
pub fn as_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
