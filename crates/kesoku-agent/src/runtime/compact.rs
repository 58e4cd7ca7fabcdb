//! Compaction as the runtime runs it: manual for `/compact` (the person's own turn), and the
//! shared step of writing a summary, which background maintenance also uses (see
//! `maintenance`). What a summary covers and how it is written is [`crate::compaction`].

use std::sync::Arc;

use kesoku_core::{Activation, Message, Outcome, Status, TurnOrigin, Usage};
use kesoku_gateway::GatewayError;
use kesoku_llm::Model;

use super::Agent;
use crate::compaction::{self, CompactionError};
use crate::error::AgentError;

/// Why a compaction did not happen.
#[derive(Debug)]
pub(super) enum CompactError {
    Summary(CompactionError),
    Gateway(GatewayError),
}

impl Agent {
    /// The model that writes summaries: `[agent.compaction] model`, or the answering one.
    pub(super) fn summarizer(&self) -> Arc<dyn Model> {
        let deps = &self.inner.deps;
        deps.config
            .compaction
            .model
            .as_deref()
            .and_then(|name| deps.models.get(name))
            .unwrap_or_else(|| deps.models.default_model())
    }

    /// Summarize the oldest turns of `view` and store the summary; returns the new view, or
    /// `None` when there was nothing to compact.
    pub(super) async fn compact(
        &self,
        root: &Message,
        view: &[Message],
        automatic: bool,
    ) -> Result<Option<Vec<Message>>, CompactError> {
        let config = &self.inner.deps.config.compaction;
        let Some(plan) = compaction::plan(view, config.keep_recent_turns) else { return Ok(None) };
        let summarizer = self.summarizer();
        let text = compaction::summarize(summarizer.as_ref(), &plan).await.map_err(CompactError::Summary)?;
        let summary = compaction::summary_message(&root.session_id, &root.chatbot_id, &root.channel_id, &plan, &text);
        let gateway = &self.inner.deps.gateway;
        gateway.post(&summary).await.map_err(CompactError::Gateway)?;
        let notice = Message::notification(
            &root.session_id,
            Some(&root.id),
            &root.chatbot_id,
            &root.channel_id,
            compaction::notification_text(&plan, automatic),
        );
        gateway.post(&notice).await.map_err(CompactError::Gateway)?;
        let history =
            gateway.store().session_history(&root.session_id).await.map_err(|e| CompactError::Gateway(e.into()))?;
        Ok(Some(compaction::apply_summaries(history)))
    }

    /// `/compact`: the Manual Compaction Trigger summarizes older turns now.
    pub(super) async fn run_manual_compaction(
        &self,
        activation: &Activation,
        root: Message,
    ) -> Result<(Outcome, Option<String>, Usage), AgentError> {
        let gateway = &self.inner.deps.gateway;
        let view = compaction::apply_summaries(gateway.store().session_history(&root.session_id).await?);
        let usage = Usage { model_calls: 1, ..Usage::default() };
        match self.compact(&root, &view, false).await {
            Ok(Some(_)) => {
                gateway.update_status(&root.id, Status::Processed).await?;
                Ok((Outcome::Succeeded, None, usage))
            }
            Ok(None) => {
                let notice = TurnOrigin::of(&root, &self.inner.deps.config.name).notification(
                    "🔄 Nothing to compact yet: the conversation is still short (the first and the latest turns are always kept).",
                );
                gateway.post(&notice).await?;
                gateway.update_status(&root.id, Status::Processed).await?;
                Ok((Outcome::Succeeded, Some("nothing to compact".to_owned()), Usage::default()))
            }
            Err(CompactError::Summary(error)) => {
                let short = error.to_string();
                self.fail_root(&root, activation, &format!("{error:?}\n{error}"), &short).await;
                Ok((Outcome::Failed, Some(short), usage))
            }
            Err(CompactError::Gateway(error)) => Err(error.into()),
        }
    }
}
