//! Service-account authentication: an RS256 JWT signed with the key file's private key,
//! exchanged at the key's own `token_uri` for a short-lived access token (OAuth 2.0 JWT bearer
//! grant, RFC 7523), cached and refreshed before it expires and again after a 401.
//!
//! The key file's JSON is parsed here ([`Credentials::from_json`]); reading the file (and
//! finding Application Default Credentials) is the binary's job. Secrets never reach logs or
//! `Debug` output: the private key and tokens print as `[redacted]`.
//!
//! Not here: which API a token is used for (one token carries both scopes).

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The scopes a Chat app needs: post as the app, and read its Pub/Sub subscription.
pub const SCOPES: &str = "https://www.googleapis.com/auth/chat.bot https://www.googleapis.com/auth/pubsub";
/// The longest lifetime Google accepts for an assertion.
const ASSERTION_LIFETIME_S: i64 = 3600;
/// Refresh this long before a token expires (at most; half the lifetime for short ones).
const REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// A secret string that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A service-account key as Google's console downloads it (the fields we use).
#[derive(Clone, Deserialize)]
pub struct ServiceAccountKey {
    pub client_email: String,
    #[serde(default)]
    pub private_key_id: Option<String>,
    private_key: String,
    #[serde(default = "default_token_uri")]
    pub token_uri: String,
    #[serde(default)]
    pub project_id: Option<String>,
}

fn default_token_uri() -> String {
    "https://oauth2.googleapis.com/token".to_owned()
}

impl fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .field("private_key", &"[redacted]")
            .finish_non_exhaustive()
    }
}

/// What a credentials file holds.
#[derive(Debug, Clone)]
pub enum Credentials {
    ServiceAccount(ServiceAccountKey),
}

/// Why credentials could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the credentials file is not valid JSON: {0}")]
    NotJson(String),
    #[error(
        "the credentials file is of type `{kind}`; a Google Chat app signs in as a service account: \
         download a JSON key of the app's service account (IAM & Admin → Service Accounts → Keys) and name it \
         in credentials_file or GOOGLE_APPLICATION_CREDENTIALS"
    )]
    NotServiceAccount { kind: String },
    #[error("the service-account key lacks `{field}`: download the key again from the Google Cloud console")]
    MissingField { field: &'static str },
    #[error("the service-account private key cannot be used for RS256: {0}")]
    BadKey(String),
    #[error("the token endpoint `{token_uri}` could not be reached: {reason}")]
    Unreachable { token_uri: String, reason: String },
    #[error("the token endpoint `{token_uri}` refused the service account ({status}): {reason}")]
    Refused { token_uri: String, status: u16, reason: String },
}

impl AuthError {
    /// Worth trying again later (the endpoint was down), as opposed to a key that is wrong.
    pub fn is_transient(&self) -> bool {
        match self {
            AuthError::Unreachable { .. } => true,
            AuthError::Refused { status, .. } => *status == 429 || *status >= 500,
            AuthError::NotJson(_)
            | AuthError::NotServiceAccount { .. }
            | AuthError::MissingField { .. }
            | AuthError::BadKey(_) => false,
        }
    }
}

impl Credentials {
    /// Parse a key file's contents.
    pub fn from_json(text: &str) -> Result<Credentials, AuthError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|error| AuthError::NotJson(error.to_string()))?;
        let kind = value.get("type").and_then(|kind| kind.as_str()).unwrap_or("service_account");
        if kind != "service_account" {
            return Err(AuthError::NotServiceAccount { kind: kind.to_owned() });
        }
        for field in ["client_email", "private_key"] {
            if value.get(field).and_then(|v| v.as_str()).is_none_or(str::is_empty) {
                return Err(AuthError::MissingField { field });
            }
        }
        let key: ServiceAccountKey =
            serde_json::from_value(value).map_err(|error| AuthError::NotJson(error.to_string()))?;
        EncodingKey::from_rsa_pem(key.private_key.as_bytes()).map_err(|error| AuthError::BadKey(error.to_string()))?;
        Ok(Credentials::ServiceAccount(key))
    }
}

/// The claims of the assertion.
#[derive(Debug, Serialize, Deserialize)]
pub struct AssertionClaims {
    pub iss: String,
    pub scope: String,
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
}

/// The signed assertion for `key`, issued at `now` (seconds since the epoch).
pub fn assertion(key: &ServiceAccountKey, now: i64) -> Result<String, AuthError> {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = key.private_key_id.clone();
    let claims = AssertionClaims {
        iss: key.client_email.clone(),
        scope: SCOPES.to_owned(),
        aud: key.token_uri.clone(),
        iat: now,
        exp: now + ASSERTION_LIFETIME_S,
    };
    let signing =
        EncodingKey::from_rsa_pem(key.private_key.as_bytes()).map_err(|e| AuthError::BadKey(e.to_string()))?;
    jsonwebtoken::encode(&header, &claims, &signing).map_err(|error| AuthError::BadKey(error.to_string()))
}

/// The token endpoint's answer.
#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

/// When a token living `lifetime` should be replaced: a minute early, or halfway for short ones.
pub fn refresh_after(lifetime: Duration) -> Duration {
    lifetime.saturating_sub(REFRESH_MARGIN.min(lifetime / 2))
}

#[derive(Clone)]
struct Cached {
    token: Secret,
    refresh_at: Instant,
}

/// Access tokens for one service account: fetched on demand, cached, refreshed early.
pub struct TokenSource {
    key: ServiceAccountKey,
    http: reqwest::Client,
    // Short sections only (read or replace the cached token), never held across an await.
    cached: Mutex<Option<Cached>>,
    /// One fetch at a time: callers arriving during a refresh wait for its token.
    fetching: tokio::sync::Mutex<()>,
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSource").field("client_email", &self.key.client_email).finish_non_exhaustive()
    }
}

impl TokenSource {
    pub fn new(credentials: Credentials, http: reqwest::Client) -> Self {
        let Credentials::ServiceAccount(key) = credentials;
        TokenSource { key, http, cached: Mutex::new(None), fetching: tokio::sync::Mutex::new(()) }
    }

    pub fn client_email(&self) -> &str {
        &self.key.client_email
    }

    fn current(&self) -> Option<Secret> {
        let cached = self.cached.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cached.as_ref().filter(|cached| Instant::now() < cached.refresh_at).map(|cached| cached.token.clone())
    }

    /// A token valid for a while yet.
    pub async fn token(&self) -> Result<Secret, AuthError> {
        if let Some(token) = self.current() {
            return Ok(token);
        }
        let _fetching = self.fetching.lock().await;
        if let Some(token) = self.current() {
            return Ok(token);
        }
        let (token, lifetime) = self.fetch().await?;
        let refresh_at = Instant::now() + refresh_after(lifetime);
        *self.cached.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some(Cached { token: token.clone(), refresh_at });
        Ok(token)
    }

    /// `token` was refused (401): forget it, unless a newer one replaced it already.
    pub fn invalidate(&self, token: &Secret) {
        let mut cached = self.cached.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cached.as_ref().is_some_and(|cached| cached.token == *token) {
            *cached = None;
        }
    }

    async fn fetch(&self) -> Result<(Secret, Duration), AuthError> {
        let token_uri = self.key.token_uri.clone();
        let now = chrono::Utc::now().timestamp();
        let assertion = assertion(&self.key, now)?;
        let body = format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={assertion}");
        let response = self
            .http
            .post(&token_uri)
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|error| AuthError::Unreachable { token_uri: token_uri.clone(), reason: error.to_string() })?;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        if status != 200 {
            let reason = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|value| {
                    let error = value.get("error")?.as_str()?.to_owned();
                    let description = value.get("error_description").and_then(|d| d.as_str()).unwrap_or("");
                    Some(format!("{error}: {description}"))
                })
                .unwrap_or_else(|| text.chars().take(200).collect());
            return Err(AuthError::Refused { token_uri, status, reason });
        }
        let parsed: TokenResponse = serde_json::from_str(&text).map_err(|error| AuthError::Refused {
            token_uri: token_uri.clone(),
            status,
            reason: format!("the answer is not a token: {error}"),
        })?;
        tracing::debug!(client_email = %self.key.client_email, expires_in = ?parsed.expires_in, "fetched a google access token");
        Ok((Secret::new(parsed.access_token), Duration::from_secs(parsed.expires_in.unwrap_or(3600))))
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_refreshed_early() {
        assert_eq!(refresh_after(Duration::from_secs(3599)), Duration::from_secs(3539));
        assert_eq!(refresh_after(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(refresh_after(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn credentials_name_what_is_wrong() {
        let user = Credentials::from_json(r#"{"type": "authorized_user", "refresh_token": "x"}"#).expect_err("user");
        assert!(user.to_string().contains("service account"), "{user}");
        let missing = Credentials::from_json(r#"{"type": "service_account", "client_email": "a@b"}"#).expect_err("key");
        assert_eq!(missing, AuthError::MissingField { field: "private_key" });
        assert!(matches!(Credentials::from_json("nope"), Err(AuthError::NotJson(_))));
        let bad = Credentials::from_json(r#"{"client_email": "a@b", "private_key": "not a pem"}"#).expect_err("pem");
        assert!(matches!(bad, AuthError::BadKey(_)));
    }

    #[test]
    fn secrets_do_not_print() {
        assert_eq!(format!("{:?}", Secret::new("ya29.secret")), "[redacted]");
    }
}
