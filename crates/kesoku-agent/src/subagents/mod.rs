//! Sub-agents: a turn hands a task to a child agent (`delegate`), which works in a session of
//! its own one level deeper; when the child's turn ends, its answer comes back to the parent
//! session as a `sub_agent_result` root, which the parent answers like any other work.
//!
//! [`Subagents`] holds the `delegate` tool's logic: it checks the depth against
//! `[agent] max_depth` (the contract's guardrail: a delegation beyond it is refused, with a
//! ledger row, and nothing runs), creates the child session (chatbot [`AGENT_CHATBOT`], channel =
//! the parent's session id, so a parent's children are its channel's sessions) and posts the
//! child's root: a direct trigger at depth + 1 whose `metadata.activation` names its parent.
//! The [`ResultKeeper`] (run by [`crate::Agent::run`] in every process that runs the agent)
//! posts each child's result into its parent and stops children whose parent was stopped.
//!
//! Invariants:
//! - One child per call: the child's session and root ids are derived from the delegating
//!   turn's root and the tool call's id ([`child_ids`]), so a call run again after a crash finds
//!   the child it made.
//! - One result per child turn: the result's id is derived from the child's root
//!   ([`result_message_id`]), so two keepers (two processes) or a restart post it once.
//! - Every message of a child turn reaches a final status: nobody delivers chatbot `agent`, so
//!   the keeper marks its answers `delivered` when the turn ends.
//! - A stopped parent stops its children, and they their own; a child stopped with its parent
//!   sends no result (the parent was stopped: nothing must wake it).
//!
//! Not here: turning the roots into activations (the intake does, from `metadata.activation`),
//! and running them (the worker, on the responsive lane, with the lane's limits).

mod keeper;
mod tools;

use std::sync::Arc;

use kesoku_core::activation::TriggerContext;
use kesoku_core::{
    ActivationId, ActivationKind, ActivationRequest, Lane, LedgerEntry, Message, MessageId, Outcome, ParentRef,
    Session, SessionId, Usage,
};
use kesoku_gateway::{Gateway, GatewayError};
use kesoku_store::{Ledger, StoreError};
use kesoku_tools::{Registry, RegistryError, ToolContext};

use crate::personas::Personas;

pub use keeper::{ResultKeeper, STOPPED_WITH_PARENT};
pub use tools::{DELEGATE, DelegateTool};

/// The chatbot id of sub-agent sessions: their channel is the parent's session id.
pub const AGENT_CHATBOT: &str = "agent";
/// Longest task accepted, in characters.
pub const MAX_TASK_CHARS: usize = 8_000;

/// Why a delegation was not made. The refusals are written for the model; a store failure is
/// ours.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    #[error("the task is empty: say what the sub-agent should do, with everything it needs to know")]
    EmptyTask,
    #[error("the task is {chars} characters long, over the limit of {MAX_TASK_CHARS}: shorten it")]
    TaskTooLong { chars: usize },
    #[error("delegation needs a turn to report back to (there is none here)")]
    NoTurn,
    #[error(
        "delegation refused: this agent runs at depth {depth} and the limit is {max_depth} ([agent] max_depth), so \
         a sub-agent (depth {}) may not be started; do the task yourself or answer with what you have",
        depth + 1
    )]
    Refused { depth: u32, max_depth: u32 },
    #[error("there is no configured agent named `{name}`; the configured agents are: {known}")]
    UnknownAgent { name: String, known: String },
    #[error("storing the sub-agent failed: {0}")]
    Store(#[from] StoreError),
    #[error("posting the sub-agent's task failed: {0}")]
    Gateway(#[from] GatewayError),
}

impl DelegateError {
    /// The caller's mistake or the contract's refusal (tell the model), as opposed to a
    /// failure of ours (retry later).
    pub fn is_refusal(&self) -> bool {
        match self {
            DelegateError::EmptyTask
            | DelegateError::TaskTooLong { .. }
            | DelegateError::NoTurn
            | DelegateError::Refused { .. }
            | DelegateError::UnknownAgent { .. } => true,
            DelegateError::Store(_) | DelegateError::Gateway(_) => false,
        }
    }
}

/// A child made (or found made, when the call ran before).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delegated {
    pub session_id: SessionId,
    pub root_id: MessageId,
    pub depth: u32,
}

/// The ids of the child a tool call makes: its session and its root message. The same call
/// (the same delegating root and call id) always gets the same ids.
/// Both parts are cut to letters, digits, `-` and `_`: a session id names a staging folder.
pub fn child_ids(parent_root: &MessageId, call_id: &str) -> (SessionId, MessageId) {
    let key = format!("{}.{}", sanitize(parent_root.as_str()), sanitize(call_id));
    (SessionId::from(format!("sess_sub.{key}")), MessageId::from(format!("msg_sub.{key}")))
}

/// The id of the result a child's root `child_root` posts into the parent session.
pub fn result_message_id(child_root: &MessageId) -> MessageId {
    MessageId::from(format!("{child_root}.result"))
}

/// The ledger id of a refused delegation (one per call).
fn refused_activation_id(parent_root: &MessageId, call_id: &str) -> ActivationId {
    ActivationId::from(format!("act_refused.{}.{}", sanitize(parent_root.as_str()), sanitize(call_id)))
}

/// An id as a part of another: letters, digits, `-` and `_` kept, anything else `_`, at most
/// 120 characters.
fn sanitize(part: &str) -> String {
    part.chars().take(120).map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// The sub-agents of one process: the `delegate` tool's logic. Cheap to clone.
#[derive(Clone)]
pub struct Subagents {
    inner: Arc<Inner>,
}

struct Inner {
    gateway: Gateway,
    ledger: Arc<dyn Ledger>,
    /// `[agent] max_depth`: the deepest a sub-agent may run.
    max_depth: u32,
    /// The delegating agent's name: the sender of a child's task.
    agent_name: String,
    /// The configured agents a task may be handed to by name.
    personas: Personas,
}

impl std::fmt::Debug for Subagents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subagents").field("max_depth", &self.inner.max_depth).finish_non_exhaustive()
    }
}

impl Subagents {
    /// Children posted through `gateway`, refusals recorded in `ledger`, at most `max_depth`
    /// deep; tasks are sent as `agent_name`.
    pub fn new(gateway: Gateway, ledger: Arc<dyn Ledger>, max_depth: u32, agent_name: impl Into<String>) -> Self {
        Subagents {
            inner: Arc::new(Inner {
                gateway,
                ledger,
                max_depth,
                agent_name: agent_name.into(),
                personas: Personas::default(),
            }),
        }
    }

    /// These sub-agents, able to hand a task to one of `personas` by name (`delegate`'s
    /// `agent`).
    pub fn with_personas(self, personas: Personas) -> Self {
        let inner = &self.inner;
        Subagents {
            inner: Arc::new(Inner {
                gateway: inner.gateway.clone(),
                ledger: Arc::clone(&inner.ledger),
                max_depth: inner.max_depth,
                agent_name: inner.agent_name.clone(),
                personas,
            }),
        }
    }

    /// The configured agents `delegate` may name.
    pub fn personas(&self) -> &Personas {
        &self.inner.personas
    }

    pub fn max_depth(&self) -> u32 {
        self.inner.max_depth
    }

    /// Add `delegate` to `registry`.
    pub fn register(&self, registry: &mut Registry) -> Result<(), RegistryError> {
        registry.register(DelegateTool::new(self.clone()))
    }

    /// Hand `task` to a sub-agent, from the turn of `ctx` (its origin says where and how deep).
    /// Returns at once: the child runs on its own activation and its result comes back later.
    pub async fn delegate(&self, ctx: &ToolContext, task: &str) -> Result<Delegated, DelegateError> {
        self.delegate_to(ctx, task, None).await
    }

    /// [`Subagents::delegate`], the child answering as the configured agent `agent` (its
    /// root's `metadata.activation.agent`) when one is named.
    pub async fn delegate_to(
        &self,
        ctx: &ToolContext,
        task: &str,
        agent: Option<&str>,
    ) -> Result<Delegated, DelegateError> {
        let Some(origin) = &ctx.origin else { return Err(DelegateError::NoTurn) };
        let agent = match agent.map(str::trim).filter(|a| !a.is_empty()) {
            Some(name) => match self.inner.personas.get(name) {
                Some(persona) => Some(persona.name.clone()),
                None => {
                    let names: Vec<&str> = self.inner.personas.all().iter().map(|p| p.name.as_str()).collect();
                    let known = if names.is_empty() { "none".to_owned() } else { names.join(", ") };
                    return Err(DelegateError::UnknownAgent { name: name.to_owned(), known });
                }
            },
            None => None,
        };
        let task = task.trim();
        if task.is_empty() {
            return Err(DelegateError::EmptyTask);
        }
        let chars = task.chars().count();
        if chars > MAX_TASK_CHARS {
            return Err(DelegateError::TaskTooLong { chars });
        }
        let store = self.inner.gateway.store();
        let now = store.clock().now();
        let depth = origin.depth.saturating_add(1);
        let triggered_by = match &origin.activation_id {
            Some(id) => format!("agent:{id}"),
            None => "agent".to_owned(),
        };
        let delegation_user = ctx.grants.as_ref().map(|grants| grants.user().to_owned());
        if depth > self.inner.max_depth {
            let refusal = DelegateError::Refused { depth: origin.depth, max_depth: self.inner.max_depth };
            self.record_refusal(ctx, &origin.message_id, depth, triggered_by, delegation_user, &refusal).await;
            return Err(refusal);
        }
        let (session_id, root_id) = child_ids(&origin.message_id, &ctx.call_id);
        let session = Session {
            id: session_id.clone(),
            chatbot_id: AGENT_CHATBOT.to_owned(),
            channel_id: ctx.session_id.to_string(),
            title: Some(title(task)),
            created_at: now,
            updated_at: now,
        };
        match store.create_session(&session).await {
            Ok(()) | Err(StoreError::Duplicate { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        let mut root = Message::direct_trigger(&session_id, AGENT_CHATBOT, ctx.session_id.as_str(), task);
        root.id = root_id.clone();
        root.sender = ctx.agent.clone().unwrap_or_else(|| self.inner.agent_name.clone());
        root.metadata.activation = Some(Box::new(ActivationRequest {
            task: Some(task.to_owned()),
            trigger: Some(TriggerContext {
                name: "delegate".to_owned(),
                source: "agent".to_owned(),
                schedule: None,
                fired_at: now,
            }),
            triggered_by: Some(triggered_by),
            depth,
            parent: Some(ParentRef {
                session_id: ctx.session_id.clone(),
                message_id: origin.message_id.clone(),
                activation_id: origin.activation_id.clone(),
                agent: ctx.agent.clone(),
            }),
            delegation_user,
            agent,
            ..ActivationRequest::new(ActivationKind::DirectTrigger)
        }));
        match self.inner.gateway.post(&root).await {
            Ok(_) => {
                tracing::info!(parent_session = %ctx.session_id, child_session = %session_id, depth, "sub-agent started");
            }
            // Made before: this call ran already (a retry after a crash).
            Err(GatewayError::Store(StoreError::Duplicate { .. })) => {}
            // Stored, only the broadcast failed: the intake catches up from the store.
            Err(GatewayError::Broker(error)) => {
                tracing::warn!(%error, child_session = %session_id, "the sub-agent's task is stored but was not announced");
            }
            Err(error) => return Err(error.into()),
        }
        Ok(Delegated { session_id, root_id, depth })
    }

    /// The ledger row of a refused child: never run, outcome `refused`, the refusal as its
    /// error. A failure to write it is logged; the refusal stands either way.
    async fn record_refusal(
        &self,
        ctx: &ToolContext,
        parent_root: &MessageId,
        depth: u32,
        triggered_by: String,
        delegation_user: Option<String>,
        refusal: &DelegateError,
    ) {
        let now = self.inner.gateway.store().clock().now();
        let entry = LedgerEntry {
            id: refused_activation_id(parent_root, &ctx.call_id),
            kind: ActivationKind::DirectTrigger,
            lane: Lane::Responsive,
            session_id: ctx.session_id.clone(),
            message_id: None,
            triggered_by,
            delegation_user,
            depth,
            agent: None,
            enqueued_at: now,
            started_at: None,
            finished_at: None,
            outcome: None,
            error: None,
            usage: Usage::default(),
        };
        let ledger = &self.inner.ledger;
        let text = refusal.to_string();
        let recorded = async {
            ledger.record_enqueued(&entry).await?;
            ledger.record_started(&entry.id, now).await?;
            ledger.record_finished(&entry.id, now, Outcome::Refused, Some(&text), &Usage::default()).await
        };
        if let Err(error) = recorded.await {
            tracing::error!(%error, session_id = %ctx.session_id, "recording a refused delegation failed");
        }
        tracing::warn!(session_id = %ctx.session_id, depth, max_depth = self.inner.max_depth, "delegation refused: too deep");
    }
}

/// A child session's title: `Sub-agent: ` and the task's first line, shortened.
fn title(task: &str) -> String {
    let first = task.lines().next().unwrap_or_default().trim();
    let short: String = first.chars().take(60).collect();
    if short.chars().count() < first.chars().count() {
        format!("Sub-agent: {short}…")
    } else {
        format!("Sub-agent: {short}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_always_gets_the_same_child_ids_and_they_are_safe_as_folder_names() {
        let root = MessageId::from("msg_01abc");
        assert_eq!(child_ids(&root, "call_1"), child_ids(&root, "call_1"));
        assert_eq!(child_ids(&root, "call_1").0, SessionId::from("sess_sub.msg_01abc.call_1"));
        assert_ne!(child_ids(&root, "call_1"), child_ids(&root, "call_2"));
        let (session, message) = child_ids(&MessageId::from("../../etc"), "a/b c");
        assert_eq!(session, SessionId::from("sess_sub.______etc.a_b_c"));
        assert!(!session.as_str().contains('/') && !message.as_str().contains('/'));
        assert_eq!(result_message_id(&message), MessageId::from("msg_sub.______etc.a_b_c.result"));
    }

    #[test]
    fn the_refusal_names_the_depth_and_the_limit() {
        let refusal = DelegateError::Refused { depth: 3, max_depth: 3 };
        assert!(refusal.is_refusal());
        assert!(
            refusal.to_string().starts_with(
                "delegation refused: this agent runs at depth 3 and the limit is 3 ([agent] max_depth), so a \
                 sub-agent (depth 4) may not be started"
            ),
            "{refusal}"
        );
    }
}
