//! Background maintenance: automatic compaction and session titles, each its own activation on
//! the background lane, never inline in a person's turn.
//!
//! A turn asks for maintenance ([`Agent::request_maintenance`]) and goes on at once; the
//! activation runs on another worker when the background lane's share of workers has room. It
//! does not hold the session against the session's turns (the queue reserves one maintenance per
//! session, beside its turns), which is safe because neither job touches a running turn:
//! compaction never covers a turn still `processing` nor the latest ones, and a title is a
//! session field. One activation per (session, task) waits or runs at a time; a request made
//! meanwhile is dropped (the next turn asks again if it still applies).

use kesoku_core::activation::MaintenanceTask;
use kesoku_core::{Activation, LedgerEntry, Message, MessageType, Outcome, Role, SessionId, Usage};
use kesoku_llm::Request;

use super::{Agent, lock};
use crate::compaction;
use crate::error::AgentError;

/// Longest session title kept, in characters.
const MAX_TITLE_CHARS: usize = 80;
/// Characters of the first exchange shown to the model that writes a title.
const TITLE_SOURCE_CHARS: usize = 2_000;

const TITLE_PROMPT: &str = "You name conversations. Answer with a title of at most six words for the \
conversation below: no quotes, no final period, nothing else.";

impl Agent {
    /// Queue `task` for the session of `root` on the background lane, unless one waits or runs
    /// already. Its ledger row is stored before it is queued; a failure is logged and dropped
    /// (maintenance is asked for again by later turns).
    pub(super) async fn request_maintenance(&self, root: &Message, task: MaintenanceTask) {
        let key = (root.session_id.clone(), task);
        if !lock(&self.inner.maintenance).insert(key.clone()) {
            return;
        }
        let activation = self.maintenance_for(&root.session_id, &root.chatbot_id, &root.channel_id, task);
        let deps = &self.inner.deps;
        let queued = async {
            deps.ledger.record_enqueued(&LedgerEntry::enqueued(&activation)).await?;
            deps.queue.push(activation).await?;
            Ok::<(), AgentError>(())
        };
        if let Err(error) = queued.await {
            tracing::warn!(%error, session_id = %root.session_id, ?task, "queueing maintenance failed");
            lock(&self.inner.maintenance).remove(&key);
        }
    }

    /// Run a maintenance activation to its end.
    pub(super) async fn run_maintenance(
        &self,
        activation: &Activation,
        task: MaintenanceTask,
    ) -> (Outcome, Option<String>, Usage) {
        let result = match task {
            MaintenanceTask::Compaction => self.background_compaction(&activation.session_id).await,
            MaintenanceTask::Title => self.title(&activation.session_id).await,
        };
        lock(&self.inner.maintenance).remove(&(activation.session_id.clone(), task));
        match result {
            Ok(done) => done,
            Err(error) => (Outcome::Failed, Some(format!("store error: {error}")), Usage::default()),
        }
    }

    /// Compact the session's older turns now, if there is anything to compact.
    async fn background_compaction(
        &self,
        session_id: &SessionId,
    ) -> Result<(Outcome, Option<String>, Usage), AgentError> {
        let store = self.inner.deps.gateway.store();
        let view = compaction::apply_summaries(store.session_history(session_id).await?);
        // The summary and its notice belong to the newest turn: the one that asked.
        let Some(anchor) = view.iter().rev().find(|m| m.parent_id.is_none() && m.role == Role::User).cloned() else {
            return Ok((Outcome::Succeeded, Some("nothing to compact: no turn yet".to_owned()), Usage::default()));
        };
        let usage = Usage { model_calls: 1, ..Usage::default() };
        Ok(match self.compact(&anchor, &view, true).await {
            Ok(Some(_)) => (Outcome::Succeeded, None, usage),
            Ok(None) => (Outcome::Succeeded, Some("nothing to compact: too few turns".to_owned()), Usage::default()),
            Err(super::compact::CompactError::Summary(error)) => {
                tracing::warn!(%error, %session_id, "automatic compaction failed; history unchanged");
                (Outcome::Failed, Some(error.to_string()), usage)
            }
            Err(super::compact::CompactError::Gateway(error)) => return Err(error.into()),
        })
    }

    /// Give an untitled session a short title written by the summarizing model from its first
    /// exchange.
    async fn title(&self, session_id: &SessionId) -> Result<(Outcome, Option<String>, Usage), AgentError> {
        let store = self.inner.deps.gateway.store();
        let Some(session) = store.get_session(session_id).await? else {
            return Ok((Outcome::Cancelled, Some("the session no longer exists".to_owned()), Usage::default()));
        };
        if session.title.is_some() {
            return Ok((Outcome::Succeeded, Some("already titled".to_owned()), Usage::default()));
        }
        let history = store.session_history(session_id).await?;
        let Some(source) = first_exchange(&history) else {
            return Ok((Outcome::Succeeded, Some("nothing to name yet".to_owned()), Usage::default()));
        };
        let request = Request { system: Some(TITLE_PROMPT.to_owned()), ..Request::user_text(source) };
        let model = self.summarizer();
        let response = match model.generate(&request).await {
            Ok(response) => response,
            Err(error) => {
                let usage = Usage { model_calls: 1, ..Usage::default() };
                return Ok((Outcome::Failed, Some(format!("the model failed: {error}")), usage));
            }
        };
        let usage = Usage {
            model_calls: 1,
            tool_calls: 0,
            input_tokens: response.usage.input_tokens,
            output_tokens: response.usage.output_tokens,
        };
        let Some(title) = clean_title(&response.text_content()) else {
            return Ok((Outcome::Failed, Some("the model wrote no title".to_owned()), usage));
        };
        store.set_session_title(session_id, &title).await?;
        Ok((Outcome::Succeeded, None, usage))
    }

    /// Before a turn of `root` runs on `view` (its history as the model will see it): ask for
    /// compaction when the view passes the configured share of the model's window (the turn
    /// goes on with the view as it is; the next one sees the summary), and for a title when the
    /// session has none.
    pub(super) fn before_turn(&self, root: &Message, view: &[Message], window: u32, untitled: bool) {
        let config = &self.inner.deps.config.compaction;
        let compact = config.auto && (compaction::estimate_tokens(view) as f64) >= config.threshold * f64::from(window);
        let tasks: Vec<MaintenanceTask> = [(compact, MaintenanceTask::Compaction), (untitled, MaintenanceTask::Title)]
            .into_iter()
            .filter_map(|(due, task)| due.then_some(task))
            .collect();
        if tasks.is_empty() {
            return;
        }
        // Queued from a task of its own: the turn does not wait even for the ledger row.
        let agent = self.clone();
        let root = root.clone();
        tokio::spawn(async move {
            for task in tasks {
                agent.request_maintenance(&root, task).await;
            }
        });
    }
}

/// The first user message and the first answer, as the title writer reads them.
fn first_exchange(history: &[Message]) -> Option<String> {
    let user = history.iter().find(|m| m.role == Role::User && m.parent_id.is_none())?;
    let answer = history.iter().find(|m| {
        m.role == Role::Assistant
            && m.message_type == MessageType::Text
            && !m.is_notification()
            && m.parent_id.is_some()
    });
    let cut = |text: &str| text.chars().take(TITLE_SOURCE_CHARS).collect::<String>();
    let mut source = format!("User: {}", cut(&user.content));
    if let Some(answer) = answer {
        source.push_str("\n\nAssistant: ");
        source.push_str(&cut(&answer.content));
    }
    Some(source)
}

/// The model's answer as a title: one line, no quotes or final period, at most
/// [`MAX_TITLE_CHARS`] characters; `None` when nothing is left.
fn clean_title(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line.trim_start_matches(['#', '*', ' ']).trim_end_matches(['*', ' ']);
    let line = line.strip_prefix("Title:").unwrap_or(line).trim();
    let line = line.trim_matches(|c| matches!(c, '"' | '\'' | '“' | '”' | '`')).trim_end_matches('.').trim();
    let title: String = line.chars().take(MAX_TITLE_CHARS).collect();
    (!title.is_empty()).then_some(title)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_are_one_clean_line() {
        assert_eq!(clean_title("\"Tokyo weather check.\"\n").as_deref(), Some("Tokyo weather check"));
        assert_eq!(clean_title("Title: Deploy plan").as_deref(), Some("Deploy plan"));
        assert_eq!(clean_title("**Rust build fix**\nmore").as_deref(), Some("Rust build fix"));
        assert_eq!(clean_title("  \n \"\" "), None);
        assert_eq!(clean_title(&"x".repeat(200)).map(|t| t.chars().count()), Some(MAX_TITLE_CHARS));
    }
}
