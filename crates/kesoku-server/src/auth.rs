//! Who may talk to the server: the bearer token, the bind check, and the Host guard.
//!
//! - With a token configured, every route except `/healthz`, `/readyz` and the console's static
//!   files needs `Authorization: Bearer <token>`; the event stream also accepts
//!   `?access_token=<token>` because a browser's `EventSource` cannot set headers. Tokens are
//!   compared in constant time (over SHA-256 digests, so the length leaks nothing either).
//! - Without a token the server must listen on loopback ([`check_bind`]), and requests whose
//!   `Host` is not a loopback name are refused, so a web page cannot reach the API through DNS
//!   rebinding.
//!
//! This module does not read the environment: the binary hands over the token value.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::header;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ErrorCode, ServerError, error_response};
use crate::server::AppState;

/// Path of the one route that accepts the token as a query parameter.
pub(crate) const EVENTS_PATH: &str = "/v1/events";
/// The query parameter carrying the token on [`EVENTS_PATH`].
pub const ACCESS_TOKEN_PARAM: &str = "access_token";

/// The API token. It never prints (`Debug` shows `[redacted]`, there is no `Display`) and is
/// not `Serialize`; the only thing it can do is say whether a candidate matches.
#[derive(Clone)]
pub struct Token {
    digest: Arc<[u8; 32]>,
}

impl Token {
    /// Wrap a token value. It must be non-empty, printable ASCII without spaces (it travels in a
    /// header and a URL).
    pub fn new(value: impl AsRef<str>) -> Result<Token, ServerError> {
        let value = value.as_ref();
        if value.is_empty() {
            return Err(ServerError::BadToken { reason: "it is empty" });
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ServerError::BadToken {
                reason: "it must be printable ascii without spaces (it is sent in a header)",
            });
        }
        Ok(Token { digest: Arc::new(digest(value)) })
    }

    /// Whether `candidate` is this token, in time independent of where they differ.
    pub fn matches(&self, candidate: &str) -> bool {
        let candidate = digest(candidate);
        bool::from(self.digest.as_slice().ct_eq(candidate.as_slice()))
    }
}

fn digest(value: &str) -> [u8; 32] {
    Sha256::digest(value.as_bytes()).into()
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token([redacted])")
    }
}

/// Refuse to listen beyond loopback without a token.
pub fn check_bind(addr: SocketAddr, token: Option<&Token>) -> Result<(), ServerError> {
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(ServerError::TokenRequired { addr });
    }
    Ok(())
}

/// The bearer token of a request, from the header or (events route only) the query.
fn presented_token(request: &Request) -> Option<String> {
    if let Some(value) = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let mut parts = value.trim().splitn(2, ' ');
        let scheme = parts.next().unwrap_or_default();
        let token = parts.next().unwrap_or_default().trim();
        if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() {
            return Some(token.to_owned());
        }
        return None;
    }
    if request.uri().path() == EVENTS_PATH {
        let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(request.uri()).ok()?.0;
        return pairs.into_iter().find(|(key, _)| key == ACCESS_TOKEN_PARAM).map(|(_, value)| value);
    }
    None
}

/// Middleware for the protected routes: with a token configured, the request must present it.
pub(crate) async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(request).await;
    };
    match presented_token(&request) {
        Some(candidate) if token.matches(&candidate) => next.run(request).await,
        Some(_) => error_response(ErrorCode::Unauthorized, "the bearer token is wrong"),
        None => error_response(
            ErrorCode::Unauthorized,
            "this route needs `Authorization: Bearer <token>` (the token configured with [http] token_env)",
        ),
    }
}

/// Whether a `Host` header value names this machine.
fn is_local_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [::1]:8787
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _port)| name)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Middleware for every route when no token is configured: only local `Host` names.
pub(crate) async fn guard_host(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.token.is_some() {
        return next.run(request).await;
    }
    let host = request.headers().get(header::HOST).map(|value| value.to_str().unwrap_or("\u{fffd}"));
    match host {
        Some(host) if !is_local_host(host) => error_response(
            ErrorCode::ForbiddenHost,
            "this server has no token, so it only answers requests addressed to localhost; configure a token \
             to serve other host names",
        ),
        Some(_) | None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hosts() {
        for host in ["localhost", "localhost:8787", "127.0.0.1:1", "127.9.9.9", "[::1]:80", "[::1]"] {
            assert!(is_local_host(host), "{host}");
        }
        for host in ["evil.example", "evil.example:8787", "10.0.0.1:80", "[2001:db8::1]:80", "localhost.evil"] {
            assert!(!is_local_host(host), "{host}");
        }
    }
}
