//! Discord's JSON shapes of the fake's objects (users, members, channels, threads, guilds,
//! messages, the application), as the API documentation describes them and as REST answers
//! and gateway dispatches carry them. Only shapes: no rule of the fake lives here.

use serde_json::{Value, json};

use super::{
    ALL_PERMISSIONS, DM, FakeState, InteractionKind, PRIVATE_THREAD, PUBLIC_THREAD, StoredMessage, now_timestamp,
};
use crate::discord::{ChannelId, GuildId, UserId};

impl FakeState {
    pub(in crate::discord) fn user_json(&self, id: UserId) -> Value {
        let (name, display_name, bot) = match self.users.get(&id) {
            Some(user) => (user.name.as_str(), user.display_name.as_str(), user.bot),
            None => ("unknown", "unknown", false),
        };
        let mut user = json!({
            "id": id.to_string(),
            "username": name,
            "discriminator": "0",
            "global_name": if display_name == name { Value::Null } else { json!(display_name) },
            "avatar": null,
            "public_flags": 0,
            "flags": 0,
            "banner": null,
            "accent_color": null,
            "avatar_decoration_data": null,
            "collectibles": null,
            "primary_guild": null,
        });
        if bot {
            user["bot"] = json!(true);
        }
        user
    }

    pub(in crate::discord) fn current_user_json(&self) -> Value {
        let mut user = self.user_json(self.bot());
        user["bot"] = json!(true);
        user["mfa_enabled"] = json!(false);
        user["verified"] = json!(true);
        user["email"] = Value::Null;
        user["locale"] = json!("en-US");
        user["premium_type"] = json!(0);
        user
    }

    pub(in crate::discord) fn application_json(&self) -> Value {
        json!({
            "id": self.options.application_id.to_string(),
            "name": self.options.bot_name,
            "icon": null,
            "description": "",
            "summary": "",
            "type": null,
            "bot_public": true,
            "bot_require_code_grant": false,
            "verify_key": "0000000000000000000000000000000000000000000000000000000000000000",
            "flags": if self.options.message_content_intent_enabled { 1 << 19 } else { 0 },
            "hook": true,
            "is_monetized": false,
            "team": null,
            "owner": self.user_json(self.bot()),
            "bot": self.user_json(self.bot()),
            "redirect_uris": [],
            "interactions_endpoint_url": null,
            "tags": [],
        })
    }

    pub(in crate::discord) fn member_json(&self, guild: GuildId) -> Value {
        let joined_at = self.guilds.get(&guild).map_or_else(now_timestamp, |guild| guild.joined_at.clone());
        json!({
            "avatar": null,
            "banner": null,
            "communication_disabled_until": null,
            "deaf": false,
            "flags": 0,
            "joined_at": joined_at,
            "mute": false,
            "nick": null,
            "pending": false,
            "premium_since": null,
            "roles": [],
        })
    }

    pub(in crate::discord) fn channel_json(&self, id: ChannelId) -> Value {
        let Some(channel) = self.channels.get(&id) else {
            return Value::Null;
        };
        match channel.kind {
            DM => json!({
                "id": id.to_string(),
                "type": DM,
                "last_message_id": self.last_message(id),
                "flags": 0,
                "recipients": channel.recipient.map(|user| vec![self.user_json(user)]).unwrap_or_default(),
            }),
            PUBLIC_THREAD | PRIVATE_THREAD => self.thread_json(id),
            _ => json!({
                "id": id.to_string(),
                "type": channel.kind,
                "guild_id": channel.guild.map(|guild| guild.to_string()),
                "name": channel.name,
                "position": 0,
                "permission_overwrites": [],
                "parent_id": null,
                "topic": null,
                "nsfw": false,
                "last_message_id": self.last_message(id),
                "rate_limit_per_user": 0,
                "default_auto_archive_duration": channel.auto_archive_duration,
                "flags": 0,
            }),
        }
    }

    pub(in crate::discord) fn thread_json(&self, id: ChannelId) -> Value {
        let Some(channel) = self.channels.get(&id) else {
            return Value::Null;
        };
        let count =
            self.messages.get(&id).map_or(0, |messages| messages.iter().filter(|message| !message.deleted).count());
        let bot = self.bot();
        json!({
            "id": id.to_string(),
            "type": channel.kind,
            "guild_id": channel.guild.map(|guild| guild.to_string()),
            "parent_id": channel.parent.map(|parent| parent.to_string()),
            "owner_id": channel.owner.unwrap_or(bot).to_string(),
            "name": channel.name,
            "last_message_id": self.last_message(id),
            "rate_limit_per_user": 0,
            "message_count": count,
            "member_count": 1,
            "total_message_sent": count,
            "flags": 0,
            "thread_metadata": {
                "archived": false,
                "auto_archive_duration": channel.auto_archive_duration,
                "archive_timestamp": channel.created_at,
                "locked": false,
                "create_timestamp": channel.created_at,
            },
            "member": {
                "id": id.to_string(),
                "user_id": bot.to_string(),
                "join_timestamp": channel.created_at,
                "flags": 0,
            },
        })
    }

    pub(in crate::discord) fn last_message(&self, channel: ChannelId) -> Value {
        self.messages
            .get(&channel)
            .and_then(|messages| messages.last())
            .map_or(Value::Null, |message| json!(message.id.to_string()))
    }

    pub(in crate::discord) fn guild_json(&self, id: GuildId) -> Value {
        let Some(guild) = self.guilds.get(&id) else {
            return Value::Null;
        };
        let (threads, channels): (Vec<ChannelId>, Vec<ChannelId>) = self
            .channels
            .iter()
            .filter(|(_, channel)| channel.guild == Some(id))
            .map(|(channel_id, _)| *channel_id)
            .partition(|channel_id| {
                self.channels
                    .get(channel_id)
                    .is_some_and(|channel| matches!(channel.kind, PUBLIC_THREAD | PRIVATE_THREAD))
            });
        let members: Vec<Value> = self
            .users
            .keys()
            .map(|user| {
                let mut member = self.member_json(id);
                member["user"] = self.user_json(*user);
                member
            })
            .collect();
        let mut json = json!({
            "id": id.to_string(),
            "name": guild.name,
            "icon": null,
            "splash": null,
            "discovery_splash": null,
            "banner": null,
            "description": null,
            "owner_id": self.users.keys().find(|user| **user != self.bot()).unwrap_or(&self.bot()).to_string(),
            "afk_channel_id": null,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "roles": [{
                "id": id.to_string(),
                "name": "@everyone",
                "color": 0,
                "colors": {"primary_color": 0, "secondary_color": null, "tertiary_color": null},
                "hoist": false,
                "icon": null,
                "unicode_emoji": null,
                "position": 0,
                "permissions": ALL_PERMISSIONS,
                "managed": false,
                "mentionable": false,
                "flags": 0,
            }],
            "emojis": [],
            "stickers": [],
            "features": [],
        });
        let rest = json!({
            "mfa_level": 0,
            "application_id": null,
            "system_channel_id": null,
            "system_channel_flags": 0,
            "rules_channel_id": null,
            "public_updates_channel_id": null,
            "safety_alerts_channel_id": null,
            "vanity_url_code": null,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": false,
            "preferred_locale": "en-US",
            "nsfw_level": 0,
            "nsfw": false,
            "max_members": 500000,
            "max_video_channel_users": 25,
            "joined_at": guild.joined_at,
            "large": false,
            "unavailable": false,
            "lazy": true,
            "member_count": members.len(),
            "members": members,
            "channels": channels.iter().map(|channel| {
                let mut json = self.channel_json(*channel);
                // GUILD_CREATE's channels carry no guild_id.
                if let Some(object) = json.as_object_mut() {
                    object.remove("guild_id");
                }
                json
            }).collect::<Vec<_>>(),
            "threads": threads.iter().map(|thread| self.thread_json(*thread)).collect::<Vec<_>>(),
            "voice_states": [],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "embedded_activities": [],
        });
        if let (Some(json), Value::Object(rest)) = (json.as_object_mut(), rest) {
            json.extend(rest);
        }
        json
    }

    /// A message as REST answers it, or (`gateway`) as MESSAGE_CREATE carries it, with
    /// `guild_id` and the author's `member`.
    pub(in crate::discord) fn message_json(&self, message: &StoredMessage, gateway: bool) -> Value {
        let guild = self.channels.get(&message.channel).and_then(|channel| channel.guild);
        let mentions: Vec<Value> = message
            .mentions
            .iter()
            .map(|user| {
                let mut json = self.user_json(*user);
                if gateway && let Some(guild) = guild {
                    json["member"] = self.member_json(guild);
                }
                json
            })
            .collect();
        let kind = if message.reply_to.is_some() {
            19
        } else if message.interaction.is_some_and(|id| {
            self.interactions.get(&id).is_some_and(|interaction| interaction.kind == InteractionKind::Command)
        }) {
            20
        } else {
            0
        };
        let mut json = json!({
            "id": message.id.to_string(),
            "channel_id": message.channel.to_string(),
            "author": self.user_json(message.author),
            "content": message.content,
            "timestamp": message.timestamp,
            "edited_timestamp": message.edited_timestamp,
            "tts": false,
            "mention_everyone": false,
            "mentions": mentions,
            "mention_roles": [],
            "attachments": message.attachments.iter().map(|attachment| {
                let mut json = json!({
                    "id": attachment.id.to_string(),
                    "filename": attachment.filename,
                    "size": attachment.size,
                    "url": attachment.url,
                    "proxy_url": attachment.url,
                });
                if let Some(content_type) = &attachment.content_type {
                    json["content_type"] = json!(content_type);
                }
                json
            }).collect::<Vec<_>>(),
            "embeds": message.embeds,
            "components": message.components,
            "pinned": false,
            "type": kind,
            "flags": message.flags,
        });
        if let Some(nonce) = &message.nonce {
            json["nonce"] = nonce.clone();
        }
        if let Some(reply_to) = message.reply_to {
            let mut reference =
                json!({"type": 0, "message_id": reply_to.to_string(), "channel_id": message.channel.to_string()});
            if let Some(guild) = guild {
                reference["guild_id"] = json!(guild.to_string());
            }
            json["message_reference"] = reference;
            if let Some(referenced) = self.find_message(message.channel, reply_to) {
                json["referenced_message"] = self.message_json(referenced, false);
            }
        }
        if let Some(interaction) =
            message.interaction.and_then(|id| self.interactions.get(&id).map(|stored| (id, stored)))
        {
            let (id, stored) = interaction;
            json["application_id"] = json!(self.options.application_id.to_string());
            json["webhook_id"] = json!(self.options.application_id.to_string());
            json["interaction_metadata"] = json!({
                "id": id.to_string(),
                "type": if stored.kind == InteractionKind::Command { 2 } else { 3 },
                "user": self.user_json(stored.user),
                "authorizing_integration_owners": {},
            });
        }
        if let Some(thread) = message.thread {
            json["thread"] = self.thread_json(thread);
        }
        if gateway && let Some(guild) = guild {
            json["guild_id"] = json!(guild.to_string());
            if message.interaction.is_none() {
                json["member"] = self.member_json(guild);
            }
        }
        json
    }
}
