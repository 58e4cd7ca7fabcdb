//! [`RedisQueue`]: the lane queue on Redis Streams (the rules are in the module above).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use kesoku_core::{Activation, SessionId};
use redis::aio::ConnectionManager;
use redis::streams::{StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{RedisOptions, backoff, client, instance_id, manager, unavailable};
use crate::queue::{Acknowledge, Aging, Hold, LaneCaps, QueueDepths, QueueLease, State, Waiting, lane_index};
use crate::{BrokerError, Queue};
const GROUP: &str = "workers";
const LANES: [&str; 3] = ["interactive", "responsive", "background"];
/// Entries claimed from dead consumers per lane and attempt.
const RECLAIM_BATCH: usize = 16;

/// The lane queue on Redis Streams, shared by every process on the same prefix.
#[derive(Clone)]
pub struct RedisQueue {
    inner: Arc<QueueInner>,
}

struct QueueInner {
    url: String,
    conn: ConnectionManager,
    /// Blocking reads wait on their own connection, so they hold up no other command.
    blocking: ConnectionManager,
    streams: [String; 3],
    consumer: String,
    local: Mutex<Local>,
    /// Something this process holds changed (an entry read, a lease ended): poppers look again.
    ready: Notify,
    /// A popper found nothing runnable: the reader should wait on Redis for new entries.
    demand: Notify,
    /// Poppers waiting with nothing runnable. The reader reads only while some wait, so a
    /// busy process leaves new entries to the others.
    idle_poppers: AtomicUsize,
    aging: Aging,
    caps: LaneCaps,
    reclaim_after: Duration,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What this process holds: its lanes (entries read, waiting) and the entries it owns (read and
/// not yet acknowledged or abandoned, waiting or out), by entry id, with their lane.
#[derive(Default)]
struct Local {
    state: State,
    /// Keyed by lane and entry id (ids are per stream: two lanes may use the same one).
    owned: HashSet<(usize, String)>,
    last_reclaim: Option<Instant>,
}

impl Drop for QueueInner {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            task.abort();
        }
    }
}

impl std::fmt::Debug for RedisQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisQueue").field("consumer", &self.inner.consumer).field("caps", &self.inner.caps).finish()
    }
}

/// How long a blocking read waits for new entries before looking around again.
fn poll_period(reclaim_after: Duration) -> Duration {
    (reclaim_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

impl RedisQueue {
    /// Connect, create the lane streams and their consumer group if missing, and start this
    /// process's reader and keep-alive tasks.
    pub async fn connect(options: &RedisOptions, aging: Aging, caps: LaneCaps) -> Result<RedisQueue, BrokerError> {
        let url = options.url.clone();
        let client = client(&url)?;
        let timeout = options.operation_timeout;
        let mut conn = manager(&client, &url, timeout, timeout).await?;
        let poll = poll_period(options.reclaim_after);
        let blocking = manager(&client, &url, timeout, poll + timeout).await?;
        let streams = LANES.map(|lane| format!("{}:lane:{lane}", options.prefix));
        create_groups(&mut conn, &streams).await.map_err(|error| unavailable(&url, &error))?;
        let queue = RedisQueue {
            inner: Arc::new(QueueInner {
                url,
                conn,
                blocking,
                idle_poppers: AtomicUsize::new(0),
                streams,
                consumer: instance_id(),
                local: Mutex::default(),
                ready: Notify::new(),
                demand: Notify::new(),
                aging,
                caps,
                reclaim_after: options.reclaim_after,
                tasks: Mutex::default(),
            }),
        };
        let weak = Arc::downgrade(&queue.inner);
        let reader = tokio::spawn(read_when_wanted(Weak::clone(&weak), poll));
        let keeper = tokio::spawn(keep_alive(weak, (options.reclaim_after / 4).max(Duration::from_millis(10))));
        queue.inner.tasks.lock().unwrap_or_else(PoisonError::into_inner).extend([reader, keeper]);
        Ok(queue)
    }

    /// The queue of a pool of `workers`: default aging, [`LaneCaps::for_workers`].
    pub async fn for_workers(options: &RedisOptions, workers: usize) -> Result<RedisQueue, BrokerError> {
        Self::connect(options, Aging::default(), LaneCaps::for_workers(workers)).await
    }

    pub fn caps(&self) -> LaneCaps {
        self.inner.caps
    }
}

/// Create the lane streams and their group where missing (at start, and after Redis lost
/// them: a restart without persistence).
async fn create_groups(conn: &mut ConnectionManager, streams: &[String; 3]) -> Result<(), redis::RedisError> {
    for stream in streams {
        let created = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async::<()>(conn)
            .await;
        match created {
            Ok(()) => {}
            Err(error) if error.code() == Some("BUSYGROUP") => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

impl QueueInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fail(&self, error: &redis::RedisError) -> BrokerError {
        unavailable(&self.url, error)
    }

    /// The best runnable entry this process holds, leased.
    fn take_local(self: &Arc<Self>) -> Option<QueueLease> {
        let waiting = self.lock().state.take_next(self.aging, self.caps, Instant::now())?;
        // Seam for one worker per session across processes: a session lease is taken here
        // (and the entry left waiting if another process holds it), then given back by `RedisAck`.
        let entry = waiting.entry.unwrap_or_default();
        let activation = waiting.activation;
        let ack = RedisAck {
            inner: Arc::clone(self),
            lane: lane_index(activation.lane),
            session_id: activation.session_id.clone(),
            hold: Hold::of(&activation),
            entry,
        };
        Some(QueueLease::new(activation, ack))
    }

    /// Lanes under their cap here: the only ones worth reading from or reclaiming for.
    fn open_lanes(&self) -> Vec<usize> {
        let local = self.lock();
        (0..3).filter(|&lane| local.state.lane_has_room(lane, self.caps)).collect()
    }

    /// Lanes under their cap with nothing runnable waiting here: the ones to read from, so that
    /// the first runnable activation of every lane competes, as in one process.
    fn lanes_to_read(&self) -> Vec<usize> {
        let local = self.lock();
        (0..3)
            .filter(|&lane| local.state.lane_has_room(lane, self.caps) && !local.state.lane_has_runnable(lane))
            .collect()
    }

    /// Read new entries until every open lane has a runnable one here or nothing is left
    /// (bounded: the rest is read next time).
    async fn fill(&self, conn: &mut ConnectionManager) -> Result<usize, BrokerError> {
        const ROUNDS: usize = 16;
        let mut read = 0;
        for _ in 0..ROUNDS {
            let round = self.read(conn, None).await?;
            if round == 0 {
                break;
            }
            read += round;
        }
        Ok(read)
    }

    /// Read at most one new entry for each lane that needs one; `block`: wait that long for
    /// one. Returns how many were read.
    async fn read(&self, conn: &mut ConnectionManager, block: Option<Duration>) -> Result<usize, BrokerError> {
        let lanes = self.lanes_to_read();
        if lanes.is_empty() {
            if let Some(block) = block {
                // Nothing to read for (every lane capped or served here): don't spin.
                tokio::time::sleep(block).await;
            }
            return Ok(0);
        }
        let keys: Vec<&str> = lanes.iter().map(|&lane| self.streams[lane].as_str()).collect();
        let ids = vec![">"; keys.len()];
        let mut options = StreamReadOptions::default().group(GROUP, &self.consumer).count(1);
        if let Some(block) = block {
            options = options.block(block.as_millis().max(1) as usize);
        }
        let mut command = redis::cmd("XREADGROUP");
        command.arg(&options).arg("STREAMS").arg(&keys).arg(&ids);
        let reply: Option<StreamReadReply> = match command.query_async(conn).await {
            Ok(reply) => reply,
            Err(error) if error.code() == Some("NOGROUP") => {
                tracing::warn!("queue: the lane streams are gone from Redis (restarted empty?); creating them again");
                create_groups(conn, &self.streams).await.map_err(|error| self.fail(&error))?;
                return Ok(0);
            }
            Err(error) => return Err(self.fail(&error)),
        };
        let mut read = 0;
        for key in reply.map(|reply| reply.keys).unwrap_or_default() {
            let Some(lane) = self.streams.iter().position(|stream| *stream == key.key) else { continue };
            for entry in key.ids {
                read += usize::from(self.adopt(lane, &entry).await);
            }
        }
        Ok(read)
    }

    /// Take an entry read or claimed into this process's lanes. An unreadable entry is logged
    /// and removed (it can never run).
    async fn adopt(&self, lane: usize, entry: &StreamId) -> bool {
        let activation = entry
            .get::<String>("activation")
            .ok_or_else(|| "no `activation` field".to_owned())
            .and_then(|json| serde_json::from_str::<Activation>(&json).map_err(|e| e.to_string()));
        let activation = match activation {
            Ok(activation) => activation,
            Err(error) => {
                tracing::error!(stream = %self.streams[lane], entry = %entry.id, %error, "queue: dropping an unreadable entry");
                let _ = self.forget(lane, &entry.id).await;
                return false;
            }
        };
        let since = entry_since(&entry.id);
        let mut local = self.lock();
        if !local.owned.insert((lane, entry.id.clone())) {
            // Already held here (claimed back from ourselves): keep the one waiting or out.
            return false;
        }
        local.state.lanes[lane].push_back(Waiting { activation, since, entry: Some(entry.id.clone()) });
        true
    }

    /// Take over entries of consumers silent for `reclaim_after`, at most once per half of it.
    async fn reclaim_if_due(&self) -> Result<usize, BrokerError> {
        {
            let mut local = self.lock();
            let now = Instant::now();
            if local.last_reclaim.is_some_and(|last| now.saturating_duration_since(last) < self.reclaim_after / 2) {
                return Ok(0);
            }
            local.last_reclaim = Some(now);
        }
        let mut conn = self.conn.clone();
        let mut claimed = 0;
        for lane in self.open_lanes() {
            let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(&self.streams[lane])
                .arg(GROUP)
                .arg(&self.consumer)
                .arg(self.reclaim_after.as_millis() as u64)
                .arg("0-0")
                .arg(StreamAutoClaimOptions::default().count(RECLAIM_BATCH))
                .query_async(&mut conn)
                .await
                .map_err(|error| self.fail(&error))?;
            for entry in &reply.claimed {
                if self.adopt(lane, entry).await {
                    tracing::info!(stream = %self.streams[lane], entry = %entry.id, "queue: took over an entry of a silent process");
                    claimed += 1;
                }
            }
        }
        // Consumers of processes gone long ago, holding nothing, are forgotten.
        let gone_after = (self.reclaim_after * 10).as_millis() as u64;
        for stream in &self.streams {
            let forgotten: usize = FORGET_CONSUMERS
                .key(stream)
                .arg(GROUP)
                .arg(&self.consumer)
                .arg(gone_after)
                .invoke_async(&mut conn)
                .await
                .map_err(|error| self.fail(&error))?;
            if forgotten > 0 {
                tracing::info!(stream, forgotten, "queue: forgot the consumers of processes gone for good");
            }
        }
        Ok(claimed)
    }

    /// Acknowledge and delete an entry: it is done for good.
    async fn forget(&self, lane: usize, entry: &str) -> Result<(), BrokerError> {
        let mut conn = self.conn.clone();
        redis::pipe()
            .atomic()
            .cmd("XACK")
            .arg(&self.streams[lane])
            .arg(GROUP)
            .arg(entry)
            .ignore()
            .cmd("XDEL")
            .arg(&self.streams[lane])
            .arg(entry)
            .ignore()
            .query_async::<()>(&mut conn)
            .await
            .map_err(|error| self.fail(&error))
    }

    /// Free what a lease held here and stop keeping its entry alive.
    fn release(&self, lane: usize, session_id: &SessionId, hold: Hold, entry: &str) {
        {
            let mut local = self.lock();
            local.state.release(lane, session_id, hold);
            local.owned.remove(&(lane, entry.to_owned()));
        }
        self.ready.notify_waiters();
        self.ready.notify_one();
    }

    /// Reset the idle time of every entry this process owns, so no other process takes them
    /// over; entries another process took meanwhile (after an outage) are dropped from the
    /// lanes here.
    async fn keep_owned_alive(&self) -> Result<(), BrokerError> {
        let mut by_lane: [Vec<String>; 3] = Default::default();
        for (lane, entry) in &self.lock().owned {
            by_lane[*lane].push(entry.clone());
        }
        let mut conn = self.conn.clone();
        for (lane, entries) in by_lane.iter().enumerate() {
            if entries.is_empty() {
                continue;
            }
            let lost: Vec<String> = KEEP_ALIVE
                .key(&self.streams[lane])
                .arg(GROUP)
                .arg(&self.consumer)
                .arg(entries)
                .invoke_async(&mut conn)
                .await
                .map_err(|error| self.fail(&error))?;
            if lost.is_empty() {
                continue;
            }
            let mut local = self.lock();
            // Only those still held here: an entry acknowledged meanwhile is not lost.
            let lost: Vec<String> =
                lost.into_iter().filter(|entry| local.owned.remove(&(lane, entry.clone()))).collect();
            if lost.is_empty() {
                continue;
            }
            let waiting = &mut local.state.lanes[lane];
            let before = waiting.len();
            waiting.retain(|w| !w.entry.as_ref().is_some_and(|entry| lost.contains(entry)));
            let running = lost.len() - (before - waiting.len());
            if running > 0 {
                tracing::warn!(
                    stream = %self.streams[lane],
                    running,
                    "queue: another process took over entries running here (this process was silent longer than reclaim_after)"
                );
            }
        }
        Ok(())
    }
}

/// Keep entries pending for a consumer alive (idle time back to 0) if they still are its;
/// return those that are not (acknowledged, deleted or taken over by another consumer).
static KEEP_ALIVE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  if pending[1] and pending[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
  else
    table.insert(lost, id)
  end
end
return lost
",
    )
});

/// Delete the group's consumers (other than this one) that hold no entry and have been silent
/// for at least ARGV[3] ms: atomically, so a consumer that reads meanwhile is never deleted
/// with entries (which would orphan them).
static FORGET_CONSUMERS: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local forgotten = 0
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local fields = {}
  for i = 1, #consumer, 2 do fields[consumer[i]] = consumer[i + 1] end
  if fields['name'] ~= ARGV[2] and fields['pending'] == 0 and fields['idle'] >= tonumber(ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], fields['name'])
    forgotten = forgotten + 1
  end
end
return forgotten
",
    )
});

/// When an entry was added, from its id (`<milliseconds>-<sequence>`), as an instant of this
/// process: how long it has waited counts for aging whichever process reads it.
fn entry_since(id: &str) -> Instant {
    let now = Instant::now();
    let added_ms = id.split('-').next().and_then(|ms| ms.parse::<u64>().ok());
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).ok();
    match (added_ms, now_ms) {
        (Some(added), Some(now_ms)) => {
            now.checked_sub(Duration::from_millis(now_ms.saturating_sub(added))).unwrap_or(now)
        }
        _ => now,
    }
}

/// Wait on Redis for new entries while some popper here finds nothing runnable.
async fn read_when_wanted(queue: Weak<QueueInner>, poll: Duration) {
    let mut attempt = 0;
    loop {
        let Some(inner) = queue.upgrade() else { return };
        if inner.idle_poppers.load(Ordering::Acquire) == 0 {
            // Wait for a popper without keeping the queue alive.
            let demand = Arc::clone(&inner);
            drop(inner);
            let wanted = demand.demand.notified();
            tokio::pin!(wanted);
            wanted.as_mut().enable();
            if demand.idle_poppers.load(Ordering::Acquire) == 0 {
                let _ = tokio::time::timeout(poll, wanted).await;
            }
            continue;
        }
        let mut conn = inner.blocking.clone();
        match inner.read(&mut conn, Some(poll)).await {
            Ok(read) => {
                attempt = 0;
                if read > 0 {
                    inner.ready.notify_waiters();
                    inner.ready.notify_one();
                }
            }
            Err(error) => {
                drop(inner);
                tracing::warn!(%error, "queue: reading new entries failed; retrying");
                tokio::time::sleep(backoff(attempt)).await;
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

/// Keep this process's entries alive every `period`.
async fn keep_alive(queue: Weak<QueueInner>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = queue.upgrade() else { return };
        if let Err(error) = inner.keep_owned_alive().await {
            tracing::warn!(%error, "queue: keeping held entries alive failed; retrying");
        }
    }
}

/// Finishes a Redis lease: `ack` acknowledges and deletes the entry; a drop only frees it
/// here, and the entry, no longer kept alive, is taken over after `reclaim_after`.
struct RedisAck {
    inner: Arc<QueueInner>,
    lane: usize,
    session_id: SessionId,
    hold: Hold,
    entry: String,
}

#[async_trait]
impl Acknowledge for RedisAck {
    async fn ack(self: Box<Self>) -> Result<(), BrokerError> {
        // A brief outage is retried; the lease is freed here whatever happens (an entry that
        // could not be acknowledged comes back after `reclaim_after`, and its turn finds its
        // message already handled).
        let mut result = Ok(());
        for attempt in 0..4 {
            result = self.inner.forget(self.lane, &self.entry).await;
            if result.is_ok() {
                break;
            }
            tokio::time::sleep(backoff(attempt)).await;
        }
        self.inner.release(self.lane, &self.session_id, self.hold, &self.entry);
        result
    }

    fn abandon(self: Box<Self>) {
        self.inner.release(self.lane, &self.session_id, self.hold, &self.entry);
    }
}

#[async_trait]
impl Queue for RedisQueue {
    async fn push(&self, activation: Activation) -> Result<(), BrokerError> {
        let inner = &self.inner;
        let json = serde_json::to_string(&activation)
            .map_err(|error| BrokerError::Corrupt(format!("an activation could not be encoded: {error}")))?;
        let mut conn = inner.conn.clone();
        let mut add = redis::cmd("XADD");
        add.arg(&inner.streams[lane_index(activation.lane)])
            .arg("*")
            .arg("session")
            .arg(activation.session_id.as_str())
            .arg("activation")
            .arg(json);
        // A brief outage is retried (the connection reconnects by itself).
        let mut attempt = 0;
        loop {
            match add.query_async::<String>(&mut conn).await {
                Ok(_) => break,
                Err(_) if attempt < 3 => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(error) => return Err(inner.fail(&error)),
            }
        }
        inner.ready.notify_one();
        Ok(())
    }

    async fn pop(&self) -> Result<QueueLease, BrokerError> {
        let inner = &self.inner;
        let poll = poll_period(inner.reclaim_after);
        let mut attempt = 0;
        loop {
            let notified = inner.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.try_pop().await {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => attempt = 0,
                Err(error) => {
                    tracing::warn!(%error, "queue: Redis unavailable; retrying");
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt = attempt.saturating_add(1);
                    continue;
                }
            }
            inner.idle_poppers.fetch_add(1, Ordering::AcqRel);
            inner.demand.notify_one();
            let _ = tokio::time::timeout(poll, notified).await;
            inner.idle_poppers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    async fn try_pop(&self) -> Result<Option<QueueLease>, BrokerError> {
        let inner = &self.inner;
        inner.reclaim_if_due().await?;
        let mut conn = inner.conn.clone();
        inner.fill(&mut conn).await?;
        Ok(inner.take_local())
    }

    /// Waiting: entries no process has read yet plus those waiting here; running: out here.
    async fn depths(&self) -> Result<QueueDepths, BrokerError> {
        let inner = &self.inner;
        let mut pipe = redis::pipe();
        for stream in &inner.streams {
            pipe.cmd("XLEN").arg(stream).cmd("XPENDING").arg(stream).arg(GROUP);
        }
        let mut conn = inner.conn.clone();
        let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await.map_err(|error| inner.fail(&error))?;
        let mut unread = [0usize; 3];
        for (lane, pair) in replies.chunks(2).enumerate().take(3) {
            let unexpected = |error: redis::ParsingError| {
                BrokerError::Corrupt(format!("Redis answered XLEN/XPENDING unexpectedly: {error}"))
            };
            let length: usize = redis::from_redis_value_ref(&pair[0]).map_err(unexpected)?;
            let pending: redis::streams::StreamPendingReply =
                redis::from_redis_value_ref(&pair[1]).map_err(unexpected)?;
            unread[lane] = length.saturating_sub(pending.count());
        }
        let here = inner.lock().state.depths();
        Ok(QueueDepths {
            interactive: unread[0] + here.interactive,
            responsive: unread[1] + here.responsive,
            background: unread[2] + here.background,
            running: here.running,
        })
    }

    /// Removes the session's entries waiting here and those no process has read yet.
    async fn remove_session(&self, session_id: &SessionId) -> Result<Vec<Activation>, BrokerError> {
        let inner = &self.inner;
        let mut removed = Vec::new();
        let here = {
            let mut local = inner.lock();
            let gone = local.state.remove_session(session_id);
            for waiting in &gone {
                if let Some(entry) = &waiting.entry {
                    local.owned.remove(&(lane_index(waiting.activation.lane), entry.clone()));
                }
            }
            gone
        };
        for waiting in here {
            if let Some(entry) = &waiting.entry {
                inner.forget(lane_index(waiting.activation.lane), entry).await?;
            }
            removed.push(waiting.activation);
        }
        let mut conn = inner.conn.clone();
        for (lane, stream) in inner.streams.iter().enumerate() {
            let groups: redis::streams::StreamInfoGroupsReply = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(stream)
                .query_async(&mut conn)
                .await
                .map_err(|e| inner.fail(&e))?;
            let Some(group) = groups.groups.iter().find(|group| group.name == GROUP) else { continue };
            // Only entries after the group's last delivered one are unread.
            let mut start = format!("({}", group.last_delivered_id);
            loop {
                let page: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                    .arg(stream)
                    .arg(&start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(200)
                    .query_async(&mut conn)
                    .await
                    .map_err(|error| inner.fail(&error))?;
                let Some(last) = page.ids.last() else { break };
                start = format!("({}", last.id);
                for entry in &page.ids {
                    if entry.get::<String>("session").as_deref() != Some(session_id.as_str()) {
                        continue;
                    }
                    let deleted: usize = redis::cmd("XDEL")
                        .arg(stream)
                        .arg(&entry.id)
                        .query_async(&mut conn)
                        .await
                        .map_err(|error| inner.fail(&error))?;
                    let activation = entry
                        .get::<String>("activation")
                        .and_then(|json| serde_json::from_str::<Activation>(&json).ok());
                    if let (1, Some(activation)) = (deleted, activation) {
                        removed.push(activation);
                    } else if deleted == 1 {
                        tracing::warn!(stream, entry = %entry.id, lane, "queue: removed an unreadable entry");
                    }
                }
            }
        }
        Ok(removed)
    }
}
