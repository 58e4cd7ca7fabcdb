//! The CLI chatbot: what a whole turn looks like, plain and rich, and following a turn live.

use std::time::Duration;

use async_trait::async_trait;
use kesoku_chatbots::cli::{CliChatbot, RenderMode, TurnOutcome};
use kesoku_chatbots::commands::{SessionControl, StopAck, TurnStop};
use kesoku_chatbots::{ChatbotError, Deliverer};
use kesoku_core::{SessionId, Status, TurnOrigin};

use crate::support::{Captured, fixture, tool_turn};

/// Renders `messages` (all but the root) through a plain CLI chatbot.
async fn plain_transcript() -> String {
    let fixture = fixture().await;
    let captured = Captured::default();
    let chatbot = CliChatbot::with_writer(RenderMode::Plain, 80, Box::new(captured.clone()));
    let turn = tool_turn(&fixture.session);
    let mut long_result = TurnOrigin::of(&turn[0], "Kesoku").tool_result(
        &turn[2],
        (1..=25).map(|n| format!("line {n}")).collect::<Vec<_>>().join("\n"),
        None,
        Some("exit status 1".into()),
    );
    long_result.step = 1;
    let notice = TurnOrigin::of(&turn[0], "Kesoku").notification("🔄 History compacted.");
    let deliverer = Deliverer::new(fixture.gateway.clone(), fixture.workspace());
    for message in turn.iter().skip(1).chain([&long_result, &notice]) {
        fixture.gateway.post(message).await.expect("post");
        deliverer.deliver(&chatbot, message).await.expect("deliver");
    }
    captured.text()
}

#[tokio::test]
async fn a_turn_in_plain_mode_is_readable_uncoloured_text() {
    let text = plain_transcript().await;
    assert!(!text.contains('\u{1b}'), "no escape codes in plain mode: {text:?}");
    let expected_start = "💭 Thought\nI will use the shell.\n\n🔧 run_shell_command\n$ echo $((25 + 15))\n\n\
                          ✅ run_shell_command\n=== STDOUT ===\n40\n\n\
                          The answer is **40**.\n[turn 1 · context 1,234 tokens · 1 tool call · 56 tokens · 1.2 s]\n\n\
                          ❌ run_shell_command: exit status 1\n… (5 earlier lines not shown)\nline 6\n";
    assert!(text.starts_with(expected_start), "{text}");
    assert!(text.contains("line 25\n\n🔔 🔄 History compacted.\n"), "{text}");
    assert!(!text.contains("line 5\n"), "only the last 20 lines of a long result: {text}");
}

#[tokio::test]
async fn a_turn_in_rich_mode_is_coloured_and_boxed() {
    let fixture = fixture().await;
    let captured = Captured::default();
    let chatbot = CliChatbot::with_writer(RenderMode::Rich, 60, Box::new(captured.clone()));
    let deliverer = Deliverer::new(fixture.gateway.clone(), fixture.workspace());
    for message in tool_turn(&fixture.session).iter().skip(1) {
        fixture.gateway.post(message).await.expect("post");
        deliverer.deliver(&chatbot, message).await.expect("deliver");
    }
    let text = captured.text();
    assert!(text.contains("\u{1b}[36m╭─ 💭 Thought"), "cyan thought panel: {text:?}");
    assert!(text.contains("\u{1b}[33m╭─ 🔧 run_shell_command"), "yellow call panel: {text:?}");
    assert!(text.contains("\u{1b}[35m╭─ ✅ run_shell_command"), "magenta result panel: {text:?}");
    let plain = console::strip_ansi_codes(&text);
    assert!(plain.contains("The answer is 40.") && !plain.contains("**"), "Markdown rendered: {plain}");
}

struct NoControl;

#[async_trait]
impl SessionControl for NoControl {
    async fn stop_session(&self, _session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        Ok(StopAck { turn: TurnStop::Unreachable("Not from here.".into()), interrupted_waiting: 0 })
    }
}

#[tokio::test]
async fn following_a_turn_renders_its_steps_and_returns_when_the_root_ends() {
    let fixture = fixture().await;
    let gateway = fixture.gateway.clone();
    let deliverer = Deliverer::new(gateway.clone(), fixture.workspace());
    let captured = Captured::default();
    let chatbot = CliChatbot::with_writer(RenderMode::Plain, 80, Box::new(captured.clone()));
    let turn = tool_turn(&fixture.session);
    let after = gateway.store().current_rev().await.expect("rev");
    gateway.post(&turn[0]).await.expect("post root");
    let agent = {
        let gateway = gateway.clone();
        let turn = turn.clone();
        tokio::spawn(async move {
            gateway.update_status(&turn[0].id, Status::Processing).await.expect("claim");
            for message in &turn[1..] {
                gateway.post(message).await.expect("post step");
            }
            gateway.update_status(&turn[0].id, Status::Processed).await.expect("finish");
        })
    };
    let (_interrupt, mut interrupts) = tokio::sync::mpsc::unbounded_channel();
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        chatbot.follow_turn(&deliverer, &fixture.session.id, &turn[0].id, after, &NoControl, &mut interrupts),
    )
    .await
    .expect("the turn ends")
    .expect("following works");
    agent.await.expect("the fake agent ran");
    assert_eq!(outcome, TurnOutcome::Processed);
    let text = captured.text();
    assert!(text.contains("💭 Thought") && text.contains("The answer is **40**."), "{text}");
    for message in &turn[1..] {
        let stored = gateway.store().get_message(&message.id).await.expect("read").expect("exists");
        assert_eq!(stored.status, Status::Delivered);
    }
}

#[tokio::test]
async fn a_second_interrupt_stops_waiting_when_the_turn_cannot_be_stopped() {
    let fixture = fixture().await;
    let gateway = fixture.gateway.clone();
    let deliverer = Deliverer::new(gateway.clone(), fixture.workspace());
    let captured = Captured::default();
    let chatbot = CliChatbot::with_writer(RenderMode::Plain, 80, Box::new(captured.clone()));
    let turn = tool_turn(&fixture.session);
    let after = gateway.store().current_rev().await.expect("rev");
    gateway.post(&turn[0]).await.expect("post root");
    let (interrupt, mut interrupts) = tokio::sync::mpsc::unbounded_channel();
    interrupt.send(()).expect("first Ctrl-C");
    interrupt.send(()).expect("second Ctrl-C");
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        chatbot.follow_turn(&deliverer, &fixture.session.id, &turn[0].id, after, &NoControl, &mut interrupts),
    )
    .await
    .expect("returns")
    .expect("following works");
    assert_eq!(outcome, TurnOutcome::Detached);
    let text = captured.text();
    assert!(text.contains("Not from here. Press Ctrl-C again to stop waiting."), "{text}");
    assert!(text.contains("Stopped waiting"), "{text}");
}

/// Follow `turn`'s root while `agent` plays the runtime's part; the outcome.
async fn follow_while(
    agent: impl FnOnce(kesoku_gateway::Gateway, Vec<kesoku_core::Message>) -> tokio::task::JoinHandle<()>,
) -> TurnOutcome {
    let fixture = fixture().await;
    let gateway = fixture.gateway.clone();
    let deliverer = Deliverer::new(gateway.clone(), fixture.workspace());
    let chatbot = CliChatbot::with_writer(RenderMode::Plain, 80, Box::new(Captured::default()));
    let turn = tool_turn(&fixture.session);
    let after = gateway.store().current_rev().await.expect("rev");
    gateway.post(&turn[0]).await.expect("post root");
    let agent = agent(gateway.clone(), turn.clone());
    let (_interrupt, mut interrupts) = tokio::sync::mpsc::unbounded_channel();
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        chatbot.follow_turn(&deliverer, &fixture.session.id, &turn[0].id, after, &NoControl, &mut interrupts),
    )
    .await
    .expect("the turn ends")
    .expect("following works");
    agent.await.expect("the fake agent ran");
    outcome
}

#[tokio::test]
async fn a_pass_to_the_next_agent_of_the_channel_is_waited_through_but_a_requeue_is_not() {
    // Ana passes: the root names Ben and goes back to `pending_agent`; Ben answers.
    let outcome = follow_while(|gateway, turn| {
        tokio::spawn(async move {
            let root = &turn[0].id;
            gateway.update_status(root, Status::Processing).await.expect("claim");
            let mut metadata = turn[0].metadata.clone();
            let round =
                kesoku_core::Orchestration { agents: vec!["Ana".into(), "Ben".into()], index: 1, no_reply_streak: 1 };
            metadata.activation = Some(Box::new(kesoku_core::ActivationRequest {
                agent: Some("Ben".into()),
                orchestration: Some(round),
                ..kesoku_core::ActivationRequest::new(kesoku_core::ActivationKind::Message)
            }));
            gateway.update_metadata(root, &metadata).await.expect("next agent");
            gateway.update_status(root, Status::PendingAgent).await.expect("handed on");
            gateway.update_status(root, Status::Processing).await.expect("Ben claims");
            for message in &turn[1..] {
                gateway.post(message).await.expect("post step");
            }
            gateway.update_status(root, Status::Processed).await.expect("finish");
        })
    })
    .await;
    assert_eq!(outcome, TurnOutcome::Processed);

    // Handed back outside a round (a shutdown): the CLI stops following.
    let outcome = follow_while(|gateway, turn| {
        tokio::spawn(async move {
            gateway.update_status(&turn[0].id, Status::Processing).await.expect("claim");
            gateway.update_status(&turn[0].id, Status::PendingAgent).await.expect("requeued");
        })
    })
    .await;
    assert_eq!(outcome, TurnOutcome::Requeued);
}
