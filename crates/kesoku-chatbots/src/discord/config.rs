//! `[[chatbots.discord]]`: what one Discord bot connects to and whom it answers.
//!
//! Every key is optional and unknown keys are refused, like every table of `kesoku.toml`.
//! `api_base_url` and `gateway_url` exist so tests and proxies can point the adapter at another
//! server; nothing else here changes the protocol. The bot token is never in the file: the file
//! names the environment variable holding it (`token_env`), the binary reads that variable and
//! hands the value over as a [`DiscordToken`], which cannot be printed.
//!
//! This module parses and checks; it does no I/O and reads no environment.

use std::fmt;
use std::str::FromStr;

use chrono_tz::Tz;
use serde::Deserialize;

/// Largest attachment downloaded by default: what staging accepts by default (25 MB).
pub const DEFAULT_MAX_ATTACHMENT_BYTES: u64 = crate::staging::DEFAULT_MAX_FILE_BYTES;

/// One `[[chatbots.discord]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscordConfig {
    /// The `chatbot_id` of this bot's messages.
    pub id: String,
    /// Environment variable holding the bot token.
    pub token_env: String,
    /// Discord's address; REST is at `{api_base_url}/api/v10`.
    pub api_base_url: String,
    /// Gateway websocket URL; default: the one `GET /gateway/bot` names.
    pub gateway_url: Option<String>,
    /// User ids (as strings) answered without mentioning the bot. Empty: everyone is.
    pub allowed_users: Vec<String>,
    /// IANA time zone of the timestamp in each message's header (`Asia/Singapore`).
    pub timezone: String,
    /// Largest attachment downloaded, in bytes; larger ones are named in the message instead.
    pub max_attachment_bytes: u64,
    /// Per-channel overrides, first match wins.
    pub channels: Vec<ChannelOverride>,
}

impl Default for DiscordConfig {
    fn default() -> Self {
        DiscordConfig {
            id: "discord".to_owned(),
            token_env: "DISCORD_TOKEN".to_owned(),
            api_base_url: "https://discord.com".to_owned(),
            gateway_url: None,
            allowed_users: Vec::new(),
            timezone: "UTC".to_owned(),
            max_attachment_bytes: DEFAULT_MAX_ATTACHMENT_BYTES,
            channels: Vec::new(),
        }
    }
}

/// A `[[chatbots.discord.channels]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ChannelOverride {
    /// Channel ids or names (`general` or `#general`) this entry applies to.
    pub channels: Vec<String>,
    /// Whether a message in a text channel starts a thread the agent answers in (default true).
    pub auto_thread: Option<bool>,
    /// The model sessions of these channels use (a `[models.NAME]` key).
    pub model: Option<String>,
}

/// What is wrong with a `[[chatbots.discord]]` table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscordConfigError {
    #[error(
        "chatbot `{id}`: timezone `{timezone}` is not an IANA time zone name (for example `Europe/Paris` or `UTC`)"
    )]
    Timezone { id: String, timezone: String },
    #[error("chatbot `{id}`: api_base_url `{url}` must start with `http://` or `https://` and name a host")]
    ApiBaseUrl { id: String, url: String },
    #[error("chatbot `{id}`: gateway_url `{url}` must start with `ws://` or `wss://`")]
    GatewayUrl { id: String, url: String },
    #[error("chatbot `{id}`: allowed_users entry `{user}` is not a Discord user id (digits only)")]
    AllowedUser { id: String, user: String },
    #[error("chatbot `{id}`: a `[[chatbots.discord.channels]]` entry lists no channels")]
    EmptyOverride { id: String },
    #[error("chatbot `{id}`: token_env must name an environment variable")]
    TokenEnv { id: String },
}

/// Where REST requests go, in the form twilight-http takes (`ClientBuilder::proxy`): the
/// host (with port and any path prefix) and whether to speak plain HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestTarget {
    pub host: String,
    pub use_http: bool,
}

impl DiscordConfig {
    /// Check every key; returns the parsed time zone.
    pub fn validate(&self) -> Result<Tz, DiscordConfigError> {
        if self.token_env.trim().is_empty() {
            return Err(DiscordConfigError::TokenEnv { id: self.id.clone() });
        }
        self.rest_target()?;
        if let Some(url) = &self.gateway_url
            && !(url.starts_with("ws://") || url.starts_with("wss://"))
        {
            return Err(DiscordConfigError::GatewayUrl { id: self.id.clone(), url: url.clone() });
        }
        if let Some(user) = self.allowed_users.iter().find(|user| !is_snowflake(user)) {
            return Err(DiscordConfigError::AllowedUser { id: self.id.clone(), user: user.clone() });
        }
        if self.channels.iter().any(|entry| entry.channels.is_empty()) {
            return Err(DiscordConfigError::EmptyOverride { id: self.id.clone() });
        }
        self.timezone()
    }

    /// The configured time zone.
    pub fn timezone(&self) -> Result<Tz, DiscordConfigError> {
        Tz::from_str(self.timezone.trim())
            .map_err(|_| DiscordConfigError::Timezone { id: self.id.clone(), timezone: self.timezone.clone() })
    }

    /// `api_base_url` split for twilight-http.
    pub fn rest_target(&self) -> Result<RestTarget, DiscordConfigError> {
        let url = self.api_base_url.trim().trim_end_matches('/');
        let (host, use_http) = if let Some(host) = url.strip_prefix("http://") {
            (host, true)
        } else if let Some(host) = url.strip_prefix("https://") {
            (host, false)
        } else {
            return Err(DiscordConfigError::ApiBaseUrl { id: self.id.clone(), url: self.api_base_url.clone() });
        };
        if host.is_empty() || host.starts_with('/') {
            return Err(DiscordConfigError::ApiBaseUrl { id: self.id.clone(), url: self.api_base_url.clone() });
        }
        Ok(RestTarget { host: host.to_owned(), use_http })
    }

    /// The REST root, `{api_base_url}/api/v10`.
    pub fn rest_root(&self) -> String {
        format!("{}/api/v10", self.api_base_url.trim().trim_end_matches('/'))
    }

    /// The first override naming the channel by id or by name.
    pub fn channel_override(&self, channel_id: u64, channel_name: Option<&str>) -> Option<&ChannelOverride> {
        let id = channel_id.to_string();
        self.channels.iter().find(|entry| {
            entry.channels.iter().any(|wanted| {
                let wanted = wanted.trim();
                wanted == id
                    || channel_name.is_some_and(|name| wanted.trim_start_matches('#').eq_ignore_ascii_case(name))
            })
        })
    }

    /// Whether a message in this guild text channel starts a thread (default yes).
    pub fn auto_thread(&self, channel_id: u64, channel_name: Option<&str>) -> bool {
        self.channel_override(channel_id, channel_name).and_then(|entry| entry.auto_thread).unwrap_or(true)
    }

    /// The model override for this channel, if any.
    pub fn model(&self, channel_id: u64, channel_name: Option<&str>) -> Option<&str> {
        self.channel_override(channel_id, channel_name).and_then(|entry| entry.model.as_deref())
    }

    /// Whether `user_id` is on a non-empty allow-list (`None`: there is no allow-list).
    pub fn is_allowed(&self, user_id: u64) -> Option<bool> {
        if self.allowed_users.is_empty() {
            return None;
        }
        let id = user_id.to_string();
        Some(self.allowed_users.iter().any(|allowed| allowed.trim() == id))
    }
}

fn is_snowflake(text: &str) -> bool {
    let text = text.trim();
    !text.is_empty() && text.len() <= 20 && text.bytes().all(|b| b.is_ascii_digit())
}

/// A Discord bot token. `Debug` and `Display` print `[redacted]`; it is deliberately not
/// `Serialize`. The only way to the value is [`DiscordToken::expose`], used where the token is
/// handed to twilight (which keeps it out of its own `Debug` too).
#[derive(Clone, PartialEq, Eq)]
pub struct DiscordToken(String);

impl DiscordToken {
    /// The token as the Developer Portal shows it; a leading `Bot ` is accepted and dropped.
    pub fn new(value: impl Into<String>) -> Self {
        let value = value.into();
        let trimmed = value.trim();
        let bare = trimmed.strip_prefix("Bot ").unwrap_or(trimmed);
        DiscordToken(bare.trim().to_owned())
    }

    /// The bare token (without `Bot `).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Replace every occurrence of the token in `text` with `[redacted]`, for error texts that
    /// might echo a request.
    pub fn scrub(&self, text: &str) -> String {
        if self.0.len() < 8 {
            // A string this short is no real token; replacing it would mangle unrelated text.
            return text.to_owned();
        }
        text.replace(&self.0, "[redacted]")
    }
}

impl fmt::Debug for DiscordToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for DiscordToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DiscordConfig, String> {
        toml::from_str::<DiscordConfig>(text).map_err(|error| error.to_string())
    }

    #[test]
    fn every_key_has_a_default() {
        let config = parse("").expect("empty table parses");
        assert_eq!(config, DiscordConfig::default());
        assert_eq!(config.id, "discord");
        assert_eq!(config.token_env, "DISCORD_TOKEN");
        assert_eq!(config.rest_root(), "https://discord.com/api/v10");
        assert_eq!(config.validate(), Ok(Tz::UTC));
        assert_eq!(config.rest_target(), Ok(RestTarget { host: "discord.com".into(), use_http: false }));
    }

    #[test]
    fn unknown_keys_are_refused() {
        let error = parse("tokn_env = \"X\"").expect_err("typo refused");
        assert!(error.contains("tokn_env"), "{error}");
        let error =
            parse("[[channels]]\nchannels = [\"1\"]\nautothread = false").expect_err("typo in an override refused");
        assert!(error.contains("autothread"), "{error}");
    }

    #[test]
    fn local_http_base_url_goes_through_the_proxy_setting() {
        let config = DiscordConfig { api_base_url: "http://127.0.0.1:4567/".into(), ..DiscordConfig::default() };
        assert_eq!(config.rest_target(), Ok(RestTarget { host: "127.0.0.1:4567".into(), use_http: true }));
        assert_eq!(config.rest_root(), "http://127.0.0.1:4567/api/v10");
        let bad = DiscordConfig { api_base_url: "discord.com".into(), ..DiscordConfig::default() };
        assert!(matches!(bad.validate(), Err(DiscordConfigError::ApiBaseUrl { .. })));
    }

    #[test]
    fn bad_values_name_the_fix() {
        let zone = DiscordConfig { timezone: "Mars/Olympus".into(), ..DiscordConfig::default() };
        let error = zone.validate().expect_err("unknown zone");
        assert!(error.to_string().contains("IANA"), "{error}");
        let users = DiscordConfig { allowed_users: vec!["@chii".into()], ..DiscordConfig::default() };
        assert!(matches!(users.validate(), Err(DiscordConfigError::AllowedUser { .. })));
        let gateway = DiscordConfig { gateway_url: Some("http://x".into()), ..DiscordConfig::default() };
        assert!(matches!(gateway.validate(), Err(DiscordConfigError::GatewayUrl { .. })));
        let zone = DiscordConfig { timezone: "Asia/Singapore".into(), ..DiscordConfig::default() };
        assert_eq!(zone.validate(), Ok(chrono_tz::Asia::Singapore));
    }

    #[test]
    fn overrides_match_by_id_or_name_first_wins() {
        let config = DiscordConfig {
            channels: vec![
                ChannelOverride { channels: vec!["#General".into()], auto_thread: Some(false), model: None },
                ChannelOverride {
                    channels: vec!["42".into(), "general".into()],
                    auto_thread: None,
                    model: Some("fast".into()),
                },
            ],
            ..DiscordConfig::default()
        };
        assert!(!config.auto_thread(7, Some("general")));
        assert_eq!(config.model(7, Some("general")), None);
        assert!(config.auto_thread(42, None));
        assert_eq!(config.model(42, Some("random")), Some("fast"));
        assert!(config.auto_thread(8, Some("random")));
        assert!(config.channel_override(8, None).is_none());
    }

    #[test]
    fn allow_list_lookup() {
        let open = DiscordConfig::default();
        assert_eq!(open.is_allowed(1), None);
        let closed = DiscordConfig { allowed_users: vec![" 112233 ".into()], ..DiscordConfig::default() };
        assert_eq!(closed.is_allowed(112233), Some(true));
        assert_eq!(closed.is_allowed(1), Some(false));
    }

    #[test]
    fn token_never_prints() {
        let token = DiscordToken::new("Bot MTIzNDU2Nzg5.abc.def");
        assert_eq!(token.expose(), "MTIzNDU2Nzg5.abc.def");
        assert_eq!(format!("{token:?} {token}"), "[redacted] [redacted]");
        assert_eq!(token.scrub("sent MTIzNDU2Nzg5.abc.def!"), "sent [redacted]!");
    }
}
