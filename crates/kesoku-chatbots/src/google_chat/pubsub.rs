//! The Cloud Pub/Sub REST calls the inbound side needs: `:pull`, `:acknowledge` and
//! `:modifyAckDeadline` on one subscription (`POST {pubsub_base_url}/v1/{subscription}:verb`).
//!
//! A pulled message stays leased until its ack deadline; not acknowledged by then, Pub/Sub
//! delivers it again. The adapter acknowledges a message only after it was stored (or found to
//! be a duplicate, or refused for good), and extends the lease while it works.

use std::time::Duration;

use base64::Engine;
use reqwest::Method;
use serde::Deserialize;
use serde_json::json;

use super::api::{ApiError, GoogleApi};

/// A pull waits on the server until messages arrive (or it gives up, ~90 s at most).
const PULL_TIMEOUT: Duration = Duration::from_secs(100);

/// One message of a pull.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReceivedMessage {
    pub ack_id: String,
    pub message: PubsubMessage,
    #[serde(default)]
    pub delivery_attempt: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PubsubMessage {
    /// Base64 of the payload (the Chat event JSON).
    #[serde(default)]
    pub data: String,
    pub message_id: String,
    #[serde(default)]
    pub publish_time: Option<String>,
}

impl PubsubMessage {
    /// The payload's bytes; `None` when `data` is not base64.
    pub fn payload(&self) -> Option<Vec<u8>> {
        base64::engine::general_purpose::STANDARD.decode(self.data.trim()).ok()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PullResponse {
    #[serde(default)]
    received_messages: Vec<ReceivedMessage>,
}

/// One subscription's REST calls.
#[derive(Debug, Clone)]
pub struct Subscription {
    api: GoogleApi,
    /// `{pubsub_base_url}/v1/projects/P/subscriptions/S`.
    url: String,
}

impl Subscription {
    pub fn new(api: GoogleApi, pubsub_base_url: &str, subscription: &str) -> Self {
        let url = format!("{}/v1/{}", pubsub_base_url.trim().trim_end_matches('/'), subscription.trim());
        Subscription { api, url }
    }

    /// Up to `max_messages` messages (none when the server gave up waiting).
    pub async fn pull(&self, max_messages: u32) -> Result<Vec<ReceivedMessage>, ApiError> {
        let body = json!({ "maxMessages": max_messages });
        let answer =
            self.api.call(Method::POST, &format!("{}:pull", self.url), Some(&body), PULL_TIMEOUT, "pulling").await?;
        let parsed: PullResponse = serde_json::from_value(answer).map_err(|error| ApiError::Permanent {
            status: 200,
            reason: format!("pulling: the answer is not a PullResponse: {error}"),
        })?;
        Ok(parsed.received_messages)
    }

    /// Acknowledge: Pub/Sub will not deliver these again.
    pub async fn acknowledge(&self, ack_ids: &[String]) -> Result<(), ApiError> {
        if ack_ids.is_empty() {
            return Ok(());
        }
        let body = json!({ "ackIds": ack_ids });
        self.api
            .call(
                Method::POST,
                &format!("{}:acknowledge", self.url),
                Some(&body),
                super::api::CALL_TIMEOUT,
                "acknowledging",
            )
            .await
            .map(|_| ())
    }

    /// Extend (or with 0, give up) the lease of these messages.
    pub async fn modify_ack_deadline(&self, ack_ids: &[String], seconds: u32) -> Result<(), ApiError> {
        if ack_ids.is_empty() {
            return Ok(());
        }
        let body = json!({ "ackIds": ack_ids, "ackDeadlineSeconds": seconds });
        let url = format!("{}:modifyAckDeadline", self.url);
        self.api
            .call(Method::POST, &url, Some(&body), super::api::CALL_TIMEOUT, "extending the ack deadline")
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_response_parses() {
        let text = r#"{"receivedMessages": [{"ackId": "a1", "message": {"data": "eyJ0eXBlIjoiTUVTU0FHRSJ9",
            "messageId": "42", "publishTime": "2026-12-06T00:00:00Z"}, "deliveryAttempt": 2}]}"#;
        let parsed: PullResponse = serde_json::from_str(text).expect("parses");
        let message = &parsed.received_messages[0];
        assert_eq!(message.ack_id, "a1");
        assert_eq!(message.delivery_attempt, Some(2));
        assert_eq!(message.message.payload().expect("base64"), br#"{"type":"MESSAGE"}"#);
        let empty: PullResponse = serde_json::from_str("{}").expect("an empty pull");
        assert!(empty.received_messages.is_empty());
    }
}
