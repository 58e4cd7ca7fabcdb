//! Cron jobs post Cronjob Trigger Messages on schedule, keyed by name, catching up once; each
//! asks for a workflow activation. Schedules across DST changes run on paused time.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use futures::StreamExt;
use kesoku_broker::MemoryBroker;
use kesoku_chatbots::Ingested;
use kesoku_chatbots::cron::{CATCH_UP_KEY, CronJob, CronJobConfig, fire, run_cron};
use kesoku_core::activation::TriggerContext;
use kesoku_core::{ActivationKind, ActivationRequest, Message, MessageFilter, Role, Status};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_store::{Clock, SqliteStore, StoreHandle};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::fixture;

fn job(name: &str, schedule: &str) -> CronJobConfig {
    CronJobConfig {
        name: name.into(),
        schedule: schedule.into(),
        prompt: "Run active diagnostics and output status summary.".into(),
        chatbot: "cli".into(),
        channel: "cli".into(),
        timezone: None,
        catch_up: true,
        model: None,
        output_schema: None,
        delegation_user: None,
    }
}

async fn triggers(gateway: &kesoku_gateway::Gateway) -> Vec<Message> {
    let all = gateway.store().list_messages(&MessageFilter::default().with_roles(&[Role::User])).await.expect("list");
    all.into_iter().filter(Message::is_cron_trigger).collect()
}

#[tokio::test]
async fn a_job_posts_cronjob_trigger_messages_on_schedule() {
    let f = fixture().await;
    let jobs = CronJob::parse_all(&[job("diagnostics", "* * * * * *")]).expect("parse");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_cron(f.gateway.clone(), jobs, shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(2300)).await;
    shutdown.cancel();
    task.await.expect("join");
    let posted = triggers(&f.gateway).await;
    assert!((2..=3).contains(&posted.len()), "one per second: {}", posted.len());
    for message in &posted {
        assert_eq!(
            (message.role, message.sender.as_str(), message.status),
            (Role::User, "Cronjob", Status::PendingAgent)
        );
        assert_eq!(message.session_id, f.session.id, "into the channel's active session");
        assert!(message.content.starts_with("`Cronjob` at `"), "{}", message.content);
        assert!(message.content.ends_with("Run active diagnostics and output status summary."));
        assert_eq!(message.metadata.cron_job.as_deref(), Some("diagnostics"));
        assert!(!message.metadata.extra.contains_key(CATCH_UP_KEY));
    }
}

#[tokio::test]
async fn a_run_missed_while_down_is_made_up_once() {
    let f = fixture().await;
    let daily = CronJob::parse(job("daily", "0 9 * * *")).expect("parse");
    // It last ran three days ago: several runs were missed; exactly one is made up.
    let mut earlier = daily.trigger(&f.session.id, Utc::now() - chrono::Duration::days(3), false);
    earlier.created_at = Some(Utc::now() - chrono::Duration::days(3));
    earlier.status = Status::Processed;
    f.gateway.store().insert_message(&earlier).await.expect("insert");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_cron(f.gateway.clone(), vec![daily.clone()], shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    task.await.expect("join");
    let posted = triggers(&f.gateway).await;
    assert_eq!(posted.len(), 2, "the old one and one make-up run");
    assert_eq!(posted[1].metadata.extra.get(CATCH_UP_KEY), Some(&serde_json::Value::Bool(true)));

    // A restart right after does not make it up again: the state is read back by job name.
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_cron(f.gateway.clone(), vec![daily], shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    task.await.expect("join");
    assert_eq!(triggers(&f.gateway).await.len(), 2);
}

#[tokio::test]
async fn the_same_slot_fired_twice_is_stored_once() {
    let f = fixture().await;
    let daily = CronJob::parse(job("daily", "0 9 * * *")).expect("parse");
    let slot = Utc.with_ymd_and_hms(2026, 12, 3, 9, 0, 0).single().expect("time");
    assert_eq!(daily.slot_key(slot), "cron:daily:2026-12-03T09:00:00Z");
    let first = fire(&f.gateway, &daily, slot, false).await.expect("first fire");
    let Ingested::Posted(posted) = first else { panic!("expected a post, got {first:?}") };
    // The timer and a catch-up (or a second process) fire the same slot.
    let second = fire(&f.gateway, &daily, slot, true).await.expect("second fire");
    assert_eq!(second, Ingested::Duplicate(posted.id.clone()));
    let stored = triggers(&f.gateway).await;
    assert_eq!(stored.len(), 1);
    let trigger = &stored[0];
    assert_eq!((trigger.sender.as_str(), trigger.status), ("Cronjob", Status::PendingAgent));
    assert_eq!((trigger.metadata.is_cronjob, trigger.metadata.cron_job.as_deref()), (Some(true), Some("daily")));
    assert!(!trigger.metadata.extra.contains_key(CATCH_UP_KEY), "the first post is kept as it was");
    assert_eq!(trigger.session_id, f.session.id);
    // The next day's slot is a run of its own.
    let next = fire(&f.gateway, &daily, slot + chrono::Duration::days(1), false).await.expect("next day");
    assert!(matches!(next, Ingested::Posted(_)), "{next:?}");
    assert_eq!(triggers(&f.gateway).await.len(), 2);
}

#[test]
fn day_of_month_and_day_of_week_combine_with_or_like_vixie_cron() {
    // "the 13th, or any Friday": from Monday 2026-11-30 the next run is Friday 2026-12-04.
    let job = CronJob::parse(job("either", "0 0 13 * 5")).expect("parse");
    let monday = Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).single().expect("time");
    assert_eq!(job.next_after(monday), Utc.with_ymd_and_hms(2026, 12, 4, 0, 0, 0).single());
}

#[test]
fn schedules_follow_their_time_zone() {
    let mut config = job("morning", "0 9 * * *");
    config.timezone = Some("Asia/Singapore".into());
    let job = CronJob::parse(config).expect("parse");
    let before = Utc.with_ymd_and_hms(2026, 12, 3, 0, 0, 0).single().expect("time");
    // 09:00 in Singapore is 01:00 UTC.
    assert_eq!(job.next_after(before), Utc.with_ymd_and_hms(2026, 12, 3, 1, 0, 0).single());
}

#[test]
fn bad_jobs_are_clear_errors() {
    let error = CronJob::parse(job("broken", "61 * * * *")).expect_err("bad minute").to_string();
    assert!(error.contains("broken") && error.contains("61 * * * *"), "{error}");
    let mut config = job("zoned", "@daily");
    config.timezone = Some("Mars/Olympus".into());
    let error = CronJob::parse(config).expect_err("bad zone").to_string();
    assert!(error.contains("Mars/Olympus"), "{error}");
    let error = CronJob::parse_all(&[job("twice", "@daily"), job("twice", "@hourly")]).expect_err("dup").to_string();
    assert!(error.contains("twice"), "{error}");
}

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).single().expect("a valid UTC time")
}

/// Run `config` on paused time from `start` until it has posted `runs` triggers, and return
/// them. The test waits on the store's broadcasts, never on a timer of its own, so tokio's
/// clock moves only to the schedule's own wake-ups and every message is stamped at the moment
/// the schedule fired.
async fn paused_runs(config: CronJobConfig, start: DateTime<Utc>, runs: usize) -> Vec<Message> {
    let (_dir, path) = kesoku_test_support::db::temp_sqlite_path();
    let store = SqliteStore::open(&path).await.expect("open a sqlite store").with_clock(Clock::following_tokio(start));
    let handle = StoreHandle::new(store);
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    let rev = gateway.store().current_rev().await.expect("current revision");
    let mut posted =
        Box::pin(gateway.listen(MessageFilter::default().with_roles(&[Role::User]), ListenFrom::AfterRev(rev)));
    let shutdown = CancellationToken::new();
    let job = CronJob::parse(config).expect("parse");
    let task = tokio::spawn(run_cron(gateway.clone(), vec![job], shutdown.clone()));
    let mut messages = Vec::new();
    while messages.len() < runs {
        let event = posted.next().await.expect("the broker stays open").expect("a stored trigger");
        messages.push(event.message);
    }
    shutdown.cancel();
    task.await.expect("join");
    messages
}

fn paris_daily() -> CronJobConfig {
    CronJobConfig {
        timezone: Some("Europe/Paris".into()),
        model: Some("reports".into()),
        output_schema: Some(json!({"type": "object", "properties": {"healthy": {"type": "boolean"}}})),
        ..job("morning", "0 9 * * *")
    }
}

/// What each trigger must be: posted at 09:00 Paris time (`expected` in UTC), saying so in
/// its header, and asking for a workflow activation whose trigger context names that time.
fn assert_runs_at(messages: &[Message], expected: &[(DateTime<Utc>, &str)]) {
    let got: Vec<_> =
        messages.iter().map(|m| (m.created_at, m.content.lines().next().unwrap_or("").to_owned())).collect();
    let want: Vec<_> =
        expected.iter().map(|(at, local)| (Some(*at), format!("`Cronjob` at `{local} Europe/Paris`:"))).collect();
    assert_eq!(got, want);
    for (message, (at, _)) in messages.iter().zip(expected) {
        assert_eq!(
            (message.role, message.sender.as_str(), message.status),
            (Role::User, "Cronjob", Status::PendingAgent)
        );
        assert!(
            message.content.ends_with("\nRun active diagnostics and output status summary."),
            "{}",
            message.content
        );
        assert_eq!((message.metadata.is_cronjob, message.metadata.cron_job.as_deref()), (Some(true), Some("morning")));
        assert_eq!(message.metadata.model.as_deref(), Some("reports"));
        let request = ActivationRequest {
            task: Some("Run active diagnostics and output status summary.".into()),
            trigger: Some(TriggerContext {
                name: "morning".into(),
                source: "cron".into(),
                schedule: Some("0 9 * * *".into()),
                fired_at: *at,
            }),
            output_schema: Some(json!({"type": "object", "properties": {"healthy": {"type": "boolean"}}})),
            timezone: Some("Europe/Paris".into()),
            triggered_by: Some("cron:morning".into()),
            ..ActivationRequest::new(ActivationKind::Workflow)
        };
        assert_eq!(message.metadata.activation.as_deref(), Some(&request));
    }
}

#[tokio::test(start_paused = true)]
async fn a_paris_morning_job_fires_at_nine_local_across_the_spring_dst_change() {
    // Clocks go forward in Paris at 01:00 UTC on 2026-03-29: 09:00 is 08:00 UTC before, 07:00 after.
    let messages = paused_runs(paris_daily(), utc(2026, 3, 27, 12, 0), 3).await;
    assert_runs_at(
        &messages,
        &[
            (utc(2026, 3, 28, 8, 0), "2026-03-28 09:00:00"),
            (utc(2026, 3, 29, 7, 0), "2026-03-29 09:00:00"),
            (utc(2026, 3, 30, 7, 0), "2026-03-30 09:00:00"),
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn a_paris_morning_job_fires_at_nine_local_across_the_autumn_dst_change() {
    // Clocks go back in Paris at 01:00 UTC on 2026-10-25: 09:00 is 07:00 UTC before, 08:00 after.
    let messages = paused_runs(paris_daily(), utc(2026, 10, 23, 12, 0), 3).await;
    assert_runs_at(
        &messages,
        &[
            (utc(2026, 10, 24, 7, 0), "2026-10-24 09:00:00"),
            (utc(2026, 10, 25, 8, 0), "2026-10-25 09:00:00"),
            (utc(2026, 10, 26, 8, 0), "2026-10-26 09:00:00"),
        ],
    );
}

#[test]
fn an_output_schema_that_is_not_an_object_is_refused() {
    let config = CronJobConfig { output_schema: Some(json!("boolean")), ..job("typed", "@daily") };
    let error = CronJob::parse(config).expect_err("a string is no schema").to_string();
    assert!(error.contains("`typed`") && error.contains("output_schema") && error.contains("got a string"), "{error}");
    let config = CronJobConfig { output_schema: Some(json!({"type": "object"})), ..job("typed", "@daily") };
    assert!(CronJob::parse(config).is_ok());
}

#[test]
fn an_output_schema_that_does_not_compile_is_refused_saying_why() {
    let config = CronJobConfig {
        name: "typed".into(),
        schedule: "0 9 * * *".into(),
        prompt: "report".into(),
        chatbot: "api".into(),
        channel: "ops".into(),
        timezone: None,
        catch_up: true,
        model: None,
        output_schema: Some(serde_json::json!({"type": 12})),
        delegation_user: None,
    };
    let error = CronJob::parse(config).map(|_| ()).expect_err("refused").to_string();
    assert!(error.contains("`typed`") && error.contains("is not a valid JSON Schema"), "{error}");
}

#[test]
fn a_jobs_delegation_user_is_carried_in_the_workflow_activation_it_asks_for() {
    let at = Utc::now();
    let mine = CronJob::parse(CronJobConfig { delegation_user: Some("alice".into()), ..job("mine", "@daily") })
        .expect("valid");
    assert_eq!(mine.activation(at).delegation_user.as_deref(), Some("alice"));
    let nobody = CronJob::parse(job("theirs", "@daily")).expect("valid");
    assert_eq!(nobody.activation(at).delegation_user, None);
}
