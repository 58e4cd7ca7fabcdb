//! The conformance kit: behaviour every chatbot must show, run by each adapter's own tests
//! against its own fake platform (feature `conformance`; test code, not shipped).
//!
//! An adapter's test implements [`Harness`] over its fake (what the platform shows, how to make
//! it fail, how a person speaks through it) and calls [`run_all`]. Each check builds what it
//! needs in the store of [`Harness::gateway`], drives the chatbot through the shared
//! [`Deliverer`] and [`crate::ingest`], and asserts on both sides: the statuses and delivery
//! records in the store, and what the platform shows. A check that fails panics with what
//! differed (this is test code). It runs for the CLI (`tests/it/conformance.rs`), Discord
//! against the fake Discord (`tests/it/discord_conformance.rs`) and the HTTP API
//! (`kesoku-server`'s `tests/it/conformance.rs`).
//!
//! The checks: capabilities are usable; a long answer with a code block arrives in chunks
//! within the limit, each renderable; a duplicated inbound event is stored once; inbound works
//! after the connection drops; transient send failures are retried and nothing is shown twice;
//! a permanent failure marks the answer `error` and is not retried; a crash between sending a
//! part and recording it resumes without showing any part twice (where the platform dedups
//! keys); an interrupted turn leaves no step showing (where the platform edits in place).

#![allow(clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_core::{Message, MessageFilter, Role, Session, Status, TurnOrigin};
use kesoku_gateway::Gateway;

use crate::answer::{OutboundPart, plan};
use crate::{Chatbot, Delivered, Deliverer, DeliveryError, RetryPolicy};

/// An adapter under test, wired to its fake platform.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The chatbot under test.
    fn chatbot(&self) -> Arc<dyn Chatbot>;
    /// The gateway the chatbot ingests into (its store is the one the kit inspects).
    fn gateway(&self) -> Gateway;
    /// The workspace files are resolved against.
    fn workspace(&self) -> PathBuf;
    /// The channel id (as stored in messages) the kit talks on.
    fn channel_id(&self) -> String;
    /// The texts the platform shows on that channel now, oldest first, after edits and
    /// without deleted messages.
    async fn visible(&self) -> Vec<String>;
    /// Make the platform fail the next `n` sends with a transient error (rate limit, 5xx).
    async fn fail_transiently(&self, n: usize);
    /// Make the platform refuse the next send for good (channel gone, bot removed).
    async fn fail_permanently(&self);
    /// A person says `text` through the platform's inbound path; `event_id` is the platform
    /// event's identity (the same id again is the platform redelivering that event). Returns
    /// once the platform side has handled it.
    async fn user_says(&self, text: &str, event_id: &str);
    /// Drop the platform connection (nothing for platforms without one).
    async fn drop_connection(&self);
    /// Whether resending a part with the same key shows it once (Discord's nonces, Google
    /// Chat's message ids); a terminal cannot take a print back.
    fn dedups_part_keys(&self) -> bool;
}

/// A deliverer with fast retries, so checks do not wait on real backoff.
fn deliverer(harness: &dyn Harness) -> Deliverer {
    Deliverer::new(harness.gateway(), harness.workspace()).with_retry(RetryPolicy {
        attempts: 4,
        first_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        sweep_every: Duration::from_millis(50),
    })
}

/// Every check, in order.
pub async fn run_all(harness: &dyn Harness) {
    capabilities_are_usable(harness).await;
    long_answer_is_chunked_within_the_limit(harness).await;
    a_duplicated_inbound_event_is_stored_once(harness).await;
    inbound_works_after_the_connection_drops(harness).await;
    transient_failures_are_retried_and_shown_once(harness).await;
    a_permanent_failure_marks_the_answer_error_once(harness).await;
    a_crash_between_send_and_record_resumes_without_duplicates(harness).await;
    an_interrupted_turn_leaves_no_step_showing(harness).await;
}

async fn session(harness: &dyn Harness) -> Session {
    let chatbot = harness.chatbot();
    harness.gateway().resolve_session(chatbot.chatbot_id(), &harness.channel_id()).await.expect("session")
}

/// A root user message being processed, as a worker leaves it mid-turn.
async fn running_root(harness: &dyn Harness, session: &Session, text: &str) -> Message {
    let chatbot = harness.chatbot();
    let gateway = harness.gateway();
    let root = Message::user_text(&session.id, chatbot.chatbot_id(), &harness.channel_id(), "Tester", text);
    gateway.post(&root).await.expect("post root");
    let claimed = gateway.claim(&root.id, Status::Processing, &[Status::PendingAgent], "kit").await.expect("claim");
    claimed.expect("the kit's root is claimable").message
}

/// A final answer to `root`, stored `pending`.
async fn answer(harness: &dyn Harness, root: &Message, text: &str) -> Message {
    let message = TurnOrigin::of(root, "Kesoku").final_text(1, text, None);
    harness.gateway().post(&message).await.expect("post answer");
    message
}

async fn status_of(harness: &dyn Harness, message: &Message) -> Message {
    harness.gateway().store().get_message(&message.id).await.expect("read").expect("stored")
}

/// The answers the kit writes are distinct per check, so `visible` can be searched.
fn shown_times(visible: &[String], needle: &str) -> usize {
    visible.iter().filter(|text| text.contains(needle)).count()
}

pub async fn capabilities_are_usable(harness: &dyn Harness) {
    let capabilities = harness.chatbot().capabilities();
    assert!(capabilities.max_message_chars >= 100, "a message limit under 100 characters cannot carry an answer");
    if capabilities.files {
        assert!(capabilities.max_file_bytes > 0, "files are supported but no size is allowed");
    }
}

pub async fn long_answer_is_chunked_within_the_limit(harness: &dyn Harness) {
    let chatbot = harness.chatbot();
    let capabilities = chatbot.capabilities();
    let session = session(harness).await;
    let root = running_root(harness, &session, "write a long answer").await;
    let prose = "Chunk check sentence number one. ".repeat(40);
    let code: String = (0..120).map(|i| format!("let kit_value_{i} = {i};\n")).collect();
    let text = format!("{prose}\n\n```rust\n{code}```\n\n{prose}");
    let message = answer(harness, &root, &text).await;
    let expected_parts = plan(&message, &capabilities, &harness.workspace()).len();
    let outcome = deliverer(harness).deliver(chatbot.as_ref(), &message).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert_eq!(status_of(harness, &message).await.status, Status::Delivered);
    let records = harness.gateway().store().delivery_records(&message.id).await.expect("records");
    assert_eq!(records.len(), expected_parts, "one record per part");
    let visible = harness.visible().await;
    for i in [0, 60, 119] {
        let line = format!("let kit_value_{i} = {i};");
        assert_eq!(visible.iter().map(|t| t.matches(&line).count()).sum::<usize>(), 1, "{line} shown once");
    }
    for text in visible.iter().filter(|t| t.contains("kit_value_") || t.contains("Chunk check")) {
        assert!(text.chars().count() <= capabilities.max_message_chars, "a chunk over the limit");
        let fences = text.lines().filter(|l| l.trim_start().starts_with("```")).count();
        assert_eq!(fences % 2, 0, "a chunk with an unclosed code fence:\n{text}");
    }
}

pub async fn a_duplicated_inbound_event_is_stored_once(harness: &dyn Harness) {
    harness.user_says("kit duplicate check", "kit-dup-1").await;
    harness.user_says("kit duplicate check", "kit-dup-1").await;
    let found = user_messages_containing(harness, "kit duplicate check").await;
    assert_eq!(found, 1, "a redelivered event must be stored once");
}

pub async fn inbound_works_after_the_connection_drops(harness: &dyn Harness) {
    harness.drop_connection().await;
    harness.user_says("kit after reconnect", "kit-reconnect-1").await;
    assert_eq!(user_messages_containing(harness, "kit after reconnect").await, 1);
}

async fn user_messages_containing(harness: &dyn Harness, needle: &str) -> usize {
    let chatbot = harness.chatbot();
    let filter = MessageFilter::default().with_chatbot(chatbot.chatbot_id()).with_roles(&[Role::User]);
    let messages = harness.gateway().store().list_messages(&filter).await.expect("list");
    messages.iter().filter(|m| m.content.contains(needle)).count()
}

pub async fn transient_failures_are_retried_and_shown_once(harness: &dyn Harness) {
    let chatbot = harness.chatbot();
    let session = session(harness).await;
    let root = running_root(harness, &session, "retry check").await;
    let message = answer(harness, &root, "Kit answer after two transient failures.").await;
    harness.fail_transiently(2).await;
    let outcome = deliverer(harness).deliver(chatbot.as_ref(), &message).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert_eq!(status_of(harness, &message).await.status, Status::Delivered);
    assert_eq!(shown_times(&harness.visible().await, "Kit answer after two transient failures."), 1);
}

pub async fn a_permanent_failure_marks_the_answer_error_once(harness: &dyn Harness) {
    let chatbot = harness.chatbot();
    let session = session(harness).await;
    let root = running_root(harness, &session, "permanent failure check").await;
    let message = answer(harness, &root, "Kit answer that cannot be sent.").await;
    harness.fail_permanently().await;
    let deliverer = deliverer(harness);
    let outcome = deliverer.deliver(chatbot.as_ref(), &message).await.expect("deliver");
    assert!(matches!(outcome, Delivered::Failed(_)), "{outcome:?}");
    let stored = status_of(harness, &message).await;
    assert_eq!(stored.status, Status::Error);
    assert!(stored.metadata.extra.contains_key(crate::delivery::DELIVERY_ERROR_KEY), "the reason is kept");
    assert_eq!(deliverer.deliver(chatbot.as_ref(), &message).await.expect("again"), Delivered::Skipped);
    assert_eq!(shown_times(&harness.visible().await, "Kit answer that cannot be sent."), 0);
}

pub async fn a_crash_between_send_and_record_resumes_without_duplicates(harness: &dyn Harness) {
    let chatbot = harness.chatbot();
    let capabilities = chatbot.capabilities();
    let session = session(harness).await;
    let root = running_root(harness, &session, "crash check").await;
    // Three parts or more wherever the limit lies (a platform without one sends the text
    // whole): the text in one chunk or several, then a warning for each missing file.
    let words = capabilities.max_message_chars.min(4000) / 10 + 5;
    let long = (0..words).map(|i| format!("crashword{i:03}")).collect::<Vec<_>>().join(" ");
    let text = format!("{long}\n[file: kit-missing-file-1.txt]\n[file: kit-missing-file-2.txt]");
    let message = answer(harness, &root, &text).await;
    let parts: Vec<OutboundPart> = plan(&message, &capabilities, &harness.workspace());
    assert!(parts.len() >= 3, "the kit's answer plans into at least three parts");
    // The crashed run: part 0 sent and recorded, part 1 sent but the process died before
    // recording it.
    let store = harness.gateway().store().clone();
    let first = chatbot.send_part(&message, &parts[0]).await.expect("send part 0");
    store
        .record_delivery(&kesoku_core::DeliveryRecord {
            message_id: message.id.clone(),
            part: 0,
            platform_message_id: first,
            recorded_at: chrono::Utc::now(),
        })
        .await
        .expect("record");
    chatbot.send_part(&message, &parts[1]).await.expect("send part 1");
    // The restarted run.
    let outcome = deliverer(harness).deliver(chatbot.as_ref(), &message).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert_eq!(store.delivery_records(&message.id).await.expect("records").len(), parts.len());
    let visible = harness.visible().await;
    assert_eq!(shown_times(&visible, "crashword000 "), 1, "part 0 is not sent again");
    let part_one_times = shown_times(&visible, &needle(&parts[1]));
    if harness.dedups_part_keys() {
        assert_eq!(part_one_times, 1, "the in-flight part is shown once");
    } else {
        assert!(part_one_times >= 1);
    }
    let last = needle(parts.last().expect("parts"));
    assert_eq!(shown_times(&visible, &last), 1, "the part after the crash is sent once");
}

/// A word that identifies `part` among everything shown: a `crashwordNNN` of a text chunk or
/// the name in a missing file's warning, without surrounding punctuation (a platform that
/// shows the answer whole shows the name inside the `[file: …]` marker).
fn needle(part: &OutboundPart) -> String {
    let crate::answer::Part::Text(text) = &part.part else { panic!("expected a text part, got {part:?}") };
    text.split_whitespace()
        .map(|word| word.trim_matches(|c: char| !c.is_alphanumeric()))
        .find(|word| word.starts_with("crashword") || word.starts_with("kit-missing-file"))
        .unwrap_or_else(|| panic!("no identifying word in part {part:?}"))
        .to_owned()
}

pub async fn an_interrupted_turn_leaves_no_step_showing(harness: &dyn Harness) {
    let chatbot = harness.chatbot();
    let capabilities = chatbot.capabilities();
    let session = session(harness).await;
    let root = running_root(harness, &session, "interruption check").await;
    chatbot.on_turn(&root).await.expect("turn started");
    let thought = TurnOrigin::of(&root, "Kesoku").thought(1, "Kit thinking about a web component", None);
    harness.gateway().post(&thought).await.expect("post thought");
    let outcome = deliverer(harness).deliver(chatbot.as_ref(), &thought).await.expect("deliver step");
    assert_eq!(status_of(harness, &thought).await.status, Status::Delivered);
    let shown_while_running = shown_times(&harness.visible().await, "Kit thinking about a web component");
    if capabilities.shows_intermediates {
        assert_eq!(outcome, Delivered::Shown);
        assert_eq!(shown_while_running, 1, "the step shows while the turn runs");
    } else {
        assert_eq!(outcome, Delivered::Marked);
        assert_eq!(shown_while_running, 0, "a platform without that UI never shows steps");
    }
    let interrupted = harness.gateway().update_status(&root.id, Status::Interrupted).await.expect("interrupt").message;
    chatbot.on_turn(&interrupted).await.expect("turn interrupted");
    if capabilities.edits_in_place {
        assert_eq!(
            shown_times(&harness.visible().await, "Kit thinking about a web component"),
            0,
            "an interrupted turn's status lines are removed"
        );
    }
}

/// Wraps a chatbot so its sends fail on demand: for harnesses whose platform has no failure
/// of its own to inject (the terminal, the HTTP API).
pub struct Flaky {
    inner: Arc<dyn Chatbot>,
    transient: AtomicUsize,
    permanent: AtomicUsize,
}

impl Flaky {
    pub fn new(inner: Arc<dyn Chatbot>) -> Self {
        Flaky { inner, transient: AtomicUsize::new(0), permanent: AtomicUsize::new(0) }
    }

    pub fn fail_transiently(&self, n: usize) {
        self.transient.store(n, Ordering::SeqCst);
    }

    pub fn fail_permanently(&self) {
        self.permanent.store(1, Ordering::SeqCst);
    }

    fn take(counter: &AtomicUsize) -> bool {
        counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

#[async_trait]
impl Chatbot for Flaky {
    fn chatbot_id(&self) -> &str {
        self.inner.chatbot_id()
    }

    fn capabilities(&self) -> crate::Capabilities {
        self.inner.capabilities()
    }

    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError> {
        self.inner.show_step(step).await
    }

    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        if Self::take(&self.permanent) {
            return Err(DeliveryError::Permanent { reason: "the kit refused this send".to_owned() });
        }
        if Self::take(&self.transient) {
            return Err(DeliveryError::Transient { reason: "the kit failed this send".to_owned(), retry_after: None });
        }
        self.inner.send_part(message, part).await
    }

    async fn on_delivered(&self, message: &Message, sent: &[kesoku_core::DeliveryRecord]) -> Result<(), DeliveryError> {
        self.inner.on_delivered(message, sent).await
    }

    async fn on_turn(&self, root: &Message) -> Result<(), DeliveryError> {
        self.inner.on_turn(root).await
    }
}
