//! What an agent may read, and what of a shared session and channel it is shown.
//!
//! - **Access at load time**: the agent of an activation must sit in the root's channel (or in
//!   the channel its thread hangs off) by `[[agents]] channels` ([`Personas::may_read`]). The
//!   config is read when the worker loads the root, so a membership removed while work waited
//!   is enforced. A denied root never reaches a model: it is closed `error` with a notice that
//!   names who cannot read where (never the message's text), and the ledger row ends `failed`.
//! - **Per-agent view**: in a session where configured agents answered, a persona sees people's
//!   messages, the roots it answered, and its own steps in full; other agents' thoughts, tool
//!   calls and results not at all. Other agents' answers reach it through the channel context.
//! - **Context entries** (virtual user-side messages before the root, never stored): the thread
//!   context of a message inside a thread, and the channel context of a channel where two or
//!   more agents sit. Each message is access-checked as it is loaded; one the agent may not read
//!   is left out and only counted (in the ledger row's note).

use std::collections::{HashMap, HashSet};

use kesoku_core::{Activation, Message, MessageFilter, MessageId, MessageType, Outcome, Role, Status, Usage};

use super::Agent;
use crate::entries::{self, Zone};
use crate::error::AgentError;
use crate::personas::Personas;

/// Longest text of one context line, in characters; longer ones are clipped with a marker.
pub(crate) const CONTEXT_CLIP_CHARS: usize = 1_000;

/// Most messages of the turn's own view a context window reads past (a long session is not
/// read twice to fill a window of 20).
const MAX_READ_PAST: usize = 1_000;

/// The agent an activation runs as: the one it names, else the one its orchestration round
/// dispatches now; `None`: the default agent.
pub(crate) fn acting_agent(activation: &Activation) -> Option<&str> {
    activation.agent.as_deref().or_else(|| {
        let round = activation.orchestration.as_ref()?;
        round.agents.get(round.index).map(String::as_str)
    })
}

/// Why the agent of an activation may not read `message`: `(detail for the ledger, short notice
/// for the people in the channel)`. `None`: it may. Neither text carries the message's content.
/// A `/compact` root is a command on the session, not work for an agent: it is not checked.
pub(crate) fn load_denied(personas: &Personas, agent: Option<&str>, message: &Message) -> Option<(String, String)> {
    if message.metadata.is_compaction == Some(true) {
        return None;
    }
    let parent = message.metadata.thread.as_ref().map(|t| t.parent_channel_id.as_str());
    if personas.may_read(agent, &message.chatbot_id, &message.channel_id, parent) {
        return None;
    }
    let place = match parent {
        Some(parent) => format!(
            "{chatbot}:{channel} (a thread of {chatbot}:{parent})",
            chatbot = message.chatbot_id,
            channel = message.channel_id
        ),
        None => format!("{}:{}", message.chatbot_id, message.channel_id),
    };
    Some(match agent {
        Some(name) if personas.get(name).is_none() => (
            format!("access denied: agent `{name}` is not configured ([[agents]]), so it reads no channel"),
            format!("Agent `{name}` is not configured, so it cannot answer here. Add it under [[agents]]."),
        ),
        Some(name) => (
            format!("access denied: agent `{name}` does not sit in {place} ([[agents]] channels)"),
            format!(
                "Agent `{name}` cannot read {place}: it does not sit there. \
                 Add the channel to its `channels` in [[agents]] to let it answer here."
            ),
        ),
        None => (
            format!(
                "access denied: the default agent does not read {place}: configured agents sit there \
                 ([[agents]] channels), so work there must name one of them"
            ),
            format!(
                "The default agent does not answer in {place}, where configured agents sit. \
                 Mention one of them, or change their `channels` in [[agents]]."
            ),
        ),
    })
}

/// The agent of a stored step: its stamp, else the stamp of the step it answers (a tool result
/// answers its call).
fn step_agent<'a>(message: &'a Message, by_id: &HashMap<&MessageId, &'a Message>) -> Option<&'a str> {
    message.metadata.agent.as_deref().or_else(|| {
        let parent = by_id.get(message.parent_id.as_ref()?)?;
        if parent.role == Role::User { None } else { parent.metadata.agent.as_deref() }
    })
}

/// Whether a message is a step of a turn (a thought, a call, a result, an answer, a notice):
/// written in answer to something, not by a person.
fn is_step(message: &Message) -> bool {
    message.parent_id.is_some() && message.role != Role::User
}

/// The root a step belongs to: up its parents to the first message that is not a step.
fn turn_root<'a>(message: &'a Message, by_id: &HashMap<&MessageId, &'a Message>) -> Option<&'a MessageId> {
    let mut current = message;
    // A turn is shallow (root → call → result); the bound guards against a cycle in bad data.
    for _ in 0..8 {
        let parent = by_id.get(current.parent_id.as_ref()?)?;
        if !is_step(parent) {
            return Some(&parent.id);
        }
        current = parent;
    }
    None
}

fn same_agent(a: Option<&str>, b: &str) -> bool {
    a.is_some_and(|a| a.eq_ignore_ascii_case(b))
}

/// What the agent `agent` sees of a session's history (see the module docs). The default agent,
/// and any session where no configured agent wrote, see the history unchanged (one pass over
/// the stamps, no copy).
pub(crate) fn agent_view(history: Vec<Message>, agent: Option<&str>, root_id: &MessageId) -> Vec<Message> {
    let Some(me) = agent else { return history };
    if !history.iter().any(|m| m.metadata.agent.is_some()) {
        return history;
    }
    let keep: Vec<bool> = {
        let by_id: HashMap<&MessageId, &Message> = history.iter().map(|m| (&m.id, m)).collect();
        // For each root that has steps: whether any of them is this agent's.
        let mut answered: HashMap<&MessageId, bool> = HashMap::new();
        for message in history.iter().filter(|m| is_step(m)) {
            if let Some(root) = turn_root(message, &by_id) {
                let mine = same_agent(step_agent(message, &by_id), me);
                *answered.entry(root).or_default() |= mine;
            }
        }
        history
            .iter()
            .map(|message| {
                if message.id == *root_id {
                    return true;
                }
                if is_step(message) {
                    return same_agent(step_agent(message, &by_id), me);
                }
                if let Some(author) = message.metadata.agent.as_deref() {
                    return author.eq_ignore_ascii_case(me);
                }
                let dispatched = message.metadata.activation.as_ref().and_then(|r| r.agent.as_deref());
                if same_agent(dispatched, me) {
                    return true;
                }
                // A root only other agents answered reaches this one as channel context.
                answered.get(&message.id).copied().unwrap_or(true)
            })
            .collect()
    };
    history.into_iter().zip(keep).filter_map(|(message, keep)| keep.then_some(message)).collect()
}

/// `text` cut to [`CONTEXT_CLIP_CHARS`] characters, with a marker saying how much was left out.
pub(crate) fn clip(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(CONTEXT_CLIP_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => {
            let left = text[cut..].chars().count();
            format!("{} […clipped: {left} more characters]", &text[..cut])
        }
    }
}

/// One context line: `[2026-03-29 09:00] Ryan (agent): text`.
fn context_line(message: &Message, zone: &Zone) -> String {
    let time = message
        .created_at
        .map(|at| at.with_timezone(&zone.tz()).format("%Y-%m-%d %H:%M").to_string())
        .unwrap_or_else(|| "unknown time".to_owned());
    let who =
        if message.metadata.agent.is_some() { format!("{} (agent)", message.sender) } else { message.sender.clone() };
    format!("[{time}] {who}: {}", clip(&message.content))
}

/// Whether `message` was written no later than the root (context is what came before it).
fn not_after(message: &Message, root: &Message) -> bool {
    match (message.created_at, root.created_at) {
        (Some(at), Some(root_at)) => at <= root_at,
        _ => true,
    }
}

/// The context entries of one turn, and how many messages were withheld from them.
#[derive(Debug, Default)]
pub(crate) struct ContextEntries {
    pub entries: Vec<Message>,
    pub withheld: usize,
}

impl ContextEntries {
    /// The ledger note of withheld messages (a count, never their content).
    pub fn note(&self) -> Option<String> {
        (self.withheld > 0).then(|| {
            let plural = if self.withheld == 1 { "message" } else { "messages" };
            format!("context: {} {plural} left out (the agent may not read them; [[agents]] channels)", self.withheld)
        })
    }
}

/// People's text and answers: what a context entry shows (never thoughts, calls or results).
fn context_filter(chatbot_id: &str, channel_id: &str) -> MessageFilter {
    MessageFilter::default()
        .with_chatbot(chatbot_id)
        .with_channel(channel_id)
        .with_roles(&[Role::User, Role::Assistant])
        .with_types(&[MessageType::Text])
}

impl Agent {
    /// Close a root its activation's agent may not read: claimed only to be closed `error` with
    /// the notice, never run.
    pub(super) async fn deny_load(
        &self,
        activation: &Activation,
        message: &Message,
        detail: String,
        short: &str,
    ) -> Result<(Outcome, Option<String>, Usage), AgentError> {
        tracing::warn!(activation_id = %activation.id, message_id = %message.id, "{detail}");
        let gateway = &self.inner.deps.gateway;
        if let Some(claimed) =
            gateway.claim(&message.id, Status::Processing, &[Status::PendingAgent], &self.inner.worker_id).await?
        {
            self.fail_root(&claimed.message, activation, &detail, short).await;
        }
        Ok((Outcome::Failed, Some(detail), Usage::default()))
    }

    /// The thread-context and channel-context entries of a turn on `root`, whose agent sees
    /// `view` already. Nothing is read when the root is not in a thread and its channel is not
    /// shared by two or more configured agents.
    pub(super) async fn context_entries(
        &self,
        activation: &Activation,
        root: &Message,
        view: &[Message],
        zone: &Zone,
    ) -> Result<ContextEntries, AgentError> {
        let deps = &self.inner.deps;
        let config = &deps.config;
        let thread = root.metadata.thread.as_deref();
        let parent = thread.map(|t| t.parent_channel_id.as_str());
        // Inside a thread the thread context is the channel's: the two are not both shown.
        let shared = thread.is_none()
            && config.channel_context_messages > 0
            && !deps.personas.is_empty()
            && deps.personas.members_of(&root.chatbot_id, &root.channel_id, parent).len() >= 2;
        let mut out = ContextEntries::default();
        if thread.is_none() && !shared {
            return Ok(out);
        }
        let agent = acting_agent(activation);
        let mut seen: HashSet<MessageId> = view.iter().map(|m| m.id.clone()).collect();
        seen.insert(root.id.clone());
        // Each message by its own channel: a reply in the thread by the thread and the channel it
        // hangs off, the message a thread was started from by its own channel.
        let readable = |m: &Message| {
            let own_parent = m.metadata.thread.as_ref().map(|t| t.parent_channel_id.as_str());
            let parent = own_parent.or(parent.filter(|_| m.channel_id == root.channel_id));
            m.chatbot_id == root.chatbot_id && deps.personas.may_read(agent, &m.chatbot_id, &m.channel_id, parent)
        };

        if let Some(thread) = thread {
            let mut lines = vec![
                "[Thread context]".to_owned(),
                format!("This message is in a thread of channel {}.", thread.parent_channel_id),
            ];
            let mut shown = false;
            if let Some(id) = thread.root_message_id.as_ref().filter(|id| !seen.contains(*id)) {
                if let Some(started) = deps.gateway.store().get_message(id).await? {
                    if readable(&started) {
                        lines.push(format!("Started by: {}", context_line(&started, zone)));
                        shown = true;
                    } else {
                        out.withheld += 1;
                    }
                }
                seen.insert(id.clone());
            }
            if config.thread_context_messages > 0 {
                let unseen = self.unseen_recent(root, view, &seen, config.thread_context_messages).await?;
                let mut replies = Vec::new();
                for message in &unseen {
                    if readable(message) {
                        replies.push(context_line(message, zone));
                    } else {
                        out.withheld += 1;
                    }
                    seen.insert(message.id.clone());
                }
                if !replies.is_empty() {
                    lines.push("Replies (oldest first):".to_owned());
                    lines.extend(replies);
                    shown = true;
                }
            }
            if shown {
                out.entries.push(entries::virtual_message(&root.session_id, Role::User, "System", lines.join("\n")));
            }
        }

        if shared {
            let unseen = self.unseen_recent(root, view, &seen, config.channel_context_messages).await?;
            let mut lines = Vec::new();
            for message in &unseen {
                if readable(message) {
                    lines.push(context_line(message, zone));
                } else {
                    out.withheld += 1;
                }
            }
            if !lines.is_empty() {
                let text = format!(
                    "[Channel context]\nRecent messages of this channel you have not seen (oldest first):\n{}",
                    lines.join("\n")
                );
                out.entries.push(entries::virtual_message(&root.session_id, Role::User, "System", text));
            }
        }
        Ok(out)
    }

    /// The newest `limit` text messages of the root's channel (any session) written up to the
    /// root that are not in `seen`, oldest first. Messages the turn already shows are read past:
    /// the window counts only what the entry could show.
    async fn unseen_recent(
        &self,
        root: &Message,
        view: &[Message],
        seen: &HashSet<MessageId>,
        limit: u32,
    ) -> Result<Vec<Message>, AgentError> {
        let filter = context_filter(&root.chatbot_id, &root.channel_id);
        let shown = view.iter().filter(|m| filter.matches(m)).count().min(MAX_READ_PAST);
        let read = limit.saturating_add(u32::try_from(shown).unwrap_or(u32::MAX)).saturating_add(1);
        let recent = self.inner.deps.gateway.store().recent_messages(&filter, read).await?;
        let mut unseen: Vec<Message> =
            recent.into_iter().filter(|m| !seen.contains(&m.id) && not_after(m, root)).collect();
        let skip = unseen.len().saturating_sub(limit as usize);
        unseen.drain(..skip);
        Ok(unseen)
    }
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use kesoku_core::{SessionId, ThreadRef};

    use super::*;
    use crate::personas::AgentPersona;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("a time")
    }

    fn persona(name: &str, channels: &[&str]) -> AgentPersona {
        AgentPersona::sitting_in(name, channels)
    }

    fn user(session: &SessionId, text: &str) -> Message {
        Message::user_text(session, "api", "room", "Chii", text)
    }

    fn step(session: &SessionId, parent: &Message, agent: Option<&str>, kind: MessageType, text: &str) -> Message {
        let mut m = Message::user_text(session, "api", "room", agent.unwrap_or("Kesoku"), text);
        m.role = if kind == MessageType::Text || kind == MessageType::Thought { Role::Assistant } else { Role::Tool };
        m.message_type = kind;
        m.parent_id = Some(parent.id.clone());
        m.metadata.agent = agent.map(Into::into);
        m.step = 1;
        m
    }

    #[test]
    fn a_denied_load_names_who_and_where_but_not_the_message() {
        let personas = Personas::new(vec![persona("Ryan", &["api:room-a"]), persona("Ana", &["api:room-b"])]);
        let session = SessionId::from("sess_1".to_owned());
        let mut message = Message::user_text(&session, "api", "room-b", "Chii", "the secret plan");
        let (detail, short) = load_denied(&personas, Some("Ryan"), &message).expect("denied");
        assert_eq!(detail, "access denied: agent `Ryan` does not sit in api:room-b ([[agents]] channels)");
        assert!(!short.contains("secret") && short.contains("[[agents]]"), "{short}");
        assert!(load_denied(&personas, Some("Ana"), &message).is_none());
        assert!(load_denied(&personas, None, &message).is_some(), "the default agent stays out of a persona's room");
        let mut compact = message.clone();
        compact.metadata.is_compaction = Some(true);
        assert!(load_denied(&personas, None, &compact).is_none(), "`/compact` is a command, not an agent's work");
        // A thread counts as the channel it hangs off.
        message.channel_id = "thread-7".to_owned();
        message.metadata.thread =
            Some(Box::new(ThreadRef { parent_channel_id: "room-a".to_owned(), root_message_id: None }));
        assert!(load_denied(&personas, Some("Ryan"), &message).is_none());
        let (detail, _) = load_denied(&personas, Some("Ana"), &message).expect("denied");
        assert!(detail.contains("api:thread-7 (a thread of api:room-a)"), "{detail}");
    }

    #[test]
    fn a_persona_sees_its_own_turns_and_not_another_agents_steps() {
        let session = SessionId::from("sess_1".to_owned());
        let first = user(&session, "who builds it?");
        let ana_call = step(&session, &first, Some("Ana"), MessageType::ToolCall, "call");
        let mut ana_result = step(&session, &ana_call, None, MessageType::ToolResult, "result");
        ana_result.role = Role::Tool;
        let ana_answer = step(&session, &first, Some("Ana"), MessageType::Text, "Ana answers");
        let second = user(&session, "Ryan, your view?");
        let ryan_thought = step(&session, &second, Some("Ryan"), MessageType::Thought, "hmm");
        let ryan_answer = step(&session, &second, Some("Ryan"), MessageType::Text, "Ryan answers");
        let third = user(&session, "now?");
        let history = vec![
            first.clone(),
            ana_call,
            ana_result,
            ana_answer,
            second.clone(),
            ryan_thought.clone(),
            ryan_answer.clone(),
            third.clone(),
        ];
        let ids = |view: Vec<Message>| view.into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(
            ids(agent_view(history.clone(), Some("Ryan"), &third.id)),
            vec![second.id.clone(), ryan_thought.id, ryan_answer.id, third.id.clone()]
        );
        // The default agent sees everything, as before.
        assert_eq!(agent_view(history.clone(), None, &third.id).len(), history.len());
        // A session no configured agent wrote in is unchanged.
        let plain = vec![first.clone(), step(&session, &first, None, MessageType::Text, "hi"), third.clone()];
        assert_eq!(agent_view(plain, Some("Ryan"), &third.id).len(), 3);
    }

    #[test]
    fn long_text_is_clipped_with_a_marker() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(CONTEXT_CLIP_CHARS + 5);
        let clipped = clip(&long);
        assert!(clipped.starts_with(&"é".repeat(CONTEXT_CLIP_CHARS)));
        assert!(clipped.ends_with("[…clipped: 5 more characters]"), "{clipped}");
    }

    #[test]
    fn a_context_line_shows_local_time_and_sender() {
        let session = SessionId::from("sess_1".to_owned());
        let mut message = user(&session, "hello");
        message.created_at = Some(at("2026-03-29T07:00:00Z"));
        assert_eq!(context_line(&message, &Zone::named(Some("Europe/Paris"))), "[2026-03-29 09:00] Chii: hello");
        message.metadata.agent = Some("Ana".into());
        message.sender = "Ana".to_owned();
        assert_eq!(context_line(&message, &Zone::named(None)), "[2026-03-29 07:00] Ana (agent): hello");
    }
}
