//! Compaction: keep long conversations inside the model's window without deleting anything.
//!
//! The oldest turns (never the first one, which usually holds the task, and never the latest
//! few) are summarized by a model into a stored *summary message* (role system, sender
//! `System`, `metadata.compaction_summary` naming the first and last turn it replaces). What
//! the model sees is the history with that range replaced by the summary; the store keeps every
//! message, and undoing a summary (`kesoku history uncompact`) shows the turns in full again.
//! Compaction works on whole turns, so a tool call is never separated from its result. A
//! summary that comes back empty or malformed is not stored: the history stays as it was.

use std::collections::HashMap;

use kesoku_core::history::turn_root;
use kesoku_core::{CompactionSummary, Message, MessageId, MessageType, Role, SessionId, Status};
use kesoku_llm::{Model, Request};
use serde::{Deserialize, Serialize};

/// `[agent.compaction]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionConfig {
    /// Compact automatically when the prepared context passes `threshold` of the window.
    #[serde(default = "default_auto")]
    pub auto: bool,
    /// Share of the model's context window (0 < threshold < 1) that triggers compaction.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// The latest turns always kept in full.
    #[serde(default = "default_keep_recent_turns")]
    pub keep_recent_turns: usize,
    /// A cheaper `[models.NAME]` for summaries; unset: the answering model.
    #[serde(default)]
    pub model: Option<String>,
}

fn default_auto() -> bool {
    true
}

fn default_threshold() -> f64 {
    0.75
}

fn default_keep_recent_turns() -> usize {
    4
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            auto: default_auto(),
            threshold: default_threshold(),
            keep_recent_turns: default_keep_recent_turns(),
            model: None,
        }
    }
}

/// Opening of a summary message's content.
pub const SUMMARY_HEADER: &str = "[Summary of earlier conversation]";
/// The notification after an automatic compaction (spec §3, User-Facing Notification).
pub const AUTO_NOTIFICATION: &str = "🔄 Conversation history has been automatically compacted";
/// Instruction given to the summarizing model.
pub const SUMMARIZER_PROMPT: &str = "You compress conversation history for an AI assistant. Write a faithful, \
dense summary of the transcript you are given: the user's goals and requests, decisions made, facts learned \
(names, numbers, paths, commands and their outcomes), files created or changed, and open questions or \
unfinished work. Do not invent anything. Output only the summary, as short paragraphs or bullet points.";

/// Rough token count of what the model would see for `messages` (4 characters a token, plus a
/// small overhead per message). Providers report the real figure after the call.
pub fn estimate_tokens(messages: &[Message]) -> u64 {
    messages
        .iter()
        .filter(|m| !m.is_notification())
        .map(|m| {
            let arguments = m.metadata.tool_arguments.as_ref().map_or(0, |a| a.to_string().len());
            (m.content.len() + arguments) as u64 / 4 + 8
        })
        .sum()
}

/// Consecutive messages of one turn (phased order keeps a turn's messages together).
pub fn group_turns(history: &[Message]) -> Vec<Vec<Message>> {
    let by_id: HashMap<&MessageId, &Message> = history.iter().map(|m| (&m.id, m)).collect();
    let mut groups: Vec<(MessageId, Vec<Message>)> = Vec::new();
    for message in history {
        let root = turn_root(message, &by_id).clone();
        match groups.last_mut() {
            Some((current, members)) if *current == root => members.push(message.clone()),
            Some(_) | None => groups.push((root, vec![message.clone()])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

fn active_summary(message: &Message) -> Option<&CompactionSummary> {
    message.metadata.compaction_summary.as_ref().filter(|s| !s.undone)
}

/// What the model sees: the newest active summary stands in for the turns it replaces.
pub fn apply_summaries(history: Vec<Message>) -> Vec<Message> {
    let Some(summary) = history.iter().rev().find(|m| active_summary(m).is_some()).cloned() else {
        // Undone summaries are kept in the store but never shown.
        return history.into_iter().filter(|m| m.metadata.compaction_summary.is_none()).collect();
    };
    let Some(range) = active_summary(&summary).cloned() else { return history };
    let groups = group_turns(&history);
    let roots: Vec<&MessageId> = groups.iter().map(|g| &g[0].id).collect();
    let (Some(first), Some(last)) =
        (roots.iter().position(|r| **r == range.first_turn), roots.iter().position(|r| **r == range.last_turn))
    else {
        // The range names turns not in this history: show everything rather than guess.
        return history;
    };
    if first > last {
        return history;
    }
    let mut view = Vec::with_capacity(history.len());
    for (index, group) in groups.into_iter().enumerate() {
        if index == first {
            view.push(summary.clone());
        }
        if (first..=last).contains(&index) {
            continue;
        }
        // Summaries other than the applied one are never shown on their own.
        view.extend(group.into_iter().filter(|m| m.metadata.compaction_summary.is_none()));
    }
    view
}

/// Which turns a compaction would replace.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub first_turn: MessageId,
    pub last_turn: MessageId,
    pub turns: u32,
    pub messages: u32,
    /// The messages to summarize (an earlier summary first, when the range extends one).
    pub source: Vec<Message>,
}

/// Plan a compaction of `view` (as [`apply_summaries`] returns it), protecting the first turn and
/// the latest `keep_recent` turns, and any turn still running. `None`: nothing worth compacting
/// (fewer than two turns, or only an existing summary, would be replaced).
pub fn plan(view: &[Message], keep_recent: usize) -> Option<Plan> {
    let groups = group_turns(view);
    if groups.len() < 2 + keep_recent {
        return None;
    }
    let end = groups.len() - keep_recent.max(1);
    let candidates: Vec<&Vec<Message>> = groups[1..end]
        .iter()
        .take_while(|g| !g.iter().any(|m| m.parent_id.is_none() && m.status == Status::Processing))
        .collect();
    let fresh_turns = candidates.iter().filter(|g| active_summary(&g[0]).is_none()).count();
    if fresh_turns < 2 {
        return None;
    }
    let first = candidates.first()?;
    let last = candidates.last()?;
    let (first_turn, mut turns, mut messages) = match active_summary(&first[0]) {
        Some(previous) => (previous.first_turn.clone(), previous.turns, previous.messages),
        None => (first[0].id.clone(), 0, 0),
    };
    for group in &candidates {
        if active_summary(&group[0]).is_none() {
            turns += 1;
            messages += group.len() as u32;
        }
    }
    Some(Plan {
        first_turn,
        last_turn: last[0].id.clone(),
        turns,
        messages,
        source: candidates.iter().flat_map(|g| g.iter().cloned()).collect(),
    })
}

/// The transcript the summarizer reads: one block per message, long tool outputs cut.
pub fn transcript(messages: &[Message]) -> String {
    const MAX_TOOL_OUTPUT: usize = 1500;
    let mut out = String::new();
    for message in messages {
        if message.is_notification() {
            continue;
        }
        let label = match (message.role, message.message_type) {
            (_, MessageType::Thought) => continue,
            (_, MessageType::ToolCall) => "Tool call".to_owned(),
            (_, MessageType::ToolResult) => format!("Tool result ({})", message.sender),
            (Role::User, MessageType::Text) => format!("User ({})", message.sender),
            (Role::Assistant | Role::Tool, MessageType::Text) => "Assistant".to_owned(),
            (Role::System, MessageType::Text) => "System".to_owned(),
        };
        let content = if message.message_type == MessageType::ToolResult && message.content.len() > MAX_TOOL_OUTPUT {
            let tail: String =
                message.content.chars().rev().take(MAX_TOOL_OUTPUT).collect::<Vec<_>>().into_iter().rev().collect();
            format!("[…cut…]{tail}")
        } else {
            message.content.clone()
        };
        out.push_str(&format!("## {label}\n{}\n\n", content.trim()));
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error("the summarizing model failed: {0}")]
    Model(#[from] kesoku_llm::LlmError),
    #[error("the summary was unusable ({0}); the history is unchanged")]
    Malformed(&'static str),
}

/// Ask `model` for a summary of `plan`; refuse empty or malformed answers.
pub async fn summarize(model: &dyn Model, plan: &Plan) -> Result<String, CompactionError> {
    let source = transcript(&plan.source);
    let request = Request {
        system: Some(SUMMARIZER_PROMPT.to_owned()),
        ..Request::user_text(format!("Transcript to summarize:\n\n{source}"))
    };
    let response = model.generate(&request).await?;
    let summary = response.text_content().trim().to_owned();
    if summary.is_empty() {
        return Err(CompactionError::Malformed("it was empty"));
    }
    if summary.len() >= source.len().max(200) {
        return Err(CompactionError::Malformed("it was not shorter than what it summarizes"));
    }
    if !response.tool_calls().is_empty() {
        return Err(CompactionError::Malformed("the model asked for tools instead of summarizing"));
    }
    Ok(summary.strip_prefix(SUMMARY_HEADER).unwrap_or(&summary).trim().to_owned())
}

/// The stored summary message for `plan`.
pub fn summary_message(session_id: &SessionId, chatbot_id: &str, channel_id: &str, plan: &Plan, text: &str) -> Message {
    let mut message = Message::compaction_summary(
        session_id,
        chatbot_id,
        channel_id,
        format!("{SUMMARY_HEADER} ({} turns)\n{text}", plan.turns),
    );
    message.metadata.compaction_summary = Some(CompactionSummary {
        first_turn: plan.first_turn.clone(),
        last_turn: plan.last_turn.clone(),
        turns: plan.turns,
        messages: plan.messages,
        undone: false,
    });
    message
}

/// The notification shown after a compaction.
pub fn notification_text(plan: &Plan, automatic: bool) -> String {
    if automatic {
        format!(
            "{AUTO_NOTIFICATION}: {} earlier turns ({} messages) were summarized. Nothing was deleted.",
            plan.turns, plan.messages
        )
    } else {
        format!(
            "🔄 Conversation history compacted: {} earlier turns ({} messages) were summarized. Nothing was deleted.",
            plan.turns, plan.messages
        )
    }
}
