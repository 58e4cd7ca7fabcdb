//! `[[chatbots.google_chat]]`: the service-account key (`credentials_file`, else Application
//! Default Credentials), the Pub/Sub pull loop and the delivery routine.

use anyhow::bail;
use kesoku_chatbots::google_chat::GoogleChatConfig;
use tokio::task::JoinHandle;

use super::Platform;

pub fn start(platform: &Platform<'_>, entry: &GoogleChatConfig) -> anyhow::Result<Vec<JoinHandle<()>>> {
    bail!("{}: the google chat chatbot is not built yet", platform.entry("google_chat", &entry.id))
}
