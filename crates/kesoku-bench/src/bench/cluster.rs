//! Scale-out: plain turns per second with 1, 2 and 4 worker processes (`kesoku start --role
//! worker`) beside one ingest process (`--role ingest`: the HTTP API and the intake), all on
//! PostgreSQL + Redis, against the instant mock model; and, in the same run, the embedded
//! default (one `kesoku start`, SQLite, in-process broker) on the same workload.
//!
//! The workload: 1,000 sessions (100 with `--quick`), each posting one message through the HTTP
//! API at once (64 requests in flight); a run ends when every message is `processed` in the
//! store. The limit is measured alone in the same run: the ingest process with no worker at
//! all (how fast the HTTP API stores and queues messages), and the CPU the kesoku processes
//! used (cores busy per wall second) beside how busy the whole machine was (PostgreSQL and Redis
//! share its CPUs): a machine near 100 % busy is stopped by its CPUs, not by Kesoku's design.
//!
//! The binary is the one next to this executable (`target/release/kesoku`): build it first.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use kesoku_core::{MessageFilter, Role, Status};
use tokio::process::{Child, Command};

use crate::bench::startup::workspace;
use crate::bench::{Row, Scale, Verdict};
use crate::mock::{HttpPolicy, PolicyServer};
use crate::procfs::{children_cpu_time, machine_cpu};
use crate::system::{Backend, StoreSetup};

/// Requests in flight while posting.
const IN_FLIGHT: usize = 64;

/// One configuration's run.
#[derive(Debug, Clone)]
pub struct Measured {
    /// `None`: the embedded default (one process, SQLite); else worker processes on PG + Redis.
    pub workers: Option<usize>,
    pub turns: usize,
    pub elapsed: Duration,
    pub turns_per_second: f64,
    /// CPU seconds of the kesoku processes per wall second.
    pub cpu_cores_used: f64,
    /// How busy the whole machine was during the workload (PostgreSQL and Redis included),
    /// 0 to 1 over all its CPUs.
    pub machine_busy: Option<f64>,
}

/// The limits alone: the ingest process with no worker (messages stored and queued per second
/// through the HTTP API), and the PostgreSQL store doing a plain turn's reads and writes with
/// nothing else (the throughput measurement's "store alone", here on the same server).
#[derive(Debug, Clone)]
pub struct IngestOnly {
    pub messages: usize,
    pub messages_per_second: f64,
    pub store_alone: crate::bench::throughput::StoreOnly,
}

pub async fn run(
    binary: &Path,
    postgres: &str,
    redis: &str,
    scale: Scale,
) -> anyhow::Result<(Vec<Measured>, IngestOnly)> {
    let sessions = scale.pick(100, 1000);
    let mock = PolicyServer::start(HttpPolicy::instant_text());
    let mut measured = Vec::new();
    eprintln!("  embedded (one process, SQLite) …");
    measured.push(run_one(binary, &mock, None, None, sessions).await?);
    for workers in [1, 2, 4] {
        eprintln!("  {workers} worker process(es) on PostgreSQL + Redis …");
        measured.push(run_one(binary, &mock, Some((postgres, redis)), Some(workers), sessions).await?);
    }
    eprintln!("  the ingest process alone …");
    let mut ingest = ingest_only(binary, &mock, postgres, redis, sessions).await?;
    eprintln!("  the PostgreSQL store alone …");
    ingest.store_alone =
        crate::bench::throughput::store_alone(&Backend::Postgres(postgres.to_owned()), sessions, scale.pick(1, 2))
            .await?;
    Ok((measured, ingest))
}

/// A deployment of kesoku processes on one workspace, stopped (SIGTERM, then waited) on drop
/// of the value by `stop`.
struct Deployment {
    dir: tempfile::TempDir,
    store: StoreSetup,
    children: Vec<Child>,
    api: String,
}

impl Deployment {
    async fn new(binary: &Path, mock: &PolicyServer, shared: Option<(&str, &str)>) -> anyhow::Result<Deployment> {
        let backend = match shared {
            Some((postgres, _)) => Backend::Postgres(postgres.to_owned()),
            None => Backend::Sqlite,
        };
        let store = StoreSetup::open(&backend).await?;
        let port = free_port()?;
        let mut extra = format!("max_concurrent_turns = 64\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n");
        if let Some((_, redis)) = shared {
            let prefix = format!("kesoku_bench_{}", ulid::Ulid::generate().to_string().to_lowercase());
            extra.push_str(&format!("\n[broker]\nurl = \"{redis}\"\nprefix = \"{prefix}\"\n"));
        }
        // `workspace` writes `[workspace] database = URL` for a `Postgres` backend: give it the
        // store just opened (its schema, or its SQLite file), which this process counts from.
        let dir = workspace(binary, &mock.base_url(), &Backend::Postgres(store.url.clone()), &extra).await?;
        Ok(Deployment { dir, store, children: Vec::new(), api: format!("http://127.0.0.1:{port}") })
    }

    fn spawn(&mut self, binary: &Path, role: Option<&str>) -> anyhow::Result<()> {
        let mut command = Command::new(binary);
        command.args(["-c", "kesoku.toml", "start"]);
        if let Some(role) = role {
            command.args(["--role", role]);
        }
        let child = command
            .current_dir(self.dir.path())
            .env_remove("KESOKU_CONFIG")
            .env("KESOKU_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting kesoku")?;
        self.children.push(child);
        Ok(())
    }

    /// Wait until the HTTP API answers.
    async fn ready(&self) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(response) = client.get(format!("{}/healthz", self.api)).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("the kesoku HTTP API at {} did not come up within a minute", self.api)
    }

    /// Post one message in each of `sessions` channels; how long the posting took.
    async fn post_all(&self, sessions: usize) -> anyhow::Result<Duration> {
        let client = reqwest::Client::new();
        let started = Instant::now();
        let mut posts = futures::stream::iter(0..sessions)
            .map(|i| {
                let client = client.clone();
                let url = format!("{}/v1/messages", self.api);
                async move {
                    let body = serde_json::json!({"channel_id": format!("bench-{i}"), "sender": "Bench", "content": format!("question {i}")});
                    let response = client.post(url).json(&body).send().await.context("posting a message")?;
                    if !response.status().is_success() {
                        bail!("POST /v1/messages answered {}", response.status());
                    }
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(IN_FLIGHT);
        while let Some(posted) = posts.next().await {
            posted?;
        }
        Ok(started.elapsed())
    }

    /// Wait until `count` user messages are `processed`.
    async fn all_processed(&self, count: usize) -> anyhow::Result<()> {
        let filter = MessageFilter::status(Status::Processed).with_roles(&[Role::User]);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let done = self.store.handle.store.list_messages(&filter).await?.len();
            if done >= count {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("only {done} of {count} messages were processed after ten minutes");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM every process, wait for them (so their CPU time is counted), drop the store.
    async fn stop(mut self) {
        for child in &mut self.children {
            if let Some(pid) = child.id() {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
        }
        for child in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(30), child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        }
        self.store.cleanup().await;
    }
}

async fn run_one(
    binary: &Path,
    mock: &PolicyServer,
    shared: Option<(&str, &str)>,
    workers: Option<usize>,
    sessions: usize,
) -> anyhow::Result<Measured> {
    let mut deployment = Deployment::new(binary, mock, shared).await?;
    // Every earlier run's processes are reaped: what the children's CPU grows by is this run's.
    let cpu_before = children_cpu_time();
    match workers {
        None => deployment.spawn(binary, None)?,
        Some(count) => {
            deployment.spawn(binary, Some("ingest"))?;
            for _ in 0..count {
                deployment.spawn(binary, Some("worker"))?;
            }
        }
    }
    let outcome = async {
        deployment.ready().await?;
        let machine_before = machine_cpu();
        let started = Instant::now();
        deployment.post_all(sessions).await?;
        deployment.all_processed(sessions).await?;
        let busy = match (machine_before, machine_cpu()) {
            (Some((busy0, total0)), Some((busy1, total1))) if total1 > total0 => {
                Some((busy1 - busy0) as f64 / (total1 - total0) as f64)
            }
            _ => None,
        };
        anyhow::Ok((started.elapsed(), busy))
    }
    .await;
    deployment.stop().await;
    let (elapsed, machine_busy) = outcome?;
    // The processes are reaped now: their CPU time (start-up included) is in the children's figure.
    let cpu = children_cpu_time().saturating_sub(cpu_before);
    Ok(Measured {
        workers,
        turns: sessions,
        elapsed,
        turns_per_second: sessions as f64 / elapsed.as_secs_f64(),
        cpu_cores_used: cpu.as_secs_f64() / elapsed.as_secs_f64(),
        machine_busy,
    })
}

async fn ingest_only(
    binary: &Path,
    mock: &PolicyServer,
    postgres: &str,
    redis: &str,
    sessions: usize,
) -> anyhow::Result<IngestOnly> {
    let mut deployment = Deployment::new(binary, mock, Some((postgres, redis))).await?;
    deployment.spawn(binary, Some("ingest"))?;
    let outcome = async {
        deployment.ready().await?;
        deployment.post_all(sessions).await
    }
    .await;
    deployment.stop().await;
    let elapsed = outcome?;
    Ok(IngestOnly {
        messages: sessions,
        messages_per_second: sessions as f64 / elapsed.as_secs_f64(),
        store_alone: crate::bench::throughput::StoreOnly {
            turns: 0,
            turns_per_second: 0.0,
            writes_per_turn: 0,
            cpu_cores_used: 0.0,
        },
    })
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

pub fn rows(measured: &[Measured], ingest: &IngestOnly) -> Vec<Row> {
    let embedded = measured.iter().find(|m| m.workers.is_none()).map(|m| m.turns_per_second);
    let mut rows = Vec::new();
    for m in measured {
        let (backend, label) = match m.workers {
            None => ("embedded (SQLite)", "scale-out: one process (all roles)".to_owned()),
            Some(n) => ("PostgreSQL + Redis", format!("scale-out: 1 ingest + {n} worker process(es)")),
        };
        let versus = match (m.workers, embedded) {
            (Some(_), Some(base)) if base > 0.0 => format!(", {:.2}× the embedded figure", m.turns_per_second / base),
            _ => String::new(),
        };
        rows.push(Row::new(
            &label,
            backend,
            format!("{:.0} turns/s", m.turns_per_second),
            "measured (no target)",
            Verdict::Info,
            format!(
                "{} sessions × 1 message through the HTTP API, instant mock; {:.1} s; kesoku processes used {:.2} CPU cores (start-up included); the machine was {} busy{versus}",
                m.turns,
                m.elapsed.as_secs_f64(),
                m.cpu_cores_used,
                m.machine_busy.map_or("?".to_owned(), |b| format!("{:.0} %", b * 100.0)),
            ),
        ));
    }
    rows.push(Row::new(
        "scale-out limit: the ingest process alone",
        "PostgreSQL + Redis",
        format!("{:.0} messages/s", ingest.messages_per_second),
        "measured (no target)",
        Verdict::Info,
        format!(
            "{} messages stored and queued through the HTTP API with no worker running; turns/s cannot pass this",
            ingest.messages
        ),
    ));
    let store = &ingest.store_alone;
    rows.push(Row::new(
        "scale-out limit: the PostgreSQL store alone",
        "PostgreSQL",
        format!("{:.0} turns/s", store.turns_per_second),
        "measured (no target)",
        Verdict::Info,
        format!(
            "{} turns of a plain turn's reads and writes ({} writes each), 1,000 concurrent, nothing else; this process used {:.2} CPU cores",
            store.turns, store.writes_per_turn, store.cpu_cores_used
        ),
    ));
    rows
}

/// The `kesoku` binary next to this one.
pub fn binary() -> anyhow::Result<PathBuf> {
    crate::binaries::sibling("kesoku").context(
        "the scale-out measurement runs the real `kesoku` binary, which is not built next to this one: \
         run `cargo build --release -p kesoku` first",
    )
}
