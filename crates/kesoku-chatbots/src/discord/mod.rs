//! The Discord chatbot: a bot account on Discord's gateway and REST API (through twilight).
//!
//! [`Discord::new`] checks the configuration and builds the REST client; [`Discord::run`]
//! connects to the gateway and turns what people write into `pending_agent` messages
//! ([`inbound`]; after each fresh session also what they wrote while it was away, [`catchup`]),
//! answers slash commands and button clicks ([`commands`]), until shutdown or a
//! fatal gateway close. Showing the agent's work and delivering its answers go through
//! [`DiscordApi`], which [`Discord::api`] hands to the delivery side.
//!
//! Modules: [`config`] (the `[[chatbots.discord]]` table and the token wrapper), [`rest`] (REST
//! calls and their errors), [`gateway`] (the shard loop, close codes), [`inbound`] (messages
//! to [`crate::Inbound`]), [`catchup`] (messages missed while offline), [`commands`] (interactions), [`wire`] (the payloads we read),
//! [`status`] and [`progress`] (a turn's live status message and typing indicator), [`outbound`]
//! (the [`crate::Chatbot`] the deliverer drives: answers in parts, files, question buttons),
//! [`custom_id`] (what the adapter's buttons carry).
//!
//! It reads no environment: the binary reads the variable `token_env` names and passes the
//! value as a [`DiscordToken`] (or reports [`DiscordError::MissingToken`]).

pub mod catchup;
pub mod commands;
pub mod config;
pub mod custom_id;
pub mod gateway;
pub mod inbound;
pub mod outbound;
pub mod progress;
pub mod rest;
pub mod status;
pub mod wire;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono_tz::Tz;
use kesoku_gateway::Gateway;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub use self::config::{ChannelOverride, DiscordConfig, DiscordConfigError, DiscordToken};
use self::gateway::Dispatch;
use self::inbound::{ChannelCache, ChannelInfo};
pub use self::rest::{DiscordApi, DiscordApiError, DiscordRest};
use self::wire::MessageCreate;
use crate::control::SessionControl;
use crate::ingest::Access;
use crate::staging::Staging;

/// How long a message being handled at shutdown may still take.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why the Discord chatbot could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DiscordError {
    #[error(
        "the discord bot token is missing: set the environment variable `{token_env}` to the bot's token \
         (Developer Portal → your application → Bot → Reset Token), or name another variable with token_env"
    )]
    MissingToken { token_env: String },
    #[error(
        "discord rejected the bot token (gateway close 4004 or HTTP 401): check the token in the environment \
         variable `{token_env}`; reset it in the Developer Portal → Bot if it was regenerated"
    )]
    TokenRejected { token_env: String },
    #[error(
        "discord refused the privileged intents (gateway close 4014): enable the Message Content and Server \
         Members privileged intents in the Developer Portal → your application → Bot, then restart"
    )]
    PrivilegedIntents,
    #[error("the discord gateway closed the connection for good (close code {code}): {reason}")]
    GatewayClosed { code: u16, reason: String },
    #[error(transparent)]
    Config(#[from] DiscordConfigError),
    #[error("asking discord for the gateway address failed: {0}")]
    GatewayUrl(DiscordApiError),
}

/// What the message worker does, in order.
enum Work {
    /// Handle a `MESSAGE_CREATE`.
    Message(Box<MessageCreate>),
    /// Read and handle what was written while no session was listening ([`catchup`]).
    CatchUp,
}

/// The adapter's shared state, used by the event handlers.
pub(crate) struct Shared {
    pub(crate) config: DiscordConfig,
    pub(crate) timezone: Tz,
    pub(crate) rest: Arc<DiscordRest>,
    pub(crate) gateway: Gateway,
    pub(crate) staging: Staging,
    pub(crate) control: Arc<dyn SessionControl>,
    pub(crate) access: Access,
    pub(crate) channels: ChannelCache,
    /// The bot's own user id, from `READY` (0 before).
    bot_user_id: AtomicU64,
}

impl Shared {
    pub(crate) fn bot_user_id(&self) -> u64 {
        self.bot_user_id.load(Ordering::Relaxed)
    }

    /// What we know of a channel, asking Discord when it is not cached (a thread created
    /// before we connected, say). `None` when Discord cannot tell.
    pub(crate) async fn channel_info(&self, channel_id: u64) -> Option<ChannelInfo> {
        if let Some(info) = self.channels.get(channel_id) {
            return Some(info);
        }
        match self.rest.channel(channel_id).await {
            Ok(channel) => {
                let info = ChannelInfo::from(&channel);
                self.channels.insert(channel_id, info.clone());
                Some(info)
            }
            Err(error) => {
                tracing::warn!(%error, channel_id, "looking up a discord channel failed");
                None
            }
        }
    }
}

/// A configured Discord chatbot, ready to run.
pub struct Discord {
    shared: Arc<Shared>,
    token: DiscordToken,
}

impl std::fmt::Debug for Discord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discord").field("id", &self.shared.config.id).finish_non_exhaustive()
    }
}

impl Discord {
    /// Check `config`, and build the REST client. `staging` receives attachments; `control`
    /// stops turns for `/stop` and the Stop button.
    pub fn new(
        gateway: Gateway,
        config: DiscordConfig,
        token: DiscordToken,
        staging: Staging,
        control: Arc<dyn SessionControl>,
    ) -> Result<Discord, DiscordError> {
        let timezone = config.validate()?;
        if token.is_empty() {
            return Err(DiscordError::MissingToken { token_env: config.token_env.clone() });
        }
        let rest = Arc::new(DiscordRest::new(&config, token.clone())?);
        let access = Access { allowed_users: config.allowed_users.iter().map(|user| user.trim().to_owned()).collect() };
        let shared = Shared {
            config,
            timezone,
            rest,
            gateway,
            staging,
            control,
            access,
            channels: ChannelCache::default(),
            bot_user_id: AtomicU64::new(0),
        };
        Ok(Discord { shared: Arc::new(shared), token })
    }

    /// The token from the variable `config.token_env` names (its value as read by the
    /// binary, `None` when unset).
    pub fn token_from(config: &DiscordConfig, value: Option<String>) -> Result<DiscordToken, DiscordError> {
        match value.map(DiscordToken::new) {
            Some(token) if !token.is_empty() => Ok(token),
            _ => Err(DiscordError::MissingToken { token_env: config.token_env.clone() }),
        }
    }

    pub fn chatbot_id(&self) -> &str {
        &self.shared.config.id
    }

    pub fn config(&self) -> &DiscordConfig {
        &self.shared.config
    }

    /// The REST calls delivery and the live status make.
    pub fn api(&self) -> Arc<dyn DiscordApi> {
        self.shared.rest.clone()
    }

    /// The REST client itself (threads, interactions, downloads besides [`DiscordApi`]).
    pub fn rest(&self) -> Arc<DiscordRest> {
        Arc::clone(&self.shared.rest)
    }

    /// Connect and handle events until `shutdown` (then `Ok`) or a fatal gateway close.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), DiscordError> {
        let Some(url) = self.gateway_url(&shutdown).await? else {
            return Ok(());
        };
        tracing::info!(chatbot_id = %self.shared.config.id, "connecting to the discord gateway");

        // Messages are handled one at a time, in the order they arrived, so two quick messages
        // of one person reach the agent in order; interactions get their own tasks, since
        // Discord wants an answer within three seconds. A catch-up after READY runs in the same
        // queue: what was written while offline is handled before what arrives live after it.
        let (messages, mut queue) = mpsc::unbounded_channel::<Work>();
        let worker_shared = Arc::clone(&self.shared);
        let worker_shutdown = shutdown.clone();
        let worker = tokio::spawn(async move {
            // Messages the last catch-up handled: a live dispatch of one of them (written just
            // before READY) is not handled twice, which matters for commands, which are not
            // stored and so not deduplicated by ingestion.
            let mut caught_up: HashSet<u64> = HashSet::new();
            loop {
                let next = tokio::select! {
                    () = worker_shutdown.cancelled() => return,
                    next = queue.recv() => next,
                };
                let Some(work) = next else { return };
                // At shutdown the work in hand gets a grace period: Discord does not send a
                // message again after a restart (a catch-up cut short is redone at the next).
                let grace = async {
                    worker_shutdown.cancelled().await;
                    tokio::time::sleep(SHUTDOWN_GRACE).await;
                };
                let handle = async {
                    match work {
                        Work::Message(message) if caught_up.contains(&message.id) => {
                            tracing::debug!(discord_message_id = message.id, "discord message already caught up on");
                        }
                        Work::Message(message) => inbound::handle_message(&worker_shared, *message).await,
                        Work::CatchUp => {
                            caught_up.clear();
                            for message in catchup::missed_messages(&worker_shared).await {
                                caught_up.insert(message.id);
                                inbound::handle_message(&worker_shared, message).await;
                            }
                        }
                    }
                };
                tokio::select! {
                    () = handle => {}
                    () = grace => {
                        tracing::warn!("shutting down while a discord message was being handled; it was dropped");
                        return;
                    }
                }
            }
        });

        let shared = Arc::clone(&self.shared);
        let on_dispatch = move |dispatch: Dispatch| match dispatch {
            Dispatch::Ready(ready) => {
                shared.bot_user_id.store(ready.user.id, Ordering::Relaxed);
                tracing::info!(bot_user = %ready.user.username, "discord gateway ready");
                // A fresh session: Discord replays nothing written before it (only a resume
                // does, and a resume sends RESUMED, not READY).
                if messages.send(Work::CatchUp).is_err() {
                    tracing::warn!("the discord message worker stopped; missed messages were not read");
                }
                let shared = Arc::clone(&shared);
                tokio::spawn(async move { commands::register_commands(&shared, ready.application.id).await });
            }
            Dispatch::GuildCreate(guild) => {
                for channel in guild.channels.iter().chain(guild.threads.iter()) {
                    shared.channels.insert(channel.id, ChannelInfo::from(channel));
                }
            }
            Dispatch::ChannelUpsert(channel) => shared.channels.insert(channel.id, ChannelInfo::from(channel.as_ref())),
            Dispatch::ChannelDelete { channel_id } => shared.channels.remove(channel_id),
            Dispatch::MessageCreate(message) => {
                if messages.send(Work::Message(message)).is_err() {
                    tracing::warn!("the discord message worker stopped; a message was not handled");
                }
            }
            Dispatch::InteractionCreate(interaction) => {
                let shared = Arc::clone(&shared);
                tokio::spawn(async move { commands::handle_interaction(&shared, *interaction).await });
            }
        };
        let result =
            gateway::run_shard(&self.token, &url, &self.shared.config.token_env, shutdown.clone(), on_dispatch).await;
        // The sender went with `on_dispatch`: the worker finishes what is queued, or stops at
        // shutdown after the message in hand.
        if let Err(error) = worker.await {
            tracing::error!(%error, "the discord message worker panicked");
        }
        result
    }

    /// `gateway_url`, or the one Discord names; retried while Discord is unavailable.
    /// `None` when shutdown came first.
    async fn gateway_url(&self, shutdown: &CancellationToken) -> Result<Option<String>, DiscordError> {
        if let Some(url) = &self.shared.config.gateway_url {
            return Ok(Some(url.clone()));
        }
        let mut delay = Duration::from_secs(1);
        loop {
            match self.shared.rest.gateway_url().await {
                Ok(url) => return Ok(Some(url)),
                Err(DiscordApiError::Permanent { status: 401, .. }) => {
                    return Err(DiscordError::TokenRejected { token_env: self.shared.config.token_env.clone() });
                }
                Err(error @ DiscordApiError::Permanent { .. }) => return Err(DiscordError::GatewayUrl(error)),
                Err(error @ DiscordApiError::Transient { .. }) => {
                    tracing::warn!(%error, retry_in_s = delay.as_secs(), "asking discord for the gateway address failed");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(60));
        }
    }
}

/// Build and run a Discord chatbot until `shutdown` or a fatal error.
pub async fn run_discord(
    gateway: Gateway,
    config: DiscordConfig,
    token: DiscordToken,
    staging: Staging,
    control: Arc<dyn SessionControl>,
    shutdown: CancellationToken,
) -> Result<(), DiscordError> {
    Discord::new(gateway, config, token, staging, control)?.run(shutdown).await
}
