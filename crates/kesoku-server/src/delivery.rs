//! The `api` chatbot: the HTTP API as a platform of the shared delivery seam.
//!
//! The API has no platform to send to: its "platform" is the event stream and the history
//! route. A message of chatbot `api` is on that platform once it is stored (the gateway
//! broadcasts it then), so [`ApiChatbot`] sends nothing: a step is "shown" at once, a part's
//! platform id is its own key, and [`kesoku_chatbots::Deliverer`] records the parts and marks
//! the message `delivered` as for any chatbot. The API is a UI chatbot (clients render steps),
//! has no length limit (a part is the stored message, whole), and no files or buttons of its
//! own (clients read the `[file: …]` and `[question: …]` markers in the text).
//!
//! What the seam decides stays true here: system-role messages (nudges, compaction summaries)
//! are shown to nobody (spec §3: "User Visibility: No") and stay `responded`; a message whose
//! status changed first (an interrupted tool call) is skipped. Delivered does *not* mean a
//! client read it: clients read the stream or the history whenever they like.

use std::sync::Arc;

use async_trait::async_trait;
use kesoku_chatbots::answer::OutboundPart;
use kesoku_chatbots::{Capabilities, Chatbot, Deliverer, DeliveryError};
use kesoku_core::Message;
use tokio_util::sync::CancellationToken;

use crate::views::API_CHATBOT;

/// The HTTP API's chatbot (`api`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiChatbot;

#[async_trait]
impl Chatbot for ApiChatbot {
    fn chatbot_id(&self) -> &str {
        API_CHATBOT
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { shows_intermediates: true, ..Capabilities::text_only(usize::MAX) }
    }

    /// Stored is shown: clients get it from the stream or the history.
    async fn show_step(&self, _step: &Message) -> Result<(), DeliveryError> {
        Ok(())
    }

    /// The part is the stored message itself; its key is its id on this "platform".
    async fn send_part(&self, _message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        Ok(part.key.clone())
    }
}

/// Deliver every message of chatbot `api` through `deliverer` (the binary gives it the ledger)
/// until `shutdown` fires or the broker closes.
pub async fn run_api_delivery(deliverer: Deliverer, shutdown: CancellationToken) {
    deliverer.run(Arc::new(ApiChatbot), shutdown).await;
}
