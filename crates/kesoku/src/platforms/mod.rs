//! The chat platforms `kesoku start` runs: one file per platform, each turning its
//! `[[chatbots.*]]` entries into running tasks (the connection that ingests what people write,
//! and the shared delivery routine that shows what the agent writes).
//!
//! The binary's side only: reading secrets (environment variables, key and token files) and
//! wiring. What a platform does is `kesoku_chatbots`'.

pub mod discord;
pub mod google_chat;
pub mod wechat;

use std::sync::Arc;

use kesoku_chatbots::control::SessionControl;
use kesoku_chatbots::staging::Staging;
use kesoku_chatbots::{Chatbot, Deliverer};
use kesoku_gateway::Gateway;
use kesoku_store::StoreHandle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// What every platform is started with.
pub struct Platform<'a> {
    pub config: &'a Config,
    pub handle: &'a StoreHandle,
    pub gateway: &'a Gateway,
    /// Stops and clears sessions for chat commands (`/stop`, Stop buttons).
    pub control: Arc<dyn SessionControl>,
    pub shutdown: &'a CancellationToken,
}

impl Platform<'_> {
    /// Where people's files go (the workspace's session folders).
    pub fn staging(&self) -> Staging {
        Staging::new(self.config.workspace_dir.clone())
    }

    /// The shared delivery routine for `chatbot`, running until shutdown.
    pub fn spawn_delivery(&self, chatbot: Arc<dyn Chatbot>) -> JoinHandle<()> {
        let deliverer = Deliverer::new(self.gateway.clone(), self.config.workspace_dir.clone())
            .with_ledger(Arc::clone(&self.handle.ledger));
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move { deliverer.run(chatbot, shutdown).await })
    }

    /// `path: [[chatbots.KIND]] id = "ID"`, the context of a start-up error.
    pub fn entry(&self, kind: &str, id: &str) -> String {
        format!("{}: [[chatbots.{kind}]] id = \"{id}\"", self.config.path.display())
    }
}

/// Start every configured chat platform. A missing secret refuses the start; a platform that
/// fails later (a token revoked, a subscription deleted) is logged with the fix and the service
/// keeps running its other inputs.
pub fn start_all(platform: &Platform<'_>) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for entry in &platform.config.chatbots.discord {
        tasks.extend(discord::start(platform, entry)?);
    }
    for entry in &platform.config.chatbots.google_chat {
        tasks.extend(google_chat::start(platform, entry)?);
    }
    for entry in &platform.config.chatbots.wechat {
        tasks.extend(wechat::start(platform, entry)?);
    }
    Ok(tasks)
}
