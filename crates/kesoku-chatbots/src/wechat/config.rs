//! `[[chatbots.wechat]]`: which iLink bot account one WeChat chatbot speaks as, where its calls
//! go, and whom it answers.
//!
//! Every key has a default and unknown keys are refused, like every table of `kesoku.toml`.
//! `base_url` and `cdn_base_url` exist so tests, proxies and private deployments can point the
//! adapter at another server. The bot token is never in this file: it is the one `kesoku wechat
//! pair` stored (outside the config, mode 0600), or the value of the environment variable
//! `token_env` names, which the binary reads.
//!
//! This module parses and checks; it does no I/O and reads no environment.

use std::str::FromStr;

use chrono_tz::Tz;
use serde::Deserialize;

use crate::google_chat::config::is_http_url;

/// One `[[chatbots.wechat]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WeChatConfig {
    /// The `chatbot_id` of this account's messages.
    pub id: String,
    /// The iLink bot API's address.
    pub base_url: String,
    /// The media CDN's address (downloads and uploads of encrypted media).
    pub cdn_base_url: String,
    /// An environment variable holding a bot token (for automation); absent: the token stored
    /// by `kesoku wechat pair`.
    pub token_env: Option<String>,
    /// WeChat user ids answered; empty: only the account that paired.
    pub allowed_users: Vec<String>,
    /// IANA time zone of the times the agent sees for this account's messages.
    pub timezone: String,
}

impl Default for WeChatConfig {
    fn default() -> Self {
        WeChatConfig {
            id: "wechat".to_owned(),
            base_url: "https://ilinkai.weixin.qq.com".to_owned(),
            cdn_base_url: DEFAULT_CDN_BASE_URL.to_owned(),
            token_env: None,
            allowed_users: Vec::new(),
            timezone: "UTC".to_owned(),
        }
    }
}

/// The media CDN the reference client (`@tencent-weixin/openclaw-weixin`) uses.
pub const DEFAULT_CDN_BASE_URL: &str = "https://novac2c.cdn.weixin.qq.com/c2c";

/// What is wrong with a `[[chatbots.wechat]]` table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WeChatConfigError {
    #[error("chatbot `{id}`: {key} `{url}` must start with `http://` or `https://` and name a host")]
    BaseUrl { id: String, key: &'static str, url: String },
    #[error(
        "chatbot `{id}`: timezone `{timezone}` is not an IANA time zone name (for example `Asia/Shanghai` or `UTC`)"
    )]
    Timezone { id: String, timezone: String },
    #[error(
        "chatbot `{id}`: token_env must name an environment variable (or leave it out to use `kesoku wechat pair`)"
    )]
    TokenEnv { id: String },
    #[error("chatbot `{id}`: allowed_users must not contain an empty user id")]
    AllowedUser { id: String },
}

impl WeChatConfig {
    /// Check every key; returns the parsed time zone.
    pub fn validate(&self) -> Result<Tz, WeChatConfigError> {
        for (key, url) in [("base_url", &self.base_url), ("cdn_base_url", &self.cdn_base_url)] {
            if !is_http_url(url) {
                return Err(WeChatConfigError::BaseUrl { id: self.id.clone(), key, url: url.clone() });
            }
        }
        if self.token_env.as_deref().is_some_and(|name| name.trim().is_empty()) {
            return Err(WeChatConfigError::TokenEnv { id: self.id.clone() });
        }
        if self.allowed_users.iter().any(|user| user.trim().is_empty()) {
            return Err(WeChatConfigError::AllowedUser { id: self.id.clone() });
        }
        self.timezone()
    }

    /// The configured time zone.
    pub fn timezone(&self) -> Result<Tz, WeChatConfigError> {
        Tz::from_str(self.timezone.trim())
            .map_err(|_| WeChatConfigError::Timezone { id: self.id.clone(), timezone: self.timezone.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checks() {
        let config = toml::from_str::<WeChatConfig>("").expect("empty table parses");
        assert_eq!(config, WeChatConfig::default());
        assert_eq!(config.id, "wechat");
        assert_eq!(config.validate(), Ok(Tz::UTC));
        let error = toml::from_str::<WeChatConfig>("base_ur = \"x\"").expect_err("typo refused").to_string();
        assert!(error.contains("base_ur"), "{error}");
        let cdn = WeChatConfig { cdn_base_url: "cdn".into(), ..WeChatConfig::default() };
        assert!(matches!(cdn.validate(), Err(WeChatConfigError::BaseUrl { key: "cdn_base_url", .. })));
        let env = WeChatConfig { token_env: Some(" ".into()), ..WeChatConfig::default() };
        assert!(matches!(env.validate(), Err(WeChatConfigError::TokenEnv { .. })));
        let zone = WeChatConfig { timezone: "Asia/Shanghai".into(), ..WeChatConfig::default() };
        assert_eq!(zone.validate(), Ok(chrono_tz::Asia::Shanghai));
    }
}
