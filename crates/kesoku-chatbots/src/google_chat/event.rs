//! The Chat interaction event inside a Pub/Sub message's `data`, in either format Chat
//! publishes: the classic event (`type`, `space`, `message`, `user`, `action`, `common`) of a
//! Chat app, or the Google Workspace add-on envelope (`chat.messagePayload`,
//! `chat.addedToSpacePayload`, `chat.buttonClickedPayload`, `commonEventObject`) of a Chat app
//! built as an add-on. Both become one [`ChatEvent`].
//!
//! Not here: what to do with an event ([`super::inbound`]).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

/// Who acted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatUser {
    /// `users/123…`.
    pub name: String,
    pub display_name: Option<String>,
    pub email: Option<String>,
    pub is_bot: bool,
}

/// Where.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatSpace {
    /// `spaces/AAA…`.
    pub name: String,
    /// A one-to-one conversation with the app.
    pub is_direct: bool,
}

/// A Chat message as an event carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChatMessage {
    /// `spaces/AAA/messages/BBB.BBB`.
    pub name: String,
    pub text: String,
    /// The text without the app's @mention, when Chat computed it.
    pub argument_text: Option<String>,
    /// `spaces/AAA/threads/CCC`.
    pub thread_name: Option<String>,
    /// Written as a reply in an existing thread.
    pub thread_reply: bool,
    pub create_time: Option<DateTime<Utc>>,
    pub sender: Option<ChatUser>,
    /// Names of attached files.
    pub attachments: Vec<String>,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Message,
    AddedToSpace,
    RemovedFromSpace,
    /// A card button was clicked: its function and parameters.
    CardClicked {
        function: String,
        parameters: BTreeMap<String, String>,
    },
    /// Another event type (widget updates, app home, …): ignored.
    Other(String),
}

/// One interaction event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatEvent {
    pub kind: EventKind,
    pub user: Option<ChatUser>,
    pub space: Option<ChatSpace>,
    pub message: Option<ChatMessage>,
    pub event_time: Option<DateTime<Utc>>,
}

/// Why a payload is not an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("the pub/sub message is not JSON: {0}")]
    NotJson(String),
    #[error("the pub/sub message is not a google chat event (no `type` and no `chat` payload)")]
    NotAnEvent,
}

/// Parse an event from a Pub/Sub payload.
pub fn parse_event(payload: &[u8]) -> Result<ChatEvent, EventError> {
    let value: Value = serde_json::from_slice(payload).map_err(|error| EventError::NotJson(error.to_string()))?;
    if let Some(kind) = value.get("type").and_then(Value::as_str) {
        return Ok(classic(kind, &value));
    }
    if let Some(chat) = value.get("chat") {
        return Ok(add_on(chat, value.get("commonEventObject")));
    }
    Err(EventError::NotAnEvent)
}

fn classic(kind: &str, value: &Value) -> ChatEvent {
    let kind = match kind {
        "MESSAGE" => EventKind::Message,
        "ADDED_TO_SPACE" => EventKind::AddedToSpace,
        "REMOVED_FROM_SPACE" => EventKind::RemovedFromSpace,
        "CARD_CLICKED" => {
            // `common.invokedFunction` and its parameters map; the older `action` array as a fallback.
            let common = value.get("common");
            let action = value.get("action");
            let function = common
                .and_then(|common| common.get("invokedFunction"))
                .or_else(|| action.and_then(|action| action.get("actionMethodName")))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let mut parameters = string_map(common.and_then(|common| common.get("parameters")));
            if let Some(list) = action.and_then(|action| action.get("parameters")).and_then(Value::as_array) {
                for pair in list {
                    if let (Some(key), Some(value)) =
                        (pair.get("key").and_then(Value::as_str), pair.get("value").and_then(Value::as_str))
                    {
                        parameters.entry(key.to_owned()).or_insert_with(|| value.to_owned());
                    }
                }
            }
            EventKind::CardClicked { function, parameters }
        }
        other => EventKind::Other(other.to_owned()),
    };
    ChatEvent {
        kind,
        user: value.get("user").map(user),
        space: value.get("space").map(space),
        message: value.get("message").map(message),
        event_time: time(value.get("eventTime")),
    }
}

fn add_on(chat: &Value, common: Option<&Value>) -> ChatEvent {
    let (kind, payload) = if let Some(payload) = chat.get("messagePayload") {
        (EventKind::Message, payload)
    } else if let Some(payload) = chat.get("addedToSpacePayload") {
        (EventKind::AddedToSpace, payload)
    } else if let Some(payload) = chat.get("removedFromSpacePayload") {
        (EventKind::RemovedFromSpace, payload)
    } else if let Some(payload) = chat.get("buttonClickedPayload") {
        let function =
            common.and_then(|c| c.get("invokedFunction")).and_then(Value::as_str).unwrap_or_default().to_owned();
        let parameters = string_map(common.and_then(|c| c.get("parameters")));
        (EventKind::CardClicked { function, parameters }, payload)
    } else {
        let other = chat
            .as_object()
            .and_then(|object| object.keys().find(|key| key.ends_with("Payload")).cloned())
            .unwrap_or_else(|| "unknown".to_owned());
        (EventKind::Other(other), chat)
    };
    ChatEvent {
        kind,
        user: chat.get("user").map(user),
        space: payload.get("space").map(space),
        message: payload.get("message").map(message),
        event_time: time(chat.get("eventTime")),
    }
}

fn text(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).filter(|text| !text.is_empty()).map(str::to_owned)
}

fn time(value: Option<&Value>) -> Option<DateTime<Utc>> {
    let stamp = value.and_then(Value::as_str)?;
    DateTime::parse_from_rfc3339(stamp).ok().map(|stamp| stamp.with_timezone(&Utc))
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|object| {
            object.iter().filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned()))).collect()
        })
        .unwrap_or_default()
}

fn user(value: &Value) -> ChatUser {
    ChatUser {
        name: text(value.get("name")).unwrap_or_default(),
        display_name: text(value.get("displayName")),
        email: text(value.get("email")),
        is_bot: value.get("type").and_then(Value::as_str) == Some("BOT"),
    }
}

fn space(value: &Value) -> ChatSpace {
    let kind = value.get("type").and_then(Value::as_str);
    let space_type = value.get("spaceType").and_then(Value::as_str);
    let single = value.get("singleUserBotDm").and_then(Value::as_bool) == Some(true);
    ChatSpace {
        name: text(value.get("name")).unwrap_or_default(),
        is_direct: single || kind == Some("DM") || space_type == Some("DIRECT_MESSAGE"),
    }
}

fn message(value: &Value) -> ChatMessage {
    ChatMessage {
        name: text(value.get("name")).unwrap_or_default(),
        text: text(value.get("text")).unwrap_or_default(),
        argument_text: value.get("argumentText").and_then(Value::as_str).map(str::to_owned),
        thread_name: text(value.get("thread").and_then(|thread| thread.get("name"))),
        thread_reply: value.get("threadReply").and_then(Value::as_bool) == Some(true),
        create_time: time(value.get("createTime")),
        sender: value.get("sender").map(user),
        attachments: value
            .get("attachment")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|item| text(item.get("contentName")).unwrap_or_else(|| "attachment".to_owned()))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: Value) -> ChatEvent {
        parse_event(value.to_string().as_bytes()).expect("an event")
    }

    #[test]
    fn a_classic_message_event() {
        let event = parse(json!({
            "type": "MESSAGE",
            "eventTime": "2026-12-06T01:02:03.456Z",
            "space": {"name": "spaces/AAA", "type": "ROOM", "spaceType": "SPACE"},
            "message": {
                "name": "spaces/AAA/messages/M1.M1", "text": "@Kesoku hello", "argumentText": " hello",
                "thread": {"name": "spaces/AAA/threads/T1"}, "threadReply": true,
                "sender": {"name": "users/1", "displayName": "Chii", "email": "chii@example.com", "type": "HUMAN"}
            },
            "user": {"name": "users/1", "displayName": "Chii", "email": "chii@example.com", "type": "HUMAN"}
        }));
        assert_eq!(event.kind, EventKind::Message);
        let message = event.message.expect("message");
        assert_eq!(message.argument_text.as_deref(), Some(" hello"));
        assert_eq!(message.thread_name.as_deref(), Some("spaces/AAA/threads/T1"));
        assert!(message.thread_reply);
        assert_eq!(event.user.expect("user").email.as_deref(), Some("chii@example.com"));
        assert!(!event.space.expect("space").is_direct);
        assert_eq!(event.event_time.map(|t| t.timestamp_millis()), Some(1_796_518_923_456));
    }

    #[test]
    fn card_clicks_in_both_formats() {
        let classic = parse(json!({
            "type": "CARD_CLICKED",
            "action": {"actionMethodName": "kesoku_answer", "parameters": [{"key": "option", "value": "Red"}]},
            "common": {"invokedFunction": "kesoku_answer", "parameters": {"option": "Red"}},
            "space": {"name": "spaces/AAA", "singleUserBotDm": true},
            "user": {"name": "users/1", "type": "HUMAN"}
        }));
        let expected = EventKind::CardClicked {
            function: "kesoku_answer".into(),
            parameters: BTreeMap::from([("option".to_owned(), "Red".to_owned())]),
        };
        assert_eq!(classic.kind, expected);
        assert!(classic.space.expect("space").is_direct);
        let add_on = parse(json!({
            "commonEventObject": {"invokedFunction": "kesoku_answer", "parameters": {"option": "Red"}},
            "chat": {"user": {"name": "users/1"}, "buttonClickedPayload": {"space": {"name": "spaces/AAA"},
                "message": {"name": "spaces/AAA/messages/Q"}}}
        }));
        assert_eq!(add_on.kind, expected);
        assert_eq!(add_on.message.expect("message").name, "spaces/AAA/messages/Q");
    }

    #[test]
    fn add_on_messages_and_garbage() {
        let event = parse(json!({"chat": {"user": {"name": "users/2", "type": "BOT"},
            "messagePayload": {"space": {"name": "spaces/B", "spaceType": "DIRECT_MESSAGE"},
            "message": {"name": "spaces/B/messages/X", "text": "hi"}}}}));
        assert_eq!(event.kind, EventKind::Message);
        assert!(event.user.expect("user").is_bot);
        assert!(event.space.expect("space").is_direct);
        assert_eq!(parse_event(b"{}"), Err(EventError::NotAnEvent));
        assert!(matches!(parse_event(b"nope"), Err(EventError::NotJson(_))));
        assert_eq!(parse(json!({"type": "WIDGET_UPDATED"})).kind, EventKind::Other("WIDGET_UPDATED".into()));
    }
}
