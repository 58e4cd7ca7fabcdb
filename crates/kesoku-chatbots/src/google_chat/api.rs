//! One authenticated JSON call to a Google REST API, and how its failures are classified.
//!
//! Every call carries a bearer token from [`TokenSource`]; a 401 drops that token and the call
//! is made once more with a fresh one (a token revoked or expired early). Failures become
//! [`ApiError`]: transient (429, 5xx, timeouts, connection errors) or permanent (400, 403,
//! 404, 409 …), with Google's `error.status` and `error.message` in the reason.
//!
//! Not here: which endpoints exist ([`super::rest`], [`super::pubsub`]).

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use super::auth::{AuthError, TokenSource};
use crate::DeliveryError;

/// How long one call may take. A Pub/Sub pull waits up to ~90 s on the server, so it gets more.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a Google API call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// Worth trying again: rate limit, server error, timeout, connection lost, token endpoint down.
    #[error("{reason}")]
    Transient { status: Option<u16>, reason: String, retry_after: Option<Duration> },
    /// Trying again cannot help: a bad request, no permission, not found, already exists.
    #[error("{reason}")]
    Permanent { status: u16, reason: String },
    /// The credentials cannot give a token.
    #[error("authentication failed: {0}")]
    Auth(AuthError),
}

impl ApiError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Transient { status, .. } => *status,
            ApiError::Permanent { status, .. } => Some(*status),
            ApiError::Auth(AuthError::Refused { status, .. }) => Some(*status),
            ApiError::Auth(_) => None,
        }
    }

    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Transient { .. } => true,
            ApiError::Permanent { .. } => false,
            ApiError::Auth(error) => error.is_transient(),
        }
    }
}

impl From<ApiError> for DeliveryError {
    fn from(error: ApiError) -> Self {
        match error {
            ApiError::Transient { reason, retry_after, .. } => DeliveryError::Transient { reason, retry_after },
            auth @ ApiError::Auth(_) if auth.is_transient() => {
                DeliveryError::Transient { reason: auth.to_string(), retry_after: None }
            }
            other @ (ApiError::Permanent { .. } | ApiError::Auth(_)) => {
                DeliveryError::Permanent { reason: other.to_string() }
            }
        }
    }
}

/// Classify an HTTP failure from its status and body (Google's `{"error": {code, message, status}}`).
pub fn classify(status: u16, body: &str, retry_after: Option<Duration>, what: &str) -> ApiError {
    let detail = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|value| {
            let error = value.get("error")?;
            let code = error.get("status").and_then(Value::as_str).unwrap_or("");
            let message = error.get("message").and_then(Value::as_str).unwrap_or("");
            Some(format!("{code} {message}").trim().to_owned())
        })
        .unwrap_or_else(|| body.chars().take(200).collect());
    let reason = format!("{what} failed with HTTP {status}: {detail}");
    if status == 429 || status == 408 || status >= 500 {
        ApiError::Transient { status: Some(status), reason, retry_after }
    } else {
        ApiError::Permanent { status, reason }
    }
}

/// An authenticated JSON client.
#[derive(Debug, Clone)]
pub struct GoogleApi {
    http: reqwest::Client,
    tokens: Arc<TokenSource>,
}

impl GoogleApi {
    pub fn new(http: reqwest::Client, tokens: Arc<TokenSource>) -> Self {
        GoogleApi { http, tokens }
    }

    /// `method url` with `body` (JSON), answered with JSON (`{}` for an empty body).
    pub async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
        timeout: Duration,
        what: &str,
    ) -> Result<Value, ApiError> {
        let mut retried_auth = false;
        loop {
            let token = self.tokens.token().await.map_err(ApiError::Auth)?;
            let mut request = self.http.request(method.clone(), url).bearer_auth(token.expose()).timeout(timeout);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = match request.send().await {
                Ok(response) => response,
                Err(error) => {
                    return Err(ApiError::Transient {
                        status: None,
                        reason: format!("{what} failed: {}", describe(&error)),
                        retry_after: None,
                    });
                }
            };
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let text = match response.text().await {
                Ok(text) => text,
                Err(error) => {
                    return Err(ApiError::Transient {
                        status: Some(status),
                        reason: format!("{what}: reading the answer failed: {}", describe(&error)),
                        retry_after: None,
                    });
                }
            };
            if status == 401 && !retried_auth {
                tracing::debug!(what, "google refused the access token; fetching a new one");
                self.tokens.invalidate(&token);
                retried_auth = true;
                continue;
            }
            if !(200..300).contains(&status) {
                return Err(classify(status, &text, retry_after, what));
            }
            if text.trim().is_empty() {
                return Ok(Value::Object(serde_json::Map::new()));
            }
            return serde_json::from_str(&text).map_err(|error| ApiError::Permanent {
                status,
                reason: format!("{what}: the answer is not JSON: {error}"),
            });
        }
    }
}

/// A reqwest error's kind and text.
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "request error"
    };
    format!("{kind}: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified_by_status() {
        let body = r#"{"error": {"code": 404, "message": "Space not found.", "status": "NOT_FOUND"}}"#;
        let error = classify(404, body, None, "posting");
        assert_eq!(
            error,
            ApiError::Permanent {
                status: 404,
                reason: "posting failed with HTTP 404: NOT_FOUND Space not found.".into()
            }
        );
        assert!(classify(429, "", Some(Duration::from_secs(3)), "x").is_transient());
        assert!(classify(503, "oops", None, "x").is_transient());
        assert!(!classify(403, "{}", None, "x").is_transient());
        assert!(matches!(DeliveryError::from(classify(500, "", None, "x")), DeliveryError::Transient { .. }));
    }
}
