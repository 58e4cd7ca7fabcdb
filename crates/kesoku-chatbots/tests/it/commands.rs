//! The shared chat commands executed over a real store.

use std::sync::Mutex;

use async_trait::async_trait;
use kesoku_chatbots::ChatbotError;
use kesoku_chatbots::commands::{
    COMPACTION_REQUEST, ChatCommand, CommandContext, CommandEffect, SessionControl, StopAck, TurnStop, execute, parse,
};
use kesoku_core::{Message, MessageFilter, Role, SessionId, Status};

use crate::support::{Fixture, fixture, tool_turn};

/// Records stop requests and interrupts nothing.
#[derive(Default)]
struct FakeControl {
    stopped: Mutex<Vec<SessionId>>,
}

#[async_trait]
impl SessionControl for FakeControl {
    async fn stop_session(&self, session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        self.stopped.lock().expect("lock").push(session_id.clone());
        Ok(StopAck { turn: TurnStop::Requested, interrupted_waiting: 2 })
    }
}

async fn run(fixture: &Fixture, control: &FakeControl, text: &str) -> (String, CommandEffect) {
    let command = parse(text).expect("a command");
    let context = CommandContext {
        gateway: &fixture.gateway,
        control,
        chatbot_id: "cli",
        channel_id: "cli",
        session_id: &fixture.session.id,
    };
    let reply = execute(&command, &context).await.expect("the command runs");
    (reply.text, reply.effect)
}

#[tokio::test]
async fn status_reports_the_last_turns_figures() {
    let fixture = fixture().await;
    let control = FakeControl::default();
    let (text, _) = run(&fixture, &control, "/status").await;
    assert!(text.contains("No turn has finished in this session yet.") && text.contains("Now: idle."), "{text}");

    for message in tool_turn(&fixture.session) {
        fixture.gateway.post(&message).await.expect("post");
    }
    let (text, effect) = run(&fixture, &control, "/status").await;
    assert_eq!(effect, CommandEffect::None);
    assert!(text.contains("Turns: 1 · context: 1,234 tokens"), "{text}");
    assert!(text.contains("Last turn: 1 tool call · 56 tokens · 1.2 s"), "{text}");
    assert!(text.contains("5 messages") && text.contains("0 running, 1 waiting"), "{text}");
}

#[tokio::test]
async fn stop_goes_through_the_control_and_says_what_happened() {
    let fixture = fixture().await;
    let control = FakeControl::default();
    let (text, effect) = run(&fixture, &control, "/stop").await;
    assert_eq!(*control.stopped.lock().expect("lock"), vec![fixture.session.id.clone()]);
    assert!(text.starts_with("Nothing was running.") && text.contains("2 waiting messages dropped."), "{text}");
    assert!(matches!(effect, CommandEffect::Stopped(StopAck { turn: TurnStop::Requested, .. })));
}

#[tokio::test]
async fn clear_starts_a_new_active_session_and_keeps_the_old_one() {
    let fixture = fixture().await;
    let control = FakeControl::default();
    let (text, effect) = run(&fixture, &control, "/clear").await;
    let CommandEffect::SessionSwitched(new_session) = effect else { panic!("expected a new session, got {effect:?}") };
    assert_ne!(new_session.id, fixture.session.id);
    let store = fixture.gateway.store();
    assert_eq!(store.active_session("cli", "cli").await.expect("read"), Some(new_session.id.clone()));
    assert!(store.get_session(&fixture.session.id).await.expect("read").is_some(), "the old session is kept");
    assert!(text.contains(new_session.id.as_str()) && text.contains(fixture.session.id.as_str()), "{text}");

    let (list, _) = run(&fixture, &control, "/sessions").await;
    let lines: Vec<&str> = list.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{list}");
    assert!(lines.iter().any(|l| l.starts_with("* ") && l.contains(fixture.session.id.as_str())), "{list}");
}

#[tokio::test]
async fn compact_posts_the_manual_compaction_trigger() {
    let fixture = fixture().await;
    let control = FakeControl::default();
    let (text, effect) = run(&fixture, &control, "/compact").await;
    assert!(text.starts_with("Compaction requested"), "{text}");
    let CommandEffect::CompactionRequested(trigger) = effect else { panic!("expected a trigger, got {effect:?}") };
    let stored: Vec<Message> =
        fixture.gateway.store().list_messages(&MessageFilter::session(&fixture.session.id)).await.expect("list");
    assert_eq!(stored.len(), 1);
    let message = &stored[0];
    assert_eq!(message.id, trigger.id);
    assert_eq!(
        (message.role, message.sender.as_str(), message.status, message.content.as_str()),
        (Role::User, "System", Status::PendingAgent, COMPACTION_REQUEST)
    );
    assert_eq!(message.metadata.is_compaction, Some(true));
    assert_eq!((message.chatbot_id.as_str(), message.channel_id.as_str()), ("cli", "cli"));
}

#[tokio::test]
async fn unknown_commands_get_a_reply_naming_the_known_ones() {
    let fixture = fixture().await;
    let control = FakeControl::default();
    let (text, effect) = run(&fixture, &control, "/wat").await;
    assert_eq!(effect, CommandEffect::None);
    assert!(text.starts_with("Unknown command `/wat`."), "{text}");
    for command in &ChatCommand::ALL {
        assert!(text.contains(&format!("/{}", command.name())), "{text}");
    }
    let (help, _) = run(&fixture, &control, "/help").await;
    assert_eq!(help.lines().count(), ChatCommand::ALL.len() + 2, "{help}");
    let stored =
        fixture.gateway.store().list_messages(&MessageFilter::session(&fixture.session.id)).await.expect("list");
    assert!(stored.is_empty(), "commands post nothing");
}
