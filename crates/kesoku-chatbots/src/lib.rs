//! Chatbots: where messages meet people.
//!
//! A chatbot is the platform end of the message flow (spec §4): it posts what people say as
//! `pending_agent` messages, and it delivers what the agent writes for its `chatbot_id` —
//! final answers and notifications (`pending`), and on chatbots with a UI the intermediate
//! steps (`responded` thoughts, tool calls and results) — then marks each `delivered`.
//!
//! The seam every platform plugs into:
//!
//! - [`ingest`]: the one way a message enters (session, checks, staged files, dedup of
//!   platform events), and [`ingest::Access`], the admission rules platforms share;
//! - [`Chatbot`] + [`Capabilities`]: what a platform implements and declares;
//! - [`delivery`]: the one routine that shows messages, sends final texts in parts
//!   ([`answer`], [`chunk`]) effectively once with a record per part, retries transient
//!   failures and settles permanent ones;
//! - [`control`]: stop / clear / compact, shared by the chat [`commands`] and the HTTP API;
//! - [`staging`]: where people's files go.
//!
//! Platforms: [`cli`] (the terminal), [`discord`], [`google_chat`], [`wechat`] and [`cron`] (scheduled prompts). It deliberately knows no
//! agent internals, reads no environment and no config file, and owns no line editor.

pub mod answer;
pub mod capabilities;
pub mod chunk;
pub mod cli;
pub mod commands;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod control;
pub mod cron;
pub mod delivery;
pub mod discord;
pub mod google_chat;
pub mod ingest;
pub mod staging;
pub mod wechat;

use std::time::Duration;

use async_trait::async_trait;
pub use capabilities::Capabilities;
pub use delivery::{Delivered, Deliverer, RetryPolicy};
pub use ingest::{Inbound, IngestError, Ingested, ingest};
use kesoku_core::DeliveryRecord;
use kesoku_core::Message;
use kesoku_gateway::GatewayError;
use kesoku_store::StoreError;

use crate::answer::OutboundPart;

#[derive(Debug, thiserror::Error)]
pub enum ChatbotError {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// The platform refused or could not be reached; the message stays undelivered.
    #[error("chatbot `{chatbot_id}` could not deliver a message: {reason}")]
    Platform { chatbot_id: String, reason: String },
    #[error("writing to the terminal failed: {0}")]
    Terminal(#[from] std::io::Error),
    /// Stopping a session's turn failed (the control behind [`control::SessionControl`]).
    #[error("stopping the session failed: {0}")]
    Stop(String),
    /// The gateway's stream ended (its broker closed) before the awaited change arrived.
    #[error("the message stream closed before the turn ended: is the process shutting down?")]
    StreamClosed,
}

/// Why a platform call failed, as delivery needs to know it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// Worth trying again (rate limit, server error, timeout, connection lost).
    #[error("{reason}")]
    Transient { reason: String, retry_after: Option<Duration> },
    /// Trying again cannot help (the channel is gone, the bot was removed, the request is bad).
    #[error("{reason}")]
    Permanent { reason: String },
}

impl From<std::io::Error> for DeliveryError {
    fn from(error: std::io::Error) -> Self {
        DeliveryError::Transient { reason: error.to_string(), retry_after: None }
    }
}

/// A platform adapter: shows the agent's messages for its `chatbot_id` to people.
#[async_trait]
pub trait Chatbot: Send + Sync {
    /// The `chatbot_id` of the messages this chatbot posts and delivers (`cli`, `discord`, …).
    fn chatbot_id(&self) -> &str;

    /// What the platform can show.
    fn capabilities(&self) -> Capabilities;

    /// Show one step of a running turn (a thought, tool call or tool result). Called only when
    /// [`Capabilities::shows_intermediates`]; `Ok` means shown, then it is marked `delivered`.
    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError>;

    /// Send one part of a final text or notification; returns the platform's id for what was
    /// sent. Must be effectively once for `part.key`: sending the same key again (after a crash
    /// between sending and recording) must not show the part twice where the platform allows.
    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError>;

    /// After every part of `message` was sent, recorded and the message marked `delivered`:
    /// stop typing, fold the status, show the turn's metrics.
    async fn on_delivered(&self, _message: &Message, _sent: &[DeliveryRecord]) -> Result<(), DeliveryError> {
        Ok(())
    }

    /// A turn's root message (a user-role message of this chatbot) changed status:
    /// `processing`, `processed`, `interrupted` or `error`.
    async fn on_turn(&self, _root: &Message) -> Result<(), DeliveryError> {
        Ok(())
    }
}
