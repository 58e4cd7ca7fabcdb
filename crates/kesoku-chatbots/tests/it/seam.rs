//! The seam over a real SQLite store and ledger: delivery in recorded parts, retries, permanent
//! failures, platforms without step UI, and ingestion (dedup, staging, refusals, sessions).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use kesoku_chatbots::answer::{OutboundPart, Part};
use kesoku_chatbots::delivery::DELIVERY_ERROR_KEY;
use kesoku_chatbots::staging::{IncomingFile, Staging};
use kesoku_chatbots::{
    Capabilities, Chatbot, Delivered, Deliverer, DeliveryError, Inbound, IngestError, Ingested, RetryPolicy, ingest,
};
use kesoku_core::{
    ActivationId, ActivationKind, DeliveryRecord, Lane, LedgerEntry, Message, MessageFilter, MessageId, Role, Session,
    Status, TurnOrigin, Usage,
};
use kesoku_gateway::Gateway;
use tokio_util::sync::CancellationToken;

use crate::support::{Fixture, eventually, fixture};

/// A platform that records what it was sent, checks the store while sending, and fails on
/// demand.
struct Platform {
    gateway: Gateway,
    capabilities: Capabilities,
    /// (message, part index, text) of every successful send.
    sent: Mutex<Vec<(MessageId, u32, String)>>,
    /// Every call of `send_part`, failed or not.
    attempts: Mutex<u32>,
    steps: Mutex<Vec<MessageId>>,
    /// What `on_delivered` was given.
    after_delivery: Mutex<Vec<(MessageId, Vec<u32>)>>,
    /// Failures the next sends return, in order.
    failures: Mutex<VecDeque<DeliveryError>>,
    /// Invariants broken during a send (checked by the tests afterwards).
    broken: Mutex<Vec<String>>,
}

impl Platform {
    fn new(gateway: &Gateway, capabilities: Capabilities) -> Arc<Platform> {
        Arc::new(Platform {
            gateway: gateway.clone(),
            capabilities,
            sent: Mutex::default(),
            attempts: Mutex::default(),
            steps: Mutex::default(),
            after_delivery: Mutex::default(),
            failures: Mutex::default(),
            broken: Mutex::default(),
        })
    }

    fn fail_next(&self, errors: impl IntoIterator<Item = DeliveryError>) {
        self.failures.lock().expect("lock").extend(errors);
    }

    fn sent_indexes(&self, id: &MessageId) -> Vec<u32> {
        self.sent.lock().expect("lock").iter().filter(|(m, _, _)| m == id).map(|(_, i, _)| *i).collect()
    }

    fn attempts(&self) -> u32 {
        *self.attempts.lock().expect("lock")
    }
}

fn transient() -> DeliveryError {
    DeliveryError::Transient { reason: "503 service unavailable".into(), retry_after: None }
}

#[async_trait]
impl Chatbot for Platform {
    fn chatbot_id(&self) -> &str {
        "cli"
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError> {
        self.steps.lock().expect("lock").push(step.id.clone());
        Ok(())
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        *self.attempts.lock().expect("lock") += 1;
        let failure = self.failures.lock().expect("lock").pop_front();
        if let Some(failure) = failure {
            return Err(failure);
        }
        // Every earlier part is recorded before this one goes out, and the message is not
        // marked delivered while parts are missing.
        let store = self.gateway.store();
        let records = store.delivery_records(&message.id).await.expect("records");
        let recorded: Vec<u32> = records.iter().map(|r| r.part).collect();
        if recorded.iter().any(|&i| i >= part.index) || recorded.len() < usize::try_from(part.index).expect("index") {
            let text = format!("part {} sent with records {recorded:?}", part.index);
            self.broken.lock().expect("lock").push(text);
        }
        let status = store.get_message(&message.id).await.expect("read").expect("stored").status;
        if status != Status::Pending {
            self.broken.lock().expect("lock").push(format!("part {} sent while {status:?}", part.index));
        }
        let Part::Text(text) = &part.part else { panic!("only text parts here: {part:?}") };
        self.sent.lock().expect("lock").push((message.id.clone(), part.index, text.clone()));
        Ok(format!("platform-{}", part.key))
    }

    async fn on_delivered(&self, message: &Message, sent: &[DeliveryRecord]) -> Result<(), DeliveryError> {
        let status = self.gateway.store().get_message(&message.id).await.expect("read").expect("stored").status;
        if status != Status::Delivered {
            self.broken.lock().expect("lock").push(format!("on_delivered while {status:?}"));
        }
        self.after_delivery.lock().expect("lock").push((message.id.clone(), sent.iter().map(|r| r.part).collect()));
        Ok(())
    }
}

/// Lets every part through but part 1, which the platform refuses for good.
struct SecondRefused(Arc<Platform>);

#[async_trait]
impl Chatbot for SecondRefused {
    fn chatbot_id(&self) -> &str {
        "cli"
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError> {
        self.0.show_step(step).await
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        if part.index == 1 {
            return Err(DeliveryError::Permanent { reason: "the channel is gone (404)".into() });
        }
        self.0.send_part(message, part).await
    }
}

/// A text-only platform with a 40-character limit: three words of 30 characters make three parts.
fn narrow() -> Capabilities {
    Capabilities::text_only(40)
}

fn three_part_text() -> String {
    ["a".repeat(30), "b".repeat(30), "c".repeat(30)].join("\n")
}

/// A root in `processing` and its final answer, `pending`, in the fixture's session.
async fn answer(fixture: &Fixture, text: &str) -> (Message, Message) {
    let root = Message::user_text(&fixture.session.id, "cli", "cli", "User", "question");
    fixture.gateway.post(&root).await.expect("post root");
    fixture.gateway.update_status(&root.id, Status::Processing).await.expect("claim");
    let answer = TurnOrigin::of(&root, "Kesoku").final_text(1, text, None);
    fixture.gateway.post(&answer).await.expect("post answer");
    (root, answer)
}

async fn stored(fixture: &Fixture, id: &MessageId) -> Message {
    fixture.gateway.store().get_message(id).await.expect("read").expect("stored")
}

fn deliverer(fixture: &Fixture) -> Deliverer {
    Deliverer::new(fixture.gateway.clone(), fixture.workspace()).with_ledger(Arc::clone(&fixture.ledger))
}

#[tokio::test]
async fn each_part_is_recorded_before_the_next_and_the_message_is_delivered_after_all() {
    let fixture = fixture().await;
    let platform = Platform::new(&fixture.gateway, narrow());
    let (_, answer) = answer(&fixture, &three_part_text()).await;
    let outcome = deliverer(&fixture).deliver(platform.as_ref(), &answer).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert!(platform.broken.lock().expect("lock").is_empty(), "{:?}", platform.broken.lock().expect("lock"));
    let sent: Vec<String> = platform.sent.lock().expect("lock").iter().map(|(_, _, t)| t.clone()).collect();
    assert_eq!(sent, ["a".repeat(30), "b".repeat(30), "c".repeat(30)]);
    let records = fixture.gateway.store().delivery_records(&answer.id).await.expect("records");
    let rows: Vec<(u32, String)> = records.iter().map(|r| (r.part, r.platform_message_id.clone())).collect();
    let expected: Vec<(u32, String)> = (0..3).map(|i| (i, format!("platform-{}:{i}", answer.id))).collect();
    assert_eq!(rows, expected, "one row per part, with the platform's id");
    assert_eq!(stored(&fixture, &answer.id).await.status, Status::Delivered);
    assert_eq!(*platform.after_delivery.lock().expect("lock"), vec![(answer.id.clone(), vec![0, 1, 2])]);
}

#[tokio::test]
async fn a_restarted_delivery_resumes_at_the_first_unrecorded_part() {
    let fixture = fixture().await;
    let platform = Platform::new(&fixture.gateway, narrow());
    let (_, answer) = answer(&fixture, &three_part_text()).await;
    // A previous run sent and recorded parts 0 and 1, then the process died.
    for part in 0..2 {
        let record = DeliveryRecord {
            message_id: answer.id.clone(),
            part,
            platform_message_id: format!("earlier-{part}"),
            recorded_at: Utc::now(),
        };
        fixture.gateway.store().record_delivery(&record).await.expect("record");
    }
    let outcome = deliverer(&fixture).deliver(platform.as_ref(), &answer).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert_eq!(platform.sent_indexes(&answer.id), vec![2], "only the unrecorded part is sent");
    let records = fixture.gateway.store().delivery_records(&answer.id).await.expect("records");
    let ids: Vec<&str> = records.iter().map(|r| r.platform_message_id.as_str()).collect();
    assert_eq!(ids, ["earlier-0", "earlier-1", &format!("platform-{}:2", answer.id)]);
    assert_eq!(stored(&fixture, &answer.id).await.status, Status::Delivered);
}

#[tokio::test(start_paused = true)]
async fn transient_failures_are_retried_with_backoff() {
    let fixture = fixture().await;
    let platform = Platform::new(&fixture.gateway, narrow());
    let (_, answer) = answer(&fixture, "short answer").await;
    platform.fail_next([transient(), transient()]);
    let started = tokio::time::Instant::now();
    let outcome = deliverer(&fixture).deliver(platform.as_ref(), &answer).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert_eq!(platform.attempts(), 3);
    assert_eq!(platform.sent_indexes(&answer.id), vec![0], "sent once");
    // The default policy waits 1 s, then 2 s (the paused clock jumps; nothing really sleeps).
    assert!(started.elapsed() >= Duration::from_secs(3), "backed off: {:?}", started.elapsed());
    assert_eq!(stored(&fixture, &answer.id).await.status, Status::Delivered);
}

#[tokio::test(start_paused = true)]
async fn a_message_left_undelivered_when_retries_run_out_is_delivered_by_the_sweep() {
    let fixture = fixture().await;
    let platform = Platform::new(&fixture.gateway, narrow());
    let (_, answer) = answer(&fixture, "kept for later").await;
    let retry = RetryPolicy {
        attempts: 2,
        first_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(4),
        // Within the polls of `eventually` (10 ms of the paused clock each).
        sweep_every: Duration::from_secs(5),
    };
    let deliverer = deliverer(&fixture).with_retry(retry);
    // Two failures for this call, two for the run's first pass; the sweep then gets through.
    platform.fail_next([transient(), transient(), transient(), transient()]);
    let error = deliverer.deliver(platform.as_ref(), &answer).await.expect_err("the tries run out");
    assert!(error.to_string().contains("503 service unavailable"), "{error}");
    assert_eq!(stored(&fixture, &answer.id).await.status, Status::Pending, "left for later, not lost");
    assert!(fixture.gateway.store().delivery_records(&answer.id).await.expect("records").is_empty());

    let shutdown = CancellationToken::new();
    let task = {
        let deliverer = deliverer.clone();
        let chatbot: Arc<dyn Chatbot> = platform.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { deliverer.run(chatbot, shutdown).await })
    };
    eventually("the sweep delivers the answer", || async {
        stored(&fixture, &answer.id).await.status == Status::Delivered
    })
    .await;
    shutdown.cancel();
    task.await.expect("the run stops");
    assert_eq!(platform.attempts(), 5, "two, two, then one that went through");
    assert_eq!(platform.sent_indexes(&answer.id), vec![0]);
}

#[tokio::test]
async fn a_permanent_failure_marks_the_answer_error_says_why_and_notes_it_on_the_ledger() {
    let fixture = fixture().await;
    let platform = Platform::new(&fixture.gateway, narrow());
    let (root, answer) = answer(&fixture, &three_part_text()).await;
    let row = LedgerEntry {
        id: ActivationId::from("act_turn"),
        kind: ActivationKind::Message,
        lane: Lane::Interactive,
        session_id: fixture.session.id.clone(),
        message_id: Some(root.id.clone()),
        triggered_by: "User".into(),
        delegation_user: None,
        depth: 0,
        agent: None,
        enqueued_at: Utc::now(),
        started_at: None,
        finished_at: None,
        outcome: None,
        error: None,
        usage: Usage::default(),
    };
    fixture.ledger.record_enqueued(&row).await.expect("ledger row");
    // Part 0 goes out, part 1 is refused for good.
    let deliverer = deliverer(&fixture);
    let refusing = SecondRefused(Arc::clone(&platform));
    let outcome = deliverer.deliver(&refusing, &answer).await.expect("deliver");
    let Delivered::Failed(reason) = outcome else { panic!("expected a failure, got {outcome:?}") };
    assert_eq!(reason, "part 1 could not be sent: the channel is gone (404)");
    assert_eq!(platform.sent_indexes(&answer.id), vec![0]);
    let message = stored(&fixture, &answer.id).await;
    assert_eq!(message.status, Status::Error);
    assert_eq!(message.metadata.extra.get(DELIVERY_ERROR_KEY), Some(&serde_json::Value::String(reason.clone())));
    let noted = fixture.ledger.get_activation(&row.id).await.expect("read").expect("row");
    assert_eq!(noted.error.as_deref(), Some(format!("delivery failed: {reason}").as_str()));
    // Not retried: the next attempt (a sweep, a restart) skips it.
    assert_eq!(deliverer.deliver(&refusing, &answer).await.expect("again"), Delivered::Skipped);
    assert_eq!(platform.sent_indexes(&answer.id), vec![0]);
}

#[tokio::test]
async fn a_platform_without_step_ui_gets_steps_marked_delivered_unshown() {
    let fixture = fixture().await;
    let platform = Platform::new(&fixture.gateway, narrow());
    let (root, _) = answer(&fixture, "done").await;
    let origin = TurnOrigin::of(&root, "Kesoku");
    let thought = origin.thought(1, "thinking", None);
    let call = origin.tool_call(1, "c1", "search", serde_json::json!({"q": "x"}));
    let result = origin.tool_result(&call, "found", None, None);
    let deliverer = deliverer(&fixture);
    for step in [&thought, &call, &result] {
        fixture.gateway.post(step).await.expect("post");
        assert_eq!(deliverer.deliver(platform.as_ref(), step).await.expect("deliver"), Delivered::Marked);
        assert_eq!(stored(&fixture, &step.id).await.status, Status::Delivered);
    }
    assert!(platform.steps.lock().expect("lock").is_empty(), "never shown");

    let with_ui = Platform::new(&fixture.gateway, Capabilities { shows_intermediates: true, ..narrow() });
    let later = origin.thought(2, "more thinking", None);
    fixture.gateway.post(&later).await.expect("post");
    assert_eq!(deliverer.deliver(with_ui.as_ref(), &later).await.expect("deliver"), Delivered::Shown);
    assert_eq!(*with_ui.steps.lock().expect("lock"), vec![later.id.clone()]);
}

#[tokio::test]
async fn a_stale_event_of_a_delivered_message_is_skipped() {
    let fixture = fixture().await;
    let platform = Platform::new(&fixture.gateway, narrow());
    let (_, answer) = answer(&fixture, "only once").await;
    let deliverer = deliverer(&fixture);
    assert_eq!(deliverer.deliver(platform.as_ref(), &answer).await.expect("deliver"), Delivered::Shown);
    // `answer` is the snapshot from before delivery (status `pending`), as a late event has it.
    assert_eq!(answer.status, Status::Pending);
    assert_eq!(deliverer.deliver(platform.as_ref(), &answer).await.expect("again"), Delivered::Skipped);
    assert_eq!(platform.attempts(), 1);
}

fn staging(fixture: &Fixture) -> Staging {
    Staging { workspace_dir: fixture.workspace().to_owned(), max_file_bytes: 1024 }
}

async fn user_messages(gateway: &Gateway) -> Vec<Message> {
    gateway.store().list_messages(&MessageFilter::default().with_roles(&[Role::User])).await.expect("list")
}

#[tokio::test]
async fn an_event_ingested_twice_is_stored_once() {
    let fixture = fixture().await;
    let mut inbound = Inbound::text("cli", "cli", "User", "hello there");
    inbound.platform_key = Some("evt/1".into());
    let first = ingest(&fixture.gateway, &staging(&fixture), inbound.clone()).await.expect("first");
    let Ingested::Posted(posted) = first else { panic!("expected a post, got {first:?}") };
    assert_eq!(posted.id.as_str(), "msg_cli_evt_1");
    assert_eq!((posted.status, posted.session_id.clone()), (Status::PendingAgent, fixture.session.id.clone()));
    let second = ingest(&fixture.gateway, &staging(&fixture), inbound).await.expect("second");
    assert_eq!(second, Ingested::Duplicate(posted.id.clone()));
    assert_eq!(user_messages(&fixture.gateway).await.len(), 1);
    // Without a key, the same text is a new message.
    let plain = Inbound::text("cli", "cli", "User", "hello there");
    let third = ingest(&fixture.gateway, &staging(&fixture), plain).await.expect("third");
    assert!(matches!(third, Ingested::Posted(_)), "{third:?}");
    assert_eq!(user_messages(&fixture.gateway).await.len(), 2);
}

fn file(name: &str, bytes: &[u8]) -> IncomingFile {
    IncomingFile { filename: name.into(), mime_type: None, bytes: bytes.to_vec() }
}

#[tokio::test]
async fn files_are_staged_with_collision_free_names() {
    let fixture = fixture().await;
    let mut inbound = Inbound::text("cli", "cli", "User", "");
    inbound.files = vec![file("notes.txt", b"one"), file("notes.txt", b"two")];
    let Ingested::Posted(first) = ingest(&fixture.gateway, &staging(&fixture), inbound).await.expect("ingest") else {
        panic!("expected a post")
    };
    let mut again = Inbound::text("cli", "cli", "User", "and one more");
    again.files = vec![file("notes.txt", b"three")];
    let Ingested::Posted(second) = ingest(&fixture.gateway, &staging(&fixture), again).await.expect("ingest") else {
        panic!("expected a post")
    };
    let dir = format!("sessions/{}/attachments", fixture.session.id);
    let staged: Vec<(String, String)> =
        first.attachments().iter().chain(second.attachments()).map(|a| (a.path.clone(), a.mime_type.clone())).collect();
    assert_eq!(
        staged,
        [
            (format!("{dir}/notes.txt"), "text/plain".to_owned()),
            (format!("{dir}/2-notes.txt"), "text/plain".to_owned()),
            (format!("{dir}/3-notes.txt"), "text/plain".to_owned()),
        ]
    );
    let read = |path: &str| std::fs::read(fixture.workspace().join(path)).expect("staged file");
    assert_eq!(read(&staged[0].0), b"one");
    assert_eq!(read(&staged[2].0), b"three");
    assert!(first.attachments().iter().all(|a| a.filename == "notes.txt"), "the sender's name is kept");
}

#[tokio::test]
async fn refusals_are_the_senders_mistakes_and_store_nothing() {
    let fixture = fixture().await;
    let staging = staging(&fixture);
    let too_long = "x".repeat(kesoku_chatbots::ingest::MAX_CONTENT_CHARS + 1);
    let mut bad_name = Inbound::text("cli", "cli", "User", "see attached");
    bad_name.files = vec![file("ok.txt", b"fine"), file("../escape.txt", b"no")];
    let mut too_big = Inbound::text("cli", "cli", "User", "see attached");
    too_big.files = vec![file("big.bin", &[0; 2048])];
    let cases = [
        (Inbound::text("cli", "cli", "User", "  \n"), "empty"),
        (Inbound::text("cli", "cli", "User", too_long), "over the limit"),
        (bad_name, "no directories"),
        (too_big, "over the limit of 1024 bytes"),
        (Inbound::text("cli", "cli", " ", "hi"), "`sender` must not be empty"),
    ];
    for (inbound, says) in cases {
        let error = ingest(&fixture.gateway, &staging, inbound).await.expect_err("refused");
        assert!(error.is_refusal(), "{error:?}");
        assert!(error.to_string().contains(says), "{error}");
    }
    assert!(user_messages(&fixture.gateway).await.is_empty());
    assert!(!fixture.workspace().join(format!("sessions/{}/attachments/ok.txt", fixture.session.id)).exists());
    // A failure of ours is not a refusal.
    let io = IngestError::Staging(kesoku_chatbots::staging::StagingError::BadSession("a/b".into()));
    assert!(!io.is_refusal());
}

#[tokio::test]
async fn a_session_id_posts_into_that_session_and_leaves_the_active_one() {
    let fixture = fixture().await;
    let other = Session::new("cli", "cli", Utc::now());
    fixture.gateway.store().create_session(&other).await.expect("create");
    let mut inbound = Inbound::text("cli", "cli", "User", "into the older session");
    inbound.session_id = Some(other.id.clone());
    let Ingested::Posted(posted) = ingest(&fixture.gateway, &staging(&fixture), inbound).await.expect("ingest") else {
        panic!("expected a post")
    };
    assert_eq!(posted.session_id, other.id);
    let active = fixture.gateway.store().active_session("cli", "cli").await.expect("read");
    assert_eq!(active, Some(fixture.session.id.clone()));

    // A session of another channel, or none at all, is refused and nothing is stored.
    let elsewhere = Session::new("cli", "elsewhere", Utc::now());
    fixture.gateway.store().create_session(&elsewhere).await.expect("create");
    for session_id in [elsewhere.id.clone(), kesoku_core::SessionId::from("sess_missing")] {
        let mut inbound = Inbound::text("cli", "cli", "User", "into a foreign session");
        inbound.session_id = Some(session_id.clone());
        let error = ingest(&fixture.gateway, &staging(&fixture), inbound).await.expect_err("refused");
        assert!(matches!(error, IngestError::ForeignSession { .. }) && error.is_refusal(), "{error}");
        assert!(error.to_string().contains(session_id.as_str()), "{error}");
    }
    let stored = fixture.gateway.store().list_messages(&MessageFilter::default()).await.expect("list");
    assert!(stored.iter().all(|m| m.content != "into a foreign session"), "nothing stored");
}

/// A platform whose channel `slow` does not answer until released; other channels answer at once.
struct Stalled {
    release: tokio::sync::Notify,
    sent: Mutex<Vec<String>>,
}

#[async_trait]
impl Chatbot for Stalled {
    fn chatbot_id(&self) -> &str {
        "cli"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::text_only(2000)
    }

    async fn show_step(&self, _step: &Message) -> Result<(), DeliveryError> {
        Ok(())
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        if message.channel_id == "slow" {
            self.release.notified().await;
        }
        self.sent.lock().expect("lock").push(message.channel_id.clone());
        Ok(part.key.clone())
    }
}

#[tokio::test]
async fn a_channel_that_cannot_be_delivered_to_does_not_hold_up_another() {
    let fixture = fixture().await;
    let platform = Arc::new(Stalled { release: tokio::sync::Notify::new(), sent: Mutex::default() });
    let answer_on = |channel: &'static str| {
        let gateway = fixture.gateway.clone();
        async move {
            let session = gateway.resolve_session("cli", channel).await.expect("session");
            let root = Message::user_text(&session.id, "cli", channel, "User", "question");
            gateway.post(&root).await.expect("post root");
            gateway.update_status(&root.id, Status::Processing).await.expect("claim");
            let answer = TurnOrigin::of(&root, "Kesoku").final_text(1, format!("answer on {channel}"), None);
            gateway.post(&answer).await.expect("post answer");
            answer
        }
    };
    let shutdown = CancellationToken::new();
    let task = {
        let deliverer = deliverer(&fixture);
        let chatbot: Arc<dyn Chatbot> = platform.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { deliverer.run(chatbot, shutdown).await })
    };
    let slow = answer_on("slow").await;
    let fast = answer_on("fast").await;
    eventually("the other channel's answer is delivered", || async {
        stored(&fixture, &fast.id).await.status == Status::Delivered
    })
    .await;
    assert_eq!(stored(&fixture, &slow.id).await.status, Status::Pending, "the stalled channel still waits");
    platform.release.notify_one();
    eventually("the stalled channel's answer is delivered once released", || async {
        stored(&fixture, &slow.id).await.status == Status::Delivered
    })
    .await;
    assert_eq!(*platform.sent.lock().expect("lock"), ["fast", "slow"]);
    shutdown.cancel();
    task.await.expect("the run stops");
}
