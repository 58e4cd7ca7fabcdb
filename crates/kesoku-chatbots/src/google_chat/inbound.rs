//! One pulled event, handled: what people write becomes a `pending_agent` message (spec 3.1),
//! a click on a question's button becomes the clicker's next message, an app added to a space
//! says hello, chat commands are answered in place.
//!
//! Mapping: `channel_id` is the thread (`spaces/S/threads/T`), or the space itself in a
//! one-to-one conversation with the app (unless the message was written as a thread reply);
//! `sender` is the display name (`User` without one); the text is `argumentText` (the @mention
//! removed); metadata keeps the Chat message name, the sender's resource name and email, and
//! the space. The message's name is its [`Inbound::platform_key`], so a redelivered event is
//! stored once.
//!
//! [`handle`] answers whether the Pub/Sub message may be acknowledged: yes once the event was
//! stored, found stored already, or refused for good; no when storing failed for now (it is
//! then delivered again).

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use kesoku_core::{Metadata, ThreadRef};
use serde_json::{Map, Value, json};

use super::Shared;
use super::event::{ChatEvent, ChatMessage, ChatSpace, ChatUser, EventKind, parse_event};
use super::format::to_chat_text;
use super::outbound::{ANSWER_FUNCTION, fit_text};
use super::pubsub::ReceivedMessage;
use super::rest::{Place, client_message_id};
use crate::commands;
use crate::ingest::{Inbound, IngestError, Ingested, ingest};

/// What became of a pulled message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Stored, a duplicate, ignored or refused for good: acknowledge it.
    Done,
    /// Not stored for now (the store or Chat failed): let Pub/Sub deliver it again.
    Retry,
}

/// The greeting posted when the app is added to a space.
pub const GREETING: &str = "Hi, I'm Kesoku. Mention me (or write to me directly) and I answer in the thread. \
                            Type /help for the commands.";

/// The channel of a message: its thread, or the space of a one-to-one conversation.
pub fn channel_for(space: Option<&ChatSpace>, message: &ChatMessage) -> Option<String> {
    let direct = space.filter(|space| space.is_direct && !space.name.is_empty());
    match (direct, &message.thread_name) {
        (Some(space), _) if !message.thread_reply => Some(space.name.clone()),
        (_, Some(thread)) => Some(thread.clone()),
        (Some(space), None) => Some(space.name.clone()),
        (None, None) => space.filter(|space| !space.name.is_empty()).map(|space| space.name.clone()),
    }
}

/// The thread a message in `channel_id` is in, when that channel is a thread of a space: it hangs
/// off the space, so an agent sitting in the space reads its threads. Google Chat's thread names
/// do not derive from the message that started them, so the thread's root is not named (it is
/// the first message of the same channel, in the history already).
pub fn thread_for(space: Option<&ChatSpace>, channel_id: &str) -> Option<ThreadRef> {
    let space = space.filter(|space| !space.name.is_empty())?;
    (channel_id != space.name && channel_id.starts_with(&format!("{}/threads/", space.name)))
        .then(|| ThreadRef { parent_channel_id: space.name.clone(), root_message_id: None })
}

/// The line before a message's text: who wrote it, and when in the configured zone.
pub fn header(name: &str, user: &str, at: DateTime<Utc>, zone: Tz) -> String {
    crate::ingest::sender_header(name, Some(&format!("<{user}>")), at, zone)
}

/// Whether `user` may talk to the agent.
pub fn is_allowed(allowed: &[String], user: &ChatUser) -> bool {
    allowed.is_empty()
        || allowed.iter().any(|entry| {
            entry == &user.name || user.email.as_deref().is_some_and(|email| email.eq_ignore_ascii_case(entry))
        })
}

fn display_name(user: &ChatUser) -> String {
    user.display_name.clone().filter(|name| !name.trim().is_empty()).unwrap_or_else(|| "User".to_owned())
}

/// Handle one pulled Pub/Sub message.
pub(crate) async fn handle(shared: &Shared, received: &ReceivedMessage) -> Handled {
    let pubsub_id = &received.message.message_id;
    let Some(payload) = received.message.payload() else {
        tracing::warn!(pubsub_message_id = %pubsub_id, "a pub/sub message's data is not base64; dropped");
        return Handled::Done;
    };
    let event = match parse_event(&payload) {
        Ok(event) => event,
        Err(error) => {
            tracing::warn!(%error, pubsub_message_id = %pubsub_id, "not a google chat event; dropped");
            return Handled::Done;
        }
    };
    match &event.kind {
        EventKind::Message => on_message(shared, &event).await,
        EventKind::AddedToSpace => {
            let greeted = greet(shared, &event, pubsub_id).await;
            // Added by an @mention: that message is an event of its own too.
            match (&event.message, greeted) {
                (Some(_), Handled::Done) => on_message(shared, &event).await,
                (_, greeted) => greeted,
            }
        }
        EventKind::RemovedFromSpace => {
            let space = event.space.as_ref().map(|space| space.name.as_str()).unwrap_or_default();
            tracing::info!(chatbot_id = %shared.config.id, space, "the google chat app was removed from a space");
            Handled::Done
        }
        EventKind::CardClicked { function, parameters } if function == ANSWER_FUNCTION => {
            let option = parameters.get("option").cloned().unwrap_or_default();
            let prompt = parameters.get("prompt").cloned().unwrap_or_default();
            on_answer(shared, &event, &option, &prompt, pubsub_id).await
        }
        EventKind::CardClicked { function, .. } => {
            tracing::debug!(function, "a click on a card this adapter did not make; ignored");
            Handled::Done
        }
        EventKind::Other(kind) => {
            tracing::debug!(kind, "a google chat event this adapter does not handle; ignored");
            Handled::Done
        }
    }
}

/// The acting person, when the event may reach the agent.
fn admitted<'a>(shared: &Shared, event: &'a ChatEvent) -> Option<&'a ChatUser> {
    let user = event.user.as_ref().or_else(|| event.message.as_ref().and_then(|m| m.sender.as_ref()))?;
    if user.is_bot {
        return None;
    }
    if !is_allowed(&shared.allowed_users, user) {
        tracing::info!(chatbot_id = %shared.config.id, user = %user.name, "a google chat user not in allowed_users was ignored");
        return None;
    }
    Some(user)
}

async fn on_message(shared: &Shared, event: &ChatEvent) -> Handled {
    let Some(message) = &event.message else {
        return Handled::Done;
    };
    let Some(user) = admitted(shared, event) else {
        return Handled::Done;
    };
    let Some(channel_id) = channel_for(event.space.as_ref(), message) else {
        tracing::warn!(message = %message.name, "a google chat message without a space; dropped");
        return Handled::Done;
    };
    let text = message.argument_text.as_deref().unwrap_or(&message.text).trim();
    if let Some(command) = commands::parse(text) {
        let reply = run_command(shared, &command, &channel_id).await;
        post_text(shared, &channel_id, &reply, &client_message_id("cmd", &message.name)).await;
        return Handled::Done;
    }
    let at = message.create_time.or(event.event_time).unwrap_or_else(Utc::now);
    let mut content = header(&display_name(user), &user.name, at, shared.timezone);
    content.push_str(&commands::message_text(text));
    for name in &message.attachments {
        content.push_str(&format!(
            "\n[attachment `{}` was not received: the google chat chatbot does not download files]",
            name.replace('`', "'")
        ));
    }
    let mut extra = Map::new();
    extra.insert("google_chat_message_name".to_owned(), Value::String(message.name.clone()));
    extra.insert("google_chat_sender".to_owned(), Value::String(user.name.clone()));
    if let Some(email) = &user.email {
        extra.insert("google_chat_sender_email".to_owned(), Value::String(email.clone()));
    }
    if let Some(space) = &event.space {
        extra.insert("google_chat_space".to_owned(), Value::String(space.name.clone()));
    }
    let inbound = Inbound {
        chatbot_id: shared.config.id.clone(),
        channel_id: channel_id.clone(),
        sender: display_name(user),
        content,
        platform_key: Some(message.name.clone()),
        session_id: None,
        files: Vec::new(),
        metadata: Metadata {
            extra,
            thread: thread_for(event.space.as_ref(), &channel_id).map(Box::new),
            ..Metadata::default()
        },
    };
    store(shared, inbound, &channel_id, &message.name).await
}

async fn on_answer(shared: &Shared, event: &ChatEvent, option: &str, prompt: &str, pubsub_id: &str) -> Handled {
    let Some(user) = admitted(shared, event) else {
        return Handled::Done;
    };
    let Some(card) = &event.message else {
        return Handled::Done;
    };
    let Some(channel_id) = channel_for(event.space.as_ref(), card) else {
        return Handled::Done;
    };
    let at = event.event_time.unwrap_or_else(Utc::now);
    let mut content = header(&display_name(user), &user.name, at, shared.timezone);
    content.push_str(option);
    let mut extra = Map::new();
    extra.insert("google_chat_answer_to".to_owned(), Value::String(card.name.clone()));
    extra.insert("google_chat_sender".to_owned(), Value::String(user.name.clone()));
    let inbound = Inbound {
        chatbot_id: shared.config.id.clone(),
        channel_id: channel_id.clone(),
        sender: display_name(user),
        content,
        platform_key: Some(format!("click-{pubsub_id}")),
        session_id: None,
        files: Vec::new(),
        metadata: Metadata {
            extra,
            thread: thread_for(event.space.as_ref(), &channel_id).map(Box::new),
            ..Metadata::default()
        },
    };
    let handled = store(shared, inbound, &channel_id, &card.name).await;
    if handled == Handled::Done && !card.name.is_empty() {
        // The buttons go; the choice stays readable under the prompt.
        let body = json!({ "text": fit_text(&format!("{}\n→ *{option}*", to_chat_text(prompt))), "cardsV2": [] });
        if let Err(error) = shared.rest.patch_message(&card.name, &body, "text,cardsV2").await {
            tracing::warn!(%error, message = %card.name, "marking a google chat question answered failed");
        }
    }
    handled
}

async fn store(shared: &Shared, inbound: Inbound, channel_id: &str, source: &str) -> Handled {
    match ingest(&shared.gateway, &shared.staging, inbound).await {
        Ok(Ingested::Posted(posted)) => {
            tracing::debug!(message_id = %posted.id, google_chat = source, "google chat message ingested");
            Handled::Done
        }
        Ok(Ingested::Duplicate(id)) => {
            tracing::debug!(message_id = %id, "google chat event seen before; acknowledged again");
            Handled::Done
        }
        Err(error) if error.is_refusal() => {
            post_text(shared, channel_id, &refusal_text(&error), &client_message_id("refused", source)).await;
            Handled::Done
        }
        Err(error) => {
            tracing::error!(%error, google_chat = source, "storing a google chat message failed; it is pulled again later");
            Handled::Retry
        }
    }
}

fn refusal_text(error: &IngestError) -> String {
    format!("⚠️ Your message was not passed on: {error}")
}

async fn greet(shared: &Shared, event: &ChatEvent, pubsub_id: &str) -> Handled {
    let Some(space) = event.space.as_ref().filter(|space| !space.name.is_empty()) else {
        return Handled::Done;
    };
    let place = Place { space: space.name.clone(), thread: None };
    let id = client_message_id("hello", pubsub_id);
    match shared.rest.create_message(&place, json!({ "text": GREETING }), &id, Some(&id)).await {
        Ok(_) => Handled::Done,
        Err(error) if error.is_transient() => {
            tracing::warn!(%error, space = %space.name, "greeting a google chat space failed; trying again later");
            Handled::Retry
        }
        Err(error) => {
            tracing::warn!(%error, space = %space.name, "greeting a google chat space failed");
            Handled::Done
        }
    }
}

/// Post a short notice (a command's answer, a refusal) in a channel; best effort.
async fn post_text(shared: &Shared, channel_id: &str, text: &str, id: &str) {
    let Some(place) = Place::of_channel(channel_id) else {
        return;
    };
    let body = json!({ "text": fit_text(&to_chat_text(text)) });
    if let Err(error) = shared.rest.create_message(&place, body, id, Some(id)).await {
        tracing::warn!(%error, channel_id, "posting a notice in google chat failed");
    }
}

async fn run_command(shared: &Shared, command: &commands::ChatCommand, channel_id: &str) -> String {
    commands::run_in_channel(&shared.gateway, shared.control.as_ref(), &shared.config.id, channel_id, command).await
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn user(name: &str, email: Option<&str>) -> ChatUser {
        ChatUser { name: name.into(), email: email.map(str::to_owned), ..ChatUser::default() }
    }

    #[test]
    fn the_allow_list_matches_names_and_emails() {
        let allowed = vec!["users/1".to_owned(), "Chii@Example.com".to_owned()];
        assert!(is_allowed(&allowed, &user("users/1", None)));
        assert!(is_allowed(&allowed, &user("users/9", Some("chii@example.com"))));
        assert!(!is_allowed(&allowed, &user("users/9", Some("other@example.com"))));
        assert!(is_allowed(&[], &user("users/9", None)));
    }

    #[test]
    fn channels_are_threads_or_direct_spaces() {
        let room = ChatSpace { name: "spaces/R".into(), is_direct: false };
        let dm = ChatSpace { name: "spaces/D".into(), is_direct: true };
        let threaded = ChatMessage { thread_name: Some("spaces/R/threads/T".into()), ..ChatMessage::default() };
        assert_eq!(channel_for(Some(&room), &threaded).as_deref(), Some("spaces/R/threads/T"));
        let in_dm = ChatMessage { thread_name: Some("spaces/D/threads/U".into()), ..ChatMessage::default() };
        assert_eq!(channel_for(Some(&dm), &in_dm).as_deref(), Some("spaces/D"));
        let reply = ChatMessage { thread_reply: true, ..in_dm };
        assert_eq!(channel_for(Some(&dm), &reply).as_deref(), Some("spaces/D/threads/U"));
        assert_eq!(channel_for(Some(&room), &ChatMessage::default()).as_deref(), Some("spaces/R"));
        assert_eq!(channel_for(None, &ChatMessage::default()), None);
    }

    #[test]
    fn a_thread_of_a_space_hangs_off_the_space() {
        let room = ChatSpace { name: "spaces/R".into(), is_direct: false };
        let thread = thread_for(Some(&room), "spaces/R/threads/T").expect("a thread");
        assert_eq!((thread.parent_channel_id.as_str(), thread.root_message_id), ("spaces/R", None));
        assert_eq!(thread_for(Some(&room), "spaces/R"), None, "the space itself is no thread");
        assert_eq!(thread_for(Some(&room), "spaces/X/threads/T"), None, "another space's thread is not this one's");
        assert_eq!(thread_for(None, "spaces/R/threads/T"), None);
    }

    #[test]
    fn the_header_names_the_sender_and_local_time() {
        let at = Utc.with_ymd_and_hms(2026, 5, 27, 12, 45, 0).single().expect("a time");
        assert_eq!(
            header("Chii `x`", "users/1", at, chrono_tz::Asia::Tokyo),
            "`Chii 'x'` <users/1> at `2026-05-27 21:45:00 Asia/Tokyo`:\n"
        );
    }
}
