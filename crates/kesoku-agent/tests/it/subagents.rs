//! Sub-agents end to end over a real SQLite store: `delegate` starts a child one level deeper
//! in a session of its own; its answer comes back to the parent as a `sub_agent_result` turn;
//! a chain is refused at `[agent] max_depth` with a ledger row; a retried call makes one child;
//! a stopped parent stops its children and grandchildren; two keepers post a result once.
//!
//! The model is routed by what it is asked (several sessions run at once, so a fixed script's
//! order would be a race): each test says what a turn answers given its last input.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_agent::subagents::{AGENT_CHATBOT, DELEGATE, STOPPED_WITH_PARENT, child_ids, result_message_id};
use kesoku_agent::{AgentConfig, ResultKeeper, Subagents};
use kesoku_broker::{MemoryBroker, StopReason};
use kesoku_core::{
    ActivationKind, Lane, LedgerEntry, Message, MessageFilter, MessageId, MessageType, Outcome, Role, SessionId,
    Status, TurnOrigin,
};
use kesoku_gateway::Gateway;
use kesoku_llm::{LlmError, Model, ModelInfo, Part, Provider, Request, ResponseStream, ScriptStep, ScriptedModel};
use kesoku_store::SessionFilter;
use kesoku_tools::{GrantSecret, Grants, ToolContext, ToolOrigin};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::harness::{BOT, CHANNEL, Harness, Options, shape};

const PATIENCE: Duration = Duration::from_secs(20);

type Route = dyn Fn(&Request) -> ScriptStep + Send + Sync;

/// A model whose answer is chosen from the request by `route`.
struct Router {
    info: ModelInfo,
    route: Box<Route>,
    requests: Mutex<Vec<Request>>,
}

impl Router {
    fn new(route: impl Fn(&Request) -> ScriptStep + Send + Sync + 'static) -> Arc<Router> {
        let info = ModelInfo {
            provider: Provider::OpenAi,
            model: "router".to_owned(),
            context_window: 128_000,
            max_output_tokens: 4_096,
        };
        Arc::new(Router { info, route: Box::new(route), requests: Mutex::new(Vec::new()) })
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl Model for Router {
    fn name(&self) -> &str {
        "router"
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        self.requests.lock().unwrap_or_else(|p| p.into_inner()).push(request.clone());
        let step = (self.route)(request);
        ScriptedModel::new("router", vec![step]).stream(request).await
    }
}

/// The text of the request's last turn (what the model answers now).
fn last_input(request: &Request) -> String {
    let Some(turn) = request.turns.last() else { return String::new() };
    turn.parts
        .iter()
        .map(|part| match part {
            Part::Text { text, .. } => text.clone(),
            Part::ToolResult(result) => format!("[tool result] {result:?}"),
            other @ (Part::Thought { .. } | Part::ToolCall(_) | Part::Attachment(_)) => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn delegate(task: &str) -> ScriptStep {
    ScriptStep::tool_call(DELEGATE, json!({ "task": task }))
}

async fn start(
    route: impl Fn(&Request) -> ScriptStep + Send + Sync + 'static,
    max_depth: u32,
) -> (Harness, Arc<Router>) {
    let router = Router::new(route);
    let mut h = Harness::start(Vec::new()).await;
    let options =
        Options { config: AgentConfig { max_depth, ..AgentConfig::default() }, delegate: true, ..Options::default() };
    h.reboot_with_model(Arc::clone(&router) as Arc<dyn Model>, options).await;
    (h, router)
}

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ledger once it holds `count` rows, every one finished.
async fn settled_ledger(h: &Harness, count: usize) -> Vec<LedgerEntry> {
    eventually(&format!("{count} finished ledger rows"), || async {
        let rows = h.ledger().await;
        (rows.len() >= count && rows.iter().all(|row| row.outcome.is_some())).then_some(rows)
    })
    .await
}

async fn history_of(h: &Harness, session: &SessionId) -> Vec<Message> {
    h.handle.store.session_history(session).await.expect("history")
}

async fn children_of(h: &Harness, session: &SessionId) -> Vec<kesoku_core::Session> {
    let filter = SessionFilter {
        chatbot_id: Some(AGENT_CHATBOT.to_owned()),
        channel_id: Some(session.to_string()),
        limit: None,
    };
    h.handle.store.list_sessions(&filter).await.expect("sessions")
}

fn row(rows: &[LedgerEntry], kind: ActivationKind, depth: u32) -> Vec<&LedgerEntry> {
    rows.iter().filter(|r| r.kind == kind && r.depth == depth).collect()
}

#[tokio::test]
async fn a_sub_agent_answers_and_its_result_turn_runs_in_the_parent() {
    let (h, router) = start(
        |request| {
            let input = last_input(request);
            if input.contains("[Sub-agent result]") {
                ScriptStep::text("The moon is about 384,400 km away.")
            } else if input.contains("[tool result]") {
                ScriptStep::text("I asked a sub-agent; I will tell you when it answers.")
            } else if input.contains("Find the mean distance") {
                ScriptStep::text("384,400 km")
            } else {
                delegate("Find the mean distance from the Earth to the moon.")
            }
        },
        3,
    )
    .await;
    let root = h.post_user("How far is the moon?").await;
    let rows = settled_ledger(&h, 3).await;

    // The parent: the person's turn delegated and answered at once; the result came back as a
    // system-made root and its turn answered the person.
    let parent = h.history().await;
    assert_eq!(
        shape(&parent),
        vec![
            (Role::User, MessageType::Text, "Chii".to_owned(), Status::Processed),
            (Role::Tool, MessageType::ToolCall, "Kesoku".to_owned(), Status::Responded),
            (Role::Tool, MessageType::ToolResult, DELEGATE.to_owned(), Status::Responded),
            (Role::Assistant, MessageType::Text, "Kesoku".to_owned(), Status::Pending),
            (Role::System, MessageType::Text, "System".to_owned(), Status::Processed),
            (Role::Assistant, MessageType::Text, "Kesoku".to_owned(), Status::Pending),
        ],
        "{parent:#?}"
    );
    assert_eq!(parent[0].id, root.id);
    let children = children_of(&h, &h.session.id).await;
    assert_eq!(children.len(), 1, "one child session");
    let child = &children[0];
    let (child_session, child_root) = child_ids(&root.id, "call_1");
    assert_eq!(child.id, child_session);
    assert!(parent[2].content.contains(&format!("Delegated to sub-agent session {child_session} (depth 1)")));
    let result = &parent[4];
    assert_eq!(result.id, result_message_id(&child_root));
    assert!(result.content.starts_with("[Sub-agent result] The sub-agent you delegated a task to finished"));
    assert!(result.content.ends_with("384,400 km"), "{}", result.content);
    assert_eq!((result.chatbot_id.as_str(), result.channel_id.as_str()), (BOT, CHANNEL));
    let request = result.metadata.activation.as_ref().expect("an activation request");
    assert_eq!(request.kind, ActivationKind::SubAgentResult);
    assert_eq!(request.child_session_id.as_ref(), Some(&child_session));
    assert_eq!(request.depth, 0);
    assert_eq!(parent[5].content, "The moon is about 384,400 km away.");

    // The child: its own session (chatbot `agent`, channel = the parent session), the task from
    // the delegating agent, its answer final (nobody else delivers chatbot `agent`).
    assert_eq!((child.chatbot_id.as_str(), child.channel_id.as_str()), (AGENT_CHATBOT, h.session.id.as_str()));
    let child_history = history_of(&h, &child_session).await;
    assert_eq!(
        shape(&child_history),
        vec![
            (Role::User, MessageType::Text, "Kesoku".to_owned(), Status::Processed),
            (Role::Assistant, MessageType::Text, "Kesoku".to_owned(), Status::Delivered),
        ]
    );
    assert_eq!(child_history[0].id, child_root);
    assert_eq!(child_history[0].content, "Find the mean distance from the Earth to the moon.");
    let task = child_history[0].metadata.activation.as_ref().expect("the child's request");
    let parent_ref = task.parent.as_ref().expect("a parent");
    assert_eq!((&parent_ref.session_id, &parent_ref.message_id), (&h.session.id, &root.id));
    // The channel's active session is still the parent's.
    assert_eq!(h.handle.store.active_session(BOT, CHANNEL).await.expect("active"), Some(h.session.id.clone()));
    // The child saw its task, not the parent's conversation.
    let child_request = router
        .requests()
        .into_iter()
        .find(|r| last_input(r).contains("Find the mean distance"))
        .expect("the child's request");
    assert!(!format!("{:?}", child_request.turns).contains("How far is the moon?"));

    // The ledger: depth 0 for the person's turn and the result turn, depth 1 for the child,
    // each on its kind's lane, the child triggered by the parent's activation.
    let kinds: Vec<(ActivationKind, Lane, u32, Option<Outcome>)> =
        rows.iter().map(|r| (r.kind, r.lane, r.depth, r.outcome)).collect();
    assert_eq!(
        kinds,
        vec![
            (ActivationKind::Message, Lane::Interactive, 0, Some(Outcome::Succeeded)),
            (ActivationKind::DirectTrigger, Lane::Responsive, 1, Some(Outcome::Succeeded)),
            (ActivationKind::SubAgentResult, Lane::Responsive, 0, Some(Outcome::Succeeded)),
        ]
    );
    assert_eq!(rows[1].triggered_by, format!("agent:{}", rows[0].id));
    assert_eq!(rows[1].session_id, child_session);
    assert_eq!(rows[2].triggered_by, format!("sub-agent:{child_session}"));
    assert_eq!(rows[2].session_id, h.session.id);
}

#[tokio::test]
async fn a_chain_of_sub_agents_is_refused_beyond_max_depth() {
    let (h, router) = start(
        |request| {
            let input = last_input(request);
            if input.contains("[Sub-agent result]") {
                ScriptStep::text("level done")
            } else if input.contains("delegation refused") {
                ScriptStep::text("I cannot go deeper; here is what I have.")
            } else if input.contains("[tool result]") {
                ScriptStep::text("delegated")
            } else {
                delegate("Go one level deeper.")
            }
        },
        2,
    )
    .await;
    h.post_user("Start the chain.").await;
    // Depth 0 (the person), 1, 2 run; the call at depth 2 is refused (depth 3); each child's
    // turns report back: C (depth 2) once to B, B twice to A (its first turn, then its result turn).
    let rows = settled_ledger(&h, 7).await;
    let depths: Vec<(ActivationKind, u32, Option<Outcome>)> =
        rows.iter().map(|r| (r.kind, r.depth, r.outcome)).collect();
    assert_eq!(row(&rows, ActivationKind::Message, 0).len(), 1, "{depths:?}");
    assert_eq!(row(&rows, ActivationKind::DirectTrigger, 1).len(), 1, "{depths:?}");
    assert_eq!(row(&rows, ActivationKind::DirectTrigger, 2).len(), 1, "{depths:?}");
    let refused = row(&rows, ActivationKind::DirectTrigger, 3);
    assert_eq!(refused.len(), 1, "{depths:?}");
    let refused = refused[0];
    assert_eq!(refused.outcome, Some(Outcome::Refused));
    assert_eq!(refused.lane, Lane::Responsive);
    assert!(refused.started_at.is_some() && refused.finished_at.is_some());
    let error = refused.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("delegation refused: this agent runs at depth 2 and the limit is 2 ([agent] max_depth)"),
        "{error}"
    );
    // The refused row belongs to the depth-2 session, triggered by its activation; nothing ran.
    let level2 = row(&rows, ActivationKind::DirectTrigger, 2)[0];
    assert_eq!(refused.session_id, level2.session_id);
    assert_eq!(refused.triggered_by, format!("agent:{}", level2.id));
    assert_eq!(refused.message_id, None);
    assert!(children_of(&h, &level2.session_id).await.is_empty(), "no session at depth 3");
    // Each level's parent is the level above.
    let level1 = row(&rows, ActivationKind::DirectTrigger, 1)[0];
    assert_eq!(level2.triggered_by, format!("agent:{}", level1.id));
    assert_eq!(level1.triggered_by, format!("agent:{}", row(&rows, ActivationKind::Message, 0)[0].id));
    assert_eq!(row(&rows, ActivationKind::SubAgentResult, 1).len(), 1, "{depths:?}");
    assert_eq!(row(&rows, ActivationKind::SubAgentResult, 0).len(), 2, "{depths:?}");
    assert!(rows.iter().filter(|r| r.outcome != Some(Outcome::Refused)).all(|r| r.outcome == Some(Outcome::Succeeded)));
    // The refusing turn's tool result says why, and the model read it.
    let level2_history = history_of(&h, &level2.session_id).await;
    let refusal =
        level2_history.iter().find(|m| m.message_type == MessageType::ToolResult).expect("the refused call's result");
    assert_eq!(refusal.metadata.tool_error.as_deref(), Some(error));
    assert!(router.requests().iter().any(|r| last_input(r).contains("delegation refused: this agent runs at depth 2")));
    // Every message of a sub-agent session reaches its final status.
    for row in [level1, level2] {
        eventually("the sub-agent's messages final", || async {
            let history = history_of(&h, &row.session_id).await;
            history.iter().all(|m| matches!(m.status, Status::Processed | Status::Delivered)).then_some(())
        })
        .await;
    }
}

/// The connections of a person (none here): the delegation user is all the tool reads.
#[derive(Debug)]
struct PersonGrants(&'static str);

#[async_trait]
impl Grants for PersonGrants {
    fn user(&self) -> &str {
        self.0
    }

    async fn grant(&self, _name: &str) -> Result<Option<GrantSecret>, String> {
        Ok(None)
    }
}

/// A tool context of `root`'s turn at `depth`, as the turn loop makes it.
fn ctx_of(h: &Harness, root: &Message, depth: u32, call_id: &str) -> ToolContext {
    let workspace = h.dir.path().join("workspace");
    let staging = workspace.join("sessions").join(root.session_id.as_str());
    ToolContext::new(workspace, staging, root.session_id.clone(), call_id).with_origin(ToolOrigin {
        message_id: root.id.clone(),
        chatbot_id: root.chatbot_id.clone(),
        channel_id: root.channel_id.clone(),
        timezone: None,
        depth,
        activation_id: Some(kesoku_core::ActivationId::from("act_parent")),
    })
}

#[tokio::test]
async fn a_delegate_call_run_again_after_a_crash_makes_one_child() {
    let (h, _router) = start(|_| ScriptStep::text("done"), 3).await;
    // A turn's root, already answered (the crash is simulated by running its call twice).
    let root = Message::user_text(&h.session.id, BOT, CHANNEL, "Chii", "delegate something");
    let root = h.gateway.post(&root).await.expect("post").message;
    h.wait_terminal(&root.id).await;
    let subagents = Subagents::new(h.gateway.clone(), Arc::clone(&h.handle.ledger), 3, "Kesoku");
    let ctx = ctx_of(&h, &root, 0, "call_abc").with_grants(Arc::new(PersonGrants("ana")));
    let first = subagents.delegate(&ctx, "Count to three.").await.expect("delegated");
    let second = subagents.delegate(&ctx, "Count to three.").await.expect("delegated again");
    assert_eq!(first, second);
    assert_eq!(children_of(&h, &h.session.id).await.len(), 1);
    let child_messages = h
        .handle
        .store
        .list_messages(&MessageFilter::session(&first.session_id).with_roles(&[Role::User]))
        .await
        .expect("list");
    assert_eq!(child_messages.len(), 1, "one task root");
    // It ran once and reported once.
    let result = result_message_id(&first.root_id);
    eventually("the result", || async { h.handle.store.get_message(&result).await.expect("get") }).await;
    h.wait_terminal(&result).await;
    let rows = settled_ledger(&h, 3).await;
    let child_rows = row(&rows, ActivationKind::DirectTrigger, 1);
    assert_eq!(child_rows.len(), 1);
    let result_rows = row(&rows, ActivationKind::SubAgentResult, 0);
    assert_eq!(result_rows.len(), 1);
    // The person the parent worked for is the sub-agent's, and its result's, delegation user.
    assert_eq!(child_rows[0].delegation_user.as_deref(), Some("ana"));
    assert_eq!(result_rows[0].delegation_user.as_deref(), Some("ana"));
    assert_eq!(child_rows[0].triggered_by, "agent:act_parent");
    // Another call of the same turn is another child.
    let other = subagents.delegate(&ctx_of(&h, &root, 0, "call_def"), "Count to four.").await.expect("delegated");
    assert_ne!(other.session_id, first.session_id);
    assert_eq!(children_of(&h, &h.session.id).await.len(), 2);
}

#[tokio::test]
async fn stopping_a_parent_stops_its_child_and_grandchild() {
    let (h, router) = start(
        |request| {
            let input = last_input(request);
            if input.contains("[tool result]") || input.contains("Level two") {
                // Each level works on (hangs) after delegating; the grandchild just works.
                ScriptStep::hang()
            } else if input.contains("Level one") {
                delegate("Level two: dig deeper.")
            } else {
                delegate("Level one: dig.")
            }
        },
        3,
    )
    .await;
    let root = h.post_user("Dig.").await;
    // Wait until the grandchild runs.
    let rows = eventually("three running turns", || async {
        let rows = h.ledger().await;
        (rows.len() == 3 && rows.iter().all(|r| r.started_at.is_some())).then_some(rows)
    })
    .await;
    let (child_session, child_root) = child_ids(&root.id, "call_1");
    let (grandchild_session, grandchild_root) = child_ids(&child_root, "call_1");
    h.wait_status(&grandchild_root, &[Status::Processing]).await;
    assert_eq!(rows[2].session_id, grandchild_session);

    h.agent.stop_session(&h.session.id, StopReason::UserRequest).await.expect("stop");
    for id in [&root.id, &child_root, &grandchild_root] {
        assert_eq!(h.wait_terminal(id).await, Status::Interrupted, "{id}");
    }
    let rows = settled_ledger(&h, 3).await;
    assert!(rows.iter().all(|r| r.outcome == Some(Outcome::Interrupted)), "{rows:?}");
    // Stopped with their parent: marked so, and none reports back (no result turn anywhere).
    for (session, id) in [(&child_session, &child_root), (&grandchild_session, &grandchild_root)] {
        let stored = h.handle.store.get_message(id).await.expect("get").expect("exists");
        assert_eq!(stored.metadata.extra.get(STOPPED_WITH_PARENT), Some(&json!(true)), "{session}");
    }
    // Give the keeper every chance to (wrongly) post: wait until all three roots' turn
    // messages are final, then check nothing was posted.
    eventually("the child's turn messages final", || async {
        let history = history_of(&h, &child_session).await;
        history.iter().all(|m| !m.awaits_delivery()).then_some(())
    })
    .await;
    for id in [&child_root, &grandchild_root] {
        assert_eq!(h.handle.store.get_message(&result_message_id(id)).await.expect("get"), None);
    }
    assert_eq!(h.ledger().await.len(), 3, "no result turn ran");
    // A and B: a delegating step, then one that hung; the grandchild: one that hung.
    assert_eq!(router.requests().len(), 5);
}

#[tokio::test]
async fn an_interrupted_parent_turn_stops_a_waiting_child() {
    // The child is posted but cannot run yet (its session's worker is held by nothing: the
    // child is created by hand, its root left waiting while no agent runs).
    let (mut h, _router) = start(|_| ScriptStep::hang(), 3).await;
    h.shut_down().await;
    let root = Message::user_text(&h.session.id, BOT, CHANNEL, "Chii", "delegate");
    let root = h.gateway.post(&root).await.expect("post").message;
    let subagents = Subagents::new(h.gateway.clone(), Arc::clone(&h.handle.ledger), 3, "Kesoku");
    let child = subagents.delegate(&ctx_of(&h, &root, 0, "call_1"), "wait").await.expect("delegated");
    let keeper = ResultKeeper::new(h.gateway.clone());
    let stopped = keeper.stop_children(&h.session.id, Some(&root.id)).await.expect("stop");
    assert_eq!(stopped, 1);
    assert_eq!(h.status_of(&child.root_id).await, Status::Interrupted);
    // Another turn's children are left alone.
    let again = keeper.stop_children(&h.session.id, Some(&MessageId::from("msg_other"))).await.expect("stop");
    assert_eq!(again, 0);
}

#[tokio::test]
async fn two_keepers_post_a_missed_result_once_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("kesoku.db").display());
    let handle = kesoku_store::open(&url).await.expect("open store");
    // Two processes: one store, a broker each.
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    let other = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    let session = gateway.resolve_session(BOT, CHANNEL).await.expect("session");
    let root = Message::user_text(&session.id, BOT, CHANNEL, "Chii", "delegate");
    let root = gateway.post(&root).await.expect("post").message;
    let subagents = Subagents::new(gateway.clone(), Arc::clone(&handle.ledger), 3, "Kesoku");
    let workspace = dir.path().join("workspace");
    let ctx = ToolContext::new(workspace.clone(), workspace, session.id.clone(), "call_1").with_origin(ToolOrigin {
        message_id: root.id.clone(),
        chatbot_id: BOT.to_owned(),
        channel_id: CHANNEL.to_owned(),
        timezone: None,
        depth: 0,
        activation_id: None,
    });
    let child = subagents.delegate(&ctx, "Say hi.").await.expect("delegated");
    // The child's turn ran and ended while no keeper ran.
    gateway.claim(&child.root_id, Status::Processing, &[Status::PendingAgent], "w").await.expect("claim");
    let child_root = handle.store.get_message(&child.root_id).await.expect("get").expect("exists");
    let answer = TurnOrigin::of(&child_root, "Kesoku").final_text(1, "hi", None);
    let answer = gateway.post(&answer).await.expect("answer").message;
    gateway.update_status(&child.root_id, Status::Processed).await.expect("processed");

    let shutdown = CancellationToken::new();
    let keepers = [
        tokio::spawn(ResultKeeper::new(gateway.clone()).run(shutdown.clone())),
        tokio::spawn(ResultKeeper::new(other.clone()).run(shutdown.clone())),
    ];
    // And two more racing on the same root directly.
    let child_root = handle.store.get_message(&child.root_id).await.expect("get").expect("exists");
    let (first, second) = (ResultKeeper::new(gateway.clone()), ResultKeeper::new(other.clone()));
    let (a, b) = tokio::join!(first.report(&child_root), second.report(&child_root));
    let posted = [a.expect("report"), b.expect("report")];
    assert!(posted.iter().filter(|p| **p).count() <= 1, "{posted:?}");
    let result_id = result_message_id(&child.root_id);
    let result = eventually("the result", || async { handle.store.get_message(&result_id).await.expect("get") }).await;
    eventually("the answer delivered", || async {
        let status = handle.store.get_message(&answer.id).await.expect("get").map(|m| m.status);
        (status == Some(Status::Delivered)).then_some(())
    })
    .await;
    shutdown.cancel();
    for keeper in keepers {
        keeper.await.expect("keeper ends");
    }
    let results: Vec<Message> = handle
        .store
        .session_history(&session.id)
        .await
        .expect("history")
        .into_iter()
        .filter(|m| m.content.starts_with("[Sub-agent result]"))
        .collect();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0], result);
    assert_eq!((result.role, result.status), (Role::System, Status::PendingAgent));
    assert!(result.content.ends_with("\n\nhi"), "{}", result.content);
}

#[tokio::test]
async fn a_root_deeper_than_max_depth_is_closed_and_refused() {
    let (h, router) = start(|_| ScriptStep::text("should not run"), 1).await;
    // A root posted by other means than `delegate`, two levels deep.
    let mut message = Message::direct_trigger(&h.session.id, BOT, CHANNEL, "too deep");
    message.metadata.activation = Some(Box::new(kesoku_core::ActivationRequest {
        depth: 2,
        ..kesoku_core::ActivationRequest::new(ActivationKind::DirectTrigger)
    }));
    let message = h.gateway.post(&message).await.expect("post").message;
    assert_eq!(h.wait_terminal(&message.id).await, Status::Error);
    let rows = h.finished_ledger_for(&message.id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].depth, rows[0].outcome), (2, Some(Outcome::Refused)));
    assert!(rows[0].error.as_deref().unwrap_or_default().contains("depth limit of 1"), "{rows:?}");
    assert!(router.requests().is_empty(), "no model call");
    let notice = h.wait_for(|m| m.parent_id.as_ref() == Some(&message.id)).await;
    assert!(notice.content.starts_with(kesoku_core::message::ERROR_NOTIFICATION_PREFIX), "{notice:?}");
    assert!(notice.content.contains("depth limit of 1"), "{notice:?}");
}
