//! Start-up of the real `kesoku` binary: `kesoku chat "…"` one-shot against an instant local
//! mock, from spawning the process to the model request arriving at the mock, and to the
//! process exiting after printing the answer; and the peak resident set of that whole run
//! (`/usr/bin/time -f %M`, or the kernel's largest-child figure when that tool is missing).
//!
//! The binary is the one next to this executable (`target/release/kesoku`): build it first.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::bench::{Row, Scale, Verdict, p50_p99};
use crate::mock::{HttpPolicy, PolicyServer};
use crate::stats::{Summary, mib};
use crate::system::Backend;

#[derive(Debug, Clone)]
pub struct Measured {
    pub binary: PathBuf,
    pub first_request: Summary,
    pub whole_turn: Summary,
    /// Median and largest peak resident set of a whole one-shot run, in bytes.
    pub peak_rss_median: u64,
    pub peak_rss_max: u64,
}

/// A workspace for `kesoku` whose model `mock` is the server at `base_url`, initialised.
pub async fn workspace(
    binary: &Path,
    base_url: &str,
    store: &Backend,
    extra: &str,
) -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("kesoku-bench-ws-").tempdir()?;
    let database = match store {
        Backend::Sqlite => String::new(),
        Backend::Postgres(url) => format!("[workspace]\ndatabase = \"{url}\"\n\n"),
    };
    let config = format!(
        "{database}[agent]\nmodel = \"mock\"\n{extra}\n\n[models.mock]\nprovider = \"openai\"\nmodel = \"mock-model\"\n\
         base_url = \"{base_url}\"\n"
    );
    std::fs::write(dir.path().join("kesoku.toml"), config)?;
    let output = tokio::process::Command::new(binary)
        .args(["-c", "kesoku.toml", "init", "--no-model"])
        .current_dir(dir.path())
        .env_remove("KESOKU_CONFIG")
        .output()
        .await
        .context("running kesoku init")?;
    if !output.status.success() {
        bail!("kesoku init failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(dir)
}

pub async fn run(binary: &Path, scale: Scale) -> anyhow::Result<Measured> {
    let mock = PolicyServer::start(HttpPolicy::instant_text());
    let dir = workspace(binary, &mock.base_url(), &Backend::Sqlite, "").await?;
    let runs = scale.pick(10, 60);
    let warmup = 3;
    let (mut first_request, mut whole_turn) = (Vec::new(), Vec::new());
    for index in 0..warmup + runs {
        let before = mock.arrivals().len();
        let started = Instant::now();
        let status = tokio::process::Command::new(binary)
            .args(["-c", "kesoku.toml", "chat", "What is 25 + 15?"])
            .current_dir(dir.path())
            .env_remove("KESOKU_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .context("running kesoku chat")?;
        let finished = started.elapsed();
        if !status.success() {
            bail!("kesoku chat failed ({status})");
        }
        let arrivals = mock.arrivals();
        let arrived = arrivals.get(before).context("the one-shot chat never asked the model")?;
        if index >= warmup {
            first_request.push(arrived.saturating_duration_since(started));
            whole_turn.push(finished);
        }
    }
    let mut peaks = Vec::new();
    for _ in 0..scale.pick(5, 20) {
        peaks.push(peak_rss(binary, dir.path()).await?);
    }
    peaks.sort_unstable();
    Ok(Measured {
        binary: binary.to_path_buf(),
        first_request: Summary::of(&first_request).context("no runs")?,
        whole_turn: Summary::of(&whole_turn).context("no runs")?,
        peak_rss_median: peaks[peaks.len() / 2],
        peak_rss_max: peaks[peaks.len() - 1],
    })
}

/// Peak resident set (bytes) of one `kesoku chat` run.
async fn peak_rss(binary: &Path, dir: &Path) -> anyhow::Result<u64> {
    let time = Path::new("/usr/bin/time");
    if time.is_file() {
        let output = tokio::process::Command::new(time)
            .args(["-f", "peak-rss-kib %M"])
            .arg(binary)
            .args(["-c", "kesoku.toml", "chat", "What is 25 + 15?"])
            .current_dir(dir)
            .env_remove("KESOKU_CONFIG")
            .output()
            .await?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        let kib: u64 = stderr
            .lines()
            .find_map(|line| line.strip_prefix("peak-rss-kib "))
            .and_then(|value| value.trim().parse().ok())
            .context("/usr/bin/time printed no peak")?;
        return Ok(kib * 1024);
    }
    let status = tokio::process::Command::new(binary)
        .args(["-c", "kesoku.toml", "chat", "What is 25 + 15?"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .status()
        .await?;
    if !status.success() {
        bail!("kesoku chat failed ({status})");
    }
    crate::procfs::children_peak_rss().context("no child usage")
}

pub fn rows(measured: &Measured) -> Vec<Row> {
    let binary = measured.binary.display();
    vec![
        Row::new(
            "4. start-up: `kesoku chat` one-shot → first model request",
            "embedded (SQLite)",
            p50_p99(&measured.first_request),
            "≤ 15 ms",
            Verdict::of(measured.first_request.p50 <= Duration::from_millis(15)),
            format!("{} runs of {binary}", measured.first_request.samples),
        ),
        Row::new(
            "4. start-up: whole one-shot turn (spawn → exit)",
            "embedded (SQLite)",
            p50_p99(&measured.whole_turn),
            "≤ 25 ms",
            Verdict::of(measured.whole_turn.p50 <= Duration::from_millis(25)),
            format!("{} runs, instant mock", measured.whole_turn.samples),
        ),
        Row::new(
            "4. start-up: peak RSS of a one-shot turn",
            "embedded (SQLite)",
            mib(measured.peak_rss_median),
            "≤ 12 MB",
            Verdict::of(measured.peak_rss_median <= 12 * 1000 * 1000),
            format!("median of runs; largest {}", mib(measured.peak_rss_max)),
        ),
    ]
}
