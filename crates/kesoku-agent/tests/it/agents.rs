//! Several agents in one channel (`[[agents]]`), end to end: a round dispatches one agent at a
//! time and halts when one replies or all have passed; a mention goes straight to its agent; an
//! agent's mention of another runs it one level deeper, up to `[agent] max_depth`; the model
//! never sees the round's bookkeeping. Each agent answers through its own scripted model, so
//! who answered is who was asked.

use std::sync::Arc;
use std::time::Duration;

use kesoku_agent::orchestration::{PASS, mention_root_id};
use kesoku_agent::{AgentConfig, AgentPersona, Personas};
use kesoku_core::{
    ActivationKind, ActivationRequest, LedgerEntry, Message, MessageId, MessageType, Orchestration, Outcome, Role,
    Status, TurnOrigin,
};
use kesoku_llm::{Request, ScriptStep, ScriptedModel};
use serde_json::json;

use crate::harness::{BOT, CHANNEL, Harness, Options};
use crate::recovery::{hostname, sqlx_claim};

const PATIENCE: Duration = Duration::from_secs(20);

/// Ana, Ben and Cai sit in the harness's channel, in that order, each answering through its own
/// model (`ana`, `ben`, `cai`) with its script; the harness's default model has none.
struct Team {
    ana: ScriptedModel,
    ben: ScriptedModel,
    cai: ScriptedModel,
}

impl Team {
    fn new(ana: Vec<ScriptStep>, ben: Vec<ScriptStep>, cai: Vec<ScriptStep>) -> Team {
        Team {
            ana: ScriptedModel::new("ana", ana),
            ben: ScriptedModel::new("ben", ben),
            cai: ScriptedModel::new("cai", cai),
        }
    }

    fn options(&self, config: AgentConfig) -> Options {
        let persona = |name: &str, model: &str| AgentPersona {
            name: name.to_owned(),
            intro: Some(format!("You are {name}.")),
            intro_file: None,
            model: Some(model.to_owned()),
            tools: None,
            channels: vec![format!("{BOT}:{CHANNEL}")],
        };
        Options {
            config,
            personas: Personas::new(vec![persona("Ana", "ana"), persona("Ben", "ben"), persona("Cai", "cai")]),
            extra_models: vec![Arc::new(self.ana.clone()), Arc::new(self.ben.clone()), Arc::new(self.cai.clone())],
            ..Options::default()
        }
    }

    async fn start(&self) -> Harness {
        Harness::start_with(vec![], self.options(AgentConfig::default())).await
    }
}

/// The message's ledger rows once there are `count` and each has an outcome.
async fn rows(h: &Harness, message: &MessageId, count: usize) -> Vec<LedgerEntry> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let rows = h.ledger_for(message).await;
        if rows.len() >= count && rows.iter().all(|row| row.outcome.is_some()) {
            return rows;
        }
        assert!(tokio::time::Instant::now() < deadline, "{message} never had {count} finished rows: {rows:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn agents_of(rows: &[LedgerEntry]) -> Vec<Option<&str>> {
    rows.iter().map(|row| row.agent.as_deref()).collect()
}

/// Everything a model was sent, as text.
fn seen(requests: &[Request]) -> String {
    requests.iter().map(|r| serde_json::to_string(r).expect("request as JSON")).collect::<Vec<_>>().join("\n")
}

fn tool_names(request: &Request) -> Vec<&str> {
    request.tools.iter().map(|t| t.name.as_str()).collect()
}

fn answers(history: &[Message], root: &MessageId) -> Vec<Message> {
    history
        .iter()
        .filter(|m| {
            m.role == Role::Assistant && m.message_type == MessageType::Text && m.parent_id.as_ref() == Some(root)
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn in_a_round_the_first_agent_passes_and_the_second_replies() {
    let team = Team::new(
        vec![ScriptStep::tool_call(PASS, json!({}))],
        vec![ScriptStep::text("Ben here: the build is green.")],
        vec![],
    );
    let h = team.start().await;
    let root = h.post_user("is the build green?").await;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    let rows = rows(&h, &root.id, 2).await;

    assert_eq!(agents_of(&rows), [Some("Ana"), Some("Ben")]);
    assert_eq!(rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Some(Outcome::Succeeded); 2]);
    assert_eq!(rows[0].error.as_deref(), Some("passed"));
    assert_eq!(rows[1].error, None);
    assert_eq!((team.ana.requests().len(), team.ben.requests().len(), team.cai.requests().len()), (1, 1, 0));
    assert!(h.model.requests().is_empty(), "the default agent never answers a channel its agents share");

    let history = h.history().await;
    let answers = answers(&history, &root.id);
    assert_eq!(answers.len(), 1, "one answer: {answers:?}");
    assert_eq!(answers[0].sender, "Ben");
    assert_eq!(answers[0].metadata.agent.as_deref(), Some("Ben"));
    assert_eq!(answers[0].content, "Ben here: the build is green.");
    // The pass stays as a step of Ana's.
    let pass = history.iter().find(|m| m.metadata.tool_name.as_deref() == Some(PASS)).expect("the pass call");
    assert_eq!((pass.sender.as_str(), pass.metadata.agent.as_deref()), ("Ana", Some("Ana")));
    let result = history.iter().find(|m| m.parent_id.as_ref() == Some(&pass.id)).expect("the pass result");
    assert_eq!(result.metadata.agent.as_deref(), Some("Ana"));

    // Each was told its peers by name and how to pass, offered `pass`, and given its own prompt.
    let ana = &team.ana.requests()[0];
    let ben = &team.ben.requests()[0];
    assert!(tool_names(ana).contains(&PASS) && tool_names(ben).contains(&PASS));
    let ana_seen = seen(std::slice::from_ref(ana));
    let ben_seen = seen(std::slice::from_ref(ben));
    assert!(ana_seen.contains("other agents in this channel: Ben, Cai"), "{ana_seen}");
    assert!(ben_seen.contains("other agents in this channel: Ana, Cai"), "{ben_seen}");
    assert!(ana_seen.contains("You are Ana.") && ben_seen.contains("You are Ben."));
}

#[tokio::test]
async fn when_every_agent_passes_the_round_closes_with_nothing_delivered() {
    let team = Team::new(
        vec![ScriptStep::tool_call(PASS, json!({}))],
        vec![ScriptStep::text("pass")],
        vec![ScriptStep::text("  PASS \n")],
    );
    let h = team.start().await;
    let root = h.post_user("thanks, everyone").await;
    let rows = rows(&h, &root.id, 3).await;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);

    assert_eq!(agents_of(&rows), [Some("Ana"), Some("Ben"), Some("Cai")]);
    assert_eq!(rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Some(Outcome::Succeeded); 3]);
    assert_eq!(
        rows.iter().map(|r| r.error.as_deref()).collect::<Vec<_>>(),
        [Some("passed"), Some("passed"), Some("every agent passed")]
    );
    let history = h.history().await;
    assert!(answers(&history, &root.id).is_empty(), "nothing answered: {history:?}");
    // Nothing for users either: only Ana's pass call and its result follow the root.
    let after: Vec<&Message> = history.iter().filter(|m| m.id != root.id).collect();
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|m| m.metadata.agent.as_deref() == Some("Ana")));
    assert!(h.model.requests().is_empty());
}

#[tokio::test]
async fn a_mention_goes_straight_to_its_agent() {
    let team = Team::new(vec![], vec![], vec![ScriptStep::text("Cai: it is sunny.")]);
    let h = team.start().await;
    let root = h.post_user("@cai what is the weather?").await;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    let rows = rows(&h, &root.id, 1).await;

    assert_eq!(agents_of(&rows), [Some("Cai")]);
    assert_eq!((team.ana.requests().len(), team.ben.requests().len()), (0, 0), "the others were never asked");
    assert!(h.model.requests().is_empty());
    let answers = answers(&h.history().await, &root.id);
    assert_eq!((answers.len(), answers[0].sender.as_str()), (1, "Cai"));
    // Not a round: no peers to tell about, no `pass` to offer.
    let cai = &team.cai.requests()[0];
    assert!(!tool_names(cai).contains(&PASS));
    assert!(!seen(std::slice::from_ref(cai)).contains("other agents in this channel"));
}

#[tokio::test]
async fn an_agents_mention_of_another_runs_it_one_level_deeper_until_max_depth_refuses() {
    let team = Team::new(
        vec![ScriptStep::text("Ana: over to you, @Ben."), ScriptStep::text("Ana: and back to @ben again.")],
        vec![ScriptStep::text("Ben: no, you, @Ana.")],
        vec![],
    );
    let config = AgentConfig { max_depth: 2, ..AgentConfig::default() };
    let h = Harness::start_with(vec![], team.options(config)).await;
    let root = h.post_user("@Ana start the chain").await;

    // Ana (depth 0) → Ben (1) → Ana (2) → Ben (3): refused.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let rows = loop {
        let rows = h.ledger().await;
        if rows.len() == 4 && rows.iter().all(|r| r.outcome.is_some()) {
            break rows;
        }
        assert!(tokio::time::Instant::now() < deadline, "the chain never reached the limit: {rows:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(agents_of(&rows), [Some("Ana"), Some("Ben"), Some("Ana"), Some("Ben")]);
    assert_eq!(rows.iter().map(|r| r.depth).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(
        rows.iter().map(|r| r.outcome).collect::<Vec<_>>(),
        [Some(Outcome::Succeeded), Some(Outcome::Succeeded), Some(Outcome::Succeeded), Some(Outcome::Refused)]
    );
    assert_eq!(rows[1].triggered_by, "agent:Ana");
    assert_eq!(rows[2].triggered_by, "agent:Ben");
    assert!(rows[3].error.as_deref().is_some_and(|e| e.contains("depth limit of 2")), "{:?}", rows[3].error);
    assert_eq!((team.ana.requests().len(), team.ben.requests().len(), team.cai.requests().len()), (2, 1, 0));

    // The hand-over is a root of the answering agent's, carrying its answer, one per answer.
    let history = h.history().await;
    let first_answer = answers(&history, &root.id).pop().expect("Ana's answer");
    let handed = history.iter().find(|m| m.id == mention_root_id(&first_answer.id, "Ben")).expect("handed on");
    assert_eq!((handed.role, handed.sender.as_str()), (Role::User, "Ana"));
    assert_eq!(handed.content, "Ana: over to you, @Ben.");
    let request = handed.metadata.activation.as_ref().expect("its request");
    assert_eq!((request.agent.as_deref(), request.depth), (Some("Ben"), 1));
    let roots = history.iter().filter(|m| m.role == Role::User && m.parent_id.is_none()).count();
    assert_eq!(roots, 4, "the person's root and three hand-overs");
}

#[tokio::test]
async fn a_round_goes_on_after_a_crash_between_the_next_dispatch_and_the_status_change() {
    // What a process killed right after writing Ana's pass onto the root leaves: Ana's pass call
    // and result, the root naming Ben as next, still `processing` under a dead claim.
    let team = Team::new(vec![], vec![ScriptStep::text("Ben picks it up.")], vec![]);
    let h = team.start().await;
    let user = Message::user_text(&h.session.id, BOT, CHANNEL, "Chii", "who is on call?");
    let mut claimed = user.clone();
    claimed.status = Status::Processing;
    let round = Orchestration::start(vec!["Ana".into(), "Ben".into(), "Cai".into()]).expect("a round");
    let kesoku_core::activation::AfterPass::Dispatch(next) = round.after_pass() else { panic!("Ben is next") };
    claimed.metadata.activation = Some(Box::new(ActivationRequest {
        agent: Some("Ben".into()),
        orchestration: Some(next),
        ..ActivationRequest::new(ActivationKind::Message)
    }));
    let origin = TurnOrigin::of(&user, "Ana");
    let mut call = origin.tool_call(1, "call_1", PASS, json!({}));
    call.metadata.agent = Some("Ana".into());
    let mut result = origin.tool_result(&call, "Passed.".to_owned(), None, None);
    result.metadata.agent = Some("Ana".into());
    h.handle.store.insert_messages(&[claimed, call, result]).await.expect("insert");
    let dead = format!("{}/2147483632/deadbeef", hostname());
    sqlx_claim(&h, &user.id, &dead).await;

    let mut h = h;
    h.shut_down().await;
    h.reboot(team.options(AgentConfig::default())).await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let rows = rows(&h, &user.id, 1).await;

    assert_eq!(agents_of(&rows), [Some("Ben")]);
    assert_eq!((team.ana.requests().len(), team.ben.requests().len()), (0, 1), "Ana is not asked again");
    let answers = answers(&h.history().await, &user.id);
    assert_eq!((answers.len(), answers[0].sender.as_str()), (1, "Ben"));
}

#[tokio::test]
async fn a_pass_that_crashed_before_the_next_dispatch_is_not_asked_again() {
    // Killed after Ana's pass call and result were stored, before the root named Ben: Ana's
    // rerun sees her own pass and passes again without a model call; Ben is dispatched.
    let team = Team::new(vec![], vec![ScriptStep::text("Ben again.")], vec![]);
    let h = team.start().await;
    let user = Message::user_text(&h.session.id, BOT, CHANNEL, "Chii", "anyone?");
    let mut claimed = user.clone();
    claimed.status = Status::Processing;
    let origin = TurnOrigin::of(&user, "Ana");
    let mut call = origin.tool_call(1, "call_1", PASS, json!({}));
    call.metadata.agent = Some("Ana".into());
    let mut result = origin.tool_result(&call, "Passed.".to_owned(), None, None);
    result.metadata.agent = Some("Ana".into());
    h.handle.store.insert_messages(&[claimed, call, result]).await.expect("insert");
    sqlx_claim(&h, &user.id, &format!("{}/2147483632/deadbeef", hostname())).await;

    let mut h = h;
    h.shut_down().await;
    h.reboot(team.options(AgentConfig::default())).await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let rows = rows(&h, &user.id, 2).await;

    assert_eq!(agents_of(&rows), [Some("Ana"), Some("Ben")]);
    assert_eq!(rows[0].error.as_deref(), Some("passed"));
    assert_eq!((team.ana.requests().len(), team.ben.requests().len()), (0, 1));
}

#[tokio::test]
async fn the_model_never_sees_the_rounds_bookkeeping() {
    let team = Team::new(
        vec![ScriptStep::text("pass")],
        vec![ScriptStep::tool_call(PASS, json!({}))],
        vec![ScriptStep::text("Cai answers.")],
    );
    let h = team.start().await;
    let root = h.post_user("hello team").await;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    rows(&h, &root.id, 3).await;
    let everything = [team.ana.requests(), team.ben.requests(), team.cai.requests()].concat();
    assert_eq!(everything.len(), 3);
    let text = seen(&everything);
    for hidden in ["no_reply_streak", "streak", "orchestration", "\"index\"", "lane", "interactive"] {
        assert!(!text.contains(hidden), "the model saw `{hidden}`: {text}");
    }
    // Cai, last in the round, is told its peers by name, not where the round stands.
    assert!(text.contains("other agents in this channel: Ana, Ben"), "{text}");
}

#[tokio::test]
async fn delegate_can_hand_a_task_to_a_named_agent_and_its_result_comes_back_to_the_delegator() {
    let task = |agent: &str| json!({ "task": "Count the open issues.", "agent": agent });
    let team = Team::new(
        vec![
            ScriptStep::tool_call("delegate", task("Zed")),
            ScriptStep::tool_call("delegate", task("cai")),
            ScriptStep::text("I asked Cai."),
            ScriptStep::text("Cai counted 3 open issues."),
        ],
        vec![],
        vec![ScriptStep::text("3 open issues.")],
    );
    let h = Harness::start_with(vec![], Options { delegate: true, ..team.options(AgentConfig::default()) }).await;
    let root = h.post_user("@Ana how many issues are open? ask Cai").await;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);

    // The unknown name was the model's mistake: a tool error naming who is configured.
    let history = h.history().await;
    let refused = history
        .iter()
        .find(|m| m.message_type == MessageType::ToolResult && m.content.contains("Zed"))
        .expect("the refusal");
    assert!(
        refused.content.contains("there is no configured agent named `Zed`; the configured agents are: Ana, Ben, Cai"),
        "{}",
        refused.content
    );

    // The child ran as Cai, one level deeper, and its result went back to Ana.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let rows = loop {
        let rows = h.ledger().await;
        if rows.len() == 3 && rows.iter().all(|r| r.outcome.is_some()) {
            break rows;
        }
        assert!(tokio::time::Instant::now() < deadline, "the delegation never came back: {rows:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let summary: Vec<(ActivationKind, Option<&str>, u32)> =
        rows.iter().map(|r| (r.kind, r.agent.as_deref(), r.depth)).collect();
    assert_eq!(
        summary,
        [
            (ActivationKind::Message, Some("Ana"), 0),
            (ActivationKind::DirectTrigger, Some("Cai"), 1),
            (ActivationKind::SubAgentResult, Some("Ana"), 0),
        ]
    );
    assert_eq!((team.ana.requests().len(), team.ben.requests().len(), team.cai.requests().len()), (4, 0, 1));
    assert!(h.model.requests().is_empty());
    let cai_seen = seen(&team.cai.requests());
    assert!(cai_seen.contains("Count the open issues.") && cai_seen.contains("You are Cai."), "{cai_seen}");
}

#[tokio::test]
async fn an_agent_is_offered_only_its_tools_and_pass_only_in_a_round() {
    let team = Team::new(
        vec![],
        vec![ScriptStep::text("Ben: read it."), ScriptStep::text("pass")],
        vec![ScriptStep::text("Cai here.")],
    );
    let mut options = team.options(AgentConfig::default());
    let mut list = options.personas.all().to_vec();
    list[1].tools = Some(vec!["read_file".to_owned()]);
    list.remove(0); // Ben and Cai sit here: a round of two.
    options.personas = Personas::new(list);
    let h = Harness::start_with(vec![], options).await;
    let root = h.post_user("@Ben what is in notes.txt?").await;
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    assert_eq!(tool_names(&team.ben.requests()[0]), ["read_file"], "a mention is not a round: no pass");

    let second = h.post_user("anyone around?").await;
    assert_eq!(h.wait_terminal(&second.id).await, Status::Processed);
    let rows = rows(&h, &second.id, 2).await;
    assert_eq!(agents_of(&rows), [Some("Ben"), Some("Cai")], "Ben is first in the round now");
    assert_eq!(tool_names(&team.ben.requests()[1]), ["pass", "read_file"]);
    assert!(tool_names(&team.cai.requests()[0]).len() > 2, "Cai lists no tools: every configured one, and pass");
}
