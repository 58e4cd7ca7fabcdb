//! The SQLite store's cache of long sessions' histories, kept current by revision.
//!
//! Every model call of a turn starts from the session's whole history in phased order. For a
//! long session, decoding every row again is most of the cost, while between two turns only a
//! handful of rows changed. So the store keeps the decoded history of its most recently read
//! long sessions with the global revision it was read at; the next read, inside one read
//! transaction (one snapshot), asks for the current revision and the session's rows changed
//! since (`rev > seen`, on the `messages_rev` index), applies them, and answers from memory.
//!
//! Why this is exact, not "usually right": revisions are assigned inside the write lock as
//! `MAX(rev) + 1`, so they follow commit order, in every process that shares the file; a
//! snapshot that sees revision `R` has seen every change numbered `≤ R`, and every later change
//! gets a number `> R`. Every change to a message row bumps its `rev` (inserts, statuses,
//! metadata; claims' heartbeats change no message field). Messages are never deleted, and the
//! phased key of a row (`turn_seq`, `step`, `phase`, `seq`) never changes after its insert, so a
//! changed row replaces its old copy in place and a new row is put at its key's position.
//!
//! Bounds: only sessions of at least [`MIN_MESSAGES`] are kept (short ones read fast anyway,
//! and a thousand idle sessions must stay cheap), at most [`MAX_SESSIONS`] of them and
//! [`MAX_BYTES`] in all (estimated from what the decoded messages hold on the heap), least
//! recently read first out. When more than [`MAX_DELTA`] revisions passed since a session was
//! read, it is read whole again rather than through the index.
//!
//! Admission: a long session is kept only when it is read again soon, that is when it is still
//! among the last [`GHOST_SESSIONS`] long sessions read (their ids alone are remembered, as in
//! 2Q's "A1out" list). A few sessions chatted with in turn are kept from their second read on;
//! a round robin over hundreds of long sessions, which a 16-session cache could never serve,
//! keeps nothing, instead of decoding a whole history into an entry on every read and evicting
//! another one (a churn that grew the resident set of a long soak).
//!
//! The cache knows no SQL beyond the revision query: the rows come through a [`RowReader`]. What
//! it holds is reported by its store ([`HistoryCache::kept`]), not counted process-wide.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use kesoku_core::{Message, SessionId};
use rusqlite::{Connection, params};

use crate::error::StoreResult;

/// Shortest history worth keeping.
pub(crate) const MIN_MESSAGES: usize = 256;
/// Most sessions kept.
pub(crate) const MAX_SESSIONS: usize = 16;
/// Most bytes kept (estimated from what the messages hold), all sessions together. One
/// session may take half: a 10,000-message session (~9 MB decoded) must fit.
pub(crate) const MAX_BYTES: usize = 32 * 1024 * 1024;
/// How many long sessions read but not kept are remembered (ids only) for admission.
pub(crate) const GHOST_SESSIONS: usize = 2 * MAX_SESSIONS;
/// Most revisions a kept history is brought forward by through the index.
pub(crate) const MAX_DELTA: i64 = 20_000;

/// A row's place in phased order: `(turn_seq, step, phase, seq)`.
pub(crate) type PhasedKey = (i64, i64, i64, i64);

/// A session's history as of revision `seen_rev`.
struct Entry {
    seen_rev: i64,
    keys: Vec<PhasedKey>,
    messages: Vec<Message>,
    /// Index of each row by its `seq` (unique, and an integer: no id copies).
    positions: HashMap<i64, usize>,
    bytes: usize,
    last_read: u64,
}

impl Entry {
    fn new(seen_rev: i64, rows: Vec<(PhasedKey, Message)>) -> Self {
        let mut keys = Vec::with_capacity(rows.len());
        let mut messages = Vec::with_capacity(rows.len());
        for (key, message) in rows {
            keys.push(key);
            messages.push(message);
        }
        let positions = keys.iter().enumerate().map(|(index, key)| (key.3, index)).collect();
        let bytes = messages.iter().map(estimated_bytes).sum();
        Entry { seen_rev, keys, messages, positions, bytes, last_read: 0 }
    }

    /// Apply rows changed since `seen_rev` (in any order).
    fn apply(&mut self, changed: Vec<(PhasedKey, Message)>) {
        for (key, message) in changed {
            if let Some(&index) = self.positions.get(&key.3) {
                self.bytes = self.bytes + estimated_bytes(&message) - estimated_bytes(&self.messages[index]);
                self.messages[index] = message;
                continue;
            }
            self.bytes += estimated_bytes(&message);
            // New rows almost always go last; a binary search places the others.
            let at = if self.keys.last().is_none_or(|last| *last < key) {
                self.keys.len()
            } else {
                self.keys.partition_point(|probe| *probe < key)
            };
            let last = at == self.keys.len();
            self.keys.insert(at, key);
            self.positions.insert(key.3, at);
            self.messages.insert(at, message);
            if !last {
                // Everything after `at` moved one place: renumber before the next row is placed.
                for (index, later) in self.keys.iter().enumerate().skip(at + 1) {
                    self.positions.insert(later.3, index);
                }
            }
        }
    }
}

/// What a kept message costs: the struct, its strings on the heap, its metadata, its key and
/// position. An estimate (allocator rounding and JSON values are guessed), cheap to compute.
fn estimated_bytes(message: &Message) -> usize {
    const PER_STRING: usize = 16; // allocator overhead of one heap string, roughly
    let strings = [
        message.id.as_str().len(),
        message.session_id.as_str().len(),
        message.parent_id.as_ref().map_or(0, |id| id.as_str().len()),
        message.chatbot_id.len(),
        message.channel_id.len(),
        message.sender.len(),
        message.content.len(),
    ];
    let meta = &message.metadata;
    let optional = [&meta.tool_name, &meta.tool_result, &meta.tool_error, &meta.tool_call_id, &meta.thought_signature];
    let metadata = optional.iter().map(|text| text.as_ref().map_or(0, |t| t.len() + PER_STRING)).sum::<usize>()
        + meta.tool_arguments.as_ref().map_or(0, |_| 256)
        + meta.attachments.as_ref().map_or(0, |list| list.len() * 256)
        + meta.compaction_summary.as_ref().map_or(0, |_| 512)
        + meta.extra.len() * 128;
    std::mem::size_of::<Message>()
        + strings.iter().map(|len| len + PER_STRING).sum::<usize>()
        + metadata
        + std::mem::size_of::<PhasedKey>()
        + 24 // its `positions` slot
}

/// The cache of one store; shared by its reader threads.
#[derive(Default)]
pub(crate) struct HistoryCache {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_session: HashMap<SessionId, Entry>,
    /// Long sessions read lately but not kept, most recent last (see the module's "Admission").
    ghosts: VecDeque<SessionId>,
    clock: u64,
}

/// How [`HistoryCache::read`] reads rows: everything of a session, or what changed since a revision.
pub(crate) trait RowReader {
    fn all(&self, conn: &Connection, session_id: &SessionId) -> StoreResult<Vec<(PhasedKey, Message)>>;
    fn changed_since(
        &self,
        conn: &Connection,
        session_id: &SessionId,
        rev: i64,
    ) -> StoreResult<Vec<(PhasedKey, Message)>>;
}

impl HistoryCache {
    /// The session's history in phased order, read in one snapshot.
    pub fn read(&self, conn: &Connection, session_id: &SessionId, rows: &impl RowReader) -> StoreResult<Vec<Message>> {
        // A savepoint outside a transaction is a read transaction: both queries see one snapshot.
        // (Inside the writer's batch, for an in-memory store, it nests.)
        conn.execute_batch("SAVEPOINT kesoku_history")?;
        let result = self.read_in_snapshot(conn, session_id, rows);
        let released = conn.execute_batch("RELEASE kesoku_history");
        let messages = result?;
        released?;
        Ok(messages)
    }

    fn read_in_snapshot(
        &self,
        conn: &Connection,
        session_id: &SessionId,
        rows: &impl RowReader,
    ) -> StoreResult<Vec<Message>> {
        let now = current_rev(conn)?;
        // Take the entry out while reading, so the other reader is not held up.
        let kept = self.lock().take(session_id);
        let mut entry = match kept {
            Some(mut entry) if entry.seen_rev <= now && now - entry.seen_rev <= MAX_DELTA => {
                if entry.seen_rev < now {
                    entry.apply(rows.changed_since(conn, session_id, entry.seen_rev)?);
                    entry.seen_rev = now;
                }
                entry
            }
            Some(_) | None => {
                let all = rows.all(conn, session_id)?;
                if all.len() < MIN_MESSAGES || !self.lock().admit(session_id) {
                    return Ok(all.into_iter().map(|(_, message)| message).collect());
                }
                Entry::new(now, all)
            }
        };
        let messages = entry.messages.clone();
        let mut entries = self.lock();
        // Another reader may have put a newer copy back meanwhile: keep the newer one.
        if entries.by_session.get(session_id).is_none_or(|other| other.seen_rev < entry.seen_rev) {
            entries.clock += 1;
            entry.last_read = entries.clock;
            if entry.bytes <= MAX_BYTES / 2 {
                entries.put(session_id.clone(), entry);
            }
            entries.evict();
        }
        Ok(messages)
    }

    /// `(bytes, sessions)` kept now, for the store's memory report. An entry being brought up
    /// to date by a reader is out of the map, and not counted, for that moment.
    pub(crate) fn kept(&self) -> (usize, usize) {
        self.lock().kept()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Entries {
    fn take(&mut self, session_id: &SessionId) -> Option<Entry> {
        self.by_session.remove(session_id)
    }

    fn put(&mut self, session_id: SessionId, entry: Entry) {
        self.by_session.insert(session_id, entry);
    }

    /// `(bytes, sessions)` of what `by_session` holds.
    fn kept(&self) -> (usize, usize) {
        (self.by_session.values().map(|entry| entry.bytes).sum(), self.by_session.len())
    }

    /// Whether a long session read whole should be kept: yes when it was read lately (it is a
    /// ghost); otherwise it becomes the newest ghost and is not kept this time.
    fn admit(&mut self, session_id: &SessionId) -> bool {
        if let Some(at) = self.ghosts.iter().position(|ghost| ghost == session_id) {
            self.ghosts.remove(at);
            return true;
        }
        if self.ghosts.len() == GHOST_SESSIONS {
            self.ghosts.pop_front();
        }
        self.ghosts.push_back(session_id.clone());
        false
    }

    fn evict(&mut self) {
        loop {
            let (bytes, sessions) = self.kept();
            if sessions <= MAX_SESSIONS && bytes <= MAX_BYTES {
                return;
            }
            let oldest = self.by_session.iter().min_by_key(|(_, entry)| entry.last_read).map(|(id, _)| id.clone());
            match oldest {
                Some(id) => {
                    self.take(&id);
                }
                None => return,
            }
        }
    }
}

/// The revision query both readers use.
pub(crate) fn current_rev(conn: &Connection) -> StoreResult<i64> {
    Ok(conn.prepare_cached("SELECT COALESCE(MAX(rev), 0) FROM messages")?.query_row(params![], |row| row.get(0))?)
}

#[cfg(test)]
mod tests {
    use kesoku_core::{MessageId, MessageType, Role, Status};

    use super::*;

    fn row(id: &str, key: PhasedKey, content: &str) -> (PhasedKey, Message) {
        let mut message = Message::user_text(&SessionId::from("s"), "cli", "cli", "User", content);
        message.id = MessageId::from(id);
        message.role = Role::User;
        message.message_type = MessageType::Text;
        (key, message)
    }

    #[test]
    fn changed_rows_replace_and_new_rows_land_at_their_key() {
        let mut entry =
            Entry::new(10, vec![row("a", (1, 0, 0, 1), "a"), row("b", (1, 1, 2, 2), "b"), row("c", (3, 0, 0, 3), "c")]);
        let mut changed_b = row("b", (1, 1, 2, 2), "b, longer now");
        changed_b.1.status = Status::Delivered;
        entry.apply(vec![
            row("d", (4, 0, 0, 5), "d"),
            // A late message of the first turn: between `b` and `c`.
            row("late", (1, 3, 5, 4), "late"),
            changed_b,
            // Changed after the insert moved it one place.
            row("c", (3, 0, 0, 3), "c, changed"),
        ]);
        let ids: Vec<&str> = entry.messages.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "late", "c", "d"]);
        assert!(entry.keys.windows(2).all(|pair| pair[0] < pair[1]));
        assert_eq!(entry.messages[1].content, "b, longer now");
        assert_eq!(entry.messages[1].status, Status::Delivered);
        assert_eq!(entry.messages[3].content, "c, changed");
        for (index, key) in entry.keys.iter().enumerate() {
            assert_eq!(entry.positions.get(&key.3), Some(&index), "position of seq {}", key.3);
        }
        let expected: usize = entry.messages.iter().map(estimated_bytes).sum();
        assert_eq!(entry.bytes, expected);
    }

    #[test]
    fn a_session_is_kept_from_its_second_read_while_it_is_still_remembered() {
        let mut entries = Entries::default();
        let id = |index: usize| SessionId::from(format!("s{index}").as_str());
        // Read again soon: kept on the second read.
        assert!(!entries.admit(&id(0)));
        assert!(entries.admit(&id(0)));
        // A round robin wider than the ghost list: never kept.
        for _ in 0..3 {
            for index in 1..=GHOST_SESSIONS + 1 {
                assert!(!entries.admit(&id(index)), "session {index} admitted in a round robin");
            }
        }
        assert_eq!(entries.ghosts.len(), GHOST_SESSIONS);
        // One narrower than it: kept from the second round on.
        let mut narrow = Entries::default();
        for round in 0..2 {
            for index in 0..GHOST_SESSIONS {
                assert_eq!(narrow.admit(&id(index)), round == 1, "session {index} in round {round}");
            }
        }
    }

    #[test]
    fn a_kept_message_is_costed_at_more_than_its_content() {
        let (_, small) = row("a", (1, 0, 0, 1), "hi");
        let (_, large) = row("b", (1, 0, 0, 2), &"x".repeat(10_000));
        assert!(estimated_bytes(&small) > std::mem::size_of::<Message>());
        assert!(estimated_bytes(&large) >= 10_000 + std::mem::size_of::<Message>());
    }

    #[test]
    fn a_ten_thousand_message_session_fits_in_the_cache() {
        // A typical turn: the user's line, a tool call with arguments, its result, the answer.
        let (_, user) = row("u", (1, 0, 0, 1), &"a question of a line or two ".repeat(4));
        let (_, mut call) =
            row("c", (1, 1, 2, 2), "Calling tool `read_file` with arguments: {\"path\": \"notes.txt\"}");
        call.metadata.tool_name = Some("read_file".to_owned());
        call.metadata.tool_call_id = Some("call_0123456789".to_owned());
        call.metadata.tool_arguments = Some(serde_json::json!({"path": "notes.txt"}));
        let (_, result) = row("r", (1, 1, 3, 3), &"file contents ".repeat(30));
        let (_, answer) = row("a", (1, 2, 4, 4), &"an answer of a few sentences ".repeat(10));
        let per_turn: usize = [&user, &call, &result, &answer].iter().map(|m| estimated_bytes(m)).sum();
        assert!(
            per_turn * 2_500 <= MAX_BYTES / 2,
            "10,000 messages cost {} bytes, more than one session may keep ({})",
            per_turn * 2_500,
            MAX_BYTES / 2
        );
    }

    #[test]
    fn the_least_recently_read_sessions_go_first() {
        let mut entries = Entries::default();
        for index in 0..MAX_SESSIONS + 3 {
            let mut entry = Entry::new(1, vec![row(&format!("m{index}"), (1, 0, 0, 1), "x")]);
            entry.last_read = index as u64;
            entries.put(SessionId::from(format!("s{index}").as_str()), entry);
        }
        entries.evict();
        assert_eq!(entries.by_session.len(), MAX_SESSIONS);
        for gone in 0..3 {
            assert!(!entries.by_session.contains_key(&SessionId::from(format!("s{gone}").as_str())));
        }
        assert!(entries.by_session.contains_key(&SessionId::from(format!("s{}", MAX_SESSIONS + 2).as_str())));
    }

    #[test]
    fn what_is_kept_is_counted_until_it_leaves() {
        let mut entries = Entries::default();
        let entry = |index: usize, content: &str| {
            let mut entry = Entry::new(1, vec![row(&format!("m{index}"), (1, 0, 0, 1), content)]);
            entry.last_read = index as u64;
            entry
        };
        let sizes: Vec<usize> = (0..MAX_SESSIONS + 2).map(|index| entry(index, &"x".repeat(index)).bytes).collect();
        for index in 0..MAX_SESSIONS + 2 {
            entries.put(SessionId::from(format!("s{index}").as_str()), entry(index, &"x".repeat(index)));
        }
        assert_eq!(entries.kept(), (sizes.iter().sum(), MAX_SESSIONS + 2));
        // A newer copy replaces the old one: counted once.
        entries.put(SessionId::from("s0"), entry(0, "a longer history now"));
        let replaced = entry(0, "a longer history now").bytes;
        assert_eq!(entries.kept().0, sizes.iter().sum::<usize>() - sizes[0] + replaced);
        entries.evict();
        let left: usize = entries.by_session.values().map(|entry| entry.bytes).sum();
        assert_eq!(entries.kept(), (left, MAX_SESSIONS));
        let taken = entries.take(&SessionId::from(format!("s{}", MAX_SESSIONS + 1).as_str())).expect("kept").bytes;
        assert_eq!(entries.kept(), (left - taken, MAX_SESSIONS - 1));
    }
}
