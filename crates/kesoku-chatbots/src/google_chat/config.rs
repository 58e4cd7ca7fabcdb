//! `[[chatbots.google_chat]]`: which Pub/Sub subscription one Google Chat app reads, where its
//! REST calls go, and whom it answers.
//!
//! Every key but `subscription` has a default and unknown keys are refused, like every table of
//! `kesoku.toml`. `chat_base_url` and `pubsub_base_url` exist so tests, proxies and private
//! deployments can point the adapter at another server; the token endpoint is the service-account
//! key's own `token_uri`. The key itself is never in this file: `credentials_file` names it (or
//! Application Default Credentials are used), and the binary reads it.
//!
//! This module parses and checks; it does no I/O and reads no environment.

use std::str::FromStr;

use chrono_tz::Tz;
use serde::Deserialize;

/// One `[[chatbots.google_chat]]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GoogleChatConfig {
    /// The `chatbot_id` of this app's messages.
    pub id: String,
    /// The Chat REST API's address (`{chat_base_url}/v1/spaces/…`).
    pub chat_base_url: String,
    /// The Cloud Pub/Sub REST API's address (`{pubsub_base_url}/v1/projects/…`).
    pub pubsub_base_url: String,
    /// The subscription the Chat app's topic delivers to: `projects/P/subscriptions/S`.
    pub subscription: String,
    /// A service-account key (JSON) to authenticate with; absent: Application Default
    /// Credentials (`GOOGLE_APPLICATION_CREDENTIALS`, then gcloud's well-known file).
    pub credentials_file: Option<String>,
    /// User resource names (`users/123…`) or emails answered; empty: everyone in the spaces the
    /// app was added to.
    pub allowed_users: Vec<String>,
    /// IANA time zone of the times the agent sees for this app's messages.
    pub timezone: String,
}

impl Default for GoogleChatConfig {
    fn default() -> Self {
        GoogleChatConfig {
            id: "google_chat".to_owned(),
            chat_base_url: "https://chat.googleapis.com".to_owned(),
            pubsub_base_url: "https://pubsub.googleapis.com".to_owned(),
            subscription: String::new(),
            credentials_file: None,
            allowed_users: Vec::new(),
            timezone: "UTC".to_owned(),
        }
    }
}

/// What is wrong with a `[[chatbots.google_chat]]` table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoogleChatConfigError {
    #[error(
        "chatbot `{id}`: subscription is missing or malformed (`{subscription}`): write the Pub/Sub subscription \
         the Chat app publishes to, as `projects/PROJECT/subscriptions/NAME`"
    )]
    Subscription { id: String, subscription: String },
    #[error("chatbot `{id}`: {key} `{url}` must start with `http://` or `https://` and name a host")]
    BaseUrl { id: String, key: &'static str, url: String },
    #[error(
        "chatbot `{id}`: timezone `{timezone}` is not an IANA time zone name (for example `Europe/Paris` or `UTC`)"
    )]
    Timezone { id: String, timezone: String },
    #[error(
        "chatbot `{id}`: credentials_file must name a file (or leave it out to use Application Default Credentials)"
    )]
    CredentialsFile { id: String },
    #[error("chatbot `{id}`: allowed_users entry `{user}` is neither a user resource name (`users/123…`) nor an email")]
    AllowedUser { id: String, user: String },
}

impl GoogleChatConfig {
    /// Check every key; returns the parsed time zone.
    pub fn validate(&self) -> Result<Tz, GoogleChatConfigError> {
        let parts: Vec<&str> = self.subscription.trim().split('/').collect();
        let well_formed = parts.len() == 4
            && parts[0] == "projects"
            && parts[2] == "subscriptions"
            && !parts[1].is_empty()
            && !parts[3].is_empty();
        if !well_formed {
            return Err(GoogleChatConfigError::Subscription {
                id: self.id.clone(),
                subscription: self.subscription.clone(),
            });
        }
        for (key, url) in [("chat_base_url", &self.chat_base_url), ("pubsub_base_url", &self.pubsub_base_url)] {
            if !is_http_url(url) {
                return Err(GoogleChatConfigError::BaseUrl { id: self.id.clone(), key, url: url.clone() });
            }
        }
        if self.credentials_file.as_deref().is_some_and(|file| file.trim().is_empty()) {
            return Err(GoogleChatConfigError::CredentialsFile { id: self.id.clone() });
        }
        if let Some(user) = self.allowed_users.iter().find(|user| !is_chat_user(user)) {
            return Err(GoogleChatConfigError::AllowedUser { id: self.id.clone(), user: user.clone() });
        }
        self.timezone()
    }

    /// The configured time zone.
    pub fn timezone(&self) -> Result<Tz, GoogleChatConfigError> {
        Tz::from_str(self.timezone.trim())
            .map_err(|_| GoogleChatConfigError::Timezone { id: self.id.clone(), timezone: self.timezone.clone() })
    }
}

/// `http(s)://host…` with a non-empty host.
pub(crate) fn is_http_url(url: &str) -> bool {
    let url = url.trim();
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    rest.is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
}

fn is_chat_user(user: &str) -> bool {
    let user = user.trim();
    user.strip_prefix("users/").is_some_and(|id| !id.is_empty()) || (user.contains('@') && !user.starts_with('@'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<GoogleChatConfig, String> {
        toml::from_str::<GoogleChatConfig>(text).map_err(|error| error.to_string())
    }

    #[test]
    fn defaults_and_the_required_subscription() {
        let config = parse("subscription = \"projects/p/subscriptions/s\"").expect("parses");
        assert_eq!(config.id, "google_chat");
        assert_eq!(config.chat_base_url, "https://chat.googleapis.com");
        assert_eq!(config.pubsub_base_url, "https://pubsub.googleapis.com");
        assert_eq!(config.validate(), Ok(Tz::UTC));
        let missing = parse("").expect("parses").validate().expect_err("no subscription");
        assert!(missing.to_string().contains("projects/PROJECT/subscriptions/NAME"), "{missing}");
        let error = parse("subscripton = \"x\"").expect_err("typo refused");
        assert!(error.contains("subscripton"), "{error}");
    }

    #[test]
    fn bad_values_name_the_fix() {
        let base =
            GoogleChatConfig { subscription: "projects/p/subscriptions/s".into(), ..GoogleChatConfig::default() };
        let url = GoogleChatConfig { pubsub_base_url: "pubsub.googleapis.com".into(), ..base.clone() };
        assert!(matches!(url.validate(), Err(GoogleChatConfigError::BaseUrl { key: "pubsub_base_url", .. })));
        let user = GoogleChatConfig { allowed_users: vec!["chii".into()], ..base.clone() };
        assert!(matches!(user.validate(), Err(GoogleChatConfigError::AllowedUser { .. })));
        let ok = GoogleChatConfig {
            allowed_users: vec!["users/1234".into(), "chii@example.com".into()],
            timezone: "Asia/Tokyo".into(),
            ..base.clone()
        };
        assert_eq!(ok.validate(), Ok(chrono_tz::Asia::Tokyo));
        let zone = GoogleChatConfig { timezone: "Mars/Olympus".into(), ..base };
        assert!(zone.validate().expect_err("unknown zone").to_string().contains("IANA"));
    }
}
