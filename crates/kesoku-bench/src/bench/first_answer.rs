//! The embedded default's first answer: the wall time of `kesoku chat "What is 25 + 15?"` on the
//! real local model (SmolLM2-135M, run in-process), from spawning the process to its exit, and
//! whether the answer is on topic (about the sum, a few lines) and right (it contains "40").
//! This is what a new user waits for.
//!
//! The workspace is set up beforehand (config, store, model file), as after a first run; each
//! measured run loads the model, reads the prompt and generates the answer. The model file comes
//! from `--local-model`, `$KESOKU_TEST_LOCAL_MODEL` or `~/.cache/kesoku-models` (`kesoku models
//! pull smollm2 --dir ~/.cache/kesoku-models` puts it there). Local model speed depends on the
//! CPU model, so the row names it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::bench::{Row, Scale, Verdict, p50_p99};
use crate::stats::Summary;

/// The prompt a new user tries first (the README's quick start).
const PROMPT: &str = "What is 25 + 15?";

/// The file name of the default local model.
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, Clone)]
pub struct Measured {
    pub wall: Summary,
    /// CPU time (user + system) of each run: what the wall time would be on an idle machine
    /// (the engine computes on every core, so it is a bound, not an equality).
    pub cpu_time: Summary,
    /// The last run's answer, as printed.
    pub answer: String,
    /// Runs whose answer was about the sum and short.
    pub on_topic: usize,
    /// Runs whose answer contained "40".
    pub correct: usize,
    pub runs: usize,
    /// `lscpu`'s model name (from /proc/cpuinfo) and the cores this process may use.
    pub cpu: String,
}

/// The model file to use: `explicit`, else `$KESOKU_TEST_LOCAL_MODEL`, else the shared cache.
pub fn find_model(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_path_buf());
    }
    let from_env = std::env::var_os("KESOKU_TEST_LOCAL_MODEL").map(PathBuf::from);
    let cache = std::env::var_os("KESOKU_MODELS_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("kesoku-models")))
        .map(|folder| folder.join(MODEL_FILE));
    [from_env, cache].into_iter().flatten().find(|path| path.is_file())
}

pub async fn run(binary: &Path, model: &Path, scale: Scale) -> anyhow::Result<Measured> {
    let dir = tempfile::Builder::new().prefix("kesoku-bench-local-").tempdir()?;
    let config = format!("[models.local]\nprovider = \"local\"\npath = \"{}\"\n", model.display());
    std::fs::write(dir.path().join("kesoku.toml"), config)?;
    let init = kesoku(binary, dir.path(), &["init", "--no-model"]).await?;
    if !init.status.success() {
        bail!("kesoku init failed: {}", String::from_utf8_lossy(&init.stderr));
    }
    let runs = scale.pick(3, 10);
    let warmup = 1;
    let (mut wall, mut cpu_time, mut on_topic, mut correct) = (Vec::new(), Vec::new(), 0, 0);
    let mut answer = String::new();
    for index in 0..warmup + runs {
        let (started, cpu_before) = (Instant::now(), crate::procfs::children_cpu_time());
        let output = kesoku(binary, dir.path(), &["chat", PROMPT]).await?;
        let elapsed = started.elapsed();
        let cpu = crate::procfs::children_cpu_time().saturating_sub(cpu_before);
        if !output.status.success() {
            bail!("kesoku chat failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr));
        }
        // The answer without the metrics line that follows it.
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        answer = printed.lines().take_while(|line| !line.starts_with("[turn ")).collect::<Vec<_>>().join("\n");
        answer = answer.trim().to_owned();
        if index >= warmup {
            wall.push(elapsed);
            cpu_time.push(cpu);
            on_topic += usize::from((answer.contains("25 + 15") || answer.contains("40")) && answer.len() <= 300);
            correct += usize::from(answer.contains("40"));
        }
    }
    let (wall, cpu_time) = (Summary::of(&wall).context("no runs")?, Summary::of(&cpu_time).context("no runs")?);
    Ok(Measured { wall, cpu_time, answer, on_topic, correct, runs, cpu: crate::procfs::machine() })
}

async fn kesoku(binary: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<std::process::Output> {
    tokio::process::Command::new(binary)
        .args(["-c", "kesoku.toml"])
        .args(args)
        .current_dir(dir)
        .env_remove("KESOKU_CONFIG")
        .output()
        .await
        .with_context(|| format!("running kesoku {}", args.join(" ")))
}

pub fn rows(measured: &Measured) -> Vec<Row> {
    let first_line = measured.answer.lines().next().unwrap_or_default();
    let shown: String = first_line.chars().take(60).collect();
    vec![Row::new(
        "6. first answer of the embedded default: `kesoku chat \"What is 25 + 15?\"` (spawn → exit)",
        "embedded (SQLite)",
        p50_p99(&measured.wall),
        "≤ 2 s, on topic",
        Verdict::of(measured.wall.p50 <= Duration::from_secs(2) && measured.on_topic == measured.runs),
        format!(
            "{} runs on {}, SmolLM2-135M Q4_1; CPU time p50 {}; on topic {}/{}, right (40) {}/{}, e.g. \"{shown}\"",
            measured.runs,
            measured.cpu,
            crate::stats::ms(measured.cpu_time.p50),
            measured.on_topic,
            measured.runs,
            measured.correct,
            measured.runs
        ),
    )]
}
