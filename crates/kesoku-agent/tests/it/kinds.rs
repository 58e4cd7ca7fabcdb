//! Every activation kind this version produces, as the runtime makes and runs it from its root
//! message: kind, lane, trigger and ledger row; what the model sees; per-activation model and
//! structured output; background maintenance beside a person's turn.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use kesoku_agent::AgentConfig;
use kesoku_core::activation::{MaintenanceTask, TriggerContext};
use kesoku_core::{
    ActivationKind, ActivationRequest, FollowUpId, JobId, Lane, Message, MessageType, Outcome, Role, Status,
};
use kesoku_llm::{LlmError, Model, ModelInfo, Provider, Request, ResponseStream, ScriptStep, ScriptedModel};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::harness::{BOT, CHANNEL, Harness, Options};

fn trigger(name: &str, source: &str) -> TriggerContext {
    TriggerContext {
        name: name.to_owned(),
        source: source.to_owned(),
        schedule: Some("0 9 * * *".to_owned()),
        fired_at: Utc.with_ymd_and_hms(2026, 3, 30, 7, 0, 0).single().expect("a time"),
    }
}

fn request_text(request: &Request) -> String {
    format!("{:?}", request.turns)
}

#[tokio::test]
async fn each_producer_gets_its_kind_lane_and_trigger_in_the_ledger() {
    let options = Options {
        config: AgentConfig { timezone: Some("Europe/Paris".to_owned()), ..AgentConfig::default() },
        ..Options::default()
    };
    let steps = (1..=4).map(|n| ScriptStep::text(format!("answer {n}"))).collect();
    let h = Harness::start_with(steps, options).await;

    let mut workflow =
        Message::cronjob_trigger(&h.session.id, BOT, CHANNEL, "`Cronjob` at …:\nSummarize the night's alerts.");
    workflow.metadata.cron_job = Some("nightly".to_owned());
    workflow.metadata.activation = Some(Box::new(ActivationRequest {
        task: Some("Summarize the night's alerts.".to_owned()),
        trigger: Some(trigger("nightly", "cron")),
        triggered_by: Some("cron:nightly".to_owned()),
        ..ActivationRequest::new(ActivationKind::Workflow)
    }));
    let mut direct = Message::direct_trigger(&h.session.id, BOT, CHANNEL, "Deploy 42 finished; tell the team.");
    direct.metadata.activation = Some(Box::new(ActivationRequest {
        trigger: Some(TriggerContext { schedule: None, ..trigger("deploys", "api") }),
        ..ActivationRequest::new(ActivationKind::DirectTrigger)
    }));
    let mut followup = Message::followup_reminder(&h.session.id, BOT, CHANNEL, "[Follow-up] check the build");
    followup.metadata.activation = Some(Box::new(ActivationRequest {
        followup_id: Some(FollowUpId::from("fu_1")),
        task: Some("check the build".to_owned()),
        ..ActivationRequest::new(ActivationKind::FollowUp)
    }));
    let mut alert = Message::wakeup_alert(&h.session.id, BOT, CHANNEL, "[System Alert] Background Job job_1 finished");
    alert.metadata.activation = Some(Box::new(ActivationRequest {
        job_id: Some(JobId::from("job_1")),
        ..ActivationRequest::new(ActivationKind::BackgroundJobResult)
    }));

    let roots = [workflow, direct, followup, alert];
    for root in &roots {
        h.gateway.post(root).await.expect("post");
        assert_eq!(h.wait_terminal(&root.id).await, Status::Processed, "{}", root.content);
    }
    let expected = [
        (ActivationKind::Workflow, "cron:nightly"),
        (ActivationKind::DirectTrigger, "api"),
        (ActivationKind::FollowUp, "follow-up"),
        (ActivationKind::BackgroundJobResult, "job:job_1"),
    ];
    for (root, (kind, by)) in roots.iter().zip(expected) {
        let rows = h.finished_ledger_for(&root.id).await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        assert_eq!((row.kind, row.lane, row.triggered_by.as_str(), row.depth), (kind, Lane::Responsive, by, 0));
        assert_eq!(row.outcome, Some(Outcome::Succeeded));
    }
    let history = h.history().await;
    for root in &roots {
        assert!(
            history.iter().any(|m| m.parent_id.as_ref() == Some(&root.id)
                && m.role == Role::Assistant
                && m.message_type == MessageType::Text),
            "an answer to {}",
            root.content
        );
    }
    let requests = h.model.requests();
    let first = request_text(&requests[0]);
    assert!(first.contains("[Trigger context]") && first.contains("workflow: nightly (source: cron)"), "{first}");
    assert!(first.contains("task: Summarize the night's alerts."), "{first}");
    // 07:00 UTC on 30 March 2026 is 09:00 in Paris, summer time.
    assert!(first.contains("fired at: 2026-03-30 09:00:00 Europe/Paris (UTC+02:00)"), "{first}");
    assert!(first.contains("time: ") && first.contains("Europe/Paris (UTC+0"), "{first}");
    let second = request_text(&requests[1]);
    assert!(second.contains("workflow: deploys (source: api)"), "{second}");
    let third = request_text(&requests[2]);
    assert!(!third.contains("[Trigger context]") && third.contains("[Follow-up] check the build"), "{third}");
}

#[tokio::test]
async fn a_trigger_never_interrupts_a_person() {
    let h = Harness::start(vec![
        ScriptStep::text("person answered").delayed(std::time::Duration::from_millis(300)),
        ScriptStep::text("trigger answered"),
    ])
    .await;
    let person = h.post_user("a question").await;
    h.wait_status(&person.id, &[Status::Processing]).await;
    let mut direct = Message::direct_trigger(&h.session.id, BOT, CHANNEL, "automation task");
    direct.metadata.activation = Some(Box::new(ActivationRequest::new(ActivationKind::DirectTrigger)));
    h.gateway.post(&direct).await.expect("post");
    assert_eq!(h.wait_terminal(&person.id).await, Status::Processed);
    assert_eq!(h.wait_terminal(&direct.id).await, Status::Processed);
}

#[tokio::test]
async fn an_activation_answers_with_the_model_it_names() {
    let cheap = ScriptedModel::new("cheap", vec![ScriptStep::text("from the cheap model")]);
    let options = Options { extra_models: vec![Arc::new(cheap.clone())], ..Options::default() };
    let h = Harness::start_with(vec![ScriptStep::text("from the default")], options).await;
    let mut direct = Message::direct_trigger(&h.session.id, BOT, CHANNEL, "use the cheap one");
    direct.metadata.activation = Some(Box::new(ActivationRequest::new(ActivationKind::DirectTrigger)));
    direct.metadata.model = Some("cheap".to_owned());
    h.gateway.post(&direct).await.expect("post");
    assert_eq!(h.wait_terminal(&direct.id).await, Status::Processed);
    assert_eq!((cheap.requests().len(), h.model.requests().len()), (1, 0));
    let answer = h.wait_for(|m| m.parent_id.as_ref() == Some(&direct.id) && m.role == Role::Assistant).await;
    assert_eq!(answer.content, "from the cheap model");
}

fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {"status": {"enum": ["ok", "down"]}}, "required": ["status"]})
}

fn structured_root(h: &Harness) -> Message {
    let mut direct = Message::direct_trigger(&h.session.id, BOT, CHANNEL, "report the status as JSON");
    direct.metadata.activation = Some(Box::new(ActivationRequest {
        output_schema: Some(schema()),
        ..ActivationRequest::new(ActivationKind::DirectTrigger)
    }));
    direct
}

#[tokio::test]
async fn structured_output_is_checked_and_asked_again_once() {
    let h =
        Harness::start(vec![ScriptStep::text("All systems nominal!"), ScriptStep::text("{\"status\": \"ok\"}")]).await;
    let root = structured_root(&h);
    h.gateway.post(&root).await.expect("post");
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    let requests = h.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].output_schema, Some(schema()), "the schema goes to the provider");
    let retry = request_text(&requests[1]);
    assert!(retry.contains("Your previous answer was rejected: the answer is not JSON"), "{retry}");
    let history = h.history().await;
    let answers: Vec<&Message> = history
        .iter()
        .filter(|m| m.role == Role::Assistant && m.message_type == MessageType::Text && !m.is_notification())
        .collect();
    assert_eq!(answers.len(), 1, "the rejected answer is never posted");
    assert_eq!(answers[0].content, "{\"status\": \"ok\"}");
    let rows = h.finished_ledger_for(&root.id).await;
    assert_eq!((rows[0].outcome, rows[0].usage.model_calls), (Some(Outcome::Succeeded), 2));
}

#[tokio::test]
async fn structured_output_that_misses_twice_fails_the_activation() {
    let h =
        Harness::start(vec![ScriptStep::text("{\"status\": \"maybe\"}"), ScriptStep::text("{\"status\": \"unsure\"}")])
            .await;
    let root = structured_root(&h);
    h.gateway.post(&root).await.expect("post");
    assert_eq!(h.wait_terminal(&root.id).await, Status::Processed);
    let rows = h.finished_ledger_for(&root.id).await;
    assert_eq!(rows[0].outcome, Some(Outcome::Failed));
    let error = rows[0].error.clone().unwrap_or_default();
    assert!(
        error.starts_with("structured output: the answer does not match the schema") && error.contains("/status"),
        "{error}"
    );
    let answer = h.wait_for(|m| m.parent_id.as_ref() == Some(&root.id) && m.role == Role::Assistant).await;
    assert_eq!(answer.content, "{\"status\": \"unsure\"}", "the last answer is still shown");
}

/// A summarizer that answers only when the test lets it.
struct Gated {
    inner: ScriptedModel,
    gate: Arc<Semaphore>,
}

#[async_trait]
impl Model for Gated {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    async fn stream(&self, request: &Request) -> Result<ResponseStream, LlmError> {
        let permit = self.gate.acquire().await.expect("gate open");
        permit.forget();
        self.inner.stream(request).await
    }
}

fn small_window(name: &str, steps: Vec<ScriptStep>) -> ScriptedModel {
    ScriptedModel::new(name, steps).with_info(ModelInfo {
        provider: Provider::OpenAi,
        model: name.to_owned(),
        context_window: 60,
        max_output_tokens: 64,
    })
}

#[tokio::test]
async fn automatic_compaction_runs_in_the_background_while_the_person_is_answered() {
    let gate = Arc::new(Semaphore::new(0));
    let summarizer = ScriptedModel::new("summarizer", vec![ScriptStep::text("The user asked three questions.")]);
    let gated = Gated { inner: summarizer.clone(), gate: Arc::clone(&gate) };
    let mut config = AgentConfig::default();
    config.compaction.model = Some("summarizer".to_owned());
    config.compaction.keep_recent_turns = 1;
    let options = Options { config, extra_models: vec![Arc::new(gated)], ..Options::default() };
    let mut h = Harness::start(vec![]).await;
    let model = small_window(
        "small",
        (1..=6).map(|n| ScriptStep::text(format!("answer number {n} with some words"))).collect(),
    );
    h.reboot_with_model(Arc::new(model.clone()), options).await;

    for n in 1..=4 {
        let user = h.post_user(&format!("question number {n} with a few words to fill the window")).await;
        assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    }
    // By now a compaction has a plan and waits for the summarizer; the person's next turn is
    // answered all the same.
    let waiting = loop {
        let rows = h.ledger().await;
        if let Some(row) =
            rows.iter().find(|r| r.kind == ActivationKind::Maintenance && r.outcome.is_none() && r.started_at.is_some())
        {
            break row.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(waiting.lane, Lane::Background);
    let user = h.post_user("question number 5 while the summary is being written").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    assert!(
        !h.history().await.iter().any(|m| m.metadata.compaction_summary.is_some()),
        "the person was answered before the summary existed"
    );
    gate.add_permits(1);
    let summary = h.wait_for(|m| m.metadata.compaction_summary.is_some()).await;
    assert!(summary.content.contains("The user asked three questions."));
    let finished = loop {
        let row = h.handle.ledger.get_activation(&waiting.id).await.expect("ledger").expect("row");
        if row.outcome.is_some() {
            break row;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!((finished.kind, finished.outcome), (ActivationKind::Maintenance, Some(Outcome::Succeeded)));
    // No person's turn ever ran a summary inline: every summarizer call belongs to a
    // maintenance activation.
    let maintenance_calls: u64 =
        h.ledger().await.iter().filter(|r| r.kind == ActivationKind::Maintenance).map(|r| r.usage.model_calls).sum();
    assert_eq!(maintenance_calls, summarizer.requests().len() as u64);
    let _ = MaintenanceTask::Compaction;
}

#[tokio::test]
async fn sessions_get_a_title_in_the_background_when_titles_are_on() {
    let titler = ScriptedModel::new("titler", vec![ScriptStep::text("\"Weather in Tokyo.\"")]);
    let mut config = AgentConfig { titles: true, ..AgentConfig::default() };
    config.compaction.model = Some("titler".to_owned());
    let options = Options { config, extra_models: vec![Arc::new(titler.clone())], ..Options::default() };
    let h =
        Harness::start_with(vec![ScriptStep::text("Sunny, 24°C."), ScriptStep::text("You're welcome.")], options).await;
    let first = h.post_user("What is the weather in Tokyo?").await;
    assert_eq!(h.wait_terminal(&first.id).await, Status::Processed);
    let title = loop {
        let session = h.handle.store.get_session(&h.session.id).await.expect("get").expect("session");
        if let Some(title) = session.title {
            break title;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(title, "Weather in Tokyo");
    let second = h.post_user("thanks").await;
    assert_eq!(h.wait_terminal(&second.id).await, Status::Processed);
    let titles: Vec<_> = h.ledger().await.into_iter().filter(|r| r.kind == ActivationKind::Maintenance).collect();
    assert_eq!(titles.len(), 1, "a titled session is not titled again: {titles:?}");
    assert_eq!((titles[0].lane, titles[0].triggered_by.as_str()), (Lane::Background, "system"));
    assert_eq!(titler.requests().len(), 1);
    assert!(request_text(&titler.requests()[0]).contains("What is the weather in Tokyo?"));
}

#[tokio::test]
async fn a_person_sees_times_in_the_chatbot_zone_else_the_agent_zone() {
    let mut config = AgentConfig { timezone: Some("Europe/Paris".to_owned()), ..AgentConfig::default() };
    config.chatbot_timezones.insert(BOT.to_owned(), "Asia/Tokyo".to_owned());
    let options = Options { config, ..Options::default() };
    let h = Harness::start_with(vec![ScriptStep::text("konnichiwa")], options).await;
    let user = h.post_user("what time is it?").await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    let sent = request_text(&h.model.requests()[0]);
    assert!(sent.contains("Asia/Tokyo (UTC+09:00)") && !sent.contains("Europe/Paris"), "{sent}");
    let mut other = AgentConfig { timezone: Some("Europe/Paris".to_owned()), ..AgentConfig::default() };
    other.chatbot_timezones.insert("another_bot".to_owned(), "Asia/Tokyo".to_owned());
    assert_eq!(other.timezone_for(BOT), Some("Europe/Paris"));
    assert_eq!(other.timezone_for("another_bot"), Some("Asia/Tokyo"));
}
