//! The Google Chat chatbot: a Chat app that receives events over Cloud Pub/Sub (no public
//! webhook) and answers through the Chat REST API.
//!
//! [`GoogleChat::new`] checks the configuration and builds the clients; [`GoogleChat::run`]
//! pulls the subscription until shutdown, handling each event ([`inbound`]) and acknowledging
//! it only once it was stored, so a crash loses nothing (Pub/Sub delivers an unacknowledged
//! message again, and the redelivery is recognised by its Chat message name). Showing the
//! agent's work and delivering its answers is [`GoogleChatChatbot`]'s job ([`outbound`]).
//!
//! Modules: [`config`] (the `[[chatbots.google_chat]]` table), [`auth`] (service-account
//! tokens), [`api`] (authenticated calls and error classes), [`pubsub`] (pull, acknowledge,
//! extend), [`event`] (the Chat event JSON, both formats), [`inbound`] (events to
//! [`crate::Inbound`]), [`rest`] (Chat messages: create, patch, delete), [`format`] (Markdown
//! to Chat's text formatting), [`progress`] (a turn's card), [`outbound`] (the
//! [`crate::Chatbot`]).
//!
//! It reads no file and no environment: the binary reads the key file and passes its text to
//! [`Credentials::from_json`].

pub mod api;
pub mod auth;
pub mod config;
pub mod event;
pub mod format;
pub mod inbound;
pub mod outbound;
pub mod progress;
pub mod pubsub;
pub mod rest;

use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use kesoku_gateway::Gateway;
use tokio_util::sync::CancellationToken;

use self::api::{ApiError, GoogleApi};
use self::auth::TokenSource;
pub use self::auth::{AuthError, Credentials};
pub use self::config::{GoogleChatConfig, GoogleChatConfigError};
use self::inbound::Handled;
pub use self::outbound::GoogleChatChatbot;
use self::pubsub::Subscription;
use self::rest::ChatRest;
use crate::control::SessionControl;
use crate::staging::Staging;

/// Messages asked for per pull.
const MAX_MESSAGES: u32 = 10;
/// The lease taken on pulled messages while they are stored, in seconds.
const LEASE_S: u32 = 60;
/// Longest wait between failed pulls.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Why the Google Chat chatbot could not start.
#[derive(Debug, thiserror::Error)]
pub enum GoogleChatError {
    #[error(transparent)]
    Config(#[from] GoogleChatConfigError),
    #[error("building the http client failed: {0}")]
    Http(String),
}

/// What the event handlers share.
pub(crate) struct Shared {
    pub(crate) config: GoogleChatConfig,
    pub(crate) timezone: Tz,
    pub(crate) rest: ChatRest,
    pub(crate) gateway: Gateway,
    pub(crate) staging: Staging,
    pub(crate) control: Arc<dyn SessionControl>,
    pub(crate) allowed_users: Vec<String>,
}

/// A configured Google Chat app, ready to run.
pub struct GoogleChat {
    shared: Arc<Shared>,
    subscription: Subscription,
}

impl std::fmt::Debug for GoogleChat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoogleChat").field("id", &self.shared.config.id).finish_non_exhaustive()
    }
}

impl GoogleChat {
    /// Check `config` and build the clients. `staging` is where files would go; `control`
    /// stops turns for `/stop`.
    pub fn new(
        gateway: Gateway,
        config: GoogleChatConfig,
        credentials: Credentials,
        staging: Staging,
        control: Arc<dyn SessionControl>,
    ) -> Result<GoogleChat, GoogleChatError> {
        let timezone = config.validate()?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|error| GoogleChatError::Http(error.to_string()))?;
        let tokens = Arc::new(TokenSource::new(credentials, http.clone()));
        let api = GoogleApi::new(http, tokens);
        let rest = ChatRest::new(api.clone(), &config.chat_base_url);
        let subscription = Subscription::new(api, &config.pubsub_base_url, &config.subscription);
        let allowed_users = config.allowed_users.iter().map(|user| user.trim().to_owned()).collect();
        let shared = Shared { config, timezone, rest, gateway, staging, control, allowed_users };
        Ok(GoogleChat { shared: Arc::new(shared), subscription })
    }

    pub fn chatbot_id(&self) -> &str {
        &self.shared.config.id
    }

    /// The delivery side, sharing this app's clients.
    pub fn chatbot(&self) -> GoogleChatChatbot {
        GoogleChatChatbot::new(
            &self.shared.config.id,
            self.shared.rest.clone(),
            Arc::clone(self.shared.gateway.store()),
        )
    }

    /// Pull and handle events until `shutdown`. Failures are retried with backoff (a deleted
    /// subscription or a missing permission is logged with the fix and retried too, so the
    /// app comes back once it is repaired).
    pub async fn run(self, shutdown: CancellationToken) {
        let id = self.shared.config.id.clone();
        tracing::info!(chatbot_id = %id, subscription = %self.shared.config.subscription, "pulling google chat events");
        let mut delay = Duration::from_secs(1);
        loop {
            let pulled = tokio::select! {
                () = shutdown.cancelled() => return,
                pulled = self.subscription.pull(MAX_MESSAGES) => pulled,
            };
            match pulled {
                Ok(messages) => {
                    delay = Duration::from_secs(1);
                    if !messages.is_empty() {
                        self.handle_batch(messages, &shutdown).await;
                    }
                    continue;
                }
                Err(error) if error.is_transient() => {
                    tracing::warn!(chatbot_id = %id, %error, retry_in_ms = delay.as_millis() as u64, "pulling google chat events failed");
                }
                Err(error) => {
                    tracing::error!(chatbot_id = %id, %error, fix = pull_fix(&error), retry_in_ms = delay.as_millis() as u64, "pulling google chat events failed");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(MAX_BACKOFF);
        }
    }

    /// Handle pulled messages in order, then acknowledge the ones handled for good and hand the
    /// others back. Shutdown between messages leaves the rest unacknowledged (delivered again).
    async fn handle_batch(&self, messages: Vec<pubsub::ReceivedMessage>, shutdown: &CancellationToken) {
        let all: Vec<String> = messages.iter().map(|message| message.ack_id.clone()).collect();
        // Storing may outlast the subscription's deadline (10 s by default): lease them longer.
        if let Err(error) = self.subscription.modify_ack_deadline(&all, LEASE_S).await {
            tracing::debug!(%error, "extending the ack deadline failed; handling anyway");
        }
        let mut done = Vec::new();
        let mut retry = Vec::new();
        for message in &messages {
            if shutdown.is_cancelled() {
                break;
            }
            match inbound::handle(&self.shared, message).await {
                Handled::Done => done.push(message.ack_id.clone()),
                Handled::Retry => retry.push(message.ack_id.clone()),
            }
        }
        if let Err(error) = self.subscription.acknowledge(&done).await {
            // They come again after the deadline and are then recognised as stored.
            tracing::warn!(%error, count = done.len(), "acknowledging google chat events failed; they will be redelivered and skipped");
        }
        if let Err(error) = self.subscription.modify_ack_deadline(&retry, 0).await {
            tracing::debug!(%error, "handing events back failed; they come back after the deadline");
        }
    }
}

/// What to do about a permanent pull failure.
fn pull_fix(error: &ApiError) -> &'static str {
    match error.status() {
        Some(404) => "the subscription does not exist: create it on the Chat app's topic and check `subscription`",
        Some(403) => "grant the service account roles/pubsub.subscriber on the subscription",
        Some(400) => "check `subscription` (projects/PROJECT/subscriptions/NAME)",
        Some(_) | None => match error {
            ApiError::Auth(_) => "check the service-account key (credentials_file or GOOGLE_APPLICATION_CREDENTIALS)",
            ApiError::Transient { .. } | ApiError::Permanent { .. } => "see the error",
        },
    }
}
