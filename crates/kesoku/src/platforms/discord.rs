//! `[[chatbots.discord]]`: the bot token from the variable `token_env` names, the gateway
//! connection and the delivery routine.

use std::sync::Arc;

use anyhow::Context;
use kesoku_chatbots::Chatbot;
use kesoku_chatbots::discord::outbound::DiscordChatbot;
use kesoku_chatbots::discord::{Discord, DiscordConfig, progress::ProgressOptions};
use tokio::task::JoinHandle;

use super::Platform;

pub fn start(platform: &Platform<'_>, entry: &DiscordConfig) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let context = || platform.entry("discord", &entry.id);
    let token = Discord::token_from(entry, std::env::var(&entry.token_env).ok()).with_context(context)?;
    let discord =
        Discord::new(platform.gateway.clone(), entry.clone(), token, platform.staging(), Arc::clone(&platform.control))
            .with_context(context)?;
    let chatbot: Arc<dyn Chatbot> = Arc::new(DiscordChatbot::new(
        &entry.id,
        discord.api(),
        Arc::clone(platform.gateway.store()),
        ProgressOptions::default(),
    ));
    let delivery = platform.spawn_delivery(chatbot);
    let shutdown = platform.shutdown.clone();
    let id = entry.id.clone();
    let connection = tokio::spawn(async move {
        if let Err(error) = discord.run(shutdown).await {
            tracing::error!(chatbot_id = %id, %error, "the discord chatbot stopped; its messages wait in the store until it is back");
        }
    });
    Ok(vec![delivery, connection])
}
