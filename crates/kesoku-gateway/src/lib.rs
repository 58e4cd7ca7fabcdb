//! The gateway: the one door through which messages are written and heard.
//!
//! `post` persists, then broadcasts; `listen` yields the stored messages that match a filter and
//! then live ones, without duplicates, and never drops a message because a subscriber is slow:
//! a lagging subscriber re-reads the store. Status changes and claims go through here too, so
//! every change is announced after it is durable.
//!
//! The gateway holds no state of its own beyond its two handles and the count of what its
//! listeners' duplicate filters hold ([`Gateway::listener_memory`]); it is cheap to clone.

pub mod watch;

use std::hash::RandomState;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::Stream;
use kesoku_broker::{Broker, BrokerEvent, Control, Interest, MessageNotice, Received, StopReason};
use kesoku_core::{Message, MessageFilter, MessageId, Metadata, Session, SessionId, Status};
use kesoku_store::{MessageEvent, Store, StoreError};

/// How far back `listen` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenFrom {
    /// Every stored message that matches now (for example all `pending` deliveries), then live.
    Current,
    /// Changes after this revision (for example an SSE client's `Last-Event-ID`), then live.
    AfterRev(i64),
    /// Only live changes.
    Now,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("broadcast failed after the change was stored: {0}")]
    Broker(#[from] kesoku_broker::BrokerError),
}

pub type GatewayResult<T> = Result<T, GatewayError>;

/// How many rows a catch-up read takes at a time.
const CATCH_UP_BATCH: u32 = 1000;
/// Revisions kept in the duplicate filter of a listener: a live event at most this far behind
/// the newest revision yielded is still recognised as already seen.
const DEDUP_WINDOW: i64 = 20_000;

#[derive(Clone)]
pub struct Gateway {
    store: Arc<dyn Store>,
    broker: Arc<dyn Broker>,
    /// What the duplicate filters of this gateway's listeners (its clones' included) hold.
    listeners: Arc<ListenerCounts>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gateway")
    }
}

impl Gateway {
    pub fn new(store: Arc<dyn Store>, broker: Arc<dyn Broker>) -> Self {
        Gateway { store, broker, listeners: Arc::default() }
    }

    /// What the duplicate filters of the listeners made by this gateway (and its clones) hold
    /// now, for the service's metrics.
    pub fn listener_memory(&self) -> ListenerMemory {
        self.listeners.get()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.broker
    }

    async fn announce(&self, event: &MessageEvent) -> GatewayResult<()> {
        let notice = MessageNotice { rev: event.rev, created: event.created, message: event.message.clone() };
        self.broker.publish(BrokerEvent::Message(Box::new(notice))).await?;
        Ok(())
    }

    /// Store a new message, then announce it.
    pub async fn post(&self, message: &Message) -> GatewayResult<MessageEvent> {
        let event = self.store.insert_message(message).await?;
        self.announce(&event).await?;
        Ok(event)
    }

    /// Store several messages in one transaction, then announce each.
    pub async fn post_many(&self, messages: &[Message]) -> GatewayResult<Vec<MessageEvent>> {
        let events = self.store.insert_messages(messages).await?;
        for event in &events {
            self.announce(event).await?;
        }
        Ok(events)
    }

    /// Change a status (checked against the transition table), then announce it.
    pub async fn update_status(&self, id: &MessageId, to: Status) -> GatewayResult<MessageEvent> {
        let event = self.store.update_status(id, to).await?;
        self.announce(&event).await?;
        Ok(event)
    }

    /// Atomic compare-and-set on the status; announces only when this caller won.
    pub async fn claim(
        &self,
        id: &MessageId,
        to: Status,
        expected: &[Status],
        claimed_by: &str,
    ) -> GatewayResult<Option<MessageEvent>> {
        let event = self.store.claim(id, to, expected, claimed_by).await?;
        if let Some(event) = &event {
            self.announce(event).await?;
        }
        Ok(event)
    }

    pub async fn update_metadata(&self, id: &MessageId, metadata: &Metadata) -> GatewayResult<MessageEvent> {
        let event = self.store.update_metadata(id, metadata).await?;
        self.announce(&event).await?;
        Ok(event)
    }

    /// Hand messages whose claim is older than `older_than` back to `pending_agent`, and
    /// announce them so every dispatcher hears of the work.
    pub async fn recover_orphans(&self, older_than: std::time::Duration) -> GatewayResult<Vec<MessageEvent>> {
        let before = self.store.current_rev().await?;
        let recovered = self.store.recover_orphans(older_than).await?;
        if recovered.is_empty() {
            return Ok(Vec::new());
        }
        let changed = self.store.changes_since(before, &MessageFilter::status(Status::PendingAgent), u32::MAX).await?;
        let events: Vec<MessageEvent> =
            changed.into_iter().filter(|event| recovered.contains(&event.message.id)).collect();
        for event in &events {
            self.announce(event).await?;
        }
        Ok(events)
    }

    /// The active session of a (chatbot, channel), created when there is none.
    pub async fn resolve_session(&self, chatbot_id: &str, channel_id: &str) -> GatewayResult<Session> {
        Ok(self.store.resolve_session(chatbot_id, channel_id).await?)
    }

    /// Ask whichever process runs `session_id` to stop its turn.
    /// `unless_root`: leave the turn alone if it is the one this message started.
    pub async fn request_stop(
        &self,
        session_id: &SessionId,
        reason: StopReason,
        unless_root: Option<&MessageId>,
    ) -> GatewayResult<()> {
        let control = Control::Stop { session_id: session_id.clone(), reason, unless_root: unless_root.cloned() };
        self.broker.publish(BrokerEvent::Control(control)).await?;
        Ok(())
    }

    /// Stored messages matching `filter` (from `from`), then live ones, each change once.
    ///
    /// The stream ends only when the broker closes. Store errors are yielded and the stream
    /// goes on (a later catch-up retries the read).
    pub fn listen(
        &self,
        filter: MessageFilter,
        from: ListenFrom,
    ) -> impl Stream<Item = GatewayResult<MessageEvent>> + Send + 'static {
        let store = Arc::clone(&self.store);
        let broker = Arc::clone(&self.broker);
        let counts = Arc::clone(&self.listeners);
        async_stream::stream! {
            // Subscribe before reading the store, so nothing written in between is missed.
            let mut subscription = match broker.subscribe(Interest::Messages(filter.clone())).await {
                Ok(subscription) => subscription,
                Err(error) => {
                    yield Err(GatewayError::Broker(error));
                    return;
                }
            };
            let mut seen = Seen::counted_in(counts);
            let mut pending_catch_up = match from {
                ListenFrom::Current => Some(CatchUp::Current),
                ListenFrom::AfterRev(rev) => Some(CatchUp::After(rev)),
                ListenFrom::Now => None,
            };
            loop {
                if let Some(catch_up) = pending_catch_up.take() {
                    match read_store(store.as_ref(), &filter, catch_up).await {
                        Ok(events) => {
                            for event in events {
                                if seen.admit(&event.message.id, event.rev) {
                                    yield Ok(event);
                                }
                            }
                        }
                        Err(error) => yield Err(GatewayError::Store(error)),
                    }
                }
                match subscription.recv().await {
                    Received::Event(BrokerEvent::Message(notice)) => {
                        if filter.matches(&notice.message) && seen.admit(&notice.message.id, notice.rev) {
                            let notice = *notice;
                            yield Ok(MessageEvent { rev: notice.rev, created: notice.created, message: notice.message });
                        }
                    }
                    Received::Event(BrokerEvent::Control(_)) => {}
                    Received::Lagged { .. } => {
                        // Broadcasts were lost to this subscriber: the store has them.
                        pending_catch_up = Some(match from {
                            ListenFrom::Current => CatchUp::Current,
                            ListenFrom::AfterRev(_) | ListenFrom::Now => {
                                CatchUp::After(seen.newest.saturating_sub(DEDUP_WINDOW / 2).max(0))
                            }
                        });
                    }
                    Received::Closed => return,
                }
            }
        }
    }

    /// Control signals (stop requests) from any process.
    pub fn controls(&self) -> impl Stream<Item = Control> + Send + 'static {
        let broker = Arc::clone(&self.broker);
        async_stream::stream! {
            let Ok(mut subscription) = broker.subscribe(Interest::Controls).await else { return };
            loop {
                match subscription.recv().await {
                    Received::Event(BrokerEvent::Control(control)) => yield control,
                    Received::Event(BrokerEvent::Message(_)) | Received::Lagged { .. } => {}
                    Received::Closed => return,
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum CatchUp {
    /// Everything matching now.
    Current,
    /// Changes after a revision.
    After(i64),
}

async fn read_store(
    store: &dyn Store,
    filter: &MessageFilter,
    catch_up: CatchUp,
) -> Result<Vec<MessageEvent>, StoreError> {
    let mut after = match catch_up {
        CatchUp::After(rev) => rev,
        CatchUp::Current => {
            // The current state of every matching message, oldest first; revisions let the
            // duplicate filter recognise the same state arriving live.
            let mut limited = filter.clone();
            limited.limit = None;
            let mut events = store.changes_since(0, &limited, u32::MAX).await?;
            events.sort_by_key(|e| e.rev);
            return Ok(events);
        }
    };
    let mut out = Vec::new();
    loop {
        let batch = store.changes_since(after, filter, CATCH_UP_BATCH).await?;
        let done = batch.len() < CATCH_UP_BATCH as usize;
        if let Some(last) = batch.last() {
            after = last.rev;
        }
        out.extend(batch);
        if done {
            return Ok(out);
        }
    }
}

/// Which (message, revision) a listener already yielded, within a bounded window of revisions.
///
/// Ids older than the window are dropped every half window of revisions, so a filter holds the
/// ids of at most one and a half windows (30,000 revisions): a listener that matches one
/// message in five (the agent's intake, the API's deliveries) keeps about 6,000 ids, steadily,
/// instead of filling up to a count of ids and then dropping most of them.
///
/// The map is hashbrown's (std's, with std's SipHash keys: ids may come from outside) for its
/// `allocation_size`: the table's bytes, which `capacity` (entries left before a rehash, used
/// up by the tombstones of dropped ids) does not tell.
struct Seen {
    rev_by_id: hashbrown::HashMap<MessageId, i64, RandomState>,
    newest: i64,
    /// The newest revision when ids were last dropped.
    pruned_at: i64,
    /// Where this filter is counted: its gateway's [`ListenerCounts`].
    counts: Arc<ListenerCounts>,
    /// `(len, table bytes)` of `rev_by_id` as last added to `counts`.
    counted: (usize, usize),
}

/// Ids in the duplicate filters of one gateway's live listeners, and the bytes of their maps'
/// tables (the ids' own strings not included).
#[derive(Debug, Default)]
struct ListenerCounts {
    ids: AtomicUsize,
    table_bytes: AtomicUsize,
}

impl ListenerCounts {
    fn get(&self) -> ListenerMemory {
        ListenerMemory {
            dedup_ids: self.ids.load(Ordering::Relaxed) as u64,
            dedup_table_bytes: self.table_bytes.load(Ordering::Relaxed) as u64,
        }
    }
}

/// What the duplicate filters of one gateway's listeners hold: `/metrics` reports both, so a
/// soak can tell these filters from growth elsewhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerMemory {
    pub dedup_ids: u64,
    /// Bytes of the filters' hash tables (a table grows, and never shrinks).
    pub dedup_table_bytes: u64,
}

/// Move `counter` from `old` to `new` (no shared write when nothing changed: a table's size
/// changes only when it grows, and an id seen again keeps the length).
fn recount(counter: &AtomicUsize, old: usize, new: usize) {
    if new > old {
        counter.fetch_add(new - old, Ordering::Relaxed);
    } else if new < old {
        counter.fetch_sub(old - new, Ordering::Relaxed);
    }
}

impl Seen {
    /// An empty filter, counted in `counts` while it lives.
    fn counted_in(counts: Arc<ListenerCounts>) -> Self {
        Seen { rev_by_id: hashbrown::HashMap::default(), newest: 0, pruned_at: 0, counts, counted: (0, 0) }
    }

    /// Record `rev` of `id`; false when that state (or a newer one) was already yielded.
    fn admit(&mut self, id: &MessageId, rev: i64) -> bool {
        if self.rev_by_id.get(id).is_some_and(|&last| last >= rev) {
            return false;
        }
        self.rev_by_id.insert(id.clone(), rev);
        if rev > self.newest {
            self.newest = rev;
            if rev - self.pruned_at >= DEDUP_WINDOW / 2 {
                self.pruned_at = rev;
                let floor = rev - DEDUP_WINDOW;
                self.rev_by_id.retain(|_, r| *r > floor);
            }
        }
        self.count((self.rev_by_id.len(), self.rev_by_id.allocation_size()));
        true
    }

    fn count(&mut self, now: (usize, usize)) {
        recount(&self.counts.ids, self.counted.0, now.0);
        recount(&self.counts.table_bytes, self.counted.1, now.1);
        self.counted = now;
    }
}

impl Drop for Seen {
    fn drop(&mut self) {
        self.count((0, 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_duplicate_filters_are_counted_while_they_live() {
        let counts = Arc::new(ListenerCounts::default());
        let usage = || counts.get();
        assert_eq!(usage(), ListenerMemory::default());
        let mut first = Seen::counted_in(Arc::clone(&counts));
        let mut second = Seen::counted_in(Arc::clone(&counts));
        assert!(first.admit(&MessageId::from("msg_a"), 1));
        assert!(!first.admit(&MessageId::from("msg_a"), 1), "the same state twice");
        assert!(second.admit(&MessageId::from("msg_a"), 1));
        assert_eq!(usage().dedup_ids, 2);
        let per_entry = std::mem::size_of::<(MessageId, i64)>() as u64 + 1; // an entry and its control byte
        assert!(usage().dedup_table_bytes >= 2 * per_entry);

        // A long run of new ids, one revision each: the filter never holds more than one and
        // a half windows of them, and still knows every id of the last window.
        let total = 3 * DEDUP_WINDOW;
        let bound = (DEDUP_WINDOW + DEDUP_WINDOW / 2) as u64;
        for rev in 2..=total {
            assert!(first.admit(&MessageId::from(format!("msg_{rev}")), rev));
            assert!(usage().dedup_ids <= bound + 1, "at revision {rev}: {} ids", usage().dedup_ids);
        }
        for rev in total - DEDUP_WINDOW + 1..=total {
            assert!(!first.admit(&MessageId::from(format!("msg_{rev}")), rev), "revision {rev} is in the window");
        }
        assert!(first.rev_by_id.len() as i64 >= DEDUP_WINDOW);
        assert!(
            first.admit(&MessageId::from("msg_2"), 2),
            "an id far behind the window is forgotten (a catch-up never reads that far back)"
        );
        let bytes = usage().dedup_table_bytes;
        assert!(
            bytes >= bound * per_entry && bytes <= 4 * bound * per_entry,
            "the table fits what it holds: {bytes} bytes for at most {bound} ids"
        );

        drop(first);
        assert_eq!(usage().dedup_ids, 1);
        drop(second);
        assert_eq!(usage(), ListenerMemory::default());

        // A listener matching one message in five, as the soak's are, for 330,000 messages
        // (110 minutes at 50 turns/s): its table reaches its size early and keeps it. (Dropping
        // ids leaves tombstones; a table whose count is above half its capacity when they run out
        // doubles instead of rehashing in place, which is how the former filter, cut at 40,000
        // ids, doubled again after 109 minutes.)
        let mut sparse = Seen::counted_in(Arc::default());
        let mut bytes_at_half = 0;
        for turn in 0..330_000_i64 {
            sparse.admit(&MessageId::from(format!("msg_{turn:026}")), 5 * turn + 1);
            if turn == 165_000 {
                bytes_at_half = sparse.rev_by_id.allocation_size();
            }
        }
        let held = (DEDUP_WINDOW + DEDUP_WINDOW / 2) as usize / 5;
        assert!(sparse.rev_by_id.len() <= held + 1, "{} ids held", sparse.rev_by_id.len());
        let bytes = sparse.rev_by_id.allocation_size();
        assert!(bytes as u64 <= 4 * held as u64 * per_entry, "{bytes} bytes of table for at most {held} ids");
        assert_eq!(bytes, bytes_at_half, "the table grew in the second half");
    }
}
