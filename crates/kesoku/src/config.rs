//! `kesoku.toml`: the one configuration file, parsed strictly.
//!
//! Every key is known: a typo is an error naming the key, the file and the line, and what is
//! expected. Paths in the file resolve relative to the file's own folder. Secrets are never in
//! the file: it names environment variables that hold them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::bail;
use kesoku_agent::{AgentConfig, AgentPersona, LaneLimits};
use kesoku_llm::ModelConfig;
use kesoku_tools::ToolsConfig;
use serde::Deserialize;
use toml::Spanned;

/// The template `kesoku init` writes.
pub const TEMPLATE: &str = include_str!("../kesoku.template.toml");

/// `[[agents]]`: names mentionable and unique (also against `[agent] name`), models
/// configured, each sitting somewhere. (Tool names are checked by the wiring, which knows them.)
fn check_agents(
    agents: &[AgentPersona],
    default: &AgentConfig,
    models: &BTreeMap<String, ModelEntry>,
) -> anyhow::Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    for (index, agent) in agents.iter().enumerate() {
        let entry = format!("[[agents]] entry {} (name = \"{}\")", index + 1, agent.name);
        if !AgentPersona::valid_name(&agent.name) {
            bail!("{entry}: a name is one word of letters, digits, `-` or `_`, so people can mention it as @name");
        }
        if agent.name.eq_ignore_ascii_case(&default.name) {
            bail!("{entry}: the name is [agent] name's (the default agent); give the configured agent its own");
        }
        if !seen.insert(agent.name.to_lowercase()) {
            bail!("{entry}: another [[agents]] entry has this name (names are case-insensitive, like mentions)");
        }
        if let Some(model) = &agent.model
            && !models.contains_key(model)
        {
            let known: Vec<&str> = models.keys().map(String::as_str).collect();
            bail!(
                "{entry}: model = \"{model}\" names no [models.{model}] entry; defined: {}",
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            );
        }
        if agent.intro.is_some() && agent.intro_file.is_some() {
            bail!("{entry}: give `intro` or `intro_file`, not both");
        }
        if agent.channels.is_empty() {
            bail!("{entry}: channels is empty: list where it sits, e.g. channels = [\"api:team\", \"discord:*\"]");
        }
        if let Some(bad) = agent.channels.iter().find(|c| c.is_empty() || c.starts_with(':') || c.ends_with(':')) {
            bail!("{entry}: channels entry \"{bad}\" is not `chatbot`, `chatbot:*` or `chatbot:channel`");
        }
    }
    Ok(())
}

/// Each `[[agents]]` entry's `tools` names tools the configuration offers (`known`, the
/// registry's names): a typo is an error naming the entry and the known tools.
pub fn check_agent_tools<'a>(agents: &[AgentPersona], known: impl Iterator<Item = &'a str>) -> anyhow::Result<()> {
    let known: Vec<&str> = known.collect();
    for (index, agent) in agents.iter().enumerate() {
        for tool in agent.tools.iter().flatten() {
            // `pass` is offered in every round whatever the list says.
            if tool != kesoku_agent::orchestration::PASS && !known.contains(&tool.as_str()) {
                bail!(
                    "[[agents]] entry {} (name = \"{}\"): tools names `{tool}`, which is not a tool of this \
                     configuration; known tools: {}",
                    index + 1,
                    agent.name,
                    if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                );
            }
        }
    }
    Ok(())
}

/// The file as written, before resolving paths and model entries.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    workspace: WorkspaceSection,
    #[serde(default)]
    agent: AgentConfig,
    #[serde(default)]
    agents: Vec<AgentPersona>,
    #[serde(default)]
    limits: LaneLimits,
    #[serde(default)]
    models: BTreeMap<String, Spanned<toml::Table>>,
    #[serde(default)]
    tools: ToolsConfig,
    #[serde(default)]
    http: Option<HttpSection>,
    #[serde(default)]
    cron: Vec<kesoku_chatbots::cron::CronJobConfig>,
    #[serde(default)]
    chatbots: ChatbotsSection,
    #[serde(default)]
    service: ServiceSection,
    #[serde(default)]
    broker: BrokerSection,
    #[serde(default)]
    database: DatabaseSection,
}

/// `[database]`: the pool of a PostgreSQL store (`[workspace] database = "postgres://…"`), per
/// process. A SQLite store ignores it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSection {
    /// Connections this process opens at most.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Milliseconds a store call waits for a connection (a free one, or a new one opened)
    /// before it fails and is retried.
    #[serde(default = "default_acquire_timeout_ms")]
    pub acquire_timeout_ms: u64,
    /// Milliseconds one statement may run before PostgreSQL cancels it; 0: the server's setting.
    #[serde(default = "default_statement_timeout_ms")]
    pub statement_timeout_ms: u64,
}

fn default_max_connections() -> u32 {
    kesoku_store::PgPoolSettings::DEFAULT_MAX_CONNECTIONS
}

fn default_acquire_timeout_ms() -> u64 {
    duration_ms(kesoku_store::PgPoolSettings::DEFAULT_ACQUIRE_TIMEOUT)
}

fn default_statement_timeout_ms() -> u64 {
    duration_ms(kesoku_store::PgPoolSettings::DEFAULT_STATEMENT_TIMEOUT)
}

fn duration_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Default for DatabaseSection {
    fn default() -> Self {
        DatabaseSection {
            max_connections: default_max_connections(),
            acquire_timeout_ms: default_acquire_timeout_ms(),
            statement_timeout_ms: default_statement_timeout_ms(),
        }
    }
}

impl DatabaseSection {
    /// The store's pool settings.
    pub fn pool(&self) -> kesoku_store::PgPoolSettings {
        use std::time::Duration;
        kesoku_store::PgPoolSettings {
            max_connections: self.max_connections,
            acquire_timeout: Duration::from_millis(self.acquire_timeout_ms),
            statement_timeout: (self.statement_timeout_ms > 0)
                .then(|| Duration::from_millis(self.statement_timeout_ms)),
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("max_connections must be at least 1".into());
        }
        if self.acquire_timeout_ms == 0 {
            return Err("acquire_timeout_ms must be at least 1 (10000 is the default)".into());
        }
        Ok(())
    }
}

/// `[broker]`: how processes hear each other and share the lane queue. Without `url`, the
/// in-process broker and queue (one process, or `kesoku chat` beside `kesoku start` through
/// the store); with `url = "redis://…"`, Redis, shared by every process on the same prefix.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerSection {
    /// `redis://[user:password@]host:port[/db]`.
    #[serde(default)]
    pub url: Option<String>,
    /// Put before every Redis key and channel (deployments sharing one Redis use different ones).
    #[serde(default = "default_broker_prefix")]
    pub prefix: String,
    /// Seconds an activation taken by a process may go without a sign of life (the process
    /// was killed) before another process takes it over.
    #[serde(default = "default_reclaim_after_s")]
    pub reclaim_after_s: u64,
    /// Seconds a session's lease lasts without a renewal (workers renew every third of it):
    /// after a process is killed, its sessions' next turns wait at most this long.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// Milliseconds one Redis operation may take (waiting for a reconnection included) before
    /// it fails and is retried with backoff.
    #[serde(default = "default_operation_timeout_ms")]
    pub operation_timeout_ms: u64,
}

fn default_lease_ttl_s() -> u64 {
    30
}

fn default_operation_timeout_ms() -> u64 {
    duration_ms(kesoku_broker::RedisOptions::DEFAULT_OPERATION_TIMEOUT)
}

fn default_broker_prefix() -> String {
    kesoku_broker::RedisOptions::DEFAULT_PREFIX.to_owned()
}

fn default_reclaim_after_s() -> u64 {
    kesoku_broker::RedisOptions::DEFAULT_RECLAIM_AFTER.as_secs()
}

impl Default for BrokerSection {
    fn default() -> Self {
        BrokerSection {
            url: None,
            prefix: default_broker_prefix(),
            reclaim_after_s: default_reclaim_after_s(),
            lease_ttl_s: default_lease_ttl_s(),
            operation_timeout_ms: default_operation_timeout_ms(),
        }
    }
}

impl BrokerSection {
    /// The Redis options, when `url` is set.
    pub fn redis(&self) -> Option<kesoku_broker::RedisOptions> {
        let url = self.url.as_ref()?;
        let mut options = kesoku_broker::RedisOptions::new(url.clone());
        options.prefix = self.prefix.clone();
        options.reclaim_after = std::time::Duration::from_secs(self.reclaim_after_s);
        options.operation_timeout = std::time::Duration::from_millis(self.operation_timeout_ms);
        Some(options)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(url) = &self.url
            && !url.starts_with("redis://")
        {
            return Err("url must be a redis://host:port URL (remove it to use the in-process broker)".into());
        }
        if self.prefix.trim().is_empty() {
            return Err("prefix must not be empty (the default is \"kesoku\")".into());
        }
        if self.reclaim_after_s == 0 {
            return Err("reclaim_after_s must be at least 1".into());
        }
        if self.lease_ttl_s == 0 || self.lease_ttl_s > 86_400 {
            return Err("lease_ttl_s must be between 1 and 86400 seconds (the default is 30)".into());
        }
        if self.operation_timeout_ms == 0 {
            return Err("operation_timeout_ms must be at least 1 (5000 is the default)".into());
        }
        Ok(())
    }
}

/// `[chatbots]`: the chat platforms `kesoku start` connects to (none by default).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatbotsSection {
    /// `[[chatbots.discord]]`: one entry per Discord bot.
    #[serde(default)]
    pub discord: Vec<kesoku_chatbots::discord::DiscordConfig>,
    /// `[[chatbots.google_chat]]`: one entry per Google Chat app.
    #[serde(default)]
    pub google_chat: Vec<kesoku_chatbots::google_chat::GoogleChatConfig>,
    /// `[[chatbots.wechat]]`: one entry per WeChat (iLink) bot account.
    #[serde(default)]
    pub wechat: Vec<kesoku_chatbots::wechat::WeChatConfig>,
}

impl ChatbotsSection {
    /// The chatbot ids configured, in config order per platform.
    pub fn ids(&self) -> Vec<String> {
        self.entries().into_iter().map(|entry| entry.id.to_owned()).collect()
    }

    /// The chatbot ids configured, for the start-up log (`none` when there is none).
    pub fn describe(&self) -> String {
        let ids = self.ids();
        if ids.is_empty() { "none".to_owned() } else { ids.join(", ") }
    }

    /// Every configured chatbot: its table name, id and time zone, with the result of checking
    /// its keys.
    pub fn entries(&self) -> Vec<ChatbotEntry<'_>> {
        let discord = self.discord.iter().map(|entry| ChatbotEntry {
            table: "discord",
            id: &entry.id,
            timezone: &entry.timezone,
            check: entry.validate().map(drop).map_err(|error| error.to_string()),
        });
        let google_chat = self.google_chat.iter().map(|entry| ChatbotEntry {
            table: "google_chat",
            id: &entry.id,
            timezone: &entry.timezone,
            check: entry.validate().map(drop).map_err(|error| error.to_string()),
        });
        let wechat = self.wechat.iter().map(|entry| ChatbotEntry {
            table: "wechat",
            id: &entry.id,
            timezone: &entry.timezone,
            check: entry.validate().map(drop).map_err(|error| error.to_string()),
        });
        discord.chain(google_chat).chain(wechat).collect()
    }
}

/// One configured chatbot, as the checks and the wiring need it.
#[derive(Debug)]
pub struct ChatbotEntry<'a> {
    /// `discord`, `google_chat` or `wechat`.
    pub table: &'static str,
    pub id: &'a str,
    pub timezone: &'a str,
    pub check: Result<(), String>,
}

/// `[service]`: how `kesoku start` runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSection {
    /// Seconds running turns get to finish after SIGTERM/SIGINT before they are stopped (their
    /// messages go back to `pending_agent` and run again at the next start).
    #[serde(default = "default_shutdown_grace_s")]
    pub shutdown_grace_s: u64,
}

fn default_shutdown_grace_s() -> u64 {
    10
}

impl Default for ServiceSection {
    fn default() -> Self {
        ServiceSection { shutdown_grace_s: default_shutdown_grace_s() }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSection {
    /// Folder for session staging folders and models; tools run here.
    #[serde(default = "default_workspace_dir")]
    pub dir: String,
    /// Store URL: `sqlite://PATH` (relative to the config file) or `postgres://…`.
    #[serde(default = "default_database")]
    pub database: String,
}

fn default_workspace_dir() -> String {
    ".kesoku".into()
}

fn default_database() -> String {
    "sqlite://.kesoku/kesoku.db".into()
}

impl Default for WorkspaceSection {
    fn default() -> Self {
        WorkspaceSection { dir: default_workspace_dir(), database: default_database() }
    }
}

/// `[http]`: the HTTP API and web console, served by `kesoku start`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    /// Address to listen on. Default: `127.0.0.1:8787`.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Environment variable holding the bearer token; required when `listen` is not loopback.
    #[serde(default)]
    pub token_env: Option<String>,
}

fn default_listen() -> String {
    "127.0.0.1:8787".into()
}

/// A `[models.NAME]` entry.
#[derive(Debug, Clone)]
pub enum ModelEntry {
    Remote(ModelConfig),
    /// `provider = "local"`: a GGUF file run in-process; `path` resolved against the config.
    Local(kesoku_local::LocalModelConfig),
}

/// The loaded configuration, paths resolved.
#[derive(Debug)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    pub workspace_dir: PathBuf,
    pub database_url: String,
    pub agent: AgentConfig,
    /// `[[agents]]`: configured agents, checked (intros still to read: `intro_file`).
    pub agents: Vec<AgentPersona>,
    pub limits: LaneLimits,
    pub models: BTreeMap<String, ModelEntry>,
    pub tools: ToolsConfig,
    pub service: ServiceSection,
    /// `[broker]`: in-process (default) or Redis.
    pub broker: BrokerSection,
    /// `[database]`: the PostgreSQL pool.
    pub database: DatabaseSection,
    pub http: Option<HttpSection>,
    /// `[[cron]]` jobs, checked.
    pub cron: Vec<kesoku_chatbots::cron::CronJob>,
    /// Chat platforms, checked.
    pub chatbots: ChatbotsSection,
}

impl Config {
    /// Read and check `path`. Errors name the file, the line and the key.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!(
                "config file {} does not exist: create it with `kesoku init -c {}`",
                path.display(),
                path.display()
            ),
            Err(error) => bail!("cannot read config file {}: {error}", path.display()),
        };
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> anyhow::Result<Config> {
        let file: ConfigFile =
            toml::from_str(text).map_err(|error| anyhow::anyhow!(describe_toml_error(path, text, &error)))?;
        let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let workspace_dir = base.join(&file.workspace.dir);
        let database_url = resolve_database_url(base, &file.workspace.database).map_err(|reason| {
            anyhow::anyhow!(
                "{}:{}: [workspace] database: {reason}",
                path.display(),
                key_line(text, "workspace", "database")
            )
        })?;
        if file.agent.name.trim().is_empty() {
            bail!("{}:{}: [agent] name must not be empty", path.display(), key_line(text, "agent", "name"));
        }
        let mut models = BTreeMap::new();
        for (name, table) in file.models {
            let (line, _) = line_column(text, table.span().start);
            let entry = parse_model(base, table.into_inner())
                .map_err(|reason| anyhow::anyhow!("{}:{line}: [models.{name}]: {reason}", path.display()))?;
            models.insert(name, entry);
        }
        if let Some(model) = &file.agent.model
            && !models.contains_key(model)
        {
            let known: Vec<&str> = models.keys().map(String::as_str).collect();
            bail!(
                "{}:{}: [agent] model = \"{model}\" names no [models.{model}] entry; defined: {}",
                path.display(),
                key_line(text, "agent", "model"),
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            );
        }
        if let Some(http) = &file.http
            && http.listen.parse::<std::net::SocketAddr>().is_err()
        {
            bail!(
                "{}:{}: [http] listen = \"{}\" is not an address: write IP:PORT, for example \"127.0.0.1:8787\"",
                path.display(),
                key_line(text, "http", "listen"),
                http.listen
            );
        }
        let cron = kesoku_chatbots::cron::CronJob::parse_all(&file.cron)
            .map_err(|error| anyhow::anyhow!("{}: [[cron]]: {error}", path.display()))?;
        for job in &cron {
            if let Some(model) = &job.config.model
                && !models.contains_key(model)
            {
                let known: Vec<&str> = models.keys().map(String::as_str).collect();
                bail!(
                    "{}: [[cron]] job `{}`: model = \"{model}\" names no [models.{model}] entry; defined: {}",
                    path.display(),
                    job.config.name,
                    if known.is_empty() { "none".to_owned() } else { known.join(", ") }
                );
            }
        }
        if let Err(error) = file.tools.validate() {
            bail!("{}: [tools]: {error}", path.display());
        }
        // `system` and `agent` (sub-agent sessions) are the runtime's own; nobody delivers them.
        let reserved = ["system", kesoku_agent::subagents::AGENT_CHATBOT];
        let mut chatbot_ids = std::collections::BTreeSet::from(["cli", "api"]);
        chatbot_ids.extend(reserved);
        let mut index_in_table = std::collections::BTreeMap::<&str, usize>::new();
        for entry in file.chatbots.entries() {
            let index = index_in_table.entry(entry.table).and_modify(|n| *n += 1).or_insert(1);
            if let Err(error) = &entry.check {
                bail!("{}: [[chatbots.{}]] entry {index}: {error}", path.display(), entry.table);
            }
            if !chatbot_ids.insert(entry.id) {
                bail!(
                    "{}: [[chatbots.{}]] entry {index}: id = \"{}\" is already taken: give each chatbot its own id",
                    path.display(),
                    entry.table,
                    entry.id
                );
            }
        }
        // A cron job's answers go to its chatbot: one that is not configured would leave them
        // waiting for a delivery that never comes.
        for job in &cron {
            if !chatbot_ids.contains(job.config.chatbot.as_str()) || reserved.contains(&job.config.chatbot.as_str()) {
                let configured: Vec<&str> = chatbot_ids.iter().copied().filter(|id| !reserved.contains(id)).collect();
                bail!(
                    "{}: [[cron]] job `{}`: chatbot = \"{}\" is not a configured chatbot; use one of: {}",
                    path.display(),
                    job.config.name,
                    job.config.chatbot,
                    configured.join(", ")
                );
            }
        }
        check_agents(&file.agents, &file.agent, &models)
            .map_err(|error| anyhow::anyhow!("{}: {error}", path.display()))?;
        file.broker.check().map_err(|reason| anyhow::anyhow!("{}: [broker] {reason}", path.display()))?;
        file.database.check().map_err(|reason| anyhow::anyhow!("{}: [database] {reason}", path.display()))?;
        Ok(Config {
            path: path.to_owned(),
            workspace_dir,
            database_url,
            agent: file.agent,
            agents: file.agents,
            limits: file.limits,
            models,
            tools: file.tools,
            service: file.service,
            broker: file.broker,
            database: file.database,
            http: file.http,
            cron,
            chatbots: file.chatbots,
        })
    }

    /// Resolve a path written in the config file.
    pub fn resolve_path(&self, path: &str) -> PathBuf {
        let base = self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        base.join(path)
    }
}

fn parse_model(base: &Path, mut table: toml::Table) -> Result<ModelEntry, String> {
    let provider = table
        .get("provider")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| "missing `provider`: expected one of gemini, openai, anthropic, local".to_owned())?
        .to_owned();
    match provider.as_str() {
        "gemini" | "openai" | "anthropic" => {
            let config: ModelConfig =
                toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| e.message().to_owned())?;
            Ok(ModelEntry::Remote(config))
        }
        "local" => {
            table.remove("provider");
            let mut config: kesoku_local::LocalModelConfig =
                toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| e.message().to_owned())?;
            if config.path.is_relative() {
                config.path = base.join(&config.path);
            }
            config.validate().map_err(|e| e.to_string())?;
            Ok(ModelEntry::Local(config))
        }
        other => Err(format!("unknown provider `{other}`: expected one of gemini, openai, anthropic, local")),
    }
}

/// `sqlite://relative/path` becomes absolute against the config folder; other URLs pass through.
fn resolve_database_url(base: &Path, url: &str) -> Result<String, String> {
    if let Some(rest) = url.strip_prefix("sqlite://") {
        if rest.is_empty() {
            return Err("`sqlite://` needs a file path, for example `sqlite://.kesoku/kesoku.db`".into());
        }
        let path = Path::new(rest);
        let absolute = if path.is_absolute() { path.to_owned() } else { base.join(path) };
        return Ok(format!("sqlite://{}", absolute.display()));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(url.to_owned());
    }
    Err(format!("`{url}` is not a store url: use `sqlite://PATH` or `postgres://USER@HOST/DB`"))
}

/// "file:line:column: message" plus the offending line, from a toml error with a span.
pub fn describe_toml_error(path: &Path, text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    match error.span() {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            let source_line = text.lines().nth(line.saturating_sub(1)).unwrap_or("");
            format!("{}:{line}:{column}: {message}\n  | {source_line}", path.display())
        }
        None => format!("{}: {message}", path.display()),
    }
}

/// 1-based line and column of a byte offset.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Line of `key = …` inside `[section]` (0 when not found, e.g. a default value).
fn key_line(text: &str, section: &str, key: &str) -> usize {
    let header = format!("[{section}]");
    let mut inside = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            inside = trimmed == header;
            continue;
        }
        if inside && trimmed.split('=').next().is_some_and(|k| k.trim() == key) {
            return index + 1;
        }
    }
    0
}

#[cfg(test)]
mod tests;
