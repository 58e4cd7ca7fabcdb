//! Building the running system from the config: store, gateway, models, tools, agent.
//! The only place that reads environment variables (API keys).

use std::sync::Arc;

use anyhow::{Context, bail};
use kesoku_agent::{Agent, AgentDeps, ModelSet};
use kesoku_broker::MemoryBroker;
use kesoku_broker::MemoryQueue;
use kesoku_gateway::Gateway;
use kesoku_llm::Model;
use kesoku_store::StoreHandle;

use crate::config::{Config, ModelEntry};

/// Open the configured store. `create`: make the SQLite file if missing (only `init` does).
pub async fn open_store(config: &Config, create: bool) -> anyhow::Result<StoreHandle> {
    let handle = if create {
        kesoku_store::open(&config.database_url).await
    } else {
        kesoku_store::open_existing(&config.database_url).await
    };
    handle.with_context(|| format!("opening the store configured in {}", config.path.display()))
}

/// The store plus an in-process broker.
pub async fn open_gateway(config: &Config) -> anyhow::Result<(StoreHandle, Gateway)> {
    let handle = open_store(config, false).await?;
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    Ok((handle, gateway))
}

/// Build one configured model, reading its key from the environment.
pub fn build_model(config: &Config, name: &str) -> anyhow::Result<Arc<dyn Model>> {
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
    }
}

/// The model that answers: `[agent] model`, or the only configured one.
pub fn build_models(config: &Config) -> anyhow::Result<ModelSet> {
    let name = match (&config.agent.model, config.models.len()) {
        (Some(name), _) => name.clone(),
        (None, 1) => config.models.keys().next().cloned().unwrap_or_default(),
        (None, 0) => bail!(
            "no model is configured: add a [models.NAME] section to {} (commented examples are in the file), \
             for example provider = \"openai\", model = \"gpt-4.1-mini\", api_key_env = \"OPENAI_API_KEY\", \
             then export that variable",
            config.path.display()
        ),
        (None, _) => bail!(
            "several models are configured in {}: choose one with [agent] model = \"NAME\"",
            config.path.display()
        ),
    };
    let model = build_model(config, &name)?;
    Ok(ModelSet::single(model))
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
