//! Access at load time and what a configured agent is shown: the per-agent view of a shared
//! session, the channel-context and thread-context entries.

use kesoku_agent::{AgentConfig, AgentPersona, Personas};
use kesoku_core::activation::{ActivationKind, ActivationRequest};
use kesoku_core::{Message, MessageType, Outcome, Role, Session, Status, ThreadRef};
use kesoku_llm::{Request, ScriptStep};
use serde_json::json;

use crate::harness::{BOT, CHANNEL, Harness, Options};

fn persona(name: &str, channels: &[&str]) -> AgentPersona {
    AgentPersona::sitting_in(name, channels)
}

/// Ana and Ryan share the harness's channel; Cai sits elsewhere.
fn team() -> Personas {
    let here = format!("{BOT}:{CHANNEL}");
    Personas::new(vec![persona("Ana", &[&here]), persona("Ryan", &[&here]), persona("Cai", &["discord:elsewhere"])])
}

/// A person's message in `channel` that asks for `agent`, as routing at intake leaves it.
fn asking(session: &Session, channel: &str, agent: &str, content: &str) -> Message {
    let mut message = Message::user_text(&session.id, BOT, channel, "Chii", content);
    let mut request = ActivationRequest::new(ActivationKind::Message);
    request.agent = Some(agent.to_owned());
    message.metadata.activation = Some(Box::new(request));
    message
}

/// A finished message of an earlier turn, stored as a turn leaves it.
fn stored(session: &Session, channel: &str, sender: &str, content: &str) -> Message {
    let mut message = Message::user_text(&session.id, BOT, channel, sender, content);
    message.status = Status::Processed;
    message
}

/// A step of `agent`'s turn on `parent`.
fn step_of(parent: &Message, agent: &str, role: Role, kind: MessageType, content: &str) -> Message {
    let mut message = Message::user_text(&parent.session_id, BOT, &parent.channel_id, agent, content);
    message.role = role;
    message.message_type = kind;
    message.parent_id = Some(parent.id.clone());
    message.status = Status::Responded;
    message.step = 1;
    message.metadata.agent = Some(agent.into());
    message
}

fn requests_text(requests: &[Request]) -> String {
    requests.iter().map(|r| format!("{:?}", r.turns)).collect::<Vec<_>>().join("\n")
}

/// The text of the virtual entry starting with `header` in the first request (it is escaped
/// as Debug output, which is enough to look for lines in it).
fn entry(requests: &[Request], header: &str) -> Option<String> {
    let text = format!("{:?}", requests.first()?.turns);
    let start = text.find(header)?;
    let rest = &text[start..];
    let end = rest.find("\", signature").unwrap_or(rest.len());
    Some(rest[..end].to_owned())
}

#[tokio::test]
async fn a_denied_load_is_a_ledger_error_and_no_model_sees_the_message() {
    let options = Options { personas: team(), ..Options::default() };
    let h = Harness::start_with(vec![ScriptStep::text("never")], options).await;
    // Cai does not sit in this channel.
    let root = h.gateway.post(&asking(&h.session, CHANNEL, "Cai", "the launch code is 4417")).await.expect("post");
    let root = root.message;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Error);

    let rows = h.finished_ledger_for(&root.id).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Some(Outcome::Failed));
    assert_eq!(
        rows[0].error.as_deref(),
        Some("access denied: agent `Cai` does not sit in discord:1234567890123 ([[agents]] channels)")
    );
    // The model got nothing at all, so nothing of the message.
    assert!(h.model.requests().is_empty(), "the model was asked: {:?}", h.model.requests());
    // The notice says who cannot read where and how to fix it, without the message's text.
    let notice = h.wait_for(|m| m.parent_id.as_ref() == Some(&root.id) && m.role == Role::Assistant).await;
    assert!(notice.content.contains("Cai") && notice.content.contains("[[agents]]"), "{}", notice.content);
    assert!(!notice.content.contains("4417") && !notice.content.contains("launch"), "{}", notice.content);
}

#[tokio::test]
async fn a_membership_removed_while_work_waited_is_enforced_at_load_time() {
    // The config at run time: Ryan no longer sits in the channel.
    let here = format!("{BOT}:{CHANNEL}");
    let now = Personas::new(vec![persona("Ana", &[&here]), persona("Ryan", &["discord:elsewhere"])]);
    let mut h =
        Harness::start_with(vec![ScriptStep::text("never")], Options { personas: now, ..Options::default() }).await;
    h.shut_down().await;
    // Queued while Ryan sat there: the activation names Ryan (as routing at intake made it).
    let root = h.gateway.post(&asking(&h.session, CHANNEL, "Ryan", "private figures")).await.expect("post");
    let activation = kesoku_core::Activation {
        id: kesoku_core::ActivationId::generate(),
        session_id: h.session.id.clone(),
        chatbot_id: BOT.into(),
        channel_id: CHANNEL.into(),
        triggered_by: "Chii".into(),
        delegation_user: None,
        depth: 0,
        agent: Some("Ryan".into()),
        orchestration: None,
        lane: kesoku_core::Lane::Interactive,
        expected_response: Default::default(),
        locale: None,
        timezone: None,
        model: None,
        output_schema: None,
        created_at: chrono::Utc::now(),
        payload: kesoku_core::ActivationPayload::Message { message_id: root.message.id.clone() },
    };
    h.handle.ledger.record_enqueued(&kesoku_core::LedgerEntry::enqueued(&activation)).await.expect("ledger");
    h.agent.run_activation(&activation).await;

    let row = h.handle.ledger.get_activation(&activation.id).await.expect("get").expect("row");
    assert_eq!(row.outcome, Some(Outcome::Failed));
    assert_eq!(
        row.error.as_deref(),
        Some("access denied: agent `Ryan` does not sit in discord:1234567890123 ([[agents]] channels)")
    );
    assert_eq!(h.status_of(&root.message.id).await, Status::Error);
    assert!(h.model.requests().is_empty());
}

#[tokio::test]
async fn a_persona_sees_its_own_steps_and_another_agents_answer_only_as_channel_context() {
    let options = Options { personas: team(), ..Options::default() };
    let h = Harness::start_with(vec![ScriptStep::text("Ryan here")], options).await;
    // Ana answered a first question, with a tool call; Ryan answered a second one.
    let first = stored(&h.session, CHANNEL, "Chii", "how many users signed up?");
    let mut call = step_of(&first, "Ana", Role::Tool, MessageType::ToolCall, "Calling tool `count`");
    call.metadata.tool_name = Some("count".to_owned());
    call.metadata.tool_call_id = Some("call_ana_1".to_owned());
    call.metadata.tool_arguments = Some(json!({"table": "users"}));
    let mut result = step_of(&call, "Ana", Role::Tool, MessageType::ToolResult, "ANA-TOOL-OUTPUT 1234");
    result.metadata.tool_name = Some("count".to_owned());
    result.metadata.tool_call_id = Some("call_ana_1".to_owned());
    result.metadata.agent = None; // a result without a stamp is its call's
    let thought = step_of(&first, "Ana", Role::Assistant, MessageType::Thought, "ANA-THINKS");
    let ana_answer = step_of(&first, "Ana", Role::Assistant, MessageType::Text, "1234 people signed up");
    let second = stored(&h.session, CHANNEL, "Chii", "@Ryan and the churn?");
    let mut ryan_call = step_of(&second, "Ryan", Role::Tool, MessageType::ToolCall, "Calling tool `churn`");
    ryan_call.metadata.tool_name = Some("churn".to_owned());
    ryan_call.metadata.tool_call_id = Some("call_ryan_1".to_owned());
    ryan_call.metadata.tool_arguments = Some(json!({}));
    let mut ryan_result = step_of(&ryan_call, "Ryan", Role::Tool, MessageType::ToolResult, "RYAN-TOOL-OUTPUT");
    ryan_result.metadata.tool_name = Some("churn".to_owned());
    ryan_result.metadata.tool_call_id = Some("call_ryan_1".to_owned());
    let ryan_answer = step_of(&second, "Ryan", Role::Assistant, MessageType::Text, "churn is 3%");
    h.handle
        .store
        .insert_messages(&[
            first.clone(),
            thought,
            call,
            result,
            ana_answer,
            second,
            ryan_call,
            ryan_result,
            ryan_answer,
        ])
        .await
        .expect("insert");

    let root = h.gateway.post(&asking(&h.session, CHANNEL, "Ryan", "Ryan, compare them")).await.expect("post");
    assert_eq!(h.wait_terminal(&root.message.id).await, Status::Processed);

    let requests = h.model.requests();
    assert_eq!(requests.len(), 1);
    let seen = requests_text(&requests);
    for hidden in ["call_ana_1", "ANA-TOOL-OUTPUT", "ANA-THINKS", "Calling tool `count`"] {
        assert!(!seen.contains(hidden), "Ryan saw Ana's step `{hidden}`: {seen}");
    }
    // Its own earlier turn in full (its call, the result and its answer), and the root.
    for own in ["call_ryan_1", "RYAN-TOOL-OUTPUT", "churn is 3%", "@Ryan and the churn?", "Ryan, compare them"] {
        assert!(seen.contains(own), "Ryan did not see `{own}`: {seen}");
    }
    // Ana's answer and the question only Ana handled come as channel context, once.
    let channel = entry(&requests, "[Channel context]").expect("a channel-context entry");
    assert!(channel.contains("Chii: how many users signed up?"), "{channel}");
    assert!(channel.contains("Ana (agent): 1234 people signed up"), "{channel}");
    assert!(!channel.contains("churn"), "what Ryan sees in its view is not repeated: {channel}");
    assert_eq!(seen.matches("1234 people signed up").count(), 1, "{seen}");
}

#[tokio::test]
async fn the_channel_context_is_the_newest_window_and_clips_long_messages() {
    let config = AgentConfig { channel_context_messages: 3, ..AgentConfig::default() };
    let options = Options { personas: team(), config, ..Options::default() };
    let h = Harness::start_with(vec![ScriptStep::text("ok")], options).await;
    let long = format!("START{}", "x".repeat(1_495));
    let mut earlier = Vec::new();
    for (question, answer) in [("q-one", "a-one"), ("q-two", "a-two"), ("q-three", long.as_str())] {
        let root = stored(&h.session, CHANNEL, "Chii", question);
        let reply = step_of(&root, "Ana", Role::Assistant, MessageType::Text, answer);
        earlier.extend([root, reply]);
    }
    h.handle.store.insert_messages(&earlier).await.expect("insert");

    let root = h.gateway.post(&asking(&h.session, CHANNEL, "Ryan", "catch me up")).await.expect("post");
    assert_eq!(h.wait_terminal(&root.message.id).await, Status::Processed);
    let requests = h.model.requests();
    let channel = entry(&requests, "[Channel context]").expect("a channel-context entry");
    // The newest three messages Ryan does not see, oldest first; the root itself is no slot.
    assert!(!channel.contains("q-one") && !channel.contains("a-one") && !channel.contains("q-two"), "{channel}");
    let (a, q, l) = (channel.find("a-two"), channel.find("q-three"), channel.find("START"));
    assert!(a.is_some() && a < q && q < l, "{channel}");
    assert!(channel.contains(&format!("START{} […clipped: 500 more characters]", "x".repeat(995))), "{channel}");
    assert!(!channel.contains("catch me up"), "the root is not its own context: {channel}");

    // 0 turns the entry off.
    let mut h = h;
    h.shut_down().await;
    let config = AgentConfig { channel_context_messages: 0, ..AgentConfig::default() };
    h.reboot(Options { personas: team(), config, ..Options::default() }).await;
    h.model.push(ScriptStep::text("ok again"));
    let again = h.gateway.post(&asking(&h.session, CHANNEL, "Ryan", "and now?")).await.expect("post");
    assert_eq!(h.wait_terminal(&again.message.id).await, Status::Processed);
    let requests = h.model.requests();
    let last = requests.last().expect("a request");
    assert!(!format!("{:?}", last.turns).contains("[Channel context]"));
}

#[tokio::test]
async fn a_thread_context_shows_the_root_from_another_session_and_recent_replies() {
    let h = Harness::start_with(vec![ScriptStep::text("ok")], Options::default()).await;
    let thread = "thread-77";
    // The thread was started from a message of the channel's session.
    let started = stored(&h.session, CHANNEL, "Mika", "shall we ship friday?");
    h.handle.store.insert_message(&started).await.expect("insert");
    let thread_ref = || ThreadRef { parent_channel_id: CHANNEL.to_owned(), root_message_id: Some(started.id.clone()) };
    // Replies in an older session of the thread, and one in the session the turn runs in.
    let older = Session::new(BOT, thread, chrono::Utc::now());
    h.handle.store.create_session(&older).await.expect("session");
    let mut replies = Vec::new();
    for (sender, text) in [("Ola", "reply-one"), ("Ola", "reply-two"), ("Mika", "reply-three")] {
        let mut reply = stored(&older, thread, sender, text);
        reply.metadata.thread = Some(Box::new(thread_ref()));
        replies.push(reply);
    }
    h.handle.store.insert_messages(&replies).await.expect("insert");
    let current = h.gateway.resolve_session(BOT, thread).await.expect("session");
    assert_ne!(current.id, older.id);
    let mut in_history = stored(&current, thread, "Ola", "reply-in-history");
    in_history.metadata.thread = Some(Box::new(thread_ref()));
    h.handle.store.insert_message(&in_history).await.expect("insert");

    let mut root = Message::user_text(&current.id, BOT, thread, "Chii", "what did we decide?");
    root.metadata.thread = Some(Box::new(thread_ref()));
    let root = h.gateway.post(&root).await.expect("post").message;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);

    let requests = h.model.requests();
    let context = entry(&requests, "[Thread context]").expect("a thread-context entry");
    assert!(context.contains("Started by: ["), "{context}");
    assert!(context.contains("Mika: shall we ship friday?"), "{context}");
    let (one, two, three) = (context.find("reply-one"), context.find("reply-two"), context.find("reply-three"));
    assert!(one.is_some() && one < two && two < three, "{context}");
    assert!(!context.contains("reply-in-history"), "what is in history is not repeated: {context}");
    assert_eq!(requests_text(&requests).matches("reply-in-history").count(), 1);
}

#[tokio::test]
async fn a_message_the_agent_may_not_read_is_left_out_of_an_entry_and_counted() {
    // Ryan sits in the channel; the thread claims a root in a channel only Cai sits in.
    let options = Options { personas: team(), ..Options::default() };
    let h = Harness::start_with(vec![ScriptStep::text("ok")], options).await;
    let elsewhere = h.gateway.resolve_session(BOT, "elsewhere").await.expect("session");
    let secret = stored(&elsewhere, "elsewhere", "Cai", "ELSEWHERE-SECRET");
    h.handle.store.insert_message(&secret).await.expect("insert");
    let thread = "thread-9";
    let thread_ref = ThreadRef { parent_channel_id: CHANNEL.to_owned(), root_message_id: Some(secret.id.clone()) };
    let older = Session::new(BOT, thread, chrono::Utc::now());
    h.handle.store.create_session(&older).await.expect("session");
    let mut reply = stored(&older, thread, "Ola", "a readable reply");
    reply.metadata.thread = Some(Box::new(thread_ref.clone()));
    h.handle.store.insert_message(&reply).await.expect("insert");
    let current = h.gateway.resolve_session(BOT, thread).await.expect("session");
    let mut root = asking(&current, thread, "Ryan", "summarise the thread");
    root.metadata.thread = Some(Box::new(thread_ref));
    let root = h.gateway.post(&root).await.expect("post").message;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);

    let requests = h.model.requests();
    let seen = requests_text(&requests);
    assert!(!seen.contains("ELSEWHERE-SECRET"), "{seen}");
    let context = entry(&requests, "[Thread context]").expect("a thread-context entry");
    assert!(context.contains("Ola: a readable reply") && !context.contains("Started by"), "{context}");
    let rows = h.finished_ledger_for(&root.id).await;
    assert_eq!(rows[0].outcome, Some(Outcome::Succeeded));
    let note = rows[0].error.as_deref().unwrap_or_default();
    assert!(note.contains("context: 1 message left out"), "{note}");
    assert!(!note.contains("ELSEWHERE"), "{note}");
}

#[tokio::test]
async fn a_thread_is_read_through_its_parent_and_plain_work_in_an_agents_channel_goes_to_its_agent() {
    let options = Options { personas: team(), ..Options::default() };
    let script = vec![ScriptStep::text("from Ryan in the thread"), ScriptStep::text("from Ana in the channel")];
    let h = Harness::start_with(script, options).await;
    // Ryan sits in the channel, so it reads a thread hanging off it.
    let thread = h.gateway.resolve_session(BOT, "thread-5").await.expect("session");
    let mut inside = asking(&thread, "thread-5", "Ryan", "in the thread");
    inside.metadata.thread = Some(Box::new(ThreadRef { parent_channel_id: CHANNEL.to_owned(), root_message_id: None }));
    let inside = h.gateway.post(&inside).await.expect("post").message;
    assert_eq!(h.wait_terminal(&inside.id).await, Status::Processed);
    assert_eq!(h.model.requests().len(), 1);

    // Work naming no agent in a channel where configured agents sit is routed to them at
    // intake (the default agent never reads such a channel): a round, Ana first.
    let plain = h.post_user("nobody named").await;
    assert_eq!(h.wait_terminal(&plain.id).await, Status::Processed);
    let rows = h.finished_ledger_for(&plain.id).await;
    assert_eq!(rows[0].agent.as_deref(), Some("Ana"));
    assert_eq!(h.model.requests().len(), 2);
}
