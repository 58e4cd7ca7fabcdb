//! `http_request`: one HTTP request to an allowed host, optionally carrying a person's
//! connection (a grant) as `Authorization: Bearer …`.
//!
//! Opt-in and bounded: only hosts of `[tools.http] allowed_hosts` are reached (the binary offers
//! the tool only when that list is non-empty), redirects are not followed (a redirect could
//! carry the token elsewhere; the model sees the `Location` and may call again), every request
//! has a timeout, and at most `max_response_bytes` of a body are read. A connection named in
//! `connection_hosts` is sent only to its hosts.
//!
//! The secret of a grant is read at call time from [`ToolContext::grants`] and goes into the
//! request's header and nowhere else: the tool's output and error texts are scrubbed with
//! [`GrantSecret::scrub`], so a server that echoes the header shows `[redacted]`.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use reqwest::Url;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::tool::{GrantSecret, Tool, ToolContext, ToolOutput, ToolSpec, parse_arguments};

pub const HTTP_REQUEST: &str = "http_request";

/// The `[tools.http]` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Hosts `http_request` may reach: exact names or addresses (`api.github.com`,
    /// `127.0.0.1`), or `*.example.com` for its subdomains. Any port. Empty (the default): the
    /// tool is not offered.
    pub allowed_hosts: Vec<String>,
    /// Seconds a request may take, from connecting to the last byte read. Default: 30.
    pub timeout_s: u64,
    /// Most bytes of a response body read and shown; the rest is dropped with a note saying
    /// so. Default: 100,000.
    pub max_response_bytes: usize,
    /// Hosts each connection's secret may be sent to (`github = ["api.github.com"]`), on top of
    /// `allowed_hosts`: a model talked into sending a token to another allowed host is refused.
    /// A connection not named here may go to any allowed host. Default: none named.
    pub connection_hosts: BTreeMap<String, Vec<String>>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            allowed_hosts: Vec::new(),
            timeout_s: 30,
            max_response_bytes: 100_000,
            connection_hosts: BTreeMap::new(),
        }
    }
}

/// Whether `host` matches one of `patterns`: an exact name or address (without case), or
/// `*.domain` for its subdomains.
fn host_matches(patterns: &[String], host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase();
    patterns.iter().any(|pattern| {
        let pattern =
            pattern.trim().trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase();
        match pattern.strip_prefix("*.") {
            Some(domain) => host.len() > domain.len() + 1 && host.ends_with(&format!(".{domain}")),
            None => host == pattern,
        }
    })
}

fn is_host_pattern(host: &str) -> bool {
    let host = host.trim();
    let ipv6 = host.starts_with('[') && host.ends_with(']');
    !host.is_empty() && !host.contains('@') && !host.contains(' ') && (ipv6 || !host.contains(['/', ':']))
}

impl HttpConfig {
    /// Whether the tool is to be offered at all.
    pub fn is_enabled(&self) -> bool {
        !self.allowed_hosts.is_empty()
    }

    /// Whether `host` is one of `allowed_hosts`.
    pub fn allows(&self, host: &str) -> bool {
        host_matches(&self.allowed_hosts, host)
    }

    /// Whether connection `name`'s secret may be sent to `host` (an allowed host already).
    pub fn allows_connection(&self, name: &str, host: &str) -> bool {
        self.connection_hosts.get(name).is_none_or(|hosts| host_matches(hosts, host))
    }

    /// A reason when a setting cannot work.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.timeout_s == 0 {
            return Err(("http.timeout_s", "must be at least 1".to_owned()));
        }
        if self.max_response_bytes < 1_000 {
            return Err(("http.max_response_bytes", "must be at least 1000".to_owned()));
        }
        if let Some(bad) = self.allowed_hosts.iter().find(|host| !is_host_pattern(host)) {
            return Err((
                "http.allowed_hosts",
                format!("`{bad}` is not a host name: write only the host (`api.github.com`, `*.example.com`)"),
            ));
        }
        for (name, hosts) in &self.connection_hosts {
            if let Err(error) = kesoku_core::check_grant_name(name) {
                return Err(("http.connection_hosts", error.to_string()));
            }
            if let Some(bad) = hosts.iter().find(|host| !is_host_pattern(host)) {
                return Err((
                    "http.connection_hosts",
                    format!("`{bad}` (connection `{name}`) is not a host name: write only the host (`api.github.com`)"),
                ));
            }
        }
        Ok(())
    }
}

/// The `http_request` tool.
pub struct HttpTool {
    spec: ToolSpec,
    config: HttpConfig,
    client: reqwest::Client,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpParams {
    method: String,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    connection: Option<String>,
}

impl HttpTool {
    pub fn new(config: &HttpConfig) -> Self {
        let config = HttpConfig {
            timeout_s: config.timeout_s.max(1),
            max_response_bytes: config.max_response_bytes.max(1_000),
            allowed_hosts: config.allowed_hosts.clone(),
            connection_hosts: config.connection_hosts.clone(),
        };
        let spec = ToolSpec {
            name: HTTP_REQUEST.to_owned(),
            description: format!(
                "Make one HTTP request (GET, POST, PUT, PATCH or DELETE) to an allowed host: {}. \
                 To act with the user's account on a service, name the connection in `connection` \
                 (e.g. \"github\"): the runtime adds the user's credentials; never put tokens in \
                 headers yourself. Redirects are not followed. At most {} bytes of the response are \
                 shown.",
                config.allowed_hosts.join(", "),
                config.max_response_bytes
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
                    "url": {"type": "string", "description": "Full http:// or https:// URL."},
                    "headers": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Extra request headers."},
                    "body": {"type": "string", "description": "Request body (send JSON as text with a content-type header)."},
                    "connection": {"type": "string", "description": "Name of the user's connection whose credentials to send (e.g. \"github\")."}
                },
                "required": ["method", "url"]
            }),
        };
        // Redirects are not followed: a redirect could carry the Authorization header to
        // another host. The client is built once; building can only fail without TLS roots,
        // and then every call says so.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(config.timeout_s))
            .user_agent(concat!("kesoku/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_else(|error| {
                tracing::error!(%error, "the HTTP client of http_request could not be built");
                reqwest::Client::new()
            });
        Self { spec, config, client }
    }

    async fn request(&self, ctx: &ToolContext, params: HttpParams) -> Result<ToolOutput, Failure> {
        let method = match params.method.to_ascii_uppercase().as_str() {
            "GET" => reqwest::Method::GET,
            "POST" => reqwest::Method::POST,
            "PUT" => reqwest::Method::PUT,
            "PATCH" => reqwest::Method::PATCH,
            "DELETE" => reqwest::Method::DELETE,
            other => {
                return Err(Failure::plain(format!(
                    "method `{other}` is not allowed: use GET, POST, PUT, PATCH or DELETE"
                )));
            }
        };
        let url = Url::parse(&params.url)
            .map_err(|error| Failure::plain(format!("`{}` is not a URL: {error}", params.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Failure::plain(format!("only http:// and https:// URLs are allowed, not `{}`", url.scheme())));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Failure::plain("credentials in the URL are not allowed: use `connection`"));
        }
        let host = url.host_str().unwrap_or_default().to_owned();
        if !self.config.allows(&host) {
            return Err(Failure::plain(format!(
                "host `{host}` is not allowed; allowed hosts: {} (an operator adds hosts to [tools.http] allowed_hosts)",
                self.config.allowed_hosts.join(", ")
            )));
        }
        if let Some(name) = &params.connection
            && !self.config.allows_connection(name, &host)
        {
            return Err(Failure::plain(format!(
                "connection `{name}` may not be sent to `{host}`; it may go to: {} ([tools.http.connection_hosts])",
                self.config.connection_hosts.get(name).map(|hosts| hosts.join(", ")).unwrap_or_default()
            )));
        }
        let secret = match &params.connection {
            Some(name) => Some(self.secret(ctx, name).await?),
            None => None,
        };
        let scrub = |text: &str| secret.as_ref().map_or_else(|| text.to_owned(), |secret| secret.scrub(text));
        let mut request = self.client.request(method.clone(), url.clone());
        for (name, value) in &params.headers {
            if secret.is_some() && name.eq_ignore_ascii_case("authorization") {
                return Err(Failure::plain("do not set an Authorization header together with `connection`"));
            }
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some(secret) = &secret {
            request = request.bearer_auth(secret.expose());
        }
        if let Some(body) = params.body {
            request = request.body(body);
        }
        let send = request.send();
        let response = tokio::select! {
            _ = ctx.cancel.cancelled() => return Err(Failure::plain("request cancelled")),
            response = send => response.map_err(|error| Failure::plain(scrub(&format!("{method} {url} failed: {}", describe(&error)))))?,
        };
        let status = response.status();
        let mut head = format!("HTTP {} {}\n", status.as_u16(), status.canonical_reason().unwrap_or(""));
        for name in ["content-type", "location", "content-length"] {
            if let Some(value) = response.headers().get(name).and_then(|v| v.to_str().ok()) {
                head.push_str(&format!("{name}: {value}\n"));
            }
        }
        let cap = self.config.max_response_bytes;
        let length = response.content_length();
        let mut body: Vec<u8> = Vec::new();
        let mut truncated = false;
        let mut stream = response.bytes_stream();
        loop {
            let chunk = tokio::select! {
                _ = ctx.cancel.cancelled() => return Err(Failure::plain("request cancelled")),
                chunk = stream.next() => chunk,
            };
            match chunk {
                None => break,
                Some(Err(error)) => {
                    return Err(Failure::plain(scrub(&format!(
                        "{method} {url}: reading the response failed: {}",
                        describe(&error)
                    ))));
                }
                Some(Ok(chunk)) => {
                    let room = cap.saturating_sub(body.len());
                    body.extend_from_slice(&chunk[..room.min(chunk.len())]);
                    // The rest is not downloaded: a body without end costs only the cap.
                    if chunk.len() > room {
                        truncated = true;
                        break;
                    }
                }
            }
        }
        let mut content = head;
        content.push('\n');
        content.push_str(&String::from_utf8_lossy(&body));
        if truncated {
            let of = length.map(|total| format!(" of {total}")).unwrap_or_default();
            content.push_str(&format!(
                "\n[response truncated: only the first {} bytes{of} were read (the limit of [tools.http] max_response_bytes)]",
                body.len()
            ));
        }
        let content = scrub(&content);
        let summary = format!("{method} {} -> {}", url.host_str().unwrap_or_default(), status.as_u16());
        if status.is_client_error() || status.is_server_error() {
            Ok(ToolOutput::failure_with_content(content, format!("HTTP {}", status.as_u16())).with_summary(summary))
        } else {
            Ok(ToolOutput::success(content).with_summary(summary))
        }
    }

    /// The secret of connection `name` for the person the work runs for, or the error that
    /// tells the model (and so the person) what to do.
    async fn secret(&self, ctx: &ToolContext, name: &str) -> Result<GrantSecret, Failure> {
        let Some(grants) = &ctx.grants else {
            return Err(Failure::plain(format!(
                "connection `{name}` cannot be used: this work runs for nobody in particular (no delegation user). \
                 Start it for a person (`delegation_user`) who has the connection (`kesoku grants set USER {name}`), \
                 or make the request without `connection`."
            )));
        };
        match grants.grant(name).await {
            Ok(Some(secret)) => Ok(secret),
            Ok(None) => Err(Failure::plain(format!(
                "user `{}` has no connection `{name}`: an operator adds it with `kesoku grants set {} {name}`",
                grants.user(),
                grants.user()
            ))),
            Err(error) => Err(Failure::plain(format!("connection `{name}` could not be read: {error}"))),
        }
    }
}

/// A failed call: its text (scrubbed already where a secret was in reach).
struct Failure(String);

impl Failure {
    fn plain(text: impl Into<String>) -> Self {
        Failure(text.into())
    }
}

/// A reqwest error with its causes (the top-level text alone is often just "error sending
/// request").
fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() { "timed out".to_owned() } else { error.to_string() };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[async_trait]
impl Tool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: HttpParams = match parse_arguments(HTTP_REQUEST, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        match self.request(ctx, params).await {
            Ok(output) => output,
            Err(Failure(text)) => ToolOutput::failure(text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_match_exactly_or_by_subdomain_wildcard() {
        let config = HttpConfig {
            allowed_hosts: vec!["api.github.com".into(), "*.example.com".into(), "127.0.0.1".into()],
            ..HttpConfig::default()
        };
        assert!(config.allows("api.github.com"));
        assert!(config.allows("API.GitHub.com."));
        assert!(config.allows("a.example.com") && config.allows("b.c.example.com"));
        assert!(config.allows("127.0.0.1"));
        assert!(!config.allows("example.com"), "the wildcard is for subdomains only");
        assert!(!config.allows("github.com"));
        assert!(!config.allows("api.github.com.evil.net"));
        assert!(!config.allows("evilexample.com"));
        assert!(!HttpConfig::default().is_enabled());
        let v6 = HttpConfig { allowed_hosts: vec!["[::1]".into()], ..HttpConfig::default() };
        assert!(v6.allows("[::1]") && v6.check().is_ok());
    }

    #[test]
    fn a_connection_named_in_connection_hosts_goes_only_to_its_hosts() {
        let config = HttpConfig {
            allowed_hosts: vec!["api.github.com".into(), "example.org".into()],
            connection_hosts: BTreeMap::from([("github".into(), vec!["api.github.com".into()])]),
            ..HttpConfig::default()
        };
        assert!(config.allows_connection("github", "api.github.com"));
        assert!(!config.allows_connection("github", "example.org"));
        assert!(config.allows_connection("drive", "example.org"), "a connection not named goes to any allowed host");
        let bad = HttpConfig {
            connection_hosts: BTreeMap::from([("Git Hub".into(), vec!["x".into()])]),
            ..HttpConfig::default()
        };
        assert!(bad.check().is_err());
    }

    #[test]
    fn a_host_with_a_scheme_or_path_is_a_config_error() {
        for bad in ["https://api.github.com", "api.github.com/x", "", "user@host"] {
            let config = HttpConfig { allowed_hosts: vec![bad.into()], ..HttpConfig::default() };
            assert!(config.check().is_err(), "{bad:?}");
        }
        let good = HttpConfig { allowed_hosts: vec!["*.example.com".into()], ..HttpConfig::default() };
        assert_eq!(good.check(), Ok(()));
    }
}
