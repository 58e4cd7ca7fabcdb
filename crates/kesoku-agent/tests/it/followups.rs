//! Follow-ups on paused time: scheduled through the tools, fired once at their due time as the
//! spec's system row (a reminder asking for a follow-up activation), across DST changes,
//! restarts, a crash between posting and marking, two schedulers, and cancellation.
//!
//! Tests wait on the store's broadcasts, not on timers of their own, while a scheduler works:
//! tokio's paused clock then moves only to the scheduler's own wake-ups, and every reminder is
//! stamped at the instant it fired.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use kesoku_agent::Followups;
use kesoku_agent::followups::{CANCEL_FOLLOWUP, LIST_FOLLOWUPS, SCHEDULE_FOLLOWUP, parse_zone};
use kesoku_broker::MemoryBroker;
use kesoku_core::{
    ActivationKind, ActivationRequest, FollowUp, FollowUpFilter, FollowUpId, FollowUpState, Message, MessageFilter,
    MessageType, Role, Session, Status,
};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_store::{Clock, SqliteStore};
use kesoku_tools::{Registry, ToolContext, ToolOrigin, ToolOutput};
use serde_json::json;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BOT: &str = "discord";
const CHANNEL: &str = "1234567890123";

fn utc(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text).expect("an RFC 3339 time").with_timezone(&Utc)
}

/// One "process": a store opened on the shared file, its gateway, its follow-ups and tools.
struct Process {
    store: SqliteStore,
    gateway: Gateway,
    followups: Followups,
    tools: Registry,
}

impl Process {
    async fn open(path: &Path, clock: &Clock) -> Process {
        let store = SqliteStore::open(path).await.expect("open the sqlite store").with_clock(clock.clone());
        let gateway = Gateway::new(Arc::new(store.clone()), Arc::new(MemoryBroker::default()));
        let followups = Followups::new(gateway.clone(), parse_zone("Europe/Paris").expect("a zone"));
        let mut tools = Registry::new();
        followups.register(&mut tools).expect("register the follow-up tools");
        Process { store, gateway, followups, tools }
    }

    /// Run the scheduler until the returned token is cancelled.
    fn start(&self) -> (CancellationToken, JoinHandle<()>) {
        let shutdown = CancellationToken::new();
        (shutdown.clone(), tokio::spawn(self.followups.clone().run(shutdown)))
    }

    /// A tool call from a turn of `session` (whose root is `root`), in Paris time.
    async fn call(
        &self,
        session: &Session,
        root: Option<&Message>,
        tool: &str,
        arguments: serde_json::Value,
    ) -> ToolOutput {
        let mut ctx = ToolContext::new("/tmp", "/tmp", session.id.clone(), "call_1");
        if let Some(root) = root {
            ctx = ctx.with_origin(ToolOrigin {
                message_id: root.id.clone(),
                chatbot_id: root.chatbot_id.clone(),
                channel_id: root.channel_id.clone(),
                timezone: Some("Europe/Paris".into()),
                depth: 0,
                activation_id: None,
            });
        }
        self.tools.call(tool, &ctx, arguments).await
    }

    async fn followup(&self, id: &FollowUpId) -> FollowUp {
        self.gateway.store().get_followup(id).await.expect("read the follow-up").expect("it exists")
    }

    async fn reminders(&self) -> Vec<Message> {
        let filter = MessageFilter::default().with_roles(&[Role::System]);
        self.gateway.store().list_messages(&filter).await.expect("list messages")
    }

    /// Stop using the file, as a process that exits does.
    async fn close(self) {
        self.store.close().await;
    }
}

struct Fixture {
    _dir: TempDir,
    path: PathBuf,
    clock: Clock,
    session: Session,
    root: Message,
}

impl Fixture {
    /// A store on paused time reading `start`, with one session and the root message of the turn
    /// that schedules.
    async fn new(start: &str) -> (Fixture, Process) {
        let (dir, path) = kesoku_test_support::db::temp_sqlite_path();
        let clock = Clock::following_tokio(utc(start));
        let process = Process::open(&path, &clock).await;
        let session = new_session(&process).await;
        let root = Message::user_text(&session.id, BOT, CHANNEL, "Ada", "Remind me to check the deploy.");
        process.gateway.store().insert_message(&root).await.expect("store the turn's root");
        (Fixture { _dir: dir, path, clock, session, root }, process)
    }

    async fn schedule(&self, process: &Process, when: &str, task: &str) -> (FollowUp, ToolOutput) {
        let output =
            process.call(&self.session, Some(&self.root), SCHEDULE_FOLLOWUP, json!({"when": when, "task": task})).await;
        assert!(!output.is_error(), "{output:?}");
        let pending = process.followups.pending(Some(&self.session.id)).await.expect("pending");
        let followup = pending.into_iter().find(|f| output.content.contains(f.id.as_str())).expect("the new follow-up");
        (followup, output)
    }
}

async fn new_session(process: &Process) -> Session {
    let session = Session::new(BOT, CHANNEL, process.gateway.store().clock().now());
    process.gateway.store().create_session(&session).await.expect("create a session");
    session
}

/// Wait (on broadcasts, not timers) for the next `count` reminders posted through `process`.
async fn next_reminders(process: &Process, count: usize) -> Vec<Message> {
    let rev = process.gateway.store().current_rev().await.expect("current revision");
    let filter = MessageFilter::default().with_roles(&[Role::System]);
    let mut posted = Box::pin(process.gateway.listen(filter, ListenFrom::AfterRev(rev)));
    let mut reminders = Vec::new();
    while reminders.len() < count {
        reminders.push(posted.next().await.expect("the broker stays open").expect("a stored reminder").message);
    }
    reminders
}

/// The reminder `followup` must post, stamped at `at`: the spec's system row (like a Background
/// Wakeup Alert) asking for a follow-up activation.
fn assert_reminder(reminder: &Message, followup: &FollowUp, at: DateTime<Utc>, content: &str) {
    assert_eq!(reminder.id, followup.root_message_id());
    assert_eq!(
        (reminder.role, reminder.message_type, reminder.sender.as_str(), reminder.status),
        (Role::System, MessageType::Text, "System", Status::PendingAgent)
    );
    assert_eq!(
        (&reminder.session_id, reminder.chatbot_id.as_str(), reminder.channel_id.as_str()),
        (&followup.session_id, BOT, CHANNEL)
    );
    assert_eq!(reminder.parent_id, None);
    assert_eq!(reminder.created_at, Some(at));
    assert_eq!(reminder.content, content);
    let request = ActivationRequest {
        followup_id: Some(followup.id.clone()),
        task: Some(followup.task.clone()),
        ..ActivationRequest::new(ActivationKind::FollowUp)
    };
    assert_eq!(reminder.metadata.activation.as_deref(), Some(&request));
}

async fn stop(scheduler: (CancellationToken, JoinHandle<()>)) {
    scheduler.0.cancel();
    scheduler.1.await.expect("the scheduler stops");
}

#[tokio::test(start_paused = true)]
async fn a_delay_and_an_rfc3339_followup_each_fire_once_at_their_due_time() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let (in_two_hours, output) = f.schedule(&process, "2h", "Check the deploy.").await;
    assert_eq!(in_two_hours.due_at, utc("2026-12-05T12:00:00Z"));
    assert_eq!(
        output.content,
        format!(
            "Follow-up {} scheduled for 2026-12-05 13:00:00 CET (in 2h). You will get a reminder in this \
             conversation then, with the task: Check the deploy.",
            in_two_hours.id
        )
    );
    let (tomorrow, output) = f.schedule(&process, "2026-12-06T09:00:00+01:00", "Send the weekly report.").await;
    assert!(output.content.contains("scheduled for 2026-12-06 09:00:00 CET (in 22h)"), "{}", output.content);
    assert_eq!(
        (&tomorrow.session_id, tomorrow.chatbot_id.as_str(), tomorrow.channel_id.as_str()),
        (&f.session.id, BOT, CHANNEL)
    );
    assert_eq!((tomorrow.created_by.as_ref(), tomorrow.state), (Some(&f.root.id), FollowUpState::Pending));

    let scheduler = process.start();
    let reminders = next_reminders(&process, 2).await;
    assert_reminder(
        &reminders[0],
        &in_two_hours,
        utc("2026-12-05T12:00:00Z"),
        "[Follow-up] You asked at 2026-12-05 11:00:00 CET to be reminded at 2026-12-05 13:00:00 CET: Check the deploy.",
    );
    assert_reminder(
        &reminders[1],
        &tomorrow,
        utc("2026-12-06T08:00:00Z"),
        "[Follow-up] You asked at 2026-12-05 11:00:00 CET to be reminded at 2026-12-06 09:00:00 CET: Send the weekly \
         report.",
    );
    // Two more days: nothing fires again.
    tokio::time::sleep(Duration::from_secs(2 * 86_400)).await;
    stop(scheduler).await;
    assert_eq!(process.reminders().await.len(), 2);
    for (followup, fired_at) in [(&in_two_hours, "2026-12-05T12:00:00Z"), (&tomorrow, "2026-12-06T08:00:00Z")] {
        let row = process.followup(&followup.id).await;
        assert_eq!((row.state, row.settled_at), (FollowUpState::Fired, Some(utc(fired_at))));
    }
    let output = process.call(&f.session, Some(&f.root), LIST_FOLLOWUPS, json!({})).await;
    assert_eq!(output.content, "No pending follow-ups in this conversation.");
}

#[tokio::test(start_paused = true)]
async fn a_followup_across_the_dst_change_shows_the_local_times_in_force() {
    // Paris leaves CET (+01:00) for CEST (+02:00) at 01:00 UTC on 2026-03-29.
    let (f, process) = Fixture::new("2026-03-28T10:00:00Z").await;
    let (one_day, output) = f.schedule(&process, "1d", "Water the plants.").await;
    assert!(output.content.contains("scheduled for 2026-03-29 12:00:00 CEST (in 1d)"), "{}", output.content);
    let (local, output) = f.schedule(&process, "2026-03-29 09:00", "Call the bakery.").await;
    assert!(output.content.contains("scheduled for 2026-03-29 09:00:00 CEST (in 21h)"), "{}", output.content);
    let scheduler = process.start();
    let reminders = next_reminders(&process, 2).await;
    stop(scheduler).await;
    assert_reminder(
        &reminders[0],
        &local,
        utc("2026-03-29T07:00:00Z"),
        "[Follow-up] You asked at 2026-03-28 11:00:00 CET to be reminded at 2026-03-29 09:00:00 CEST: Call the bakery.",
    );
    assert_reminder(
        &reminders[1],
        &one_day,
        utc("2026-03-29T10:00:00Z"),
        "[Follow-up] You asked at 2026-03-28 11:00:00 CET to be reminded at 2026-03-29 12:00:00 CEST: Water the plants.",
    );
}

#[tokio::test(start_paused = true)]
async fn a_scheduler_stopped_before_the_due_time_fires_once_after_a_restart() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let (followup, _) = f.schedule(&process, "2h", "Check the deploy.").await;
    let scheduler = process.start();
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    stop(scheduler).await;
    process.close().await;
    assert_eq!(f.clock.now(), utc("2026-12-05T11:00:00Z"));

    // The restarted process reads the follow-up back from the file and fires it on time.
    let process = Process::open(&f.path, &f.clock).await;
    let scheduler = process.start();
    let reminders = next_reminders(&process, 1).await;
    stop(scheduler).await;
    assert_reminder(
        &reminders[0],
        &followup,
        utc("2026-12-05T12:00:00Z"),
        "[Follow-up] You asked at 2026-12-05 11:00:00 CET to be reminded at 2026-12-05 13:00:00 CET: Check the deploy.",
    );
    assert_eq!(process.reminders().await.len(), 1);
    assert_eq!(process.followup(&followup.id).await.state, FollowUpState::Fired);
}

#[tokio::test(start_paused = true)]
async fn a_followup_due_while_nothing_ran_fires_once_at_start_and_not_again_after_another_restart() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let (followup, _) = f.schedule(&process, "2h", "Check the deploy.").await;
    process.close().await;
    // Down from 10:00 to 15:00 UTC: the follow-up came due at 12:00 with no scheduler running.
    tokio::time::sleep(Duration::from_secs(5 * 3_600)).await;

    let process = Process::open(&f.path, &f.clock).await;
    let scheduler = process.start();
    let reminders = next_reminders(&process, 1).await;
    stop(scheduler).await;
    // Posted when the scheduler came back; its text still says when it was due.
    assert_reminder(
        &reminders[0],
        &followup,
        utc("2026-12-05T15:00:00Z"),
        "[Follow-up] You asked at 2026-12-05 11:00:00 CET to be reminded at 2026-12-05 13:00:00 CET: Check the deploy.",
    );
    process.close().await;

    let process = Process::open(&f.path, &f.clock).await;
    let scheduler = process.start();
    tokio::time::sleep(Duration::from_secs(86_400)).await;
    stop(scheduler).await;
    assert_eq!(process.reminders().await.len(), 1);
    let row = process.followup(&followup.id).await;
    assert_eq!((row.state, row.settled_at), (FollowUpState::Fired, Some(utc("2026-12-05T15:00:00Z"))));
}

#[tokio::test(start_paused = true)]
async fn a_crash_between_posting_and_marking_leaves_one_reminder_and_a_fired_row() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let (followup, _) = f.schedule(&process, "10m", "Check the deploy.").await;
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;
    // What a scheduler that died right after posting left behind: the reminder, a pending row.
    process.gateway.post(&process.followups.reminder(&followup)).await.expect("post the reminder");
    assert_eq!(process.followup(&followup.id).await.state, FollowUpState::Pending);
    process.close().await;

    let process = Process::open(&f.path, &f.clock).await;
    assert_eq!(process.followups.fire_due().await.expect("a pass"), None, "nothing else is pending");
    assert_eq!(process.reminders().await.len(), 1);
    let row = process.followup(&followup.id).await;
    assert_eq!((row.state, row.settled_at), (FollowUpState::Fired, Some(utc("2026-12-05T10:15:00Z"))));
    // Another pass changes nothing.
    process.followups.fire_due().await.expect("a second pass");
    assert_eq!(process.reminders().await.len(), 1);
    assert_eq!(process.followup(&followup.id).await, row);
}

#[tokio::test(start_paused = true)]
async fn two_schedulers_on_one_store_fire_a_followup_once() {
    let (f, first) = Fixture::new("2026-12-05T10:00:00Z").await;
    let second = Process::open(&f.path, &f.clock).await;
    let (followup, _) = f.schedule(&first, "10m", "Check the deploy.").await;
    let (other, _) = f.schedule(&second, "20m", "Check the logs.").await;
    tokio::time::sleep(Duration::from_secs(30 * 60)).await;
    let (a, b) = tokio::join!(first.followups.fire_due(), second.followups.fire_due());
    a.expect("first pass");
    b.expect("second pass");
    let reminders = first.reminders().await;
    let ids: Vec<_> = reminders.iter().map(|m| m.id.clone()).collect();
    assert_eq!(ids, vec![followup.root_message_id(), other.root_message_id()]);
    assert_eq!(first.followup(&followup.id).await.state, FollowUpState::Fired);
    assert_eq!(first.followup(&other.id).await.state, FollowUpState::Fired);
}

#[tokio::test(start_paused = true)]
async fn a_followup_cancelled_before_it_is_due_never_fires() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let (followup, _) = f.schedule(&process, "2h", "Check the deploy.").await;
    let (kept, _) = f.schedule(&process, "3h", "Check the logs.").await;
    let scheduler = process.start();
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    let output = process.call(&f.session, Some(&f.root), CANCEL_FOLLOWUP, json!({"followup_id": followup.id})).await;
    assert_eq!(
        output.content,
        format!("Follow-up {} (due 2026-12-05 13:00:00 CET) is cancelled: Check the deploy.", followup.id)
    );
    let output = process.call(&f.session, Some(&f.root), LIST_FOLLOWUPS, json!({})).await;
    assert_eq!(
        output.content,
        format!(
            "Pending follow-ups, soonest first:\n- {}: due 2026-12-05 14:00:00 CET (in 2h): Check the logs.",
            kept.id
        )
    );
    let reminders = next_reminders(&process, 1).await;
    assert_eq!(reminders[0].id, kept.root_message_id(), "only the one left pending");
    tokio::time::sleep(Duration::from_secs(86_400)).await;
    stop(scheduler).await;
    assert_eq!(process.reminders().await.len(), 1);
    let row = process.followup(&followup.id).await;
    assert_eq!((row.state, row.settled_at), (FollowUpState::Cancelled, Some(utc("2026-12-05T11:00:00Z"))));
    // Cancelling again, or cancelling one that fired, is refused.
    let again = process.call(&f.session, Some(&f.root), CANCEL_FOLLOWUP, json!({"followup_id": followup.id})).await;
    assert_eq!(again.error, Some(format!("follow-up `{}` was already cancelled", followup.id)));
    let fired = process.call(&f.session, Some(&f.root), CANCEL_FOLLOWUP, json!({"followup_id": kept.id})).await;
    assert_eq!(
        fired.error,
        Some(format!(
            "follow-up `{}` already fired (at 2026-12-05 14:00:00 CET); there is nothing left to cancel",
            kept.id
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn another_sessions_followup_cannot_be_cancelled_or_listed() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let (followup, _) = f.schedule(&process, "2h", "Check the deploy.").await;
    let other = new_session(&process).await;
    let output = process.call(&other, Some(&f.root), CANCEL_FOLLOWUP, json!({"followup_id": followup.id})).await;
    assert_eq!(
        output.error,
        Some(format!(
            "there is no follow-up `{}` in this session: list_followups shows this session's pending ones",
            followup.id
        ))
    );
    let output = process.call(&other, Some(&f.root), LIST_FOLLOWUPS, json!({})).await;
    assert_eq!(output.content, "No pending follow-ups in this conversation.");
    assert_eq!(process.followup(&followup.id).await.state, FollowUpState::Pending);
}

#[tokio::test(start_paused = true)]
async fn a_reminder_posted_but_not_marked_cannot_be_cancelled() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let (followup, _) = f.schedule(&process, "10m", "Check the deploy.").await;
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;
    process.gateway.post(&process.followups.reminder(&followup)).await.expect("post the reminder");
    let output = process.call(&f.session, Some(&f.root), CANCEL_FOLLOWUP, json!({"followup_id": followup.id})).await;
    assert!(
        output.error.as_deref().is_some_and(|e| e.contains("already fired (at 2026-12-05 11:15:00 CET)")),
        "{output:?}"
    );
    assert_eq!(process.followup(&followup.id).await.state, FollowUpState::Fired);
}

#[tokio::test(start_paused = true)]
async fn bad_calls_are_refused_with_what_to_do() {
    let (f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    let cases = [
        (json!({"when": "soon", "task": "x"}), "`soon` is neither a time nor a delay"),
        (json!({"when": "2026-12-05T09:00:00Z", "task": "x"}), "is in the past (it is now 2026-12-05 11:00:00 CET)"),
        (json!({"when": "400d", "task": "x"}), "more than a year ahead"),
        (json!({"when": "2h", "task": "  "}), "the task is empty"),
        (json!({"when": "2h"}), "missing"),
    ];
    for (arguments, expected) in cases {
        let output = process.call(&f.session, Some(&f.root), SCHEDULE_FOLLOWUP, arguments.clone()).await;
        assert!(output.error.as_deref().is_some_and(|e| e.contains(expected)), "{arguments}: {output:?}");
    }
    // Outside a turn there is nothing to come back to.
    let output = process.call(&f.session, None, SCHEDULE_FOLLOWUP, json!({"when": "2h", "task": "x"})).await;
    assert!(output.error.as_deref().is_some_and(|e| e.contains("only be scheduled from a turn")), "{output:?}");
    let all = process.gateway.store().list_followups(&FollowUpFilter::default()).await.expect("list");
    assert!(all.is_empty(), "nothing was stored: {all:?}");
}

#[tokio::test(start_paused = true)]
async fn a_followup_scheduled_in_work_for_a_person_fires_for_the_same_person() {
    let (mut f, process) = Fixture::new("2026-12-05T10:00:00Z").await;
    // The scheduling turn ran for alice (its root asked for that).
    let mut root = Message::user_text(&f.session.id, BOT, CHANNEL, "Ada", "Check my pull requests tomorrow.");
    root.metadata.activation = Some(Box::new(ActivationRequest {
        delegation_user: Some("alice".into()),
        ..ActivationRequest::new(ActivationKind::Message)
    }));
    process.gateway.store().insert_message(&root).await.expect("store the delegated root");
    f.root = root;
    let (followup, _) = f.schedule(&process, "10m", "Check alice's pull requests.").await;
    tokio::time::sleep(Duration::from_secs(15 * 60)).await;
    process.followups.fire_due().await.expect("a pass");
    let reminders = process.reminders().await;
    assert_eq!(reminders.len(), 1);
    let request = reminders[0].metadata.activation.as_ref().expect("a follow-up request");
    assert_eq!((request.kind, request.followup_id.as_ref()), (ActivationKind::FollowUp, Some(&followup.id)));
    assert_eq!(request.delegation_user.as_deref(), Some("alice"), "the reminder's turn runs for alice too");
}
