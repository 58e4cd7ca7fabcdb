//! Compaction: manual and automatic, nothing deleted, the window respected, bad summaries refused.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kesoku_agent::AgentConfig;
use kesoku_agent::compaction::{self, AUTO_NOTIFICATION, SUMMARIZER_PROMPT};
use kesoku_core::{Message, MessageType, Outcome, Role, Status};
use kesoku_llm::{LlmError, Model, ModelInfo, Provider, Request, Response, ResponseStream, StreamEvent};

use crate::harness::{BOT, CHANNEL, Harness, Options};

/// A model that answers turns with a fixed-size text and summaries with a short digest, and
/// records how big each turn request was.
struct Echo {
    info: ModelInfo,
    summary: Mutex<String>,
    turn_request_chars: Mutex<Vec<usize>>,
    summaries: Mutex<usize>,
}

impl Echo {
    fn new(context_window: u32) -> Arc<Echo> {
        Arc::new(Echo {
            info: ModelInfo {
                provider: Provider::OpenAi,
                model: "echo".into(),
                context_window,
                max_output_tokens: 512,
            },
            summary: Mutex::new("The user asked many numbered questions; each was answered.".into()),
            turn_request_chars: Mutex::new(Vec::new()),
            summaries: Mutex::new(0),
        })
    }
}

fn request_chars(request: &Request) -> usize {
    serde_json::to_string(&request.turns).map(|s| s.len()).unwrap_or(0) + request.system.as_ref().map_or(0, String::len)
}

#[async_trait]
impl Model for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let response = if request.system.as_deref() == Some(SUMMARIZER_PROMPT) {
            *self.summaries.lock().expect("lock") += 1;
            Response::text(self.summary.lock().expect("lock").clone())
        } else {
            self.turn_request_chars.lock().expect("lock").push(request_chars(request));
            Response::text(format!("Here is my answer, padded to a realistic length. {}", "lorem ipsum ".repeat(20)))
        };
        Ok(Box::pin(futures::stream::iter(vec![Ok(StreamEvent::Completed(response))])))
    }
}

fn options() -> Options {
    let mut config = AgentConfig::default();
    config.compaction.keep_recent_turns = 3;
    Options { config, ..Options::default() }
}

#[tokio::test]
async fn a_200_turn_conversation_stays_under_the_window_and_loses_nothing() {
    let model = Echo::new(4000);
    let mut h = Harness::start(vec![]).await;
    h.reboot_with_model(Arc::clone(&model) as Arc<dyn Model>, options()).await;
    for n in 0..200 {
        let user = h.post_user(&format!("Question number {n}: {}", "please consider this carefully ".repeat(4))).await;
        assert_eq!(h.wait_terminal(&user.id).await, Status::Processed, "turn {n}");
    }
    // Nothing deleted: every message of every turn is still stored.
    let stored = h.history().await;
    let users = stored.iter().filter(|m| m.role == Role::User).count();
    assert_eq!(users, 200);
    let summaries: Vec<&Message> = stored.iter().filter(|m| m.metadata.compaction_summary.is_some()).collect();
    let notifications: Vec<&Message> = stored.iter().filter(|m| m.is_notification()).collect();
    assert!(summaries.len() >= 2, "several compactions happened: {}", summaries.len());
    assert_eq!(notifications.len(), summaries.len(), "one notification per compaction");
    assert!(notifications.iter().all(|n| n.content.starts_with(AUTO_NOTIFICATION)));
    assert_eq!(*model.summaries.lock().expect("lock"), summaries.len());
    // Every turn request fit the window (4 characters a token is generous for JSON text).
    let sizes = model.turn_request_chars.lock().expect("lock").clone();
    assert_eq!(sizes.len(), 200);
    let largest = sizes.iter().max().copied().unwrap_or(0);
    assert!(largest / 4 < 4000, "largest request ≈ {} tokens", largest / 4);
    // The model never saw a notification, and saw the summary.
    let view = compaction::apply_summaries(stored.clone());
    assert!(view.iter().any(|m| m.metadata.compaction_summary.is_some()));
    assert!(view.len() < stored.len());
    // Each compaction is a background maintenance activation in the ledger.
    let maintenance: Vec<_> =
        h.ledger().await.into_iter().filter(|r| r.kind == kesoku_core::ActivationKind::Maintenance).collect();
    assert_eq!(maintenance.len(), summaries.len());
    assert!(
        maintenance.iter().all(|r| r.lane == kesoku_core::Lane::Background && r.outcome == Some(Outcome::Succeeded))
    );
}

#[tokio::test]
async fn manual_compaction_summarizes_older_turns_and_can_be_undone() {
    let model = Echo::new(1_000_000);
    let mut h = Harness::start(vec![]).await;
    h.reboot_with_model(Arc::clone(&model) as Arc<dyn Model>, options()).await;
    for n in 0..8 {
        let user = h.post_user(&format!("question {n}")).await;
        h.wait_terminal(&user.id).await;
    }
    let before = h.history().await;
    let trigger = Message::compaction_trigger(
        &h.session.id,
        BOT,
        CHANNEL,
        "[System Notification] The user manually requested compaction of the conversation history.",
    );
    h.gateway.post(&trigger).await.expect("post");
    assert_eq!(h.wait_terminal(&trigger.id).await, Status::Processed);
    let after = h.history().await;
    assert_eq!(after.len(), before.len() + 3, "trigger, summary and notification added; nothing removed");
    let summary = after.iter().find(|m| m.metadata.compaction_summary.is_some()).expect("a summary");
    let range = summary.metadata.compaction_summary.clone().expect("range");
    // The first turn and the latest three (the trigger is the latest) are kept.
    let roots: Vec<&Message> = before.iter().filter(|m| m.parent_id.is_none()).collect();
    assert_eq!(range.first_turn, roots[1].id);
    assert_eq!(range.last_turn, roots[5].id);
    assert_eq!(range.turns, 5);
    let view = compaction::apply_summaries(after.clone());
    assert!(!view.iter().any(|m| m.content == "question 3"), "summarized turns are not shown");
    assert!(view.iter().any(|m| m.content == "question 0"), "the first turn is pinned");
    assert!(view.iter().any(|m| m.content == "question 7"), "recent turns are kept");
    assert_eq!(after.iter().filter(|m| m.is_notification()).count(), 1);

    // Undo: mark the summary undone and the full history is shown again.
    let mut metadata = summary.metadata.clone();
    if let Some(range) = metadata.compaction_summary.as_mut() {
        range.undone = true;
    }
    h.gateway.update_metadata(&summary.id, &metadata).await.expect("undo");
    let restored = compaction::apply_summaries(h.history().await);
    assert!(restored.iter().any(|m| m.content == "question 3"));
    assert!(!restored.iter().any(|m| m.metadata.compaction_summary.is_some()));
}

#[tokio::test]
async fn an_empty_summary_leaves_the_history_as_it_was() {
    let model = Echo::new(1_000_000);
    *model.summary.lock().expect("lock") = "   ".into();
    let mut h = Harness::start(vec![]).await;
    h.reboot_with_model(Arc::clone(&model) as Arc<dyn Model>, options()).await;
    for n in 0..8 {
        let user = h.post_user(&format!("question {n}")).await;
        h.wait_terminal(&user.id).await;
    }
    let trigger = Message::compaction_trigger(&h.session.id, BOT, CHANNEL, "[System Notification] compact please");
    h.gateway.post(&trigger).await.expect("post");
    assert_eq!(h.wait_terminal(&trigger.id).await, Status::Error);
    let after = h.history().await;
    assert!(!after.iter().any(|m| m.metadata.compaction_summary.is_some()), "no summary stored");
    let notice = after.last().expect("error notification");
    assert!(notice.content.contains("summary was unusable"), "{}", notice.content);
    let view = compaction::apply_summaries(after);
    assert!(view.iter().any(|m| m.content == "question 3"));
}

#[tokio::test]
async fn compaction_never_splits_a_tool_call_from_its_result() {
    // Turns with tool calls: the summary range always covers whole turns.
    let session = kesoku_core::SessionId::from("s");
    let mut history = Vec::new();
    for n in 0..6 {
        let user = Message::user_text(&session, BOT, CHANNEL, "Chii", format!("q{n}"));
        let origin = kesoku_core::TurnOrigin::of(&user, "Kesoku");
        let call = origin.tool_call(1, "c", "run_shell_command", serde_json::json!({"command": "true"}));
        let result = origin.tool_result(&call, "ok", None, None);
        let answer = origin.final_text(2, format!("a{n}"), None);
        history.extend([user, call, result, answer]);
    }
    let plan = compaction::plan(&history, 2).expect("a plan");
    let calls = plan.source.iter().filter(|m| m.message_type == MessageType::ToolCall).count();
    let results = plan.source.iter().filter(|m| m.message_type == MessageType::ToolResult).count();
    assert_eq!((calls, results), (3, 3));
    assert_eq!(plan.turns, 3);
}
