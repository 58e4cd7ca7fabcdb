//! `kesoku start`: the long-running service.
//!
//! It runs recovery, then the agent (intake, workers, stop signals) until SIGTERM or SIGINT,
//! with structured logs on stderr (`--log-format json` for journald and log shippers). On the
//! signal it stops taking work and gives running turns `[service] shutdown_grace_s` to finish;
//! turns still running then are stopped and their messages go back to `pending_agent`, to run
//! again at the next start. A second signal stops them at once. It exits 0 after a clean stop.
//!
//! What the service needs to start: a model (else it refuses, saying what to configure). The
//! agent always runs; its inputs are
//! - the store itself: messages other processes post to it (`kesoku chat` while the service
//!   runs acts as its client, see `chat.rs`), heard through the store watch, and work left
//!   `pending_agent` by an earlier run;
//! - the HTTP API, when `[http]` is configured;
//! - `[[cron]]` jobs and the follow-ups the agent scheduled, each posting its root message when
//!   due;
//! - the chat platforms under `[chatbots]` (each connects, ingests, and is delivered to by a
//!   `kesoku_chatbots::Deliverer`, see `crate::platforms`).
//!
//! So with a model configured there is always an input and the service starts; it logs which
//! inputs are on. One service per workspace: a lock file (`<workspace>/service.lock`, holding
//! the pid) refuses a second one and tells `kesoku chat` to act as a client. Two agents on one
//! store would still be safe (claims are atomic), only wasteful.
//!
//! Roles (`--role`): `all` runs everything above; `ingest` runs the inputs and the intake (no
//! turns); `worker` runs the worker pool and the stop signals for its turns (no chat platforms,
//! no HTTP, no cron, no follow-ups). `ingest` and `worker` need `[broker] url`: without a
//! shared queue, what one process queues no other could take. With `[broker] url` set, any
//! number of processes of any role share the workspace, so the lock is not taken at all (the
//! exactly-once intake and the claims keep them apart; `kesoku chat` then runs its own turns
//! as one more process of the cluster).
//!
//! Background jobs (`run_shell_command` with `background`) are offered by the service only: it
//! recovers them at start (adopting the running ones, reporting the ended and lost ones) and
//! stops watching them, not the jobs, at shutdown.
//!
//! Not here: installing the service as a systemd unit (`service.rs`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use kesoku_broker::StopReason;
use kesoku_core::{MessageFilter, Status};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::cli::{Role, StartArgs};
use crate::config::Config;
use crate::wiring;

/// Extra time after the grace period for stopped turns to write their last state.
const STOP_DEADLINE_MARGIN: Duration = Duration::from_secs(15);

/// The exclusive lock a running service holds on its workspace; released when dropped (and by
/// the kernel when the process dies, so a crash never leaves a stale lock).
#[derive(Debug)]
pub struct ServiceLock {
    _file: File,
}

/// The lock file of a workspace.
pub fn lock_path(config: &Config) -> PathBuf {
    config.workspace_dir.join("service.lock")
}

impl ServiceLock {
    /// Take the workspace's service lock, or explain which service holds it.
    pub fn acquire(config: &Config) -> anyhow::Result<ServiceLock> {
        let path = lock_path(config);
        std::fs::create_dir_all(&config.workspace_dir)
            .with_context(|| format!("creating the workspace {}", config.workspace_dir.display()))?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening the service lock {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let pid = read_pid(&mut file).map_or_else(|| "unknown".to_owned(), |pid| pid.to_string());
                bail!(
                    "a kesoku service is already running for this workspace (pid {pid}, lock {}): stop it first \
                     (`kesoku service stop`, or send it SIGTERM)",
                    path.display()
                );
            }
            Err(TryLockError::Error(error)) => {
                return Err(error).with_context(|| format!("locking {}", path.display()));
            }
        }
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        file.flush()?;
        Ok(ServiceLock { _file: file })
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// The pid of the service running for this workspace, if one runs.
pub fn running_service(config: &Config) -> Option<u32> {
    let mut file = OpenOptions::new().read(true).open(lock_path(config)).ok()?;
    match file.try_lock_shared() {
        // Nobody holds it exclusively: no service. Dropping the file releases our shared lock.
        Ok(()) => None,
        Err(TryLockError::WouldBlock) => Some(read_pid(&mut file).unwrap_or(0)),
        Err(TryLockError::Error(_)) => None,
    }
}

pub async fn run(config: &Config, args: &StartArgs) -> anyhow::Result<ExitCode> {
    let role = args.role;
    let shared = config.broker.url.is_some();
    if role != Role::All && !shared {
        bail!(
            "`kesoku start --role {}` needs a shared queue: set [broker] url = \"redis://host:6379\" in {} \
             (every ingest and worker process must use the same one), or run `kesoku start` (role all) alone",
            role.as_str(),
            config.path.display()
        );
    }
    let models = wiring::build_models(config).await.context("cannot start the service")?;
    // One process per workspace, unless processes share a broker (then several are the point).
    let _lock = if shared { None } else { Some(ServiceLock::acquire(config)?) };
    let grace = Duration::from_secs(config.service.shutdown_grace_s);
    // Listen before anything runs, so a signal during start-up is not the default "die now".
    let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;

    let (handle, gateway) = wiring::open_gateway(config, kesoku_store::Footprint::Service).await?;
    let jobs = wiring::build_jobs(config, &gateway);
    let followups = wiring::build_followups(config, &gateway);
    let agent = wiring::build_service_agent(config, &handle, gateway.clone(), models, &followups, &jobs).await?;
    let report = agent.recover().await.context("recovering unfinished work")?;
    // Background jobs left running by the last run: still running ones are watched again, ended
    // or lost ones are reported now (their alerts wait as `pending_agent` for the agent). Jobs
    // run where turns run: workers watch them.
    if role.works()
        && let Err(error) = jobs.recover().await
    {
        tracing::warn!(%error, "recovering background jobs failed; they are looked at again at the next start");
    }
    let waiting = gateway.store().list_messages(&MessageFilter::status(Status::PendingAgent)).await?.len();
    tracing::info!(
        recovered_messages = report.recovered_messages.len(),
        closed_tool_calls = report.closed_tool_calls.len(),
        closed_activations = report.closed_activations.len(),
        waiting_messages = waiting,
        "recovery done"
    );

    let shutdown = CancellationToken::new();
    let tasks = match role {
        Role::All => kesoku_agent::Tasks::ALL,
        Role::Ingest => kesoku_agent::Tasks::INTAKE,
        Role::Worker => kesoku_agent::Tasks::WORKERS,
    };
    let mut agent_task = {
        let agent = agent.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { agent.run_tasks(tasks, shutdown, grace).await })
    };
    let watch = wiring::spawn_store_watch(config, gateway.clone(), shutdown.clone());
    let mut inputs = Vec::new();
    let mut http = None;
    if role.ingests() {
        // Chat platforms: each connects (inbound) and gets the shared delivery routine (outbound).
        inputs.extend(crate::platforms::start_all(&crate::platforms::Platform {
            config,
            handle: &handle,
            gateway: &gateway,
            control: std::sync::Arc::new(crate::control::AgentHandle(agent.clone())),
            shutdown: &shutdown,
        })?);
        // Cron jobs post their trigger messages on schedule.
        inputs.push(tokio::spawn(kesoku_chatbots::cron::run_cron(
            gateway.clone(),
            config.cron.clone(),
            shutdown.clone(),
        )));
        // Follow-ups the agent scheduled fire as they come due (those due while it was down, now).
        inputs.push(tokio::spawn(followups.run(shutdown.clone())));
        // HTTP when configured: the API, the console and the `api` chatbot's delivery.
        if let Some(section) = &config.http {
            http = Some(start_http(config, section, &handle, &gateway, &agent, &shutdown).await?);
        }
    }
    tracing::info!(
        role = role.as_str(),
        pid = std::process::id(),
        workspace = %config.workspace_dir.display(),
        inputs = if role.ingests() { "store (kesoku chat and other processes; pending work)" } else { "none (a worker)" },
        http = http.as_ref().map_or_else(|| "off".to_owned(), |h| h.addr.to_string()),
        chatbots = %if role.ingests() { config.chatbots.describe() } else { "none (a worker)".to_owned() },
        cron_jobs = if role.ingests() { config.cron.len() } else { 0 },
        shutdown_grace_s = grace.as_secs(),
        "kesoku service started"
    );

    let which = tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = interrupt.recv() => "SIGINT",
        result = &mut agent_task => {
            shutdown.cancel();
            let _ = watch.await;
            bail!("the agent stopped unexpectedly: {}", result.err().map_or_else(|| "no error".to_owned(), |e| e.to_string()));
        }
    };
    let running = agent.running_turns().len();
    tracing::info!(signal = which, running_turns = running, grace_s = grace.as_secs(), "shutting down");
    shutdown.cancel();

    let deadline = tokio::time::sleep(grace + STOP_DEADLINE_MARGIN);
    tokio::pin!(deadline);
    let mut stopping_now = false;
    loop {
        tokio::select! {
            result = &mut agent_task => {
                if let Err(error) = result {
                    tracing::error!(%error, "the agent task failed while stopping");
                }
                break;
            }
            _ = terminate.recv(), if !stopping_now => {
                stopping_now = true;
                stop_running_turns(&agent).await;
            }
            _ = interrupt.recv(), if !stopping_now => {
                stopping_now = true;
                stop_running_turns(&agent).await;
            }
            () = &mut deadline => {
                tracing::error!("running turns did not stop in time; exiting anyway (recovery will hand their messages back)");
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    // Stop watching jobs, never the jobs themselves: they outlive the service by design, and
    // the next start reports the ones that end meanwhile.
    jobs.shutdown().await;
    let _ = watch.await;
    for input in inputs {
        let _ = input.await;
    }
    if let Some(http) = http {
        let _ = http.task.await;
    }
    tracing::info!("kesoku service stopped");
    Ok(ExitCode::SUCCESS)
}

/// A second signal: stop the running turns now instead of waiting out the grace period. They
/// end as at the end of the grace period: their messages go back to `pending_agent`.
async fn stop_running_turns(agent: &kesoku_agent::Agent) {
    tracing::info!("second signal: stopping running turns now");
    for (session_id, _) in agent.running_turns() {
        if let Err(error) = agent.gateway().request_stop(&session_id, StopReason::Shutdown, None).await {
            tracing::warn!(%error, session_id = %session_id, "asking a turn to stop failed");
        }
    }
}

/// The running HTTP server.
struct Http {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

/// Bind and serve the API and console, refusing a non-loopback address without a token.
async fn start_http(
    config: &Config,
    section: &crate::config::HttpSection,
    handle: &kesoku_store::StoreHandle,
    gateway: &kesoku_gateway::Gateway,
    agent: &kesoku_agent::Agent,
    shutdown: &CancellationToken,
) -> anyhow::Result<Http> {
    let addr: std::net::SocketAddr = section
        .listen
        .parse()
        .with_context(|| format!("{}: [http] listen is not an address", config.path.display()))?;
    let token = match &section.token_env {
        Some(variable) => {
            let value = std::env::var(variable).map_err(|_| {
                anyhow::anyhow!(
                    "{}: [http] token_env names `{variable}`, which is not set: export the API token there",
                    config.path.display()
                )
            })?;
            Some(kesoku_server::Token::new(value).map_err(|e| anyhow::anyhow!("the token in `{variable}`: {e}"))?)
        }
        None => None,
    };
    kesoku_server::check_bind(addr, token.as_ref())
        .map_err(|e| anyhow::anyhow!("{e}: set [http] token_env in {} and export the token", config.path.display()))?;
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    {
        let metrics = metrics.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => metrics.run_upkeep(),
                }
            }
        });
    }
    let workspace = config.workspace_dir.canonicalize().unwrap_or_else(|_| config.workspace_dir.clone());
    let mut state = kesoku_server::ServerState::new(
        gateway.clone(),
        std::sync::Arc::clone(&handle.ledger),
        std::sync::Arc::new(crate::control::AgentHandle(agent.clone())),
        workspace.clone(),
    )
    .with_metrics(metrics)
    .with_memory(crate::memory::probe(std::sync::Arc::clone(&handle.store), gateway.clone()))
    .with_models(config.models.keys().cloned())
    .with_chatbots(["api", "cli"].into_iter().map(str::to_owned).chain(config.chatbots.ids()));
    if let Some(token) = token {
        state = state.with_token(token);
    }
    if let Some(leasing) = agent.leasing() {
        state = state.with_leases(std::sync::Arc::clone(&leasing.leases));
    }
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr}"))?;
    let addr = listener.local_addr().unwrap_or(addr);
    let deliverer =
        kesoku_chatbots::Deliverer::new(gateway.clone(), workspace).with_ledger(std::sync::Arc::clone(&handle.ledger));
    tokio::spawn(kesoku_server::run_api_delivery(deliverer, shutdown.clone()));
    let shutdown = shutdown.clone();
    let task = tokio::spawn(async move {
        if let Err(error) = kesoku_server::serve(listener, state, shutdown).await {
            tracing::error!(%error, "the HTTP server stopped");
        }
    });
    tracing::info!(%addr, "HTTP API and console listening");
    Ok(Http { addr, task })
}
