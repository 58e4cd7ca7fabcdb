//! Interactions: the shared chat commands as Discord slash commands, and the adapter's buttons.
//!
//! On `READY` the commands of [`crate::commands::ChatCommand::ALL`] replace the application's
//! global commands (one bulk overwrite, so a removed command disappears too). A slash command
//! is acknowledged at once with a deferred response (Discord allows three seconds), run like
//! the same command typed as text, and answered with a follow-up message.
//!
//! Buttons carry everything they need in their `custom_id` ([`super::custom_id`]), so they keep
//! working after a restart: Stop stops that session's turn ([`crate::control::SessionControl`]);
//! an answer posts the chosen option of the agent's question as the clicker's next message,
//! then disables the buttons.
//!
//! Not here: drawing the buttons (the status and delivery code does).

use chrono::{TimeZone, Utc};
use kesoku_core::{MessageId, Metadata};
use serde_json::{Value, json};

use super::Shared;
use super::custom_id::{ButtonAction, parse_custom_id};
use super::inbound::{self, Place};
use super::status::DISCORD_MAX_CHARS;
use super::wire::{self, Interaction, interaction_kind};
use crate::answer;
use crate::commands::{self, ChatCommand};
use crate::ingest::{Inbound, Ingested, ingest};

/// Discord's limit on a command description.
const MAX_DESCRIPTION_CHARS: usize = 100;

/// Interaction callback types.
mod callback {
    pub const CHANNEL_MESSAGE: u8 = 4;
    pub const DEFERRED_CHANNEL_MESSAGE: u8 = 5;
    pub const DEFERRED_UPDATE_MESSAGE: u8 = 6;
    pub const UPDATE_MESSAGE: u8 = 7;
}

/// Message flag: only the clicker sees the message.
const EPHEMERAL: u64 = 1 << 6;
/// Button style of the chosen answer.
const STYLE_SUCCESS: u64 = 3;

/// The application commands to register: one per shared chat command.
pub fn application_commands() -> Value {
    Value::Array(
        ChatCommand::ALL
            .iter()
            .map(|command| {
                let description: String = command.summary().chars().take(MAX_DESCRIPTION_CHARS).collect();
                json!({ "name": command.name(), "description": description, "type": 1 })
            })
            .collect(),
    )
}

/// `text` cut to Discord's message limit, with an ellipsis when cut.
pub fn fit_message(text: &str) -> String {
    if text.chars().count() <= DISCORD_MAX_CHARS {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(DISCORD_MAX_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// The components of a message with every button disabled, and the one clicked (`chosen`)
/// shown as chosen.
pub fn disabled_components(components: &[Value], chosen: &str) -> Vec<Value> {
    fn disable(component: &mut Value, chosen: &str) {
        let Some(object) = component.as_object_mut() else {
            return;
        };
        if let Some(Value::Array(children)) = object.get_mut("components") {
            for child in children {
                disable(child, chosen);
            }
            return;
        }
        if object.get("type").and_then(Value::as_u64) == Some(2) {
            if object.get("custom_id").and_then(Value::as_str) == Some(chosen) {
                object.insert("style".into(), json!(STYLE_SUCCESS));
            }
            object.insert("disabled".into(), json!(true));
        }
    }
    components
        .iter()
        .cloned()
        .map(|mut component| {
            disable(&mut component, chosen);
            component
        })
        .collect()
}

/// The label of the button with `custom_id` among `components`.
fn button_label(components: &[Value], custom_id: &str) -> Option<String> {
    components.iter().find_map(|component| {
        if component.get("custom_id").and_then(Value::as_str) == Some(custom_id) {
            return component.get("label").and_then(Value::as_str).map(str::to_owned);
        }
        component.get("components").and_then(Value::as_array).and_then(|children| button_label(children, custom_id))
    })
}

/// Replace the application's global commands with ours.
pub(super) async fn register_commands(shared: &Shared, application_id: u64) {
    match shared.rest.set_global_commands(application_id, &application_commands()).await {
        Ok(()) => tracing::info!(application_id, "discord slash commands registered"),
        Err(error) => {
            tracing::warn!(%error, "registering the discord slash commands failed; typed commands still work")
        }
    }
}

/// Handle one `INTERACTION_CREATE`.
pub(super) async fn handle_interaction(shared: &Shared, interaction: Interaction) {
    let result = match interaction.kind {
        interaction_kind::APPLICATION_COMMAND => slash_command(shared, &interaction).await,
        interaction_kind::MESSAGE_COMPONENT => component(shared, &interaction).await,
        interaction_kind::PING => Ok(()),
        other => {
            tracing::debug!(kind = other, "discord interaction type not handled");
            Ok(())
        }
    };
    if let Err(error) = result {
        tracing::warn!(%error, interaction_id = interaction.id, "answering a discord interaction failed");
    }
}

async fn slash_command(shared: &Shared, interaction: &Interaction) -> Result<(), super::rest::DiscordApiError> {
    let name = interaction.data.as_ref().and_then(|data| data.name.clone()).unwrap_or_default();
    let command = commands::parse(&format!("/{name}")).unwrap_or(ChatCommand::Unknown(name));
    respond(shared, interaction, &json!({ "type": callback::DEFERRED_CHANNEL_MESSAGE })).await?;
    let text = match interaction.channel_id() {
        Some(channel_id) => run_command(shared, &command, &channel_id.to_string()).await,
        None => "⚠️ This command must be used in a channel.".to_owned(),
    };
    let body = json!({ "content": fit_message(&text), "allowed_mentions": { "parse": [] } });
    shared.rest.create_followup(interaction.application_id, &interaction.token, &body).await
}

/// Run a shared command for a channel's session; the reply text (an error says what failed).
/// Slash commands and commands typed as messages both run here.
pub(super) async fn run_command(shared: &Shared, command: &ChatCommand, channel_id: &str) -> String {
    commands::run_in_channel(&shared.gateway, shared.control.as_ref(), &shared.config.id, channel_id, command).await
}

async fn component(shared: &Shared, interaction: &Interaction) -> Result<(), super::rest::DiscordApiError> {
    let custom_id = interaction.data.as_ref().and_then(|data| data.custom_id.clone()).unwrap_or_default();
    match parse_custom_id(&custom_id) {
        Some(ButtonAction::Stop { session_id }) => {
            // Acknowledge first: stopping may take longer than the three seconds Discord waits.
            respond(shared, interaction, &json!({ "type": callback::DEFERRED_UPDATE_MESSAGE })).await?;
            if let Err(error) = shared.control.stop_session(&session_id).await {
                let body =
                    json!({ "content": fit_message(&format!("⚠️ Stopping failed: {error}")), "flags": EPHEMERAL });
                shared.rest.create_followup(interaction.application_id, &interaction.token, &body).await?;
            }
            Ok(())
        }
        Some(ButtonAction::Answer { message_id, option }) => {
            answer(shared, interaction, &custom_id, &message_id, option).await
        }
        None => {
            tracing::debug!(custom_id, "a button that is not ours was clicked");
            Ok(())
        }
    }
}

/// Post the chosen option as the clicker's message, then show the buttons as answered.
async fn answer(
    shared: &Shared,
    interaction: &Interaction,
    custom_id: &str,
    message_id: &MessageId,
    option: usize,
) -> Result<(), super::rest::DiscordApiError> {
    let components = interaction.message.as_ref().map(|message| message.components.as_slice()).unwrap_or_default();
    let ephemeral = |text: &str| json!({ "type": callback::CHANNEL_MESSAGE, "data": { "content": fit_message(text), "flags": EPHEMERAL } });
    let (Some(actor), Some(channel_id)) = (interaction.actor(), interaction.channel_id()) else {
        return respond(shared, interaction, &ephemeral("⚠️ Who clicked where is unknown.")).await;
    };
    let Some(choice) = option_text(shared, message_id, option).await.or_else(|| button_label(components, custom_id))
    else {
        let body = ephemeral("⚠️ That question is no longer known; type your answer instead.");
        return respond(shared, interaction, &body).await;
    };

    let sender = inbound::display_name(actor, interaction.member.as_ref()).to_owned();
    let at = Utc.timestamp_millis_opt(wire::snowflake_unix_ms(interaction.id)).single().unwrap_or_else(Utc::now);
    let mut content = inbound::header(&sender, actor.id, at, shared.timezone);
    content.push_str(&choice);
    let info = shared.channel_info(channel_id).await;
    let parent_channel_id = match inbound::place_of(interaction.guild_id, info.as_ref()) {
        Place::Thread { parent_id } => parent_id,
        Place::Direct | Place::Channel { .. } => None,
    };
    let route = inbound::Route { channel_id, parent_channel_id, start_thread: false };
    let mut metadata: Metadata =
        inbound::metadata(&shared.config.id, 0, actor.id, channel_id, &route, interaction.guild_id);
    metadata.discord_message_id = None;
    metadata.extra.insert("discord_interaction_id".into(), Value::String(interaction.id.to_string()));
    let inbound = Inbound {
        chatbot_id: shared.config.id.clone(),
        channel_id: channel_id.to_string(),
        sender,
        content,
        // One answer per question: a second click (by anyone) is a duplicate.
        platform_key: Some(format!("answer-{message_id}")),
        session_id: None,
        files: Vec::new(),
        metadata,
    };
    let body = match ingest(&shared.gateway, &shared.staging, inbound).await {
        Ok(Ingested::Posted(_)) => {
            json!({ "type": callback::UPDATE_MESSAGE, "data": { "components": disabled_components(components, custom_id) } })
        }
        Ok(Ingested::Duplicate(_)) => ephemeral("This question was already answered."),
        Err(error) => {
            tracing::error!(%error, "ingesting a discord button answer failed");
            ephemeral(&format!("⚠️ Your answer was not passed on: {error}"))
        }
    };
    respond(shared, interaction, &body).await
}

/// Answer `interaction` (its one callback; follow-ups go through the webhook routes).
async fn respond(shared: &Shared, interaction: &Interaction, body: &Value) -> Result<(), super::rest::DiscordApiError> {
    shared.rest.interaction_callback(interaction.id, &interaction.token, body).await
}

/// Option `option` of the question in the agent's message `message_id`, read from the store.
async fn option_text(shared: &Shared, message_id: &MessageId, option: usize) -> Option<String> {
    let message = shared.gateway.store().get_message(message_id).await.ok()??;
    let (_, options) = answer::markers(&message.content).question?;
    options.into_iter().nth(option)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_command_is_registered_within_limits() {
        let commands = application_commands();
        let commands = commands.as_array().expect("array");
        assert_eq!(commands.len(), ChatCommand::ALL.len());
        for command in commands {
            let name = command["name"].as_str().expect("name");
            let description = command["description"].as_str().expect("description");
            assert!(
                !name.is_empty()
                    && name.len() <= 32
                    && name.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '-')
            );
            assert!(!description.is_empty() && description.chars().count() <= MAX_DESCRIPTION_CHARS);
            assert_eq!(command["type"], 1);
        }
    }

    #[test]
    fn answered_buttons_are_disabled_and_the_choice_marked() {
        let rows = vec![json!({"type": 1, "components": [
            {"type": 2, "style": 1, "label": "Yes", "custom_id": "kesoku:answer:m:0"},
            {"type": 2, "style": 1, "label": "No", "custom_id": "kesoku:answer:m:1"},
        ]})];
        let disabled = disabled_components(&rows, "kesoku:answer:m:1");
        assert_eq!(
            disabled,
            vec![json!({"type": 1, "components": [
                {"type": 2, "style": 1, "label": "Yes", "custom_id": "kesoku:answer:m:0", "disabled": true},
                {"type": 2, "style": 3, "label": "No", "custom_id": "kesoku:answer:m:1", "disabled": true},
            ]})]
        );
        assert_eq!(button_label(&rows, "kesoku:answer:m:1").as_deref(), Some("No"));
        assert_eq!(button_label(&rows, "kesoku:answer:m:7"), None);
    }

    #[test]
    fn long_replies_fit_a_message() {
        assert_eq!(fit_message("short"), "short");
        let cut = fit_message(&"é".repeat(2500));
        assert_eq!(cut.chars().count(), DISCORD_MAX_CHARS);
        assert!(cut.ends_with('…'));
    }
}
