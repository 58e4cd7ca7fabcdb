//! Live progress of running Discord turns: one status message per turn, typing while it runs.
//!
//! [`Progress`] is the delivery side's memory of the turns one Discord chatbot instance is
//! showing (spec §4.3, §5.3). The first intermediate step of a turn creates its status message
//! ([`TurnStatus`]), later steps edit it in place; while the turn runs the channel shows the
//! typing indicator (every [`TYPING_INTERVAL`], at most [`TYPING_CAP`]). How a turn ends decides
//! what stays:
//!
//! - answer delivered ([`Progress::on_delivered`]): the status message is edited down to the
//!   single header line with the turn's figures (`⚡ 3 turns · context 8,421 tokens · …`) and
//!   loses its Stop button. The spec's "deletes intermediate status lines" (§6.1) is read as
//!   removing the step lines, not the message: the header keeps the figures §4.2 asks for. A
//!   turn that showed no step has no status message, and none is posted after its answer;
//! - interrupted (§6.3): the status message is deleted;
//! - error: the header becomes `❌ Failed` and the step lines stay, so the user sees where.
//!
//! Showing progress is best-effort: a failed edit is logged and the step still counts as shown.
//! Only a transient failure to *create* the status message is returned (the seam retries the
//! step; the create carries a nonce with `enforce_nonce`, so a retry after a lost response does
//! not post twice). The status message id of a turn is kept through [`StatusMemory`], so after
//! a restart the same message is edited, folded or deleted.
//!
//! It does not deliver final answers (that is the seam's `send_part`), hold any gateway
//! connection, or decide which messages are steps of which chatbot (the seam does).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_core::message::ERROR_NOTIFICATION_PREFIX;
use kesoku_core::{Message, MessageId, MessageType, Role, SessionId, Status, TurnMetrics};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::rest::{DiscordApi, DiscordApiError, UNKNOWN_MESSAGE, create_nonce};
use super::status::TurnStatus;

/// How often the typing indicator is renewed (Discord shows it for about 10 seconds).
pub const TYPING_INTERVAL: Duration = Duration::from_secs(8);
/// How long a turn shows the typing indicator at most: a turn that runs for an hour should not
/// look like someone typing for an hour.
pub const TYPING_CAP: Duration = Duration::from_secs(10 * 60);
/// Ended turns remembered so a late step does not open a new status message for them.
const ENDED_TURNS_KEPT: usize = 256;
/// Attempts of the edit that ends a turn (fold, failure): a status left at `⏳ Working…` with a
/// live Stop button would mislead, and no later step will repaint it.
const FINAL_EDIT_ATTEMPTS: u32 = 3;
const FINAL_EDIT_BACKOFF: Duration = Duration::from_secs(1);
const FINAL_EDIT_MAX_WAIT: Duration = Duration::from_secs(10);

/// Keeps a turn's status message id across restarts. The lead backs it with the store's
/// delivery records (part 0 of the turn's root message).
#[async_trait]
pub trait StatusMemory: Send + Sync {
    /// The status message of the turn opened by `root` is `status_message` in `channel`.
    /// Failures are the implementation's to log: the status message still works until a restart.
    async fn remember(&self, root: &MessageId, channel: u64, status_message: u64);
    /// `(channel, status_message)` of the turn opened by `root`, if one was remembered.
    async fn recall(&self, root: &MessageId) -> Option<(u64, u64)>;
}

/// Timing of the typing indicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgressOptions {
    pub typing_interval: Duration,
    pub typing_cap: Duration,
}

impl Default for ProgressOptions {
    fn default() -> Self {
        ProgressOptions { typing_interval: TYPING_INTERVAL, typing_cap: TYPING_CAP }
    }
}

/// Why progress could not be shown.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProgressError {
    /// Discord could not take the call now; the same call later should work.
    #[error("discord could not show the turn's status message now ({reason}); try the step again later")]
    Transient { reason: String, retry_after: Option<Duration> },
    /// The message's channel is not a Discord channel id: it will never be shown.
    #[error("channel id `{channel_id}` is not a discord channel id (a number): the message cannot be shown on discord")]
    InvalidChannel { channel_id: String },
}

impl ProgressError {
    pub fn is_retryable(&self) -> bool {
        match self {
            ProgressError::Transient { .. } => true,
            ProgressError::InvalidChannel { .. } => false,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProgressError::Transient { retry_after, .. } => *retry_after,
            ProgressError::InvalidChannel { .. } => None,
        }
    }
}

/// The running turns of one Discord chatbot instance and their status messages.
pub struct Progress {
    api: Arc<dyn DiscordApi>,
    memory: Arc<dyn StatusMemory>,
    options: ProgressOptions,
    /// The turns shown. A std mutex: held only to read or update the maps and to render a
    /// body, never across an await (every platform call happens after it is released).
    turns: Mutex<Turns>,
}

#[derive(Default)]
struct Turns {
    /// Turns being shown, by root message id.
    running: HashMap<MessageId, Turn>,
    /// Tool call message id → root: a tool result's parent is its call, not the root.
    call_roots: HashMap<MessageId, MessageId>,
    /// (session, provider call id) → root, for a result whose parent is not a call seen here.
    provider_call_roots: HashMap<(SessionId, String), MessageId>,
    /// Roots whose turn ended here lately (oldest first).
    ended: VecDeque<MessageId>,
}

struct Turn {
    /// The channel of the status message.
    channel: u64,
    status: TurnStatus,
    status_message: Option<u64>,
    /// Whether [`StatusMemory::recall`] was asked (once per turn and process).
    recalled: bool,
    /// Discord refused to create the status message for good (no permission, channel gone):
    /// no further attempts for this turn.
    gave_up: bool,
    /// Status messages created for this turn so far: part of the nonce, so a message posted
    /// again after someone deleted the first is not answered with the deleted one.
    creates: u32,
    typing: Option<CancellationToken>,
    /// Tool calls of this turn, to forget their entries in the call maps when it ends.
    calls: Vec<(MessageId, Option<String>)>,
    /// Orders this turn's platform calls. An async mutex, held across the call on purpose: two
    /// steps must not both create a status message, and edits must land in the steps' order.
    lane: Arc<tokio::sync::Mutex<()>>,
}

impl Turn {
    fn new(channel: u64, session_id: SessionId) -> Self {
        Turn {
            channel,
            status: TurnStatus::new(session_id),
            status_message: None,
            recalled: false,
            gave_up: false,
            creates: 0,
            typing: None,
            calls: Vec::new(),
            lane: Arc::new(tokio::sync::Mutex::new(())),
        }
    }
}

impl Turns {
    /// The root of the turn `step` belongs to: its parent, or for a tool result its call's parent.
    fn root_of(&self, step: &Message, channel: u64) -> Option<MessageId> {
        match step.message_type {
            MessageType::Thought | MessageType::ToolCall | MessageType::Text => step.parent_id.clone(),
            MessageType::ToolResult => step
                .parent_id
                .as_ref()
                .and_then(|call| self.call_roots.get(call))
                .or_else(|| {
                    let call_id = step.metadata.tool_call_id.clone()?;
                    self.provider_call_roots.get(&(step.session_id.clone(), call_id))
                })
                .cloned()
                // The call was shown before a restart: a session runs one turn at a time, so
                // the one running turn of this session and channel is the result's.
                .or_else(|| {
                    let mut candidates = self.running.iter().filter(|(_, turn)| {
                        turn.channel == channel
                            && turn.status.session_id() == &step.session_id
                            && turn.status.is_running()
                    });
                    match (candidates.next(), candidates.next()) {
                        (Some((root, _)), None) => Some(root.clone()),
                        (Some(_), Some(_)) | (None, _) => None,
                    }
                }),
        }
    }

    fn has_ended(&self, root: &MessageId) -> bool {
        self.ended.contains(root)
    }

    fn register_call(&mut self, root: &MessageId, call: &Message) {
        self.call_roots.insert(call.id.clone(), root.clone());
        if let Some(call_id) = &call.metadata.tool_call_id {
            self.provider_call_roots.insert((call.session_id.clone(), call_id.clone()), root.clone());
        }
        if let Some(turn) = self.running.get_mut(root) {
            turn.calls.push((call.id.clone(), call.metadata.tool_call_id.clone()));
        }
    }

    /// Forget a turn (stopping its typing) and remember that it ended.
    fn end(&mut self, root: &MessageId) {
        if let Some(turn) = self.running.remove(root) {
            if let Some(typing) = turn.typing {
                typing.cancel();
            }
            let session_id = turn.status.session_id().clone();
            for (call, call_id) in turn.calls {
                self.call_roots.remove(&call);
                if let Some(call_id) = call_id {
                    self.provider_call_roots.remove(&(session_id.clone(), call_id));
                }
            }
        }
        if !self.ended.contains(root) {
            self.ended.push_back(root.clone());
        }
        while self.ended.len() > ENDED_TURNS_KEPT {
            self.ended.pop_front();
        }
    }
}

/// How a turn ended, as its status message should show it.
enum Ending {
    Finished(Option<TurnMetrics>),
    Interrupted,
    Failed,
}

impl Progress {
    pub fn new(api: Arc<dyn DiscordApi>, memory: Arc<dyn StatusMemory>, options: ProgressOptions) -> Self {
        Progress { api, memory, options, turns: Mutex::new(Turns::default()) }
    }

    fn turns(&self) -> MutexGuard<'_, Turns> {
        // The maps stay consistent between statements, so a panic elsewhere leaves them usable.
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Run `f` on the turn of `root`, if it is still shown.
    fn with_turn<T>(&self, root: &MessageId, f: impl FnOnce(&mut Turn) -> T) -> Option<T> {
        self.turns().running.get_mut(root).map(f)
    }

    /// Show one intermediate step (thought, tool call, tool result, intermediate assistant
    /// text) of a running turn: create the turn's status message, or edit it in place.
    ///
    /// `Ok` means the step may be marked delivered: also when the edit failed (logged) or the
    /// step belongs to no turn shown here. `Err(Transient)` when the status message could not
    /// be created for now: deliver the step again later.
    pub async fn show_step(&self, message: &Message) -> Result<(), ProgressError> {
        let is_step = match message.message_type {
            MessageType::Thought | MessageType::ToolCall | MessageType::ToolResult => true,
            MessageType::Text => message.role == Role::Assistant,
        };
        if !is_step {
            return Ok(());
        }
        let channel = parse_channel(&message.channel_id)?;
        let (root, lane) = {
            let mut turns = self.turns();
            let Some(root) = turns.root_of(message, channel) else {
                tracing::debug!(message_id = %message.id, "a step of no turn shown here: not shown on discord");
                return Ok(());
            };
            if turns.has_ended(&root) {
                tracing::debug!(message_id = %message.id, root = %root, "a step after its turn ended: not shown");
                return Ok(());
            }
            let turn =
                turns.running.entry(root.clone()).or_insert_with(|| Turn::new(channel, message.session_id.clone()));
            let changed = turn.status.apply(message);
            let nothing_to_do = turn.gave_up || turn.status.is_empty() || (!changed && turn.status_message.is_some());
            let lane = Arc::clone(&turn.lane);
            if message.message_type == MessageType::ToolCall {
                turns.register_call(&root, message);
            }
            if nothing_to_do {
                return Ok(());
            }
            (root, lane)
        };
        let _order = lane.lock().await;
        self.publish(&root).await
    }

    /// A turn's root changed status: `processing` starts the typing indicator; `interrupted`
    /// stops it and deletes the status message (spec §6.3); `error` stops it and shows
    /// `❌ Failed`; `processed` stops it (the answer's delivery folds the status).
    ///
    /// `Err(Transient)` when the status message could not be deleted for now: call again later.
    pub async fn on_turn(&self, root: &Message) -> Result<(), ProgressError> {
        match root.status {
            Status::Processing => self.start(root),
            Status::Interrupted => {
                let channel = parse_channel(&root.channel_id)?;
                self.conclude(&root.id, channel, &root.session_id, Ending::Interrupted).await
            }
            Status::Error => {
                let channel = parse_channel(&root.channel_id)?;
                self.conclude(&root.id, channel, &root.session_id, Ending::Failed).await
            }
            Status::Processed => {
                self.stop_typing(&root.id);
                Ok(())
            }
            Status::PendingAgent | Status::Pending | Status::Responded | Status::Delivered => Ok(()),
        }
    }

    /// A final answer (or error notification) of a turn was delivered: stop typing and fold the
    /// status message into its header line with the turn's figures (or `❌ Failed` after an
    /// error notification). Notifications inside a turn leave the status alone.
    pub async fn on_delivered(&self, message: &Message) -> Result<(), ProgressError> {
        if message.role != Role::Assistant || message.message_type != MessageType::Text || message.is_notification() {
            return Ok(());
        }
        let Some(root) = &message.parent_id else {
            return Ok(());
        };
        let channel = parse_channel(&message.channel_id)?;
        let ending = if message.content.starts_with(ERROR_NOTIFICATION_PREFIX) {
            Ending::Failed
        } else {
            Ending::Finished(message.metadata.turn_metrics.clone())
        };
        self.conclude(root, channel, &message.session_id, ending).await
    }

    /// A turn started (or started again after recovery): keep its entry and start typing.
    fn start(&self, root: &Message) -> Result<(), ProgressError> {
        let channel = parse_channel(&root.channel_id)?;
        let mut turns = self.turns();
        // A root that ended here and runs again (recovered after a crash, spec §4.4) is shown again.
        turns.ended.retain(|id| id != &root.id);
        // A session runs one turn at a time: an earlier turn of it whose end this instance
        // missed has ended, and must not keep the channel typing for the rest of its cap.
        for (other, turn) in turns.running.iter_mut() {
            if other != &root.id
                && turn.status.session_id() == &root.session_id
                && let Some(typing) = turn.typing.take()
            {
                typing.cancel();
            }
        }
        let turn = turns.running.entry(root.id.clone()).or_insert_with(|| Turn::new(channel, root.session_id.clone()));
        if turn.typing.is_none() {
            turn.typing = Some(self.start_typing(channel));
        }
        Ok(())
    }

    fn stop_typing(&self, root: &MessageId) {
        if let Some(typing) = self.with_turn(root, |turn| turn.typing.take()).flatten() {
            typing.cancel();
        }
    }

    fn start_typing(&self, channel: u64) -> CancellationToken {
        let stop = CancellationToken::new();
        tokio::spawn(keep_typing(Arc::clone(&self.api), channel, self.options, stop.clone()));
        stop
    }

    /// Ask the memory once per turn for a status message posted before a restart.
    async fn recall_once(&self, root: &MessageId) {
        let ask = self.with_turn(root, |turn| {
            let ask = turn.status_message.is_none() && !turn.recalled;
            turn.recalled = true;
            ask
        });
        if ask != Some(true) {
            return;
        }
        if let Some((channel, message_id)) = self.memory.recall(root).await {
            self.with_turn(root, |turn| {
                if turn.status_message.is_none() {
                    turn.channel = channel;
                    turn.status_message = Some(message_id);
                }
            });
        }
    }

    /// Bring the turn's status message up to date: edit it, or create it. Called holding the lane.
    async fn publish(&self, root: &MessageId) -> Result<(), ProgressError> {
        self.recall_once(root).await;
        let Some((channel, existing, body)) =
            self.with_turn(root, |turn| (turn.channel, turn.status_message, turn.status.body()))
        else {
            return Ok(());
        };
        if let Some(message_id) = existing {
            match self.api.edit_message(channel, message_id, body).await {
                Ok(()) => return Ok(()),
                Err(error) if is_unknown_message(&error) => {
                    tracing::info!(root = %root, message_id, "the status message was deleted on discord; posting a new one");
                    self.with_turn(root, |turn| turn.status_message = None);
                }
                Err(error) => {
                    tracing::warn!(root = %root, message_id, error = %describe(&error), "editing the status message failed; the next step repaints it");
                    return Ok(());
                }
            }
        }
        self.create(root).await
    }

    async fn create(&self, root: &MessageId) -> Result<(), ProgressError> {
        let Some((channel, mut body, creates)) =
            self.with_turn(root, |turn| (turn.channel, turn.status.body(), turn.creates))
        else {
            return Ok(());
        };
        body["nonce"] = Value::String(status_nonce(root, creates));
        body["enforce_nonce"] = Value::Bool(true);
        match self.api.create_message(channel, body).await {
            Ok(message_id) => {
                self.with_turn(root, |turn| {
                    turn.status_message = Some(message_id);
                    turn.creates += 1;
                });
                self.memory.remember(root, channel, message_id).await;
                Ok(())
            }
            Err(DiscordApiError::Transient { reason, retry_after }) => {
                Err(ProgressError::Transient { reason, retry_after })
            }
            Err(error @ DiscordApiError::Permanent { .. }) => {
                tracing::warn!(root = %root, channel, error = %describe(&error), "discord refused the status message; this turn is shown without one");
                self.with_turn(root, |turn| turn.gave_up = true);
                Ok(())
            }
        }
    }

    /// End a turn: stop typing, then delete (interrupted) or edit for the last time (finished,
    /// failed) its status message, found here or through the memory, and forget the turn.
    async fn conclude(
        &self,
        root: &MessageId,
        channel: u64,
        session_id: &SessionId,
        ending: Ending,
    ) -> Result<(), ProgressError> {
        let lane = {
            let mut turns = self.turns();
            if turns.has_ended(root) {
                return Ok(());
            }
            let turn = turns.running.entry(root.clone()).or_insert_with(|| Turn::new(channel, session_id.clone()));
            if let Some(typing) = turn.typing.take() {
                typing.cancel();
            }
            Arc::clone(&turn.lane)
        };
        let _order = lane.lock().await;
        self.recall_once(root).await;
        let target = self
            .with_turn(root, |turn| {
                match &ending {
                    Ending::Finished(metrics) => turn.status.finish(metrics.clone()),
                    Ending::Interrupted => turn.status.interrupt(),
                    Ending::Failed => turn.status.fail(),
                }
                turn.status_message.map(|message_id| (turn.channel, message_id, turn.status.body()))
            })
            .flatten();
        if let Some((channel, message_id, body)) = target {
            match ending {
                Ending::Interrupted => match self.api.delete_message(channel, message_id).await {
                    Ok(()) => {}
                    // The turn stays known, so the call again finds the message to delete.
                    Err(DiscordApiError::Transient { reason, retry_after }) => {
                        return Err(ProgressError::Transient { reason, retry_after });
                    }
                    Err(error @ DiscordApiError::Permanent { .. }) => {
                        tracing::warn!(root = %root, message_id, error = %describe(&error), "deleting the interrupted turn's status message failed");
                    }
                },
                Ending::Finished(_) | Ending::Failed => self.edit_last(root, channel, message_id, body).await,
            }
        }
        self.turns().end(root);
        Ok(())
    }

    /// The last edit of a turn, retried a few times on transient failures: no later step
    /// would repaint a status left at `⏳ Working…`.
    async fn edit_last(&self, root: &MessageId, channel: u64, message_id: u64, body: Value) {
        for attempt in 1..=FINAL_EDIT_ATTEMPTS {
            match self.api.edit_message(channel, message_id, body.clone()).await {
                Ok(()) => return,
                Err(DiscordApiError::Transient { retry_after, .. }) if attempt < FINAL_EDIT_ATTEMPTS => {
                    tokio::time::sleep(retry_after.unwrap_or(FINAL_EDIT_BACKOFF).min(FINAL_EDIT_MAX_WAIT)).await;
                }
                Err(error) => {
                    tracing::warn!(root = %root, message_id, error = %describe(&error), "the last edit of the status message failed; it keeps its previous text");
                    return;
                }
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        let turns = self.turns.get_mut().unwrap_or_else(PoisonError::into_inner);
        for turn in turns.running.values() {
            if let Some(typing) = &turn.typing {
                typing.cancel();
            }
        }
    }
}

/// Renew the typing indicator of `channel` until `stop` or the cap.
async fn keep_typing(api: Arc<dyn DiscordApi>, channel: u64, options: ProgressOptions, stop: CancellationToken) {
    let started = tokio::time::Instant::now();
    loop {
        // Biased: a turn that ended before this task first ran must not show typing at all.
        let typed = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            typed = api.trigger_typing(channel) => typed,
        };
        match typed {
            Ok(()) => {}
            Err(error @ DiscordApiError::Transient { .. }) => {
                tracing::debug!(channel, error = %describe(&error), "the typing indicator failed; trying again at the next beat");
            }
            Err(error @ DiscordApiError::Permanent { .. }) => {
                tracing::debug!(channel, error = %describe(&error), "discord refused the typing indicator; not shown for this turn");
                return;
            }
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(options.typing_interval) => {}
        }
        if started.elapsed() >= options.typing_cap {
            tracing::debug!(channel, "the typing indicator reached its cap");
            return;
        }
    }
}

/// A message's channel id as a Discord snowflake.
fn parse_channel(channel_id: &str) -> Result<u64, ProgressError> {
    channel_id.parse::<u64>().map_err(|_| ProgressError::InvalidChannel { channel_id: channel_id.to_owned() })
}

fn is_unknown_message(error: &DiscordApiError) -> bool {
    match error {
        DiscordApiError::Permanent { status, code, .. } => *status == 404 || *code == Some(UNKNOWN_MESSAGE),
        DiscordApiError::Transient { .. } => false,
    }
}

fn describe(error: &DiscordApiError) -> String {
    match error {
        DiscordApiError::Transient { reason, .. } => format!("transient: {reason}"),
        DiscordApiError::Permanent { status, code: Some(code), reason } => {
            format!("http {status}, code {code}: {reason}")
        }
        DiscordApiError::Permanent { status, code: None, reason } => format!("http {status}: {reason}"),
    }
}

/// The nonce of a turn's `creates`-th status message: stable for the same turn and count (a
/// retried create is answered with the first message).
fn status_nonce(root: &MessageId, creates: u32) -> String {
    create_nonce("ks", &[root.as_str().as_bytes(), &creates.to_le_bytes()].concat())
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, VecDeque};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;
    use kesoku_core::{MessageId, Status, TurnOrigin};
    use serde_json::{Value, json};

    use super::super::rest::{DiscordApi, DiscordApiError};
    use super::super::status::{DISCORD_MAX_CHARS, spec};
    use super::*;

    /// One REST call the fake saw (failed attempts included).
    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Create { channel: u64, body: Value },
        Edit { channel: u64, message: u64, body: Value },
        Delete { channel: u64, message: u64 },
        Typing { channel: u64 },
    }

    /// What a call did to a status message, in a form a test can write down: the text, and
    /// whether the Stop button is on it.
    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Create(u64, String, bool),
        Edit(u64, String, bool),
        Delete(u64),
    }

    /// A recording Discord: message ids from 9001, scripted failures per kind of call.
    #[derive(Default)]
    struct FakeDiscord {
        /// Every call, in order. A std mutex: never held across an await.
        calls: Mutex<Vec<Call>>,
        next_id: AtomicU64,
        create_failures: Mutex<VecDeque<DiscordApiError>>,
        edit_failures: Mutex<VecDeque<DiscordApiError>>,
        delete_failures: Mutex<VecDeque<DiscordApiError>>,
        typing_failures: Mutex<VecDeque<DiscordApiError>>,
    }

    impl FakeDiscord {
        fn record(&self, call: Call) {
            self.calls.lock().expect("calls").push(call);
        }

        fn next_failure(queue: &Mutex<VecDeque<DiscordApiError>>) -> Option<DiscordApiError> {
            queue.lock().expect("failures").pop_front()
        }

        fn fail_next(queue: &Mutex<VecDeque<DiscordApiError>>, error: DiscordApiError) {
            queue.lock().expect("failures").push_back(error);
        }

        fn calls(&self) -> Vec<Call> {
            self.calls.lock().expect("calls").clone()
        }

        /// Creates, edits and deletes (not typing), in order, with the channel they went to.
        fn seen(&self) -> Vec<(u64, Seen)> {
            let has_stop = |body: &Value| body["components"].as_array().is_some_and(|rows| !rows.is_empty());
            let content = |body: &Value| body["content"].as_str().unwrap_or_default().to_owned();
            self.calls()
                .into_iter()
                .filter_map(|call| match call {
                    Call::Create { channel, body } => {
                        Some((channel, Seen::Create(channel, content(&body), has_stop(&body))))
                    }
                    Call::Edit { channel, message, body } => {
                        Some((channel, Seen::Edit(message, content(&body), has_stop(&body))))
                    }
                    Call::Delete { channel, message } => Some((channel, Seen::Delete(message))),
                    Call::Typing { .. } => None,
                })
                .collect()
        }

        fn seen_in(&self, channel: u64) -> Vec<Seen> {
            self.seen().into_iter().filter(|(c, _)| *c == channel).map(|(_, seen)| seen).collect()
        }

        fn typing_count(&self) -> usize {
            self.calls().iter().filter(|call| matches!(call, Call::Typing { .. })).count()
        }
    }

    #[async_trait]
    impl DiscordApi for FakeDiscord {
        async fn create_message(&self, channel_id: u64, body: Value) -> Result<u64, DiscordApiError> {
            self.record(Call::Create { channel: channel_id, body });
            match Self::next_failure(&self.create_failures) {
                Some(error) => Err(error),
                None => Ok(9001 + self.next_id.fetch_add(1, Ordering::SeqCst)),
            }
        }

        async fn create_message_with_files(
            &self,
            channel_id: u64,
            body: Value,
            _files: Vec<(String, Vec<u8>)>,
        ) -> Result<u64, DiscordApiError> {
            self.create_message(channel_id, body).await
        }

        async fn edit_message(&self, channel_id: u64, message_id: u64, body: Value) -> Result<(), DiscordApiError> {
            self.record(Call::Edit { channel: channel_id, message: message_id, body });
            Self::next_failure(&self.edit_failures).map_or(Ok(()), Err)
        }

        async fn delete_message(&self, channel_id: u64, message_id: u64) -> Result<(), DiscordApiError> {
            self.record(Call::Delete { channel: channel_id, message: message_id });
            Self::next_failure(&self.delete_failures).map_or(Ok(()), Err)
        }

        async fn trigger_typing(&self, channel_id: u64) -> Result<(), DiscordApiError> {
            self.record(Call::Typing { channel: channel_id });
            Self::next_failure(&self.typing_failures).map_or(Ok(()), Err)
        }
    }

    /// The store's delivery records, in memory.
    #[derive(Default)]
    struct FakeMemory {
        records: Mutex<HashMap<MessageId, (u64, u64)>>,
    }

    #[async_trait]
    impl StatusMemory for FakeMemory {
        async fn remember(&self, root: &MessageId, channel: u64, status_message: u64) {
            self.records.lock().expect("records").insert(root.clone(), (channel, status_message));
        }

        async fn recall(&self, root: &MessageId) -> Option<(u64, u64)> {
            self.records.lock().expect("records").get(root).copied()
        }
    }

    fn setup() -> (Arc<FakeDiscord>, Arc<FakeMemory>, Progress) {
        let discord = Arc::new(FakeDiscord::default());
        let memory = Arc::new(FakeMemory::default());
        let progress = Progress::new(discord.clone(), memory.clone(), ProgressOptions::default());
        (discord, memory, progress)
    }

    fn transient() -> DiscordApiError {
        DiscordApiError::Transient { reason: "429 too many requests".into(), retry_after: Some(Duration::from_secs(2)) }
    }

    /// Let the typing task (and anything else spawned) run; on the paused clock this moves
    /// time forward by `seconds` without waiting.
    async fn pass(seconds: u64) {
        tokio::time::sleep(Duration::from_secs(seconds)).await;
    }

    const C: u64 = spec::CHANNEL_ID;

    #[tokio::test(start_paused = true)]
    async fn spec_6_1_creates_once_edits_in_place_and_folds_into_the_metrics() {
        let (discord, memory, progress) = setup();
        let root = spec::root();
        let (thought, call) = (spec::thought(&root), spec::call(&root));
        let result = spec::result(&root, &call);
        progress.on_turn(&spec::with_status(root.clone(), Status::Processing)).await.expect("processing");
        for step in [&thought, &call, &result] {
            progress.show_step(step).await.expect("step shown");
        }
        progress.on_turn(&spec::with_status(root.clone(), Status::Processed)).await.expect("processed");
        progress.on_delivered(&spec::reply(&root)).await.expect("folded");

        assert_eq!(
            discord.seen_in(C),
            vec![
                Seen::Create(C, spec::AFTER_THOUGHT.into(), true),
                Seen::Edit(9001, spec::AFTER_CALL.into(), true),
                Seen::Edit(9001, spec::AFTER_RESULT.into(), true),
                Seen::Edit(9001, spec::FOLDED.into(), false),
            ]
        );
        let Call::Create { body, .. } =
            &discord.calls().into_iter().find(|c| matches!(c, Call::Create { .. })).expect("a create")
        else {
            unreachable!("filtered to creates");
        };
        assert_eq!(body["enforce_nonce"], json!(true));
        assert!(body["nonce"].as_str().is_some_and(|nonce| nonce.len() <= super::super::rest::MAX_NONCE_CHARS));
        assert_eq!(body["allowed_mentions"], json!({ "parse": [] }));
        assert_eq!(body["components"][0]["components"][0]["custom_id"], "kesoku:stop:sess_agent_history");
        assert_eq!(memory.recall(&root.id).await, Some((C, 9001)));
    }

    #[tokio::test(start_paused = true)]
    async fn spec_6_3_interruption_deletes_the_status_message() {
        let (discord, _memory, progress) = setup();
        let root_a = spec::root_in("msg_user_a", "sess_a", spec::CHANNEL);
        progress.on_turn(&spec::with_status(root_a.clone(), Status::Processing)).await.expect("processing");
        pass(9).await;
        assert_eq!(discord.typing_count(), 2, "typing while the turn runs");
        progress
            .show_step(&spec::thought_text(&root_a, "msg_thought_a", "Let me sketch the component."))
            .await
            .expect("shown");
        progress.on_turn(&spec::with_status(root_a.clone(), Status::Interrupted)).await.expect("interrupted");
        assert_eq!(
            discord.seen_in(C),
            vec![Seen::Create(C, "⏳ Working…\n💭 Let me sketch the component.".into(), true), Seen::Delete(9001)]
        );
        let typed = discord.typing_count();
        pass(60).await;
        assert_eq!(discord.typing_count(), typed, "typing stopped with the interruption");

        // A late step of the interrupted turn opens nothing; the new turn gets its own message.
        progress.show_step(&spec::thought_text(&root_a, "msg_thought_late", "Late.")).await.expect("ignored");
        let root_b = spec::root_in("msg_user_b", "sess_a", spec::CHANNEL);
        progress.on_turn(&spec::with_status(root_b.clone(), Status::Processing)).await.expect("processing");
        progress.show_step(&spec::thought_text(&root_b, "msg_thought_b", "A CLI then.")).await.expect("shown");
        assert_eq!(discord.seen_in(C)[2..], [Seen::Create(C, "⏳ Working…\n💭 A CLI then.".into(), true)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_interruption_after_a_restart_deletes_the_remembered_message() {
        let (discord, memory, progress) = setup();
        let root = spec::root();
        memory.remember(&root.id, C, 4242).await;
        progress.on_turn(&spec::with_status(root, Status::Interrupted)).await.expect("interrupted");
        assert_eq!(discord.seen_in(C), vec![Seen::Delete(4242)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_delete_failure_is_returned_and_the_retry_deletes() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        progress.show_step(&spec::thought(&root)).await.expect("shown");
        FakeDiscord::fail_next(&discord.delete_failures, transient());
        let interrupted = spec::with_status(root, Status::Interrupted);
        let error = progress.on_turn(&interrupted).await.expect_err("the delete failed for now");
        assert!(error.is_retryable());
        assert_eq!(error.retry_after(), Some(Duration::from_secs(2)));
        progress.on_turn(&interrupted).await.expect("deleted on the retry");
        assert_eq!(discord.seen_in(C)[1..], [Seen::Delete(9001), Seen::Delete(9001)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_result_shows_a_cross_with_a_snippet() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        let call = spec::call_with(&root, "msg_call_f", "read_file", json!({ "path": "missing.txt" }));
        progress.show_step(&call).await.expect("call");
        progress
            .show_step(&spec::failed_result(&root, &call, "msg_result_f", "no such file: missing.txt"))
            .await
            .expect("result");
        assert_eq!(
            discord.seen_in(C),
            vec![
                Seen::Create(C, "⏳ Working…\n🛠️ read_file: missing.txt ⏳".into(), true),
                Seen::Edit(9001, "⏳ Working…\n🛠️ read_file: missing.txt ❌ no such file: missing.txt".into(), true),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_error_marks_the_status_failed_and_ends_it() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        progress.on_turn(&spec::with_status(root.clone(), Status::Processing)).await.expect("processing");
        progress.show_step(&spec::call(&root)).await.expect("call");
        pass(9).await;
        assert_eq!(discord.typing_count(), 2, "typing while the turn runs");
        progress.on_turn(&spec::with_status(root.clone(), Status::Error)).await.expect("error");
        let notice = TurnOrigin::of(&root, "Kesoku").error_notification(1, "the model is unreachable");
        progress.on_delivered(&notice).await.expect("nothing more to do");
        assert_eq!(
            discord.seen_in(C),
            vec![
                Seen::Create(
                    C,
                    "⏳ Working…\n🛠️ run_shell_command: uv run pytest tests/test_history.py ⏳".into(),
                    true
                ),
                Seen::Edit(
                    9001,
                    "❌ Failed\n🛠️ run_shell_command: uv run pytest tests/test_history.py ⏳".into(),
                    false
                ),
            ]
        );
        let typed = discord.typing_count();
        pass(60).await;
        assert_eq!(discord.typing_count(), typed, "typing stopped with the error");
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_notification_delivered_first_also_shows_failed() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        progress.show_step(&spec::thought(&root)).await.expect("thought");
        let notice = TurnOrigin::of(&root, "Kesoku").error_notification(1, "boom");
        progress.on_delivered(&notice).await.expect("failed");
        progress.on_turn(&spec::with_status(root, Status::Error)).await.expect("already ended");
        assert_eq!(discord.seen_in(C)[1..], [Seen::Edit(9001, format!("❌ Failed\n💭 {}", spec::THOUGHT), false)]);
    }

    #[tokio::test(start_paused = true)]
    async fn typing_repeats_every_eight_seconds_and_stops_after_ten_minutes() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        progress.on_turn(&spec::with_status(root.clone(), Status::Processing)).await.expect("processing");
        pass(1).await;
        assert_eq!(discord.typing_count(), 1, "typing starts at once");
        pass(16).await;
        assert_eq!(discord.typing_count(), 3, "at 0, 8 and 16 s");
        pass(700).await;
        assert_eq!(discord.typing_count(), 75, "every 8 s below 600 s: 0, 8, …, 592");
        pass(3_600).await;
        assert_eq!(discord.typing_count(), 75, "nothing after the cap");
        assert!(discord.calls().iter().all(|call| *call == Call::Typing { channel: C }));
    }

    #[tokio::test(start_paused = true)]
    async fn typing_stops_when_the_answer_is_delivered() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        progress.on_turn(&spec::with_status(root.clone(), Status::Processing)).await.expect("processing");
        pass(20).await;
        assert_eq!(discord.typing_count(), 3);
        progress.on_delivered(&spec::reply(&root)).await.expect("delivered");
        pass(120).await;
        assert_eq!(discord.typing_count(), 3, "no typing after the answer");
        assert_eq!(discord.seen(), vec![], "a turn that showed no step posts no status message");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_turn_of_the_session_stops_the_typing_of_the_previous_one() {
        let (discord, _memory, progress) = setup();
        let first = spec::root_in("msg_user_1", "sess_1", "111");
        let second = spec::root_in("msg_user_2", "sess_1", "222");
        progress.on_turn(&spec::with_status(first, Status::Processing)).await.expect("first");
        pass(9).await;
        progress.on_turn(&spec::with_status(second, Status::Processing)).await.expect("second");
        pass(20).await;
        let in_first = discord.calls().iter().filter(|call| **call == Call::Typing { channel: 111 }).count();
        let in_second = discord.calls().iter().filter(|call| **call == Call::Typing { channel: 222 }).count();
        assert_eq!((in_first, in_second), (2, 3), "the first turn's channel stopped typing at 9 s");
    }

    #[tokio::test(start_paused = true)]
    async fn a_notification_inside_the_turn_leaves_the_status_running() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        progress.on_turn(&spec::with_status(root.clone(), Status::Processing)).await.expect("processing");
        progress.show_step(&spec::thought(&root)).await.expect("thought");
        let notice =
            TurnOrigin::of(&root, "Kesoku").notification("🔄 Conversation history has been automatically compacted");
        progress.on_delivered(&notice).await.expect("nothing to fold");
        let typed = discord.typing_count();
        pass(16).await;
        assert_eq!(discord.typing_count(), typed + 2, "still typing");
        assert_eq!(discord.seen_in(C).len(), 1, "only the create");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_create_failure_is_returned_and_the_retry_posts_once() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        let thought = spec::thought(&root);
        FakeDiscord::fail_next(&discord.create_failures, transient());
        let error = progress.show_step(&thought).await.expect_err("the create failed for now");
        assert!(matches!(error, ProgressError::Transient { .. }));
        progress.show_step(&thought).await.expect("created on the retry");
        progress.show_step(&spec::call(&root)).await.expect("call");
        let nonces: Vec<Value> = discord
            .calls()
            .into_iter()
            .filter_map(|call| match call {
                Call::Create { body, .. } => Some(body["nonce"].clone()),
                Call::Edit { .. } | Call::Delete { .. } | Call::Typing { .. } => None,
            })
            .collect();
        assert_eq!(nonces.len(), 2);
        assert_eq!(nonces[0], nonces[1], "the retry carries the same nonce, so discord posts it once");
        assert_eq!(
            discord.seen_in(C),
            vec![
                Seen::Create(C, spec::AFTER_THOUGHT.into(), true),
                Seen::Create(C, spec::AFTER_THOUGHT.into(), true),
                Seen::Edit(9001, spec::AFTER_CALL.into(), true),
            ],
            "the thought shows once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_edit_is_logged_and_the_next_step_repaints() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        let call = spec::call(&root);
        progress.show_step(&spec::thought(&root)).await.expect("thought");
        FakeDiscord::fail_next(&discord.edit_failures, transient());
        progress.show_step(&call).await.expect("a failed edit still counts as shown");
        progress.show_step(&spec::result(&root, &call)).await.expect("result");
        assert_eq!(
            discord.seen_in(C)[1..],
            [Seen::Edit(9001, spec::AFTER_CALL.into(), true), Seen::Edit(9001, spec::AFTER_RESULT.into(), true)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_edit_is_retried_after_a_transient_failure() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        progress.show_step(&spec::thought(&root)).await.expect("thought");
        FakeDiscord::fail_next(&discord.edit_failures, transient());
        progress.on_delivered(&spec::reply(&root)).await.expect("folded");
        assert_eq!(
            discord.seen_in(C)[1..],
            [Seen::Edit(9001, spec::FOLDED.into(), false), Seen::Edit(9001, spec::FOLDED.into(), false)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_status_message_deleted_by_someone_is_posted_again() {
        let (discord, memory, progress) = setup();
        let root = spec::root();
        progress.show_step(&spec::thought(&root)).await.expect("thought");
        FakeDiscord::fail_next(
            &discord.edit_failures,
            DiscordApiError::Permanent { status: 404, code: Some(10008), reason: "Unknown Message".into() },
        );
        progress.show_step(&spec::call(&root)).await.expect("call");
        assert_eq!(
            discord.seen_in(C)[1..],
            [Seen::Edit(9001, spec::AFTER_CALL.into(), true), Seen::Create(C, spec::AFTER_CALL.into(), true)]
        );
        assert_eq!(memory.recall(&root.id).await, Some((C, 9002)));
        let nonces: Vec<Value> = discord
            .calls()
            .into_iter()
            .filter_map(|call| match call {
                Call::Create { body, .. } => Some(body["nonce"].clone()),
                Call::Edit { .. } | Call::Delete { .. } | Call::Typing { .. } => None,
            })
            .collect();
        assert_ne!(nonces[0], nonces[1], "a new message, not the deleted one");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_create_gives_up_for_the_turn_without_failing_steps() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        FakeDiscord::fail_next(
            &discord.create_failures,
            DiscordApiError::Permanent { status: 403, code: Some(50013), reason: "Missing Permissions".into() },
        );
        progress.show_step(&spec::thought(&root)).await.expect("best-effort");
        progress.show_step(&spec::call(&root)).await.expect("best-effort");
        assert_eq!(discord.seen_in(C), vec![Seen::Create(C, spec::AFTER_THOUGHT.into(), true)], "one attempt only");
    }

    #[tokio::test(start_paused = true)]
    async fn the_status_message_survives_a_restart() {
        let discord = Arc::new(FakeDiscord::default());
        let memory = Arc::new(FakeMemory::default());
        let root = spec::root();
        let call = spec::call(&root);
        {
            let before = Progress::new(discord.clone(), memory.clone(), ProgressOptions::default());
            before.show_step(&spec::thought(&root)).await.expect("thought");
            before.show_step(&call).await.expect("call");
        }
        let after = Progress::new(discord.clone(), memory.clone(), ProgressOptions::default());
        let result = spec::result(&root, &call);
        after.show_step(&result).await.expect("a result of no turn known here");
        assert_eq!(discord.seen_in(C).len(), 2, "not shown: nothing says which turn it belongs to");
        // Recovery claims the root again (spec §4.4): the running turn of the channel takes it.
        after.on_turn(&spec::with_status(root.clone(), Status::Processing)).await.expect("processing");
        after.show_step(&result).await.expect("result after the restart");
        after.on_delivered(&spec::reply(&root)).await.expect("folded");
        assert_eq!(
            discord.seen_in(C)[2..],
            [
                // The result's call was shown before the restart: its line stands alone now.
                Seen::Edit(9001, "⏳ Working…\n🛠️ run_shell_command ✅".into(), true),
                Seen::Edit(9001, spec::FOLDED.into(), false),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn turns_in_two_channels_keep_their_own_status_messages() {
        let (discord, _memory, progress) = setup();
        let one = spec::root_in("msg_user_1", "sess_1", "111");
        let two = spec::root_in("msg_user_2", "sess_2", "222");
        let (call_one, call_two) =
            (spec::call(&one), spec::call_with(&two, "msg_call_2", "web_search", json!({ "query": "Tokyo weather" })));
        let (shown_one, shown_two) = tokio::join!(
            async {
                progress.show_step(&spec::thought_text(&one, "msg_t1", "One.")).await?;
                progress.show_step(&call_one).await
            },
            async {
                progress.show_step(&spec::thought_text(&two, "msg_t2", "Two.")).await?;
                progress.show_step(&call_two).await
            }
        );
        shown_one.expect("channel one");
        shown_two.expect("channel two");
        // Ids follow the order of the creates, whichever channel's came first.
        let (first, second) = if discord.seen()[0].0 == 111 { (9001, 9002) } else { (9002, 9001) };
        assert_eq!(
            discord.seen_in(111),
            vec![
                Seen::Create(111, "⏳ Working…\n💭 One.".into(), true),
                Seen::Edit(
                    first,
                    "⏳ Working…\n💭 One.\n🛠️ run_shell_command: uv run pytest tests/test_history.py ⏳".into(),
                    true
                ),
            ]
        );
        assert_eq!(
            discord.seen_in(222),
            vec![
                Seen::Create(222, "⏳ Working…\n💭 Two.".into(), true),
                Seen::Edit(second, "⏳ Working…\n💭 Two.\n🛠️ web_search: Tokyo weather ⏳".into(), true),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fifty_long_tool_calls_never_exceed_the_limit() {
        let (discord, _memory, progress) = setup();
        let root = spec::root();
        for n in 1..=50 {
            let call = spec::call_with(
                &root,
                &format!("msg_call_{n}"),
                "run_shell_command",
                json!({ "command": "x".repeat(3_000), "cwd": "y".repeat(500) }),
            );
            progress.show_step(&call).await.expect("call");
            let mut result = spec::result(&root, &call);
            result.id = MessageId::from(format!("msg_result_{n}"));
            progress.show_step(&result).await.expect("result");
        }
        let seen = discord.seen_in(C);
        assert_eq!(seen.len(), 100, "one create and 99 edits");
        for seen in seen {
            let (Seen::Create(_, text, _) | Seen::Edit(_, text, _)) = seen else { panic!("no delete expected") };
            assert!(text.chars().count() <= DISCORD_MAX_CHARS && text.encode_utf16().count() <= DISCORD_MAX_CHARS);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_that_is_no_discord_id_is_a_permanent_error() {
        let (_discord, _memory, progress) = setup();
        let root = spec::root_in("msg_user_x", "sess_x", "cli");
        let error = progress.show_step(&spec::thought(&root)).await.expect_err("not a snowflake");
        assert_eq!(error, ProgressError::InvalidChannel { channel_id: "cli".into() });
        assert!(!error.is_retryable());
    }

    #[test]
    fn the_nonce_is_stable_short_and_differs_per_create() {
        let root = MessageId::from("msg_user_001");
        assert_eq!(status_nonce(&root, 0), status_nonce(&root, 0));
        assert_ne!(status_nonce(&root, 0), status_nonce(&root, 1));
        assert_ne!(status_nonce(&root, 0), status_nonce(&MessageId::from("msg_user_002"), 0));
        assert!(status_nonce(&root, 0).len() <= 25);
    }
}
