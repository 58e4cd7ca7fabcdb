//! Building the running system from the config: store, gateway, models, tools, agent.
//! The only place that reads environment variables (API keys).

use std::sync::Arc;

use anyhow::{Context, bail};
use kesoku_agent::{Agent, AgentDeps, Followups, Jobs, JobsConfig, ModelSet};
use kesoku_broker::{Broker, MemoryBroker, MemoryQueue, Queue, RedisBroker, RedisQueue};
use kesoku_gateway::Gateway;
use kesoku_llm::Model;
use kesoku_store::{Footprint, StoreHandle};

use crate::config::{Config, ModelEntry};

/// Open the configured store. `create`: make the SQLite file if missing (only `init` does).
pub async fn open_store(config: &Config, create: bool) -> anyhow::Result<StoreHandle> {
    if create {
        let handle = kesoku_store::open_pooled(&config.database_url, config.database.pool()).await;
        handle.with_context(|| format!("opening the store configured in {}", config.path.display()))
    } else {
        open_existing_store(config, Footprint::Service).await
    }
}

/// Open the configured store, which must exist, holding what `footprint` says.
async fn open_existing_store(config: &Config, footprint: Footprint) -> anyhow::Result<StoreHandle> {
    let handle = kesoku_store::open_existing_pooled(&config.database_url, footprint, config.database.pool()).await;
    handle.with_context(|| format!("opening the store configured in {}", config.path.display()))
}

/// The store plus the configured broker (`[broker]`: in-process, or Redis). `footprint`:
/// what a SQLite store holds open (the service's readers and checkpoint thread, or a
/// command's single connection).
pub async fn open_gateway(config: &Config, footprint: Footprint) -> anyhow::Result<(StoreHandle, Gateway)> {
    let handle = open_existing_store(config, footprint).await?;
    let gateway = Gateway::new(Arc::clone(&handle.store), build_broker(config).await?);
    Ok((handle, gateway))
}

/// The configured broker: Redis when `[broker] url` is set, else in-process.
pub async fn build_broker(config: &Config) -> anyhow::Result<Arc<dyn Broker>> {
    match config.broker.redis() {
        Some(options) => {
            let broker = RedisBroker::connect(&options).await;
            Ok(Arc::new(broker.with_context(|| format!("{}: [broker]", config.path.display()))?))
        }
        None => Ok(Arc::new(MemoryBroker::default())),
    }
}

/// The configured lane queue for a pool of `workers`, with lane caps sized for it: Redis when
/// `[broker] url` is set (caps per process), else in-process.
pub async fn build_queue(config: &Config, workers: usize) -> anyhow::Result<Arc<dyn Queue>> {
    match config.broker.redis() {
        Some(options) => {
            let queue = RedisQueue::for_workers(&options, workers).await;
            Ok(Arc::new(queue.with_context(|| format!("{}: [broker]", config.path.display()))?))
        }
        None => Ok(Arc::new(MemoryQueue::for_workers(workers))),
    }
}

/// Build one configured model, reading its key from the environment (remote) or loading its
/// file (local; loaded once per process and shared).
pub async fn build_model(config: &Config, name: &str) -> anyhow::Result<Arc<dyn Model>> {
    let Some(entry) = config.models.get(name) else {
        let known: Vec<&str> = config.models.keys().map(String::as_str).collect();
        bail!(
            "no model named `{name}` in {}; configured: {}",
            config.path.display(),
            if known.is_empty() { "none".to_owned() } else { known.join(", ") }
        );
    };
    match entry {
        ModelEntry::Remote(model_config) => {
            kesoku_llm::build_model_with_lookup(name, model_config, |var| std::env::var(var).ok())
                .map_err(|e| anyhow::anyhow!("model `{name}`: {e}"))
        }
        ModelEntry::Local(local) => {
            if !local.path.exists() {
                bail!(
                    "model `{name}`: the model file {} is missing: fetch it with `kesoku models pull` (or `kesoku init`)",
                    local.path.display()
                );
            }
            let model = kesoku_local::LocalModel::load_shared(local)
                .await
                .map_err(|e| anyhow::anyhow!("model `{name}`: {e}"))?;
            Ok(Arc::new(kesoku_local::LocalChatModel::new(name, model, kesoku_llm::Provider::Local)))
        }
    }
}

fn is_local(config: &Config, name: &str) -> bool {
    matches!(config.models.get(name), Some(ModelEntry::Local(_)))
}

/// The model that answers: `[agent] model`; else the only configured one; else the only remote
/// one. A remote model whose key is missing falls back to a configured local model, saying so in
/// one line on stderr.
pub async fn build_models(config: &Config) -> anyhow::Result<ModelSet> {
    let remote: Vec<&String> = config.models.keys().filter(|name| !is_local(config, name)).collect();
    let local = config.models.keys().find(|name| is_local(config, name)).cloned();
    let name = match (&config.agent.model, config.models.len(), remote.len()) {
        (Some(name), _, _) => name.clone(),
        (None, 1, _) => config.models.keys().next().cloned().unwrap_or_default(),
        (None, _, 1) => remote[0].clone(),
        (None, 0, _) => bail!(
            "no model is configured: add a [models.NAME] section to {} (commented examples are in the file), \
             for example provider = \"openai\", model = \"gpt-4.1-mini\", api_key_env = \"OPENAI_API_KEY\", \
             then export that variable; or run `kesoku init` to set up the local model",
            config.path.display()
        ),
        (None, _, _) => bail!(
            "several models are configured in {}: choose one with [agent] model = \"NAME\"",
            config.path.display()
        ),
    };
    let model = match build_model(config, &name).await {
        Ok(model) => model,
        Err(error) if !is_local(config, &name) && local.is_some() && is_missing_key(config, &name) => {
            let local_name = local.clone().unwrap_or_default();
            let model = build_model(config, &local_name).await.map_err(|local_error| {
                anyhow::anyhow!("{error:#}\n(and the local fallback failed too: {local_error:#})")
            })?;
            eprintln!("note: using the local model `{local_name}`: {error:#}");
            model
        }
        Err(error) => return Err(error),
    };
    if local.as_deref() == Some(name.as_str()) && config.models.len() == 1 {
        eprintln!(
            "note: answering with the local model `{name}` (no API key needed; add a [models.NAME] entry for a hosted model)"
        );
    }
    let mut models = vec![Arc::clone(&model)];
    for name in referenced_models(config) {
        if name != model.name() {
            models.push(build_model(config, &name).await?);
        }
    }
    ModelSet::new(models, model.name()).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Models the config names besides the answering one: the summarizer, cron jobs' and
/// channels' models. Each is built at start, so a missing key or file is reported then, not
/// when the work that names it runs.
fn referenced_models(config: &Config) -> std::collections::BTreeSet<String> {
    let summarizer = config.agent.compaction.model.iter().cloned();
    let channels = config
        .chatbots
        .discord
        .iter()
        .flat_map(|discord| discord.channels.iter())
        .filter_map(|entry| entry.model.clone());
    summarizer.chain(channels).collect()
}

/// Whether model `name` fails only because its API key is not in the environment.
fn is_missing_key(config: &Config, name: &str) -> bool {
    match config.models.get(name) {
        Some(ModelEntry::Remote(model)) => {
            kesoku_llm::resolve_api_key(name, model, |var| std::env::var(var).ok()).is_err()
        }
        Some(ModelEntry::Local(_)) | None => false,
    }
}

/// The follow-ups of this process over `gateway`: their tools (given to the agent by
/// [`build_agent`]) and their scheduler (`Followups::run`, spawned by whoever runs the agent).
/// Reminders show times in `[agent] timezone`, else UTC.
pub fn build_followups(config: &Config, gateway: &Gateway) -> Followups {
    Followups::new(gateway.clone(), local_zone(config))
}

/// `[agent] timezone`, else UTC: the zone times are shown in outside a turn.
pub fn local_zone(config: &Config) -> kesoku_agent::followups::Tz {
    match config.agent.timezone.as_deref() {
        Some(name) => kesoku_agent::followups::parse_zone(name).unwrap_or_else(|| {
            tracing::warn!(timezone = name, "[agent] timezone is not an IANA time zone; showing UTC");
            kesoku_agent::followups::Tz::UTC
        }),
        None => kesoku_agent::followups::Tz::UTC,
    }
}

/// The agent runtime over `handle` and `gateway`, offering `followups`' tools with the built-in
/// ones, without background jobs (`kesoku chat` running the agent itself: the process ends with
/// the conversation, so nothing would watch a job).
pub async fn build_agent(
    config: &Config,
    handle: &StoreHandle,
    gateway: Gateway,
    models: ModelSet,
    followups: &Followups,
) -> anyhow::Result<Agent> {
    build_agent_with(config, handle, gateway, models, followups, None).await
}

/// The service's job keeper: one per service, on its gateway and workspace.
pub fn build_jobs(config: &Config, gateway: &Gateway) -> Jobs {
    let workspace = config.workspace_dir.canonicalize().unwrap_or_else(|_| config.workspace_dir.clone());
    Jobs::new(gateway.clone(), workspace, JobsConfig::from_shell(&config.tools.shell))
}

/// The service's agent: [`build_agent`] whose `run_shell_command` offers background jobs kept by
/// `jobs`, with the job tools beside the built-in ones.
pub async fn build_service_agent(
    config: &Config,
    handle: &StoreHandle,
    gateway: Gateway,
    models: ModelSet,
    followups: &Followups,
    jobs: &Jobs,
) -> anyhow::Result<Agent> {
    build_agent_with(config, handle, gateway, models, followups, Some(jobs)).await
}

async fn build_agent_with(
    config: &Config,
    handle: &StoreHandle,
    gateway: Gateway,
    models: ModelSet,
    followups: &Followups,
    jobs: Option<&Jobs>,
) -> anyhow::Result<Agent> {
    let intro = match &config.agent.system_prompt_file {
        Some(file) => {
            let path = config.resolve_path(file);
            Some(std::fs::read_to_string(&path).with_context(|| {
                format!("{}: [agent] system_prompt_file: cannot read {}", config.path.display(), path.display())
            })?)
        }
        None => None,
    };
    let mut personas = Vec::with_capacity(config.agents.len());
    for agent in &config.agents {
        let mut agent = agent.clone();
        if let Some(file) = agent.intro_file.take() {
            let path = config.resolve_path(&file);
            agent.intro = Some(std::fs::read_to_string(&path).with_context(|| {
                format!(
                    "{}: [[agents]] `{}` intro_file: cannot read {}",
                    config.path.display(),
                    agent.name,
                    path.display()
                )
            })?);
        }
        personas.push(agent);
    }
    std::fs::create_dir_all(config.workspace_dir.join("sessions"))
        .with_context(|| format!("creating the workspace {}", config.workspace_dir.display()))?;
    let workspace = config.workspace_dir.canonicalize().unwrap_or_else(|_| config.workspace_dir.clone());
    let answering = models.default_model();
    // Sub-agents: `delegate` refuses beyond `[agent] max_depth`; their results come back through
    // the agent's own result keeper (`Agent::run`).
    let subagents = kesoku_agent::Subagents::new(
        gateway.clone(),
        Arc::clone(&handle.ledger),
        config.agent.max_depth,
        config.agent.name.clone(),
    )
    .with_personas(kesoku_agent::Personas::new(personas.clone()));
    let profile = Profile::of(config, answering.name(), followups, jobs, &subagents);
    crate::config::check_agent_tools(&config.agents, profile.tools.names())
        .with_context(|| format!("{}: [[agents]]", config.path.display()))?;
    // Lane caps sized for the worker pool: a quarter of it always free of automation.
    let queue = build_queue(config, profile.agent.max_concurrent_turns).await?;
    let leasing = build_leasing(config).await?;
    Ok(Agent::new(AgentDeps {
        gateway,
        ledger: Arc::clone(&handle.ledger),
        queue,
        models,
        tools: Arc::new(profile.tools),
        workspace,
        config: profile.agent,
        limits: config.limits.clone(),
        intro,
        personas: kesoku_agent::Personas::new(personas),
        leasing,
    }))
}

/// Session leases across processes when `[broker] url` names a Redis (on its prefix); none in
/// one process, where the queue hands a session to one worker at a time.
pub async fn build_leasing(config: &Config) -> anyhow::Result<Option<kesoku_agent::SessionLeasing>> {
    let Some(options) = config.broker.redis() else { return Ok(None) };
    let leases = kesoku_broker::lease::RedisLeases::connect(&options.url, options.prefix.clone())
        .await
        .with_context(|| format!("{}: [broker] url: session leases", config.path.display()))?
        .with_operation_timeout(std::time::Duration::from_millis(config.broker.operation_timeout_ms));
    Ok(Some(kesoku_agent::SessionLeasing {
        leases: Arc::new(leases),
        ttl: std::time::Duration::from_secs(config.broker.lease_ttl_s),
    }))
}

/// What the agent offers the model that answers. A local model not configured with
/// `tools = true` is a small one: it gets no tools and, unless `[agent] system_prompt` says
/// otherwise, the short system prompt of `kesoku_local`, so its prompt is the question and
/// little else. Every other model gets the configured tools and prompt.
struct Profile {
    tools: kesoku_tools::Registry,
    agent: kesoku_agent::AgentConfig,
}

impl Profile {
    fn of(
        config: &Config,
        answering: &str,
        followups: &Followups,
        jobs: Option<&Jobs>,
        subagents: &kesoku_agent::Subagents,
    ) -> Profile {
        let mut agent = config.agent.clone();
        // A chatbot's own time zone counts for its messages; a chatbot's default (UTC) does not
        // override `[agent] timezone`.
        for entry in config.chatbots.entries() {
            if entry.timezone.trim() != "UTC" {
                agent.chatbot_timezones.insert(entry.id.to_owned(), entry.timezone.trim().to_owned());
            }
        }
        match config.models.get(answering) {
            Some(ModelEntry::Local(local)) if !local.tools => {
                if agent.system_prompt.is_none() {
                    agent.system_prompt = Some(kesoku_local::SMALL_MODEL_SYSTEM_PROMPT.to_owned());
                }
                Profile { tools: kesoku_tools::Registry::new(), agent }
            }
            Some(ModelEntry::Local(_) | ModelEntry::Remote(_)) | None => {
                Profile { tools: tools(config, followups, jobs, subagents), agent }
            }
        }
    }
}

/// The configured built-in tools; with `jobs` (and `run_shell_command` not disabled), background
/// jobs and the job tools too.
fn tools(
    config: &Config,
    followups: &Followups,
    jobs: Option<&Jobs>,
    subagents: &kesoku_agent::Subagents,
) -> kesoku_tools::Registry {
    let shell_disabled = config.tools.disabled.iter().any(|name| name == kesoku_tools::RUN_SHELL_COMMAND);
    let mut registry = match jobs.filter(|_| !shell_disabled) {
        Some(jobs) => {
            let mut registry = kesoku_tools::builtin_registry_with_background(&config.tools, Arc::new(jobs.clone()));
            for tool in kesoku_agent::jobs::job_tools(jobs) {
                // Their names are fixed and none is a built-in's, so this cannot fail; if it ever
                // did, the tool would be missing and the log would say why.
                if let Err(error) = registry.register_shared(tool) {
                    tracing::error!(%error, "a job tool could not be registered");
                }
            }
            registry
        }
        None => kesoku_tools::builtin_registry(&config.tools),
    };
    // Their names are distinct from the built-ins' (tested); a failure would leave them out and
    // say why.
    if let Err(error) = followups.register(&mut registry) {
        tracing::error!(%error, "the follow-up tools could not be registered");
    }
    // `[agent] max_depth = 0` refuses every delegation (the tool then says so).
    if let Err(error) = subagents.register(&mut registry) {
        tracing::error!(%error, "the delegate tool could not be registered");
    }
    // `http_request` is opt-in: offered only when `[tools.http] allowed_hosts` names hosts.
    if config.tools.http.is_enabled()
        && let Err(error) = registry.register(kesoku_tools::HttpTool::new(&config.tools.http))
    {
        tracing::error!(%error, "the http_request tool could not be registered");
    }
    registry
}

/// Hear the changes other processes make: through the broker when it is shared (`[broker]
/// url`, Redis), else by watching the store ([`kesoku_gateway::watch`]). The task ends with
/// `shutdown`.
pub fn spawn_store_watch(
    config: &Config,
    gateway: Gateway,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    if config.broker.url.is_some() {
        return tokio::spawn(async move { shutdown.cancelled().await });
    }
    kesoku_gateway::watch::spawn_store_watch(gateway, kesoku_gateway::watch::STORE_WATCH_PERIOD, shutdown)
}

#[cfg(test)]
mod tests {
    //! What the agent sends the answering model, per profile: a whole turn on a real SQLite
    //! store, the model scripted under the configured model's name.

    #![allow(clippy::expect_used)]

    use kesoku_core::{Message, Status};
    use kesoku_llm::{Request, ScriptStep, ScriptedModel};

    use super::*;

    /// The request the agent sends for one user message, with `models` as the config's models
    /// section and `agent` as its `[agent]` section.
    async fn first_request(agent: &str, models: &str) -> Request {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kesoku.toml");
        let config = Config::parse(&path, &format!("[agent]\n{agent}\n{models}")).expect("config");
        std::fs::create_dir_all(&config.workspace_dir).expect("workspace");
        let handle = open_store(&config, true).await.expect("store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let model = ScriptedModel::new("local", vec![ScriptStep::text("40")]);
        let models = ModelSet::single(Arc::new(model.clone()));
        let followups = build_followups(&config, &gateway);
        let agent = build_agent(&config, &handle, gateway.clone(), models, &followups).await.expect("agent");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let runner = tokio::spawn({
            let (agent, shutdown) = (agent.clone(), shutdown.clone());
            async move { agent.run(shutdown, std::time::Duration::from_secs(1)).await }
        });
        let session = gateway.resolve_session("cli", "local").await.expect("session");
        let message = Message::user_text(&session.id, "cli", "local", "user", "What is 25 + 15?");
        gateway.post(&message).await.expect("post");
        // Wait for the turn to end (the answer is scripted: it ends at once).
        let mut status = Status::PendingAgent;
        for _ in 0..500 {
            status = gateway.store().get_message(&message.id).await.expect("read").expect("stored").status;
            if status == Status::Processed {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        runner.await.expect("agent stops");
        assert_eq!(status, Status::Processed);
        let requests = model.requests();
        assert_eq!(requests.len(), 1, "one model call");
        requests.into_iter().next().expect("a request")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_turn_runs_on_the_redis_broker_and_queue_and_is_acknowledged() {
        let Some(url) = kesoku_test_support::db::redis_url() else { return };
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kesoku.toml");
        let prefix = format!("kesoku_test_{}", ulid::Ulid::generate());
        let text = format!("[broker]\nurl = \"{url}\"\nprefix = \"{prefix}\"\n");
        let config = Config::parse(&path, &text).expect("config");
        std::fs::create_dir_all(&config.workspace_dir).expect("workspace");
        let handle = open_store(&config, true).await.expect("store");
        let gateway = Gateway::new(Arc::clone(&handle.store), build_broker(&config).await.expect("redis broker"));
        let model = ScriptedModel::new("local", vec![ScriptStep::text("40")]);
        let followups = build_followups(&config, &gateway);
        let agent =
            build_agent(&config, &handle, gateway.clone(), ModelSet::single(Arc::new(model.clone())), &followups)
                .await
                .expect("agent");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let runner = tokio::spawn({
            let (agent, shutdown) = (agent.clone(), shutdown.clone());
            async move { agent.run(shutdown, std::time::Duration::from_secs(1)).await }
        });
        let session = gateway.resolve_session("cli", "local").await.expect("session");
        let message = Message::user_text(&session.id, "cli", "local", "user", "What is 25 + 15?");
        gateway.post(&message).await.expect("post");
        let mut status = Status::PendingAgent;
        for _ in 0..3000 {
            status = gateway.store().get_message(&message.id).await.expect("read").expect("stored").status;
            if status == Status::Processed {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(status, Status::Processed);
        // The activation was acknowledged once its outcome was recorded: nothing waits or runs.
        let mut depths = agent.queue_depths().await.expect("depths");
        for _ in 0..3000 {
            if depths.waiting() + depths.running == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            depths = agent.queue_depths().await.expect("depths");
        }
        assert_eq!((depths.waiting(), depths.running), (0, 0));
        shutdown.cancel();
        runner.await.expect("agent stops");
        assert_eq!(model.requests().len(), 1, "one turn, one model call");
    }

    #[tokio::test]
    async fn a_small_local_model_gets_no_tools_and_the_short_system_prompt() {
        let local = "[models.local]\nprovider = \"local\"\npath = \"m.gguf\"\n";
        let request = first_request("", local).await;
        assert!(
            request.tools.is_empty(),
            "tools offered: {:?}",
            request.tools.iter().map(|t| &t.name).collect::<Vec<_>>()
        );
        let short = kesoku_local::SMALL_MODEL_SYSTEM_PROMPT.replace("{name}", "Kesoku");
        assert_eq!(request.system.as_deref(), Some(short.as_str()));

        // A configured prompt is kept; the tools stay off.
        let request = first_request("system_prompt = \"Be terse, {name}.\"", local).await;
        assert!(request.tools.is_empty());
        assert_eq!(request.system.as_deref(), Some("Be terse, Kesoku."));

        // `tools = true`: the full agent, tools and built-in prompt.
        let request = first_request("", &format!("{local}tools = true\n")).await;
        let names: Vec<&str> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "cancel_followup",
                "delegate",
                "edit_file",
                "list_followups",
                "read_file",
                "run_shell_command",
                "schedule_followup",
                "write_file"
            ]
        );
        assert!(
            request.system.as_deref().is_some_and(|s| s.starts_with("# System Instructions")),
            "{:?}",
            request.system
        );
    }
}
