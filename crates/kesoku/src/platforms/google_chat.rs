//! `[[chatbots.google_chat]]`: the service-account key (`credentials_file`, else Application
//! Default Credentials), the Pub/Sub pull loop and the delivery routine.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use kesoku_chatbots::Chatbot;
use kesoku_chatbots::google_chat::{Credentials, GoogleChat, GoogleChatConfig};
use tokio::task::JoinHandle;

use super::Platform;

pub fn start(platform: &Platform<'_>, entry: &GoogleChatConfig) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let context = || platform.entry("google_chat", &entry.id);
    let path = key_file(platform, entry).with_context(context)?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the google service-account key `{}`", path.display()))
        .with_context(context)?;
    let credentials = Credentials::from_json(&text)
        .with_context(|| format!("the google service-account key `{}`", path.display()))
        .with_context(context)?;
    let google = GoogleChat::new(
        platform.gateway.clone(),
        entry.clone(),
        credentials,
        platform.staging(),
        Arc::clone(&platform.control),
    )
    .with_context(context)?;
    let chatbot: Arc<dyn Chatbot> = Arc::new(google.chatbot());
    let delivery = platform.spawn_delivery(chatbot);
    let pull = tokio::spawn(google.run(platform.shutdown.clone()));
    Ok(vec![delivery, pull])
}

/// The key file: `credentials_file` (relative to the config file), else Application Default
/// Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, then gcloud's well-known file).
fn key_file(platform: &Platform<'_>, entry: &GoogleChatConfig) -> anyhow::Result<PathBuf> {
    if let Some(file) = entry.credentials_file.as_deref() {
        return Ok(platform.config.resolve_path(file.trim()));
    }
    if let Some(file) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS").filter(|file| !file.is_empty()) {
        return Ok(PathBuf::from(file));
    }
    let well_known = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".config/gcloud/application_default_credentials.json"));
    match well_known {
        Some(path) if path.is_file() => Ok(path),
        _ => bail!(
            "no google credentials: set credentials_file to the Chat app's service-account key (JSON), \
             or the environment variable GOOGLE_APPLICATION_CREDENTIALS to its path"
        ),
    }
}
