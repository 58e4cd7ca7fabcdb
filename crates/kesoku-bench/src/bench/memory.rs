//! Memory of the real service, `kesoku start` with its HTTP API on 127.0.0.1: the resident set
//! when idle, its growth per 1,000 sessions that have had a turn (and sit idle), and a soak
//! under steady load with the slope of the resident set over time. Load arrives over the HTTP
//! API as a client would send it; the model is the instant local mock.
//!
//! The resident set is read from `/proc/PID/status` (`VmRSS`) of the service process alone.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use kesoku_core::{MemoryGauge, MessageFilter, Status};
use serde_json::json;
use tokio::io::AsyncBufReadExt;

use crate::bench::{Row, Scale, Verdict};
use crate::mock::{HttpPolicy, PolicyServer};
use crate::procfs::memory_of;
use crate::stats::{median, mib, slope};
use crate::system::Backend;

#[derive(Debug, Clone)]
pub struct Measured {
    pub idle_rss: u64,
    /// Its anonymous part (heap, stacks, relocated data); the rest are pages of files (the
    /// binary's code, libc).
    pub idle_anon: u64,
    /// RSS after 1,000 and after 2,000 sessions had one turn each (idle again).
    pub rss_after_1000: u64,
    pub rss_after_2000: u64,
    /// The service's own account (`/metrics`) when idle and after 1,000 sessions.
    pub reported_idle: Reported,
    pub reported_after_1000: Reported,
    pub soak: Soak,
}

#[derive(Debug, Clone)]
pub struct Soak {
    pub duration: Duration,
    pub turns: usize,
    pub rate_per_second: f64,
    pub start_rss: u64,
    pub end_rss: u64,
    pub max_rss: u64,
    /// Least-squares slope of the resident set after the first fifth of the soak, bytes/minute.
    pub slope_per_minute: f64,
    /// The same over the last half alone: below the first when growth levels off.
    pub last_half_slope_per_minute: f64,
    /// The same for its anonymous part (heap), which a leak would grow.
    pub anon_slope_per_minute: f64,
    /// The service's own account of that memory (its `/metrics`), sampled with the RSS.
    pub parts: Parts,
    pub lost: usize,
}

/// Slopes (bytes/minute, after the first fifth) and last values of the memory parts the
/// service reports on `/metrics`: the bytes in live Rust heap allocations, what SQLite
/// allocated (page caches, statements), and the history caches (part of the heap). The
/// anonymous RSS less the first two is the rest: pages the allocators hold beyond what is
/// live (free space, fragmentation), glibc's overhead, thread stacks.
#[derive(Debug, Clone, Default)]
pub struct Parts {
    pub heap: Part,
    pub sqlite: Part,
    pub history_cache: Part,
    pub rest: Part,
}

#[derive(Debug, Clone, Default)]
pub struct Part {
    pub slope_per_minute: f64,
    /// Over the last half of the soak alone.
    pub last_half_slope_per_minute: f64,
    pub last: u64,
}

impl Part {
    fn of(samples: &[(f64, f64)]) -> Part {
        Part {
            slope_per_minute: slope_after(samples, 5),
            last_half_slope_per_minute: slope_after(samples, 2),
            last: samples.last().map(|sample| sample.1 as u64).unwrap_or_default(),
        }
    }
}

/// Least-squares slope of `samples` without their first `1/skip_share` (the warm-up).
fn slope_after(samples: &[(f64, f64)], skip_share: usize) -> f64 {
    slope(&samples[samples.len() / skip_share..]).unwrap_or(0.0)
}

/// One scrape of the service's memory gauges.
#[derive(Debug, Clone, Copy)]
pub struct Reported {
    heap: u64,
    sqlite: u64,
    history_cache: u64,
    /// Ids in the listeners' duplicate filters and the bytes of their tables (0 from a service
    /// older than these gauges).
    dedup_ids: u64,
    dedup_table_bytes: u64,
}

async fn reported_memory(http: &reqwest::Client, base: &str) -> anyhow::Result<Reported> {
    let text = http.get(format!("{base}/metrics")).send().await?.error_for_status()?.text().await?;
    let gauge = |name: &str| -> anyhow::Result<u64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .with_context(|| format!("/metrics has no `{name}`"))
    };
    Ok(Reported {
        heap: gauge(MemoryGauge::HeapLive.name())?,
        sqlite: gauge(MemoryGauge::Sqlite.name())?,
        history_cache: gauge(MemoryGauge::HistoryCache.name())?,
        dedup_ids: gauge(MemoryGauge::ListenerDedupIds.name()).unwrap_or(0),
        dedup_table_bytes: gauge(MemoryGauge::ListenerDedupTableBytes.name()).unwrap_or(0),
    })
}

impl Measured {
    pub fn per_1000_sessions(&self) -> i64 {
        self.rss_after_1000 as i64 - self.idle_rss as i64
    }
}

/// A running `kesoku start`.
struct Service {
    child: tokio::process::Child,
    pid: u32,
    addr: std::net::SocketAddr,
}

async fn start_service(binary: &Path, dir: &Path) -> anyhow::Result<Service> {
    let mut child = tokio::process::Command::new(binary)
        .args(["-c", "kesoku.toml", "-v", "start"])
        .current_dir(dir)
        .env_remove("KESOKU_CONFIG")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting kesoku start")?;
    let pid = child.id().context("the service has no pid")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    {
        let lines = Arc::clone(&lines);
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let addr = lines.lock().unwrap_or_else(|p| p.into_inner()).iter().find_map(|line| {
            let line = strip_ansi(line);
            let start = line.find("HTTP API and console listening")?;
            let at = line[start..].find("addr=")? + start + 5;
            line[at..].split_whitespace().next()?.parse().ok()
        });
        if let Some(addr) = addr {
            return Ok(Service { child, pid, addr });
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!("kesoku start exited ({status}): {}", lines.lock().unwrap_or_else(|p| p.into_inner()).join("\n"));
        }
        if Instant::now() > deadline {
            bail!("kesoku start did not report its HTTP address");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `line` without terminal colour sequences (`ESC [ … m`).
pub fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The median of a few RSS samples a little apart.
async fn settled_rss(pid: u32) -> anyhow::Result<u64> {
    Ok(settled(pid).await?.0)
}

/// The medians of a few (RSS, anonymous RSS) samples a little apart.
async fn settled(pid: u32) -> anyhow::Result<(u64, u64)> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (mut rss, mut anon) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let memory = memory_of(pid).context("the service is gone")?;
        rss.push(memory.rss as f64);
        anon.push(memory.anon as f64);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((median(&rss) as u64, median(&anon) as u64))
}

/// Measures the service at `binary`; a soak of `soak_minutes`, its samples also written to
/// `samples` as CSV when given (one line per 5 s, written as taken).
pub async fn run(binary: &Path, scale: Scale, soak_minutes: f64, samples: Option<&Path>) -> anyhow::Result<Measured> {
    let mock = PolicyServer::start(HttpPolicy::instant_text());
    let dir =
        super::startup::workspace(binary, &mock.base_url(), &Backend::Sqlite, "\n[http]\nlisten = \"127.0.0.1:0\"")
            .await?;
    let store_url = format!("sqlite://{}", dir.path().join(".kesoku").join("kesoku.db").display());
    let mut service = start_service(binary, dir.path()).await?;
    // For a look from outside while it runs (`scripts/memory-map PID`).
    eprintln!("  the service under measure is pid {}", service.pid);
    let http = reqwest::Client::new();
    let base = format!("http://{}", service.addr);
    let store = kesoku_store::open_existing(&store_url).await.context("opening the service's store")?;

    let (idle_rss, idle_anon) = settled(service.pid).await?;
    let reported_idle = reported_memory(&http, &base).await?;
    open_sessions(&http, &base, "first", 1000).await?;
    wait_idle(&store, 1000).await?;
    let rss_after_1000 = settled_rss(service.pid).await?;
    let reported_after_1000 = reported_memory(&http, &base).await?;
    open_sessions(&http, &base, "second", 1000).await?;
    wait_idle(&store, 2000).await?;
    let rss_after_2000 = settled_rss(service.pid).await?;

    let soak_for = Duration::from_secs_f64(soak_minutes * 60.0);
    let soak = soak(&http, &base, &store, service.pid, soak_for, scale, samples).await?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(service.pid).unwrap_or(i32::MAX));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = tokio::time::timeout(Duration::from_secs(30), service.child.wait()).await;
    Ok(Measured { idle_rss, idle_anon, rss_after_1000, rss_after_2000, reported_idle, reported_after_1000, soak })
}

/// Post one message on each of `count` new channels (a new session each), 32 at a time.
async fn open_sessions(http: &reqwest::Client, base: &str, label: &str, count: usize) -> anyhow::Result<()> {
    let posts = futures::stream::iter(0..count).map(|index| {
        let body = json!({"channel_id": format!("{label}-{index}"), "sender": "Bench", "content": "hello"});
        http.post(format!("{base}/v1/messages")).json(&body).send()
    });
    let mut posts = posts.buffer_unordered(32);
    while let Some(response) = posts.next().await {
        let response = response.context("posting a message")?;
        if response.status().as_u16() != 202 {
            bail!("the API refused a message: {}", response.status());
        }
    }
    Ok(())
}

/// Wait until `roots` user messages exist and none is waiting or running.
async fn wait_idle(store: &kesoku_store::StoreHandle, roots: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let busy = store
            .store
            .list_messages(&MessageFilter::default().with_statuses(&[Status::PendingAgent, Status::Processing]))
            .await?
            .len();
        let done = store.store.list_messages(&MessageFilter::status(Status::Processed)).await?.len();
        if busy == 0 && done >= roots {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{busy} messages still busy, {done} of {roots} processed");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Turns a soak session gets before its channel moves on to a new session (as `/new` or a
/// compaction would bound it): 300 messages, past the store's history-cache threshold, so that
/// path is exercised too, but bounded, so the load is steady. Sessions that grow without end
/// make every turn's working set (history read, request, its JSON) grow with them; that is
/// the history measurement's subject, not a leak.
const SOAK_TURNS_PER_SESSION: usize = 150;

/// The soak is flat when, over its last half, the resident set grows by at most this many bytes
/// per turn: less than any leak of one allocation per turn (mimalloc's smallest block is 8
/// bytes), and at 50 turns/s 15 KB/min, about the noise of a slope fitted to RSS samples that
/// move by a megabyte between minutes. Judged only for a soak of an hour or
/// more (issue #8: "flat after a 1-hour soak"); shorter ones still fill their bounded
/// structures.
const FLAT_BYTES_PER_TURN: f64 = 5.0;
const FLAT_JUDGED_AFTER: Duration = Duration::from_secs(60 * 60);

impl Soak {
    /// Resident-set growth per turn over the last half.
    pub fn last_half_bytes_per_turn(&self) -> f64 {
        self.last_half_slope_per_minute / (self.rate_per_second * 60.0)
    }

    pub fn verdict(&self) -> Verdict {
        if self.duration < FLAT_JUDGED_AFTER {
            Verdict::Info
        } else {
            Verdict::of(self.lost == 0 && self.last_half_bytes_per_turn() <= FLAT_BYTES_PER_TURN)
        }
    }
}

/// Steady load for `duration`: 50 messages per second over 200 channels (each moving to a new
/// session every [`SOAK_TURNS_PER_SESSION`] turns), RSS sampled every 5 s (and written to
/// `samples_to` as CSV when given).
async fn soak(
    http: &reqwest::Client,
    base: &str,
    store: &kesoku_store::StoreHandle,
    pid: u32,
    duration: Duration,
    scale: Scale,
    samples_to: Option<&Path>,
) -> anyhow::Result<Soak> {
    let mut csv = match samples_to {
        Some(path) => {
            let mut file = std::fs::File::create(path)
                .with_context(|| format!("creating the soak samples file {}", path.display()))?;
            writeln!(
                file,
                "minutes,rss_bytes,anon_bytes,heap_live_bytes,sqlite_bytes,history_cache_bytes,rest_bytes,dedup_ids,dedup_table_bytes"
            )?;
            Some(file)
        }
        None => None,
    };
    let rate = scale.pick(50.0, 50.0);
    let channels = 200;
    let before = store.store.list_messages(&MessageFilter::status(Status::Processed)).await?.len();
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut sample = tokio::time::interval(Duration::from_secs(5));
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut anon_samples: Vec<(f64, f64)> = Vec::new();
    let (mut heap, mut sqlite, mut cache, mut rest) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut posted = 0usize;
    let mut in_flight = futures::stream::FuturesUnordered::new();
    while started.elapsed() < duration {
        tokio::select! {
            _ = tick.tick() => {
                let generation = posted / (channels * SOAK_TURNS_PER_SESSION);
                let channel = format!("soak-{}-{generation}", posted % channels);
                let body = json!({"channel_id": channel, "sender": "Bench", "content": format!("tick {posted}")});
                in_flight.push(http.post(format!("{base}/v1/messages")).json(&body).send());
                posted += 1;
            }
            _ = sample.tick() => {
                let memory = memory_of(pid).context("the service is gone")?;
                let minutes = started.elapsed().as_secs_f64() / 60.0;
                samples.push((minutes, memory.rss as f64));
                anon_samples.push((minutes, memory.anon as f64));
                let parts = reported_memory(http, base).await.context("reading the service's memory gauges")?;
                heap.push((minutes, parts.heap as f64));
                sqlite.push((minutes, parts.sqlite as f64));
                cache.push((minutes, parts.history_cache as f64));
                let rest_bytes = memory.anon as i64 - parts.heap as i64 - parts.sqlite as i64;
                rest.push((minutes, rest_bytes as f64));
                if let Some(file) = csv.as_mut() {
                    writeln!(
                        file,
                        "{minutes:.3},{},{},{},{},{},{rest_bytes},{},{}",
                        memory.rss,
                        memory.anon,
                        parts.heap,
                        parts.sqlite,
                        parts.history_cache,
                        parts.dedup_ids,
                        parts.dedup_table_bytes
                    )
                    .context("writing a soak sample")?;
                }
            }
            Some(response) = in_flight.next() => {
                let response = response.context("posting a message")?;
                if response.status().as_u16() != 202 {
                    bail!("the API refused a message: {}", response.status());
                }
            }
        }
    }
    while let Some(response) = in_flight.next().await {
        response.context("posting a message")?;
    }
    wait_idle(store, before + posted).await.ok();
    let done = store.store.list_messages(&MessageFilter::status(Status::Processed)).await?.len();
    let rss = |p: &(f64, f64)| p.1 as u64;
    Ok(Soak {
        duration: started.elapsed(),
        turns: posted,
        rate_per_second: rate,
        start_rss: samples.first().map(rss).unwrap_or_default(),
        end_rss: samples.last().map(rss).unwrap_or_default(),
        max_rss: samples.iter().map(rss).max().unwrap_or_default(),
        slope_per_minute: slope_after(&samples, 5),
        last_half_slope_per_minute: slope_after(&samples, 2),
        anon_slope_per_minute: slope_after(&anon_samples, 5),
        parts: Parts {
            heap: Part::of(&heap),
            sqlite: Part::of(&sqlite),
            history_cache: Part::of(&cache),
            rest: Part::of(&rest),
        },
        lost: (before + posted).saturating_sub(done),
    })
}

pub fn rows(measured: &Measured) -> Vec<Row> {
    let per_1000 = measured.per_1000_sessions();
    let per_session = per_1000 as f64 / 1000.0;
    let second_1000 = measured.rss_after_2000 as i64 - measured.rss_after_1000 as i64;
    let soak = &measured.soak;
    vec![
        Row::new(
            "3. memory: idle service (`kesoku start`, HTTP API on)",
            "embedded (SQLite)",
            mib(measured.idle_rss),
            "≤ 15 MB",
            Verdict::of(measured.idle_rss <= 15 * 1000 * 1000),
            format!(
                "VmRSS, instant mock configured; anonymous {} (live heap {}, SQLite {})",
                mib(measured.idle_anon),
                mib(measured.reported_idle.heap),
                mib(measured.reported_idle.sqlite),
            ),
        ),
        Row::new(
            "3. memory: per idle session (1,000 sessions after one turn each)",
            "embedded (SQLite)",
            format!("{:.1} KB", per_session / 1000.0),
            "≤ 20 KB",
            Verdict::of(per_session <= 20_000.0),
            format!(
                "+{} for the first 1,000, +{} for the next 1,000; of the first (the service's /metrics): \
                 live heap {}, SQLite {}",
                signed_mib(per_1000),
                signed_mib(second_1000),
                signed_mib(measured.reported_after_1000.heap as i64 - measured.reported_idle.heap as i64),
                signed_mib(measured.reported_after_1000.sqlite as i64 - measured.reported_idle.sqlite as i64),
            ),
        ),
        Row::new(
            &format!(
                "3. memory: soak, {:.0} turns/s for {:.1} min",
                soak.rate_per_second,
                soak.duration.as_secs_f64() / 60.0
            ),
            "embedded (SQLite)",
            format!(
                "{:+.1} KB/min; last half {:+.1} KB/min ({:+.1} B/turn)",
                soak.slope_per_minute / 1000.0,
                soak.last_half_slope_per_minute / 1000.0,
                soak.last_half_bytes_per_turn()
            ),
            "flat: ≤ 5 B/turn over the last half of ≥ 1 h, none lost",
            soak.verdict(),
            format!(
                "slope after the first fifth; {} turns, {} lost; RSS {} → {} (max {}); anonymous \
                 part {:+.1} KB/min, of it (the service's /metrics, KB/min after the first fifth / over the \
                 last half, last value): live heap {}, SQLite {}, history cache {}, rest {}; sessions of {} \
                 turns",
                soak.turns,
                soak.lost,
                mib(soak.start_rss),
                mib(soak.end_rss),
                mib(soak.max_rss),
                soak.anon_slope_per_minute / 1000.0,
                part(&soak.parts.heap),
                part(&soak.parts.sqlite),
                part(&soak.parts.history_cache),
                part(&soak.parts.rest),
                SOAK_TURNS_PER_SESSION
            ),
        ),
    ]
}

fn part(part: &Part) -> String {
    format!(
        "{:+.1} / {:+.1} ({})",
        part.slope_per_minute / 1000.0,
        part.last_half_slope_per_minute / 1000.0,
        mib(part.last)
    )
}

fn signed_mib(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "" };
    format!("{sign}{}", mib(bytes.unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_that_levels_off_shows_in_the_last_half_slope() {
        // 60 minutes: +100 KB/min for the first 30, then flat.
        let samples: Vec<(f64, f64)> = (0..=120)
            .map(|step| {
                let minutes = f64::from(step) / 2.0;
                (minutes, 1e6 + 100_000.0 * minutes.min(30.0))
            })
            .collect();
        let part = Part::of(&samples);
        assert!(part.slope_per_minute > 30_000.0, "after the first fifth: {}", part.slope_per_minute);
        assert!(part.last_half_slope_per_minute.abs() < 1.0, "last half: {}", part.last_half_slope_per_minute);
        assert_eq!(part.last, 4_000_000);
        assert_eq!(Part::of(&[]).last_half_slope_per_minute, 0.0);
    }

    fn soak(minutes: u64, last_half_slope_per_minute: f64, lost: usize) -> Soak {
        Soak {
            duration: Duration::from_secs(minutes * 60),
            turns: 1000,
            rate_per_second: 50.0,
            start_rss: 0,
            end_rss: 0,
            max_rss: 0,
            slope_per_minute: 0.0,
            last_half_slope_per_minute,
            anon_slope_per_minute: 0.0,
            parts: Parts::default(),
            lost,
        }
    }

    #[test]
    fn a_soak_is_judged_flat_only_after_an_hour_with_nothing_lost() {
        assert_eq!(soak(60, 12_000.0, 0).last_half_bytes_per_turn(), 4.0);
        assert_eq!(soak(60, 12_000.0, 0).verdict(), Verdict::Met);
        assert_eq!(soak(60, 48_000.0, 0).verdict(), Verdict::Missed, "16 bytes a turn is a leak");
        assert_eq!(soak(60, 0.0, 1).verdict(), Verdict::Missed, "a lost turn");
        assert_eq!(soak(15, 0.0, 0).verdict(), Verdict::Info, "too short to judge");
    }
}
