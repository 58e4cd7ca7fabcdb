//! `kesoku chat`: one turn from the terminal, with plain output.
//!
//! The command runs the whole system in-process: it posts the user's message through the
//! gateway, runs the agent until that message's turn ends, and acts as the `cli` chatbot:
//! it prints each step of the turn and marks it `delivered` (spec §4.3).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::Utc;
use futures::StreamExt;
use kesoku_broker::StopReason;
use kesoku_core::{Attachment, Message, MessageFilter, MessageType, Session, SessionId, Status};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_store::SessionFilter;
use tokio_util::sync::CancellationToken;

use crate::cli::ChatArgs;
use crate::config::Config;
use crate::wiring;

/// The CLI chatbot's ids and sender (spec §3.1).
pub const CLI_CHATBOT: &str = "cli";
pub const CLI_CHANNEL: &str = "cli";
pub const CLI_SENDER: &str = "User";

pub async fn run(config: &Config, args: &ChatArgs) -> anyhow::Result<ExitCode> {
    let (handle, gateway) = wiring::open_gateway(config).await?;
    let store = &handle.store;
    if args.list {
        let filter = SessionFilter {
            chatbot_id: Some(CLI_CHATBOT.into()),
            channel_id: Some(CLI_CHANNEL.into()),
            limit: Some(50),
        };
        for session in store.list_sessions(&filter).await? {
            println!(
                "{}  {}  {}",
                session.id,
                session.updated_at.format("%Y-%m-%d %H:%M"),
                session.title.unwrap_or_default()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let prompt = args.prompt.join(" ");
    if prompt.trim().is_empty() {
        bail!("give a prompt, for example: kesoku chat \"What is 25 + 15?\"");
    }
    let models = wiring::build_models(config)?;
    let agent = wiring::build_agent(config, &handle, gateway.clone(), models)?;
    agent.recover().await.context("recovering unfinished work")?;

    let session = choose_session(&gateway, args).await?;
    let mut message = Message::user_text(&session.id, CLI_CHATBOT, CLI_CHANNEL, CLI_SENDER, prompt);
    if !args.attach.is_empty() {
        message.metadata.attachments = Some(stage_attachments(config, &session.id, &args.attach)?);
    }
    let start_rev = store.current_rev().await?;
    let root_id = message.id.clone();
    gateway.post(&message).await?;

    let shutdown = CancellationToken::new();
    let runner = {
        let agent = agent.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { agent.run(shutdown, Duration::from_secs(2)).await })
    };
    let filter = MessageFilter::session(&session.id);
    let mut events = Box::pin(gateway.listen(filter, ListenFrom::AfterRev(start_rev)));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut stopping = false;
    let final_status = loop {
        let event = tokio::select! {
            _ = &mut ctrl_c, if !stopping => {
                stopping = true;
                eprintln!("stopping the turn…");
                agent.stop_session(&session.id, StopReason::UserRequest).await?;
                continue;
            }
            event = events.next() => event,
        };
        let Some(event) = event else { bail!("the message stream ended unexpectedly") };
        let message = event?.message;
        if message.id == root_id {
            if matches!(message.status, Status::Processed | Status::Error | Status::Interrupted) {
                break message.status;
            }
            continue;
        }
        deliver(&gateway, &message).await;
    };
    shutdown.cancel();
    let _ = runner.await;
    Ok(match final_status {
        Status::Processed => ExitCode::SUCCESS,
        Status::Interrupted => ExitCode::from(130),
        Status::PendingAgent
        | Status::Processing
        | Status::Error
        | Status::Pending
        | Status::Delivered
        | Status::Responded => ExitCode::FAILURE,
    })
}

/// Print a message of the turn and mark it delivered, as the CLI chatbot does.
async fn deliver(gateway: &Gateway, message: &Message) {
    if message.chatbot_id != CLI_CHATBOT || !matches!(message.status, Status::Pending | Status::Responded) {
        return;
    }
    match (message.message_type, message.status) {
        (MessageType::Thought, _) => println!("💭 {}\n", message.content.trim()),
        (MessageType::ToolCall, _) => println!("🛠️ {}\n", message.content.trim()),
        (MessageType::ToolResult, _) => {
            let mark = if message.metadata.tool_error.is_some() { "❌" } else { "✅" };
            println!("{mark} {}\n", message.content.trim());
        }
        (MessageType::Text, Status::Pending) => {
            println!("{}", message.content.trim());
            if let Some(metrics) = &message.metadata.turn_metrics {
                println!(
                    "\n[turn {} · {} tool calls · {} tokens · {:.1}s]",
                    metrics.session_turns, metrics.turn_tool_calls, metrics.turn_tokens, metrics.turn_time
                );
            }
        }
        // Hidden system messages (nudges) are not shown to the user.
        (MessageType::Text, _) => {}
    }
    if let Err(error) = gateway.update_status(&message.id, Status::Delivered).await {
        tracing::debug!(%error, "marking a message delivered failed (another deliverer may have done it)");
    }
}

async fn choose_session(gateway: &Gateway, args: &ChatArgs) -> anyhow::Result<Session> {
    let store = gateway.store();
    if let Some(id) = &args.session {
        let id = SessionId::from(id.as_str());
        let Some(session) = store.get_session(&id).await? else {
            bail!("no session `{id}`: list them with `kesoku chat -l`");
        };
        store.set_active_session(CLI_CHATBOT, CLI_CHANNEL, &id).await?;
        return Ok(session);
    }
    if args.resume
        && let Some(id) = store.active_session(CLI_CHATBOT, CLI_CHANNEL).await?
        && let Some(session) = store.get_session(&id).await?
    {
        return Ok(session);
    }
    let session = Session::new(CLI_CHATBOT, CLI_CHANNEL, Utc::now());
    store.create_session(&session).await?;
    store.set_active_session(CLI_CHATBOT, CLI_CHANNEL, &session.id).await?;
    Ok(session)
}

/// Copy files into the session's staging folder and describe them for the message metadata.
fn stage_attachments(
    config: &Config,
    session_id: &SessionId,
    paths: &[std::path::PathBuf],
) -> anyhow::Result<Vec<Attachment>> {
    let dir = config.session_dir(session_id).join("attachments");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut attachments = Vec::new();
    for path in paths {
        let filename = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty())
            .with_context(|| format!("{} has no usable file name", path.display()))?
            .to_owned();
        let target = unique_path(&dir, &filename);
        std::fs::copy(path, &target).with_context(|| format!("cannot attach {}", path.display()))?;
        let relative = target.strip_prefix(&config.workspace_dir).unwrap_or(&target);
        attachments.push(Attachment {
            path: relative.display().to_string(),
            mime_type: mime_type_of(&filename).to_owned(),
            filename,
        });
    }
    Ok(attachments)
}

fn unique_path(dir: &Path, filename: &str) -> std::path::PathBuf {
    let candidate = dir.join(filename);
    if !candidate.exists() {
        return candidate;
    }
    (2..).map(|n| dir.join(format!("{n}-{filename}"))).find(|p| !p.exists()).unwrap_or(candidate)
}

/// MIME type by file extension (the types models accept; anything else is a plain file).
pub fn mime_type_of(filename: &str) -> &'static str {
    let extension = filename.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
    match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "html" | "htm" => "text/html",
        _ => "application/octet-stream",
    }
}
