//! Building the running system from the config: store, gateway, models, tools, agent.
//! The only place that reads environment variables (API keys).

use std::sync::Arc;

use anyhow::{Context, bail};
use kesoku_agent::{Agent, AgentDeps, ModelSet};
use kesoku_broker::MemoryBroker;
use kesoku_broker::MemoryQueue;
use kesoku_gateway::Gateway;
use kesoku_llm::Model;
use kesoku_store::{Footprint, StoreHandle};

use crate::config::{Config, ModelEntry};

/// Open the configured store. `create`: make the SQLite file if missing (only `init` does).
pub async fn open_store(config: &Config, create: bool) -> anyhow::Result<StoreHandle> {
    if create {
        let handle = kesoku_store::open(&config.database_url).await;
        handle.with_context(|| format!("opening the store configured in {}", config.path.display()))
    } else {
        open_existing_store(config, Footprint::Service).await
    }
}

/// Open the configured store, which must exist, holding what `footprint` says.
async fn open_existing_store(config: &Config, footprint: Footprint) -> anyhow::Result<StoreHandle> {
    let handle = kesoku_store::open_existing_with(&config.database_url, footprint).await;
    handle.with_context(|| format!("opening the store configured in {}", config.path.display()))
}

/// The store plus an in-process broker. `footprint`: what a SQLite store holds open (the
/// service's readers and checkpoint thread, or a command's single connection).
pub async fn open_gateway(config: &Config, footprint: Footprint) -> anyhow::Result<(StoreHandle, Gateway)> {
    let handle = open_existing_store(config, footprint).await?;
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    Ok((handle, gateway))
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
    if let Some(summarizer) = &config.agent.compaction.model
        && *summarizer != model.name()
    {
        models.push(build_model(config, summarizer).await?);
    }
    ModelSet::new(models, model.name()).map_err(|e| anyhow::anyhow!("{e}"))
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

/// The agent runtime over `handle` and `gateway`.
pub fn build_agent(config: &Config, handle: &StoreHandle, gateway: Gateway, models: ModelSet) -> anyhow::Result<Agent> {
    let intro = match &config.agent.system_prompt_file {
        Some(file) => {
            let path = config.resolve_path(file);
            Some(std::fs::read_to_string(&path).with_context(|| {
                format!("{}: [agent] system_prompt_file: cannot read {}", config.path.display(), path.display())
            })?)
        }
        None => None,
    };
    std::fs::create_dir_all(config.workspace_dir.join("sessions"))
        .with_context(|| format!("creating the workspace {}", config.workspace_dir.display()))?;
    let workspace = config.workspace_dir.canonicalize().unwrap_or_else(|_| config.workspace_dir.clone());
    Ok(Agent::new(AgentDeps {
        gateway,
        ledger: Arc::clone(&handle.ledger),
        queue: Arc::new(MemoryQueue::default()),
        models,
        tools: Arc::new(kesoku_tools::builtin_registry(&config.tools)),
        workspace,
        config: config.agent.clone(),
        limits: config.limits.clone(),
        intro,
    }))
}

/// How often [`spawn_store_watch`] looks for changes made by other processes.
pub const STORE_WATCH_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

/// Announce on this process's broker the changes other processes make to the shared store.
///
/// The broker is in-process, so a message posted by another process (`kesoku chat` talking to
/// a running service, or the service answering it) would otherwise only be heard at the next
/// start. This reads `changes_since` every `period` and republishes what it finds; listeners
/// drop what they already heard (the gateway's duplicate filter works on revisions), so this
/// process's own changes passing through again are harmless.
pub fn spawn_store_watch(
    gateway: Gateway,
    period: std::time::Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    const BATCH: u32 = 500;
    tokio::spawn(async move {
        let store = Arc::clone(gateway.store());
        let mut after = match store.current_rev().await {
            Ok(rev) => rev,
            Err(error) => {
                tracing::warn!(%error, "store watch: reading the current revision failed; starting from the beginning");
                0
            }
        };
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            loop {
                let batch = match store.changes_since(after, &kesoku_core::MessageFilter::default(), BATCH).await {
                    Ok(batch) => batch,
                    Err(error) => {
                        tracing::warn!(%error, "store watch: reading changes failed; retrying");
                        break;
                    }
                };
                let full = batch.len() == BATCH as usize;
                for event in batch {
                    after = event.rev;
                    let notice =
                        kesoku_broker::MessageNotice { rev: event.rev, created: event.created, message: event.message };
                    if let Err(error) =
                        gateway.broker().publish(kesoku_broker::BrokerEvent::Message(Box::new(notice))).await
                    {
                        tracing::warn!(%error, "store watch: announcing a change failed");
                    }
                }
                if !full {
                    break;
                }
            }
        }
    })
}
