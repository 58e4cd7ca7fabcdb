//! The Chat REST calls the adapter makes, authenticated as the app (`chat.bot`):
//! `spaces.messages.create` (into a thread with `messageReplyOption=
//! REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD`, named with a `client-…` `messageId` and a
//! `requestId` so that a create sent again returns the first message instead of a second one),
//! `patch` (with `updateMask`) and `delete`.
//!
//! A channel id is where messages go: a thread (`spaces/S/threads/T`) or a whole space
//! (`spaces/S`), see [`Place`].

use md5::{Digest, Md5};
use reqwest::Method;
use serde_json::{Value, json};

use super::api::{ApiError, CALL_TIMEOUT, GoogleApi};

/// Chat's limit on a message's text, in characters (as its errors state it).
pub const MAX_TEXT_CHARS: usize = 4096;
/// Chat's limit on a whole message (text and cards), in bytes.
pub const MAX_MESSAGE_BYTES: usize = 32_000;

/// Where a message goes: a space, and in it a thread when the conversation is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// `spaces/S`.
    pub space: String,
    /// `spaces/S/threads/T`.
    pub thread: Option<String>,
}

impl Place {
    /// The place a channel id names; `None` when it is neither a space nor a thread name.
    pub fn of_channel(channel_id: &str) -> Option<Place> {
        let parts: Vec<&str> = channel_id.split('/').collect();
        match parts.as_slice() {
            ["spaces", space] if !space.is_empty() => Some(Place { space: channel_id.to_owned(), thread: None }),
            ["spaces", space, "threads", thread] if !space.is_empty() && !thread.is_empty() => {
                Some(Place { space: format!("spaces/{space}"), thread: Some(channel_id.to_owned()) })
            }
            _ => None,
        }
    }
}

/// A `client-…` message id for `key`: stable, lowercase hex, within Chat's 63 characters.
pub fn client_message_id(kind: &str, key: &str) -> String {
    let digest = Md5::digest(key.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("client-{kind}-{hex}")
}

/// A message created (or found created before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// `spaces/S/messages/…`.
    pub name: String,
    /// The id was taken already: this is the earlier message, as it stands.
    pub existed: bool,
}

/// The Chat API of one app.
#[derive(Debug, Clone)]
pub struct ChatRest {
    api: GoogleApi,
    /// `{chat_base_url}/v1`.
    base: String,
}

impl ChatRest {
    pub fn new(api: GoogleApi, chat_base_url: &str) -> Self {
        ChatRest { api, base: format!("{}/v1", chat_base_url.trim().trim_end_matches('/')) }
    }

    /// Create a message at `place` named `message_id` (`client-…`). With a `request_id`, a
    /// create sent again is answered by Chat with the first message; without one, with
    /// `ALREADY_EXISTS`, which is reported as [`Created::existed`].
    pub async fn create_message(
        &self,
        place: &Place,
        mut body: Value,
        message_id: &str,
        request_id: Option<&str>,
    ) -> Result<Created, ApiError> {
        let mut url = format!("{}/{}/messages?messageId={message_id}", self.base, place.space);
        if let Some(request_id) = request_id {
            url.push_str(&format!("&requestId={request_id}"));
        }
        if let Some(thread) = &place.thread {
            url.push_str("&messageReplyOption=REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD");
            body["thread"] = json!({ "name": thread });
        }
        let named = format!("{}/messages/{message_id}", place.space);
        match self.api.call(Method::POST, &url, Some(&body), CALL_TIMEOUT, "posting a google chat message").await {
            Ok(created) => {
                let name = created.get("name").and_then(Value::as_str).map_or(named, str::to_owned);
                Ok(Created { name, existed: false })
            }
            Err(ApiError::Permanent { status: 409, .. }) => Ok(Created { name: named, existed: true }),
            Err(error) => Err(error),
        }
    }

    /// Replace the fields of `update_mask` (`text`, `cardsV2`, …) of message `name`.
    pub async fn patch_message(&self, name: &str, body: &Value, update_mask: &str) -> Result<(), ApiError> {
        let url = format!("{}/{name}?updateMask={update_mask}", self.base);
        self.api.call(Method::PATCH, &url, Some(body), CALL_TIMEOUT, "updating a google chat message").await.map(|_| ())
    }

    /// Delete message `name`; one already gone counts as deleted.
    pub async fn delete_message(&self, name: &str) -> Result<(), ApiError> {
        let url = format!("{}/{name}", self.base);
        match self.api.call(Method::DELETE, &url, None, CALL_TIMEOUT, "deleting a google chat message").await {
            Ok(_) | Err(ApiError::Permanent { status: 404, .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_and_ids() {
        assert_eq!(Place::of_channel("spaces/A"), Some(Place { space: "spaces/A".into(), thread: None }));
        assert_eq!(
            Place::of_channel("spaces/A/threads/T"),
            Some(Place { space: "spaces/A".into(), thread: Some("spaces/A/threads/T".into()) })
        );
        assert_eq!(Place::of_channel("1234"), None);
        assert_eq!(Place::of_channel("spaces/"), None);
        let id = client_message_id("p", "msg_a:0");
        assert_eq!(id, client_message_id("p", "msg_a:0"));
        assert_ne!(id, client_message_id("p", "msg_a:1"));
        assert!(id.len() <= 63 && id.starts_with("client-p-"), "{id}");
        assert!(id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{id}");
    }
}
