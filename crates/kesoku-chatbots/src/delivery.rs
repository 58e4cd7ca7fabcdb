//! Delivery: the one routine that shows the agent's messages on a chatbot and marks them
//! `delivered` (spec §4.2, §4.3).
//!
//! For each message of the chatbot that [`Message::awaits_delivery`]:
//!
//! - a step of a running turn (`responded` thought, tool call, tool result) is shown through
//!   [`Chatbot::show_step`] when the platform shows intermediates, and marked `delivered`
//!   either way (a platform without that UI skips it, spec §4.3);
//! - a final text or notification (`pending`) is planned into parts ([`crate::answer::plan`]:
//!   chunks, files, a question) and each part not yet recorded is sent through
//!   [`Chatbot::send_part`], then recorded (message, part, platform id) in the store *before*
//!   the next part and before the message is marked `delivered`; then
//!   [`Chatbot::on_delivered`] runs. After a crash, delivery resumes at the first unrecorded
//!   part; the part that was in flight is sent again with the same key, which the platform's
//!   idempotency (Discord's `enforce_nonce`) turns into the first send.
//!
//! Failures: a transient one (rate limit, 5xx, timeout) is retried with exponential backoff
//! ([`RetryPolicy`]); when the attempts run out the message stays undelivered and is taken
//! again by the next sweep, so nothing is lost. A permanent one (the channel is gone, the bot
//! was removed) moves a final text to `error` with `metadata.delivery_error` saying why,
//! notes it on the turn's ledger row and logs it, so it is not retried forever; a step that
//! cannot be shown is marked `delivered` with a warning (progress display is best effort).
//!
//! [`Deliverer::run`] also tells the chatbot when one of its turns starts and ends
//! ([`Chatbot::on_turn`]: typing indicators, status lines of interrupted turns). Each channel
//! has a lane: its messages and turn changes are handled one at a time, in the order the store
//! announces them; channels do not wait for each other.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use kesoku_core::{DeliveryRecord, Message, MessageFilter, Role, Status};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_store::Ledger;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::answer::{OutboundPart, plan};
use crate::{Chatbot, ChatbotError, DeliveryError};

/// Metadata key holding why a message could not be delivered.
pub const DELIVERY_ERROR_KEY: &str = "delivery_error";

/// How transient failures are retried within one delivery attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries per part before the message is left for the next sweep.
    pub attempts: u32,
    pub first_delay: Duration,
    pub max_delay: Duration,
    /// How often messages left undelivered by transient failures are tried again.
    pub sweep_every: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            first_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            sweep_every: Duration::from_secs(30),
        }
    }
}

/// What delivering one message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// Not this chatbot's, or nothing to deliver (already delivered, hidden, closed meanwhile).
    Skipped,
    /// Shown (all parts sent and recorded, or the step shown) and marked `delivered`.
    Shown,
    /// Marked `delivered` without being shown (a step on a platform without that UI, or one
    /// that could not be shown).
    Marked,
    /// Failed for good: a final text is now `error` (the reason is in its metadata).
    Failed(String),
}

/// Delivers messages for chatbots: the store, the workspace files are named from, the retries.
#[derive(Clone)]
pub struct Deliverer {
    gateway: Gateway,
    /// Where permanent failures are noted on the turn's activation row.
    ledger: Option<Arc<dyn Ledger>>,
    workspace_dir: PathBuf,
    retry: RetryPolicy,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").field("workspace_dir", &self.workspace_dir).field("retry", &self.retry).finish()
    }
}

impl Deliverer {
    pub fn new(gateway: Gateway, workspace_dir: impl Into<PathBuf>) -> Self {
        Deliverer { gateway, ledger: None, workspace_dir: workspace_dir.into(), retry: RetryPolicy::default() }
    }

    /// Note permanent failures on the ledger (the binary always does; tests may not).
    pub fn with_ledger(mut self, ledger: Arc<dyn Ledger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    pub fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    /// Deliver `message` through `chatbot` if it is the chatbot's and awaits delivery.
    ///
    /// The message is read again from the store first, so a stale event (an older snapshot)
    /// never causes a second delivery. An `Err` is a transient failure that outlasted the
    /// retries, or a store failure: the message stays undelivered for a later attempt.
    pub async fn deliver(&self, chatbot: &dyn Chatbot, message: &Message) -> Result<Delivered, ChatbotError> {
        if message.chatbot_id != chatbot.chatbot_id() {
            return Ok(Delivered::Skipped);
        }
        let Some(current) = self.gateway.store().get_message(&message.id).await? else {
            return Ok(Delivered::Skipped);
        };
        if !current.awaits_delivery() {
            return Ok(Delivered::Skipped);
        }
        match current.status {
            Status::Responded => self.deliver_step(chatbot, &current).await,
            Status::Pending => self.deliver_parts(chatbot, &current).await,
            Status::PendingAgent
            | Status::Processing
            | Status::Processed
            | Status::Delivered
            | Status::Interrupted
            | Status::Error => Ok(Delivered::Skipped),
        }
    }

    async fn deliver_step(&self, chatbot: &dyn Chatbot, step: &Message) -> Result<Delivered, ChatbotError> {
        let mut outcome = Delivered::Marked;
        if chatbot.capabilities().shows_intermediates {
            match self.with_retries(|| chatbot.show_step(step)).await {
                Ok(()) => outcome = Delivered::Shown,
                Err(DeliveryError::Permanent { reason }) => {
                    tracing::warn!(chatbot_id = chatbot.chatbot_id(), message_id = %step.id, %reason, "a step could not be shown; marking it delivered");
                }
                Err(error @ DeliveryError::Transient { .. }) => return Err(self.undelivered(chatbot, step, &error)),
            }
        }
        self.mark_delivered(chatbot, step).await?;
        Ok(outcome)
    }

    async fn deliver_parts(&self, chatbot: &dyn Chatbot, message: &Message) -> Result<Delivered, ChatbotError> {
        let store = self.gateway.store();
        let mut records = store.delivery_records(&message.id).await?;
        let done: BTreeSet<u32> = records.iter().map(|record| record.part).collect();
        for part in plan(message, &chatbot.capabilities(), &self.workspace_dir) {
            if done.contains(&part.index) {
                continue;
            }
            match self.with_retries(|| chatbot.send_part(message, &part)).await {
                Ok(platform_message_id) => {
                    let record = DeliveryRecord {
                        message_id: message.id.clone(),
                        part: part.index,
                        platform_message_id,
                        recorded_at: Utc::now(),
                    };
                    store.record_delivery(&record).await?;
                    records.push(record);
                }
                Err(DeliveryError::Permanent { reason }) => return self.fail(chatbot, message, &part, reason).await,
                Err(error @ DeliveryError::Transient { .. }) => return Err(self.undelivered(chatbot, message, &error)),
            }
        }
        self.mark_delivered(chatbot, message).await?;
        records.sort_by_key(|record| record.part);
        if let Err(error) = chatbot.on_delivered(message, &records).await {
            tracing::warn!(chatbot_id = chatbot.chatbot_id(), message_id = %message.id, %error, "after-delivery update failed");
        }
        Ok(Delivered::Shown)
    }

    async fn mark_delivered(&self, chatbot: &dyn Chatbot, message: &Message) -> Result<(), ChatbotError> {
        let marked = self
            .gateway
            .claim(&message.id, Status::Delivered, &[Status::Pending, Status::Responded], chatbot.chatbot_id())
            .await?;
        if marked.is_none() {
            tracing::debug!(message_id = %message.id, "message was delivered or closed meanwhile");
        }
        Ok(())
    }

    /// A permanent failure: the message goes to `error`, says why, and the ledger notes it.
    async fn fail(
        &self,
        chatbot: &dyn Chatbot,
        message: &Message,
        part: &OutboundPart,
        reason: String,
    ) -> Result<Delivered, ChatbotError> {
        let reason = format!("part {} could not be sent: {reason}", part.index);
        tracing::error!(chatbot_id = chatbot.chatbot_id(), message_id = %message.id, %reason, "delivery failed for good; the message is marked error");
        let claimed = self.gateway.claim(&message.id, Status::Error, &[Status::Pending], chatbot.chatbot_id()).await?;
        let Some(event) = claimed else {
            // Delivered or closed meanwhile (another deliverer, an interruption): not ours to fail.
            tracing::debug!(message_id = %message.id, "message changed before it could be marked error");
            return Ok(Delivered::Skipped);
        };
        let mut metadata = event.message.metadata;
        metadata.extra.insert(DELIVERY_ERROR_KEY.to_owned(), Value::String(reason.clone()));
        self.gateway.update_metadata(&message.id, &metadata).await?;
        if let Some(ledger) = &self.ledger {
            let root = message.parent_id.as_ref().unwrap_or(&message.id);
            ledger.record_delivery_failure(root, &reason).await?;
        }
        Ok(Delivered::Failed(reason))
    }

    fn undelivered(&self, chatbot: &dyn Chatbot, message: &Message, error: &DeliveryError) -> ChatbotError {
        tracing::warn!(chatbot_id = chatbot.chatbot_id(), message_id = %message.id, %error, "delivery failed for now; it is retried later");
        ChatbotError::Platform { chatbot_id: chatbot.chatbot_id().to_owned(), reason: error.to_string() }
    }

    /// Run `attempt` until it succeeds, fails for good, or the tries run out (the last
    /// transient error is returned).
    async fn with_retries<T, F, Fut>(&self, mut attempt: F) -> Result<T, DeliveryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, DeliveryError>>,
    {
        let mut delay = self.retry.first_delay;
        let mut tries = 0;
        loop {
            tries += 1;
            match attempt().await {
                Ok(value) => return Ok(value),
                Err(error @ DeliveryError::Permanent { .. }) => return Err(error),
                Err(error @ DeliveryError::Transient { .. }) if tries >= self.retry.attempts.max(1) => {
                    return Err(error);
                }
                Err(DeliveryError::Transient { retry_after, reason }) => {
                    let wait = retry_after.unwrap_or(delay).min(self.retry.max_delay.max(Duration::from_millis(1)));
                    tracing::debug!(%reason, ?wait, tries, "transient delivery failure; retrying");
                    tokio::time::sleep(wait).await;
                    delay = (delay * 2).min(self.retry.max_delay);
                }
            }
        }
    }

    /// Deliver every message of `chatbot` awaiting delivery (stored now, then live ones) and
    /// tell it when its turns start and end, until `shutdown` fires or the broker closes.
    ///
    /// Each channel has its own lane: a channel's messages and turn changes are handled one at
    /// a time in the order the store announced them, while a channel waiting out a rate limit
    /// or an outage never holds up another.
    pub async fn run(&self, chatbot: Arc<dyn Chatbot>, shutdown: CancellationToken) {
        let chatbot_id = chatbot.chatbot_id().to_owned();
        let waiting =
            MessageFilter::default().with_chatbot(&chatbot_id).with_statuses(&[Status::Pending, Status::Responded]);
        let turns = MessageFilter::default().with_chatbot(&chatbot_id).with_roles(&[Role::User]).with_statuses(&[
            Status::Processing,
            Status::Processed,
            Status::Interrupted,
            Status::Error,
        ]);
        let mut deliveries = pin!(self.gateway.listen(waiting.clone(), ListenFrom::Current));
        let mut roots = pin!(self.gateway.listen(turns, ListenFrom::Now));
        let mut sweep = tokio::time::interval(self.retry.sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        sweep.tick().await;
        // Ended lanes are forgotten promptly: a closed lane's queue stays allocated while the
        // map holds its sender.
        let mut prune = tokio::time::interval(LANE_IDLE);
        prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut lanes = Lanes {
            deliverer: self.clone(),
            chatbot,
            shutdown: shutdown.clone(),
            behind: Arc::new(AtomicBool::new(false)),
            senders: HashMap::new(),
        };
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                next = deliveries.next() => match next {
                    Some(Ok(event)) => lanes.push(Work::Deliver(Box::new(event.message))),
                    Some(Err(error)) => {
                        tracing::warn!(%error, %chatbot_id, "reading messages to deliver failed; catching up later");
                        lanes.behind.store(true, Ordering::Relaxed);
                    }
                    None => return,
                },
                next = roots.next() => match next {
                    Some(Ok(event)) => lanes.push(Work::Turn(Box::new(event.message))),
                    Some(Err(error)) => tracing::warn!(%error, %chatbot_id, "reading turn changes failed"),
                    None => return,
                },
                _ = prune.tick() => lanes.prune(),
                _ = sweep.tick() => {
                    if !lanes.behind.swap(false, Ordering::Relaxed) {
                        continue;
                    }
                    match self.gateway.store().list_messages(&waiting).await {
                        Ok(waiting) => waiting.into_iter().for_each(|message| lanes.push(Work::Deliver(Box::new(message)))),
                        Err(error) => {
                            tracing::warn!(%error, %chatbot_id, "listing undelivered messages failed");
                            lanes.behind.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
    }
}

/// How long a channel's lane waits for more work before it ends (a new one starts on demand,
/// after the old one has finished: see [`LaneHandle::order`]). Short: starting a lane costs a
/// task spawn, while a thousand quiet channels each keeping one costs ~2 KB apiece.
const LANE_IDLE: Duration = Duration::from_secs(1);

/// One thing for a channel's lane to do. Boxed: a lane's queue allocates its slots in blocks
/// of 32, and a message inline would make every idle lane's queue ~10 KB.
enum Work {
    Deliver(Box<Message>),
    Turn(Box<Message>),
}

impl Work {
    fn message(&self) -> &Message {
        match self {
            Work::Deliver(message) | Work::Turn(message) => message,
        }
    }
}

/// The delivery lanes of one chatbot, by channel.
struct Lanes {
    deliverer: Deliverer,
    chatbot: Arc<dyn Chatbot>,
    shutdown: CancellationToken,
    /// Set by a lane when a delivery failed for now; the sweep takes it.
    behind: Arc<AtomicBool>,
    senders: HashMap<String, LaneHandle>,
}

/// A channel's running lane, and what keeps its successive lanes in order.
struct LaneHandle {
    sender: mpsc::UnboundedSender<Work>,
    /// Held by the channel's lane for its whole life: a lane started after an idle one closed
    /// waits until the old one has finished the work it had queued, so a channel's work never
    /// overlaps or reorders.
    order: Arc<tokio::sync::Mutex<()>>,
}

impl Lanes {
    /// Queue `work` on its channel's lane, starting the lane when it is not running.
    fn push(&mut self, work: Work) {
        let channel = work.message().channel_id.clone();
        let (work, order) = match self.senders.get(&channel) {
            Some(lane) => match lane.sender.send(work) {
                Ok(()) => return,
                // The lane ended (idle): start a new one with the work, after the old one.
                Err(mpsc::error::SendError(work)) => (work, Arc::clone(&lane.order)),
            },
            None => (work, Arc::new(tokio::sync::Mutex::new(()))),
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        let started = sender.send(work).is_ok();
        debug_assert!(started, "a new lane's receiver is alive");
        tokio::spawn(lane(
            self.deliverer.clone(),
            Arc::clone(&self.chatbot),
            receiver,
            Arc::clone(&order),
            self.shutdown.clone(),
            Arc::clone(&self.behind),
        ));
        self.senders.insert(channel, LaneHandle { sender, order });
    }

    /// Forget the channels whose lanes have ended.
    fn prune(&mut self) {
        self.senders.retain(|_, lane| !lane.sender.is_closed() || Arc::strong_count(&lane.order) > 1);
    }
}

/// One channel's lane: its work in order, until idle for [`LANE_IDLE`] or shutdown.
async fn lane(
    deliverer: Deliverer,
    chatbot: Arc<dyn Chatbot>,
    mut receiver: mpsc::UnboundedReceiver<Work>,
    order: Arc<tokio::sync::Mutex<()>>,
    shutdown: CancellationToken,
    behind: Arc<AtomicBool>,
) {
    let _turn = tokio::select! {
        () = shutdown.cancelled() => return,
        guard = order.lock_owned() => guard,
    };
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => return,
            next = tokio::time::timeout(LANE_IDLE, receiver.recv()) => next,
        };
        let work = match next {
            Ok(Some(work)) => work,
            Ok(None) => return,
            Err(_idle) => {
                // Refuse new work (the pusher starts a new lane), then finish what was queued.
                receiver.close();
                while let Ok(work) = receiver.try_recv() {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = Box::pin(handle(&deliverer, chatbot.as_ref(), work, &behind)) => {}
                    }
                }
                return;
            }
        };
        // Boxed: a delivery's future is large (store reads, platform calls), and an idle lane —
        // one per channel heard from in the last minute — should hold only its queue.
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = Box::pin(handle(&deliverer, chatbot.as_ref(), work, &behind)) => {}
        }
    }
}

async fn handle(deliverer: &Deliverer, chatbot: &dyn Chatbot, work: Work, behind: &AtomicBool) {
    match work {
        Work::Deliver(message) => {
            if deliverer.deliver(chatbot, &message).await.is_err() {
                behind.store(true, Ordering::Relaxed);
            }
        }
        Work::Turn(root) => {
            if let Err(error) = chatbot.on_turn(&root).await {
                tracing::warn!(%error, chatbot_id = chatbot.chatbot_id(), message_id = %root.id, "updating the platform for a turn failed");
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    struct Nothing;

    #[async_trait::async_trait]
    impl Chatbot for Nothing {
        fn chatbot_id(&self) -> &str {
            "nothing"
        }
        fn capabilities(&self) -> crate::Capabilities {
            crate::Capabilities::text_only(100)
        }
        async fn show_step(&self, _step: &Message) -> Result<(), DeliveryError> {
            Ok(())
        }
        async fn send_part(&self, _message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
            Ok(part.key.clone())
        }
    }

    #[tokio::test]
    async fn an_idle_lane_is_small() {
        // One lane lives per recently active channel: its task must not carry a delivery's
        // whole future while it waits (a thousand channels, a thousand lanes). Unboxed, the
        // lane's future was 7.9 KB in a debug build; boxed, 1.8 KB.
        let handle = kesoku_store::open("sqlite::memory:").await.expect("an in-memory store");
        let gateway = Gateway::new(handle.store, Arc::new(kesoku_broker::MemoryBroker::default()));
        let (_sender, receiver) = mpsc::unbounded_channel();
        let future = lane(
            Deliverer::new(gateway, "/nonexistent"),
            Arc::new(Nothing),
            receiver,
            Arc::new(tokio::sync::Mutex::new(())),
            CancellationToken::new(),
            Arc::new(AtomicBool::new(false)),
        );
        assert!(std::mem::size_of_val(&future) <= 3 * 1024, "{} bytes", std::mem::size_of_val(&future));
    }
}
