//! `kesoku history`: list sessions and show a session's phased trajectory.

use std::process::ExitCode;

use anyhow::bail;
use kesoku_core::{Message, MessageType, SessionId};
use kesoku_store::SessionFilter;

use crate::cli::HistoryCommand;
use crate::config::Config;
use crate::wiring;

pub async fn run(config: &Config, command: HistoryCommand) -> anyhow::Result<ExitCode> {
    let handle = wiring::open_store(config, false).await?;
    let store = &handle.store;
    match command {
        HistoryCommand::List { limit } => {
            let sessions =
                store.list_sessions(&SessionFilter { limit: Some(limit), ..SessionFilter::default() }).await?;
            if sessions.is_empty() {
                println!("no sessions yet: start one with `kesoku chat \"hello\"`");
            }
            for session in sessions {
                let messages = store.list_messages(&kesoku_core::MessageFilter::session(&session.id)).await?;
                let first = messages
                    .iter()
                    .find(|m| m.role == kesoku_core::Role::User)
                    .map(|m| kesoku_chatbots::commands::one_line(&m.content, 60));
                println!(
                    "{}  {}  {}:{}  {} messages  {}",
                    session.id,
                    session.updated_at.format("%Y-%m-%d %H:%M"),
                    session.chatbot_id,
                    session.channel_id,
                    messages.len(),
                    session.title.clone().or(first).unwrap_or_default()
                );
            }
        }
        HistoryCommand::Show { session, json, html } => {
            let id = SessionId::from(session.as_str());
            let Some(found) = store.get_session(&id).await? else {
                bail!("no session `{session}`: list them with `kesoku history list`");
            };
            let messages = store.session_history(&id).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&messages)?);
            } else if html {
                println!("{}", kesoku_server::render_trajectory_html(&found, &messages));
            } else {
                for message in &messages {
                    println!("{}", render_line(message));
                }
            }
        }
        HistoryCommand::Uncompact { session } => {
            let id = SessionId::from(session.as_str());
            if store.get_session(&id).await?.is_none() {
                bail!("no session `{session}`: list them with `kesoku history list`");
            }
            let messages = store.session_history(&id).await?;
            let latest =
                messages.iter().rev().find(|m| m.metadata.compaction_summary.as_ref().is_some_and(|s| !s.undone));
            let Some(summary) = latest else {
                println!("session {session} has no active compaction summary");
                return Ok(ExitCode::SUCCESS);
            };
            let mut metadata = summary.metadata.clone();
            let mut turns = 0;
            if let Some(range) = metadata.compaction_summary.as_mut() {
                range.undone = true;
                turns = range.turns;
            }
            store.update_metadata(&summary.id, &metadata).await?;
            println!("undid summary {}: the {turns} turns it replaced are shown to the model again", summary.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A plain, one-message-per-block rendering of the trajectory.
pub fn render_line(message: &Message) -> String {
    let label = match message.message_type {
        MessageType::Text => message.role.as_str(),
        MessageType::Thought => "thought",
        MessageType::ToolCall => "tool call",
        MessageType::ToolResult => "tool result",
    };
    format!("[{label}] {} ({}) {}\n{}\n", message.sender, message.status, message.id, message.content)
}
