//! Delivery for the `api` chatbot.
//!
//! The HTTP API has no platform to send to: its "platform" is the event stream. A message of
//! chatbot `api` counts as delivered once it has been broadcast, which the gateway does when the
//! message is stored; so this task marks `pending` (final answers, notifications) and
//! `responded` (thoughts, tool calls and results: the API is a UI chatbot) messages of that
//! chatbot `delivered` as it hears of them. System-role messages (nudges, compaction summaries)
//! are shown to nobody (spec §3: "User Visibility: No"), so they stay `responded`. Delivered
//! does *not* mean a client read it: clients read the stream or the history whenever they like,
//! and the stored message is the record.
//!
//! On start it takes every such message still waiting (`ListenFrom::Current`), so nothing is
//! left behind by a restart. A status that changed meanwhile (an unfinished tool call
//! interrupted by a newer message) is not an error.

use std::pin::pin;

use futures::StreamExt;
use kesoku_core::{MessageFilter, MessageId, Status};
use kesoku_gateway::{Gateway, GatewayError, ListenFrom};
use kesoku_store::StoreError;
use tokio_util::sync::CancellationToken;

use crate::views::API_CHATBOT;

/// Mark every `pending`/`responded` message of chatbot `api` that people see `delivered`, until
/// `shutdown` fires or the broker closes.
pub async fn run_api_delivery(gateway: Gateway, shutdown: CancellationToken) {
    let filter =
        MessageFilter::default().with_chatbot(API_CHATBOT).with_statuses(&[Status::Pending, Status::Responded]);
    let mut stream = pin!(gateway.listen(filter, ListenFrom::Current));
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => return,
            next = stream.next() => next,
        };
        match next {
            Some(Ok(event)) if event.message.awaits_delivery() => deliver(&gateway, &event.message.id).await,
            // Seen by nobody (nudges, compaction summaries): it stays `responded`.
            Some(Ok(_hidden)) => {}
            Some(Err(error)) => tracing::warn!(%error, "api delivery: reading messages failed; the stream catches up"),
            None => {
                tracing::info!("api delivery: the broker closed");
                return;
            }
        }
    }
}

async fn deliver(gateway: &Gateway, id: &MessageId) {
    match gateway.update_status(id, Status::Delivered).await {
        Ok(_) => tracing::debug!(message = %id, "api message delivered"),
        // Someone moved it first (for example an interruption): nothing to deliver.
        Err(GatewayError::Store(StoreError::IllegalTransition { .. } | StoreError::NotFound { .. })) => {
            tracing::debug!(message = %id, "api message changed before delivery");
        }
        Err(error) => tracing::warn!(message = %id, %error, "api delivery: marking a message delivered failed"),
    }
}
