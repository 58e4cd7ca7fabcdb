//! Chatbots: where messages meet people.
//!
//! A chatbot is the platform end of the message flow (spec §4): it posts what people say as
//! `pending_agent` messages through the gateway, and it delivers what the agent writes for its
//! `chatbot_id` — final answers and notifications (`pending`), and on chatbots with a UI the
//! intermediate steps (`responded` thoughts, tool calls and results) — then marks each
//! `delivered`. This crate holds:
//!
//! - the [`Chatbot`] seam every platform adapter implements, and the one delivery routine
//!   ([`deliver`], [`run_delivery`]) that decides what awaits delivery and marks it delivered;
//! - [`commands`]: the chat commands every chatbot shares (`/help`, `/status`, `/stop`,
//!   `/clear`, `/compact`, `/sessions`), parsed and executed over the gateway;
//! - [`cli`]: the terminal chatbot — coloured panels, Markdown answers, a spinner, plain output
//!   when there is no terminal — and the follower that renders one turn as it happens.
//!
//! It deliberately knows no agent internals (stopping a turn goes through the small
//! [`commands::SessionControl`] trait), reads no environment and no config file, and owns no
//! line editor: the binary decides the render mode and runs the prompt.

pub mod cli;
pub mod commands;
pub mod cron;
pub mod discord;

use std::pin::pin;

use async_trait::async_trait;
use futures::StreamExt;
use kesoku_core::{Message, MessageFilter, Status};
use kesoku_gateway::{Gateway, GatewayError, ListenFrom};
use kesoku_store::StoreError;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ChatbotError {
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The platform refused or could not be reached; the message stays undelivered.
    #[error("chatbot `{chatbot_id}` could not deliver a message: {reason}")]
    Platform { chatbot_id: String, reason: String },
    #[error("writing to the terminal failed: {0}")]
    Terminal(#[from] std::io::Error),
    /// Stopping a session's turn failed (the control behind [`commands::SessionControl`]).
    #[error("stopping the session failed: {0}")]
    Stop(String),
    /// The gateway's stream ended (its broker closed) before the awaited change arrived.
    #[error("the message stream closed before the turn ended: is the process shutting down?")]
    StreamClosed,
}

/// A platform adapter: shows the agent's messages for its `chatbot_id` to people.
#[async_trait]
pub trait Chatbot: Send + Sync {
    /// The `chatbot_id` of the messages this chatbot posts and delivers (`cli`, `discord`, …).
    fn chatbot_id(&self) -> &str;

    /// Show one message that [`awaits_delivery`]. A chatbot that does not show a kind of
    /// message (a platform without UI skips thoughts and tool steps, spec §4.3) returns
    /// `Ok(())`: skipping is its way of delivering. An error leaves the message undelivered.
    async fn present(&self, message: &Message) -> Result<(), ChatbotError>;
}

/// Whether a chatbot still has to deliver `message` ([`Message::awaits_delivery`]: the rule is
/// the same for every chatbot, the HTTP API's included).
pub fn awaits_delivery(message: &Message) -> bool {
    message.awaits_delivery()
}

/// Present `message` through `chatbot` if it is the chatbot's and awaits delivery, then mark
/// it `delivered`. Returns whether it was presented.
///
/// The mark is a compare-and-set from `pending`/`responded`: when it loses (another deliverer
/// was faster, or an interruption closed an unfinished tool call meanwhile) nothing is wrong.
pub async fn deliver(gateway: &Gateway, chatbot: &dyn Chatbot, message: &Message) -> Result<bool, ChatbotError> {
    if message.chatbot_id != chatbot.chatbot_id() || !awaits_delivery(message) {
        return Ok(false);
    }
    chatbot.present(message).await?;
    let marked = gateway
        .claim(&message.id, Status::Delivered, &[Status::Pending, Status::Responded], chatbot.chatbot_id())
        .await?;
    if marked.is_none() {
        tracing::debug!(message_id = %message.id, "message was already delivered or closed meanwhile");
    }
    Ok(true)
}

/// Deliver every message of `chatbot` awaiting delivery — those stored now, then live ones —
/// until `shutdown` fires or the broker closes. A failed delivery is logged and retried when
/// the message is next heard of (at the latest on the next start, which reads the store).
pub async fn run_delivery(gateway: Gateway, chatbot: &dyn Chatbot, shutdown: CancellationToken) {
    let filter = MessageFilter::default()
        .with_chatbot(chatbot.chatbot_id())
        .with_statuses(&[Status::Pending, Status::Responded]);
    let mut stream = pin!(gateway.listen(filter, ListenFrom::Current));
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => return,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(event)) => {
                if let Err(error) = deliver(&gateway, chatbot, &event.message).await {
                    tracing::warn!(%error, chatbot_id = chatbot.chatbot_id(), message_id = %event.message.id, "delivery failed");
                }
            }
            Some(Err(error)) => {
                tracing::warn!(%error, chatbot_id = chatbot.chatbot_id(), "reading messages to deliver failed; catching up later");
            }
            None => return,
        }
    }
}
