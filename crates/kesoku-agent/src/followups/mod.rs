//! Follow-ups: work the agent schedules for itself (`schedule_followup`), come due as a
//! follow-up activation in the session that scheduled it.
//!
//! A follow-up is a row in the store ([`FollowUp`]), so it survives restarts. [`Followups`]
//! holds the three tools the model calls ([`tools`]) and the scheduler ([`Followups::run`]),
//! which wakes at the earliest pending due time, or when a tool stores a new one, and fires
//! every follow-up that has come due: it posts the follow-up's reminder (a `system` message,
//! `pending_agent`, invisible to users, asking in `metadata.activation` for a `follow_up`
//! activation), then marks the row `fired`.
//!
//! Invariants:
//! - A follow-up fires once, also with two schedulers (two processes) or a crash between posting
//!   and marking: the reminder's id is derived from the follow-up's
//!   ([`FollowUp::root_message_id`]), so the store keeps one reminder, and the move from
//!   `pending` is a compare-and-set only one caller wins.
//! - A reminder that exists means the follow-up fired, whatever its row says: cancelling it then
//!   is refused (and the row marked fired), and a scheduler finding it marks the row fired.
//! - A follow-up due while no scheduler ran fires once when one starts.
//! - Time is the store's clock ([`kesoku_store::Store::clock`]), never `Utc::now()`: tests move
//!   it with tokio's paused time.
//!
//! Not here: turning the reminder into an activation (the intake does, from its
//! `metadata.activation`), and anything a reminder's turn does.

mod tools;
mod when;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
/// The IANA time zones follow-up times are read and shown in.
pub use chrono_tz::Tz;
use kesoku_core::{
    ActivationKind, ActivationRequest, FollowUp, FollowUpFilter, FollowUpId, FollowUpState, Message, SessionId,
};
use kesoku_gateway::{Gateway, GatewayError};
use kesoku_store::{Store, StoreError};
use kesoku_tools::{Registry, RegistryError, ToolOrigin};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use tools::{
    CANCEL_FOLLOWUP, CancelFollowupTool, LIST_FOLLOWUPS, ListFollowupsTool, SCHEDULE_FOLLOWUP, ScheduleFollowupTool,
};
pub use when::{MAX_AHEAD, WhenError, format_local, parse_when, parse_zone, relative};

/// Longest task accepted, in characters: a reminder is a note to self, not a document.
pub const MAX_TASK_CHARS: usize = 4_000;
/// Most pending follow-ups one session may hold, so a looping model cannot fill the store.
pub const MAX_PENDING_PER_SESSION: usize = 100;
/// The scheduler looks at the store at least this often, to see follow-ups another process
/// stored (this process's tools wake it at once).
const POLL: Duration = Duration::from_secs(60);
/// After a store error, or a reminder that could not be posted, the scheduler tries again this
/// much later.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Why a follow-up could not be scheduled or cancelled. The refusals are written for the
/// model, which corrects its call; a store failure is ours.
#[derive(Debug, thiserror::Error)]
pub enum FollowUpError {
    #[error(transparent)]
    When(#[from] WhenError),
    #[error("the task is empty: say what to do when the follow-up comes due")]
    EmptyTask,
    #[error("the task is {chars} characters long, over the limit of {MAX_TASK_CHARS}: keep it to a short note")]
    TaskTooLong { chars: usize },
    #[error(
        "this session already has {MAX_PENDING_PER_SESSION} pending follow-ups: cancel some (list_followups \
         shows them) before scheduling more"
    )]
    TooMany,
    #[error("follow-ups can only be scheduled from a turn (there is no conversation to come back to here)")]
    NoTurn,
    #[error("there is no follow-up `{id}` in this session: list_followups shows this session's pending ones")]
    NotFound { id: FollowUpId },
    #[error("follow-up `{id}` already fired (at {at}); there is nothing left to cancel")]
    AlreadyFired { id: FollowUpId, at: String },
    #[error("follow-up `{id}` was already cancelled")]
    AlreadyCancelled { id: FollowUpId },
    #[error("the follow-up store failed: {0}")]
    Store(#[from] StoreError),
}

impl FollowUpError {
    /// The caller's mistake (tell them), as opposed to a failure of ours (retry later).
    pub fn is_refusal(&self) -> bool {
        match self {
            FollowUpError::When(_)
            | FollowUpError::EmptyTask
            | FollowUpError::TaskTooLong { .. }
            | FollowUpError::TooMany
            | FollowUpError::NoTurn
            | FollowUpError::NotFound { .. }
            | FollowUpError::AlreadyFired { .. }
            | FollowUpError::AlreadyCancelled { .. } => true,
            FollowUpError::Store(_) => false,
        }
    }
}

/// The follow-ups of one process: its tools and its scheduler share one wake-up. Cheap to
/// clone; build one per service.
#[derive(Clone)]
pub struct Followups {
    inner: Arc<Inner>,
}

struct Inner {
    gateway: Gateway,
    /// Wakes the scheduler when this process stores a follow-up (a permit is kept when it is
    /// busy, so a wake-up is never lost).
    wake: Notify,
    /// The zone of the times in a reminder's text and of a turn without one of its own
    /// (`[agent] timezone`; UTC by default).
    timezone: Tz,
}

impl std::fmt::Debug for Followups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Followups").field("timezone", &self.inner.timezone).finish_non_exhaustive()
    }
}

impl Followups {
    /// Follow-ups stored through `gateway`'s store, reminders posted through `gateway`, times
    /// shown in `timezone`.
    pub fn new(gateway: Gateway, timezone: Tz) -> Self {
        Followups { inner: Arc::new(Inner { gateway, wake: Notify::new(), timezone }) }
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.inner.gateway.store()
    }

    /// The default time zone (reminders, turns without one).
    pub fn timezone(&self) -> Tz {
        self.inner.timezone
    }

    /// The zone times are shown in for a turn: its own when it names a real one, else the
    /// default.
    pub fn zone_for(&self, origin: Option<&ToolOrigin>) -> Tz {
        origin.and_then(|origin| origin.timezone.as_deref()).and_then(parse_zone).unwrap_or(self.inner.timezone)
    }

    /// Add `schedule_followup`, `cancel_followup` and `list_followups` to `registry`.
    pub fn register(&self, registry: &mut Registry) -> Result<(), RegistryError> {
        registry.register(ScheduleFollowupTool::new(self.clone()))?;
        registry.register(CancelFollowupTool::new(self.clone()))?;
        registry.register(ListFollowupsTool::new(self.clone()))
    }

    /// Store a follow-up for `session_id`, due at `when` (see [`parse_when`]), coming back to the
    /// turn `origin` came from, and wake the scheduler.
    pub async fn schedule(
        &self,
        session_id: &SessionId,
        origin: &ToolOrigin,
        when: &str,
        task: &str,
    ) -> Result<FollowUp, FollowUpError> {
        let task = task.trim();
        if task.is_empty() {
            return Err(FollowUpError::EmptyTask);
        }
        let chars = task.chars().count();
        if chars > MAX_TASK_CHARS {
            return Err(FollowUpError::TaskTooLong { chars });
        }
        let now = self.store().clock().now();
        let due_at = parse_when(when, now, self.zone_for(Some(origin)))?;
        let pending = self.pending(Some(session_id)).await?;
        if pending.len() >= MAX_PENDING_PER_SESSION {
            return Err(FollowUpError::TooMany);
        }
        let followup = FollowUp {
            id: FollowUpId::generate(),
            session_id: session_id.clone(),
            chatbot_id: origin.chatbot_id.clone(),
            channel_id: origin.channel_id.clone(),
            task: task.to_owned(),
            due_at,
            created_at: now,
            created_by: Some(origin.message_id.clone()),
            state: FollowUpState::Pending,
            settled_at: None,
        };
        self.store().insert_followup(&followup).await?;
        self.inner.wake.notify_one();
        tracing::info!(followup_id = %followup.id, session_id = %session_id, %due_at, "follow-up scheduled");
        Ok(followup)
    }

    /// Pending follow-ups, soonest first: of `session_id`, or of every session.
    pub async fn pending(&self, session_id: Option<&SessionId>) -> Result<Vec<FollowUp>, FollowUpError> {
        let filter = FollowUpFilter {
            session_id: session_id.cloned(),
            state: Some(FollowUpState::Pending),
            ..Default::default()
        };
        Ok(self.store().list_followups(&filter).await?)
    }

    /// Cancel a pending follow-up (only one of `session_id` when given). See [`cancel`].
    pub async fn cancel(&self, id: &FollowUpId, session_id: Option<&SessionId>) -> Result<FollowUp, FollowUpError> {
        cancel(self.store().as_ref(), id, session_id, self.inner.timezone).await
    }

    /// The reminder `followup` posts when it comes due.
    pub fn reminder(&self, followup: &FollowUp) -> Message {
        let zone = self.inner.timezone;
        let content = format!(
            "[Follow-up] You asked at {} to be reminded at {}: {}",
            format_local(followup.created_at, zone),
            format_local(followup.due_at, zone),
            followup.task
        );
        let mut message =
            Message::followup_reminder(&followup.session_id, &followup.chatbot_id, &followup.channel_id, content);
        message.id = followup.root_message_id();
        message.metadata.activation = Some(Box::new(ActivationRequest {
            followup_id: Some(followup.id.clone()),
            task: Some(followup.task.clone()),
            ..ActivationRequest::new(ActivationKind::FollowUp)
        }));
        message
    }

    /// Fire every pending follow-up due by now. Answers when to look again: the soonest pending
    /// due time still ahead (`None` when there is none), or sooner when a reminder could not be
    /// posted and must be tried again.
    pub async fn fire_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let clock = self.store().clock();
        let now = clock.now();
        let pending = self
            .store()
            .list_followups(&FollowUpFilter { state: Some(FollowUpState::Pending), ..Default::default() })
            .await?;
        let mut next = None;
        for followup in pending {
            if followup.due_at > now {
                // Soonest first: the first one ahead is the next wake-up.
                next = Some(next.map_or(followup.due_at, |n: DateTime<Utc>| n.min(followup.due_at)));
                break;
            }
            if let Err(error) = self.fire(&followup).await {
                tracing::error!(%error, followup_id = %followup.id, "posting a follow-up's reminder failed; trying again later");
                let retry = now + chrono::Duration::from_std(RETRY_AFTER).unwrap_or(chrono::Duration::MAX);
                next = Some(next.map_or(retry, |n: DateTime<Utc>| n.min(retry)));
            }
        }
        Ok(next)
    }

    /// Post `followup`'s reminder (once, whoever else tries), then mark it fired.
    async fn fire(&self, followup: &FollowUp) -> Result<(), GatewayError> {
        // Cancelled (or fired by another process) since it was listed: leave it.
        match self.store().get_followup(&followup.id).await? {
            Some(current) if current.state == FollowUpState::Pending => {}
            Some(_) | None => return Ok(()),
        }
        let mut reminder = self.reminder(followup);
        if let Some(root) = &followup.created_by {
            crate::grants::inherit_delegation_user(self.store().as_ref(), root, &mut reminder).await?;
        }
        match self.inner.gateway.post(&reminder).await {
            Ok(_) => {}
            // Posted before: by another scheduler, or by this one before a crash kept it from
            // marking the row.
            Err(GatewayError::Store(StoreError::Duplicate { .. })) => {}
            // Stored, only the broadcast failed: listeners catch up from the store.
            Err(GatewayError::Broker(error)) => {
                tracing::warn!(%error, followup_id = %followup.id, "the reminder is stored but was not announced");
            }
            Err(error) => return Err(error),
        }
        let fired =
            self.store().settle_followup(&followup.id, FollowUpState::Fired, self.store().clock().now()).await?;
        if fired {
            tracing::info!(followup_id = %followup.id, session_id = %followup.session_id, "follow-up fired");
        }
        Ok(())
    }

    /// Fire follow-ups as they come due until `shutdown`: those overdue at once (a follow-up
    /// due while nothing ran fires when this starts), then each at its due time.
    pub async fn run(self, shutdown: CancellationToken) {
        let clock = self.store().clock();
        let poll = chrono::Duration::from_std(POLL).unwrap_or(chrono::Duration::MAX);
        loop {
            let now = clock.now();
            let next = match self.fire_due().await {
                Ok(next) => next,
                Err(error) => {
                    tracing::error!(%error, "reading the due follow-ups failed; trying again later");
                    Some(now + chrono::Duration::from_std(RETRY_AFTER).unwrap_or(chrono::Duration::MAX))
                }
            };
            let wake_at = next.map_or(now + poll, |next| next.min(now + poll));
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.inner.wake.notified() => {}
                () = clock.sleep_until(wake_at) => {}
            }
        }
    }
}

/// Cancel the pending follow-up `id` — only one of `session_id` when given (a follow-up of
/// another session is reported as not found, so a session cannot probe another's ids). One
/// whose reminder was posted has fired, whatever its row says: that is refused, and the row
/// marked fired. `timezone`: for the time in the error.
pub async fn cancel(
    store: &dyn Store,
    id: &FollowUpId,
    session_id: Option<&SessionId>,
    timezone: Tz,
) -> Result<FollowUp, FollowUpError> {
    let not_found = || FollowUpError::NotFound { id: id.clone() };
    let Some(followup) = store.get_followup(id).await? else { return Err(not_found()) };
    if session_id.is_some_and(|session_id| *session_id != followup.session_id) {
        return Err(not_found());
    }
    let now = store.clock().now();
    let fired = |at: Option<DateTime<Utc>>| FollowUpError::AlreadyFired {
        id: id.clone(),
        at: format_local(at.unwrap_or(followup.due_at), timezone),
    };
    match followup.state {
        FollowUpState::Pending => {}
        FollowUpState::Fired => return Err(fired(followup.settled_at)),
        FollowUpState::Cancelled => return Err(FollowUpError::AlreadyCancelled { id: id.clone() }),
    }
    if let Some(reminder) = store.get_message(&followup.root_message_id()).await? {
        store.settle_followup(id, FollowUpState::Fired, now).await?;
        return Err(fired(reminder.created_at));
    }
    if store.settle_followup(id, FollowUpState::Cancelled, now).await? {
        return Ok(FollowUp { state: FollowUpState::Cancelled, settled_at: Some(now), ..followup });
    }
    // Settled by someone else in between: say how.
    match store.get_followup(id).await? {
        Some(current) if current.state == FollowUpState::Cancelled => {
            Err(FollowUpError::AlreadyCancelled { id: id.clone() })
        }
        Some(current) => Err(fired(current.settled_at)),
        None => Err(not_found()),
    }
}
