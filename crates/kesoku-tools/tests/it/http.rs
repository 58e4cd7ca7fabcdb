//! `http_request` against a local echo server: the grant's secret reaches the server as a
//! bearer token and never the tool's output; hosts outside the allow-list, a connection with
//! nobody to act for and a missing grant are tool errors that say what to do; big bodies are cut
//! with a note.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use kesoku_core::SessionId;
use kesoku_test_support::echo::EchoServer;
use kesoku_tools::{GrantSecret, Grants, HttpConfig, HttpTool, Tool, ToolContext};
use serde_json::json;

const SECRET: &str = "ghp_s3cr3t_token_value";

#[derive(Debug)]
struct FixedGrants {
    user: String,
    grants: HashMap<String, String>,
}

#[async_trait]
impl Grants for FixedGrants {
    fn user(&self) -> &str {
        &self.user
    }

    async fn grant(&self, name: &str) -> Result<Option<GrantSecret>, String> {
        Ok(self.grants.get(name).map(GrantSecret::new))
    }
}

fn tool(max_response_bytes: usize) -> HttpTool {
    HttpTool::new(&HttpConfig {
        allowed_hosts: vec!["127.0.0.1".into()],
        timeout_s: 10,
        max_response_bytes,
        ..HttpConfig::default()
    })
}

fn ctx() -> ToolContext {
    ToolContext::new("/tmp", "/tmp", SessionId::from("sess_http"), "call_1")
}

fn alice() -> ToolContext {
    let grants = FixedGrants { user: "alice".into(), grants: HashMap::from([("github".into(), SECRET.into())]) };
    ctx().with_grants(Arc::new(grants))
}

#[tokio::test]
async fn a_connection_is_sent_as_a_bearer_token_and_scrubbed_from_the_echoed_output() {
    let server = EchoServer::start().await;
    let output = tool(100_000)
        .call(
            &alice(),
            json!({"method": "POST", "url": format!("{}/repos", server.base_url()), "body": "{\"a\":1}",
                   "headers": {"content-type": "application/json"}, "connection": "github"}),
        )
        .await;
    assert!(!output.is_error(), "{output:?}");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].body, "{\"a\":1}");
    assert!(output.content.starts_with("HTTP 200 OK\n"), "{}", output.content);
    assert!(output.content.contains("Bearer [redacted]"), "the echo is shown, scrubbed: {}", output.content);
    assert!(!format!("{output:?}").contains(SECRET), "{output:?}");
}

#[tokio::test]
async fn a_host_outside_the_allow_list_is_refused_before_anything_is_sent() {
    let server = EchoServer::start().await;
    let url = server.base_url().replace("127.0.0.1", "localhost");
    let output = tool(100_000).call(&alice(), json!({"method": "GET", "url": url, "connection": "github"})).await;
    assert!(output.is_error());
    assert!(
        output.content.contains("host `localhost` is not allowed") && output.content.contains("127.0.0.1"),
        "{}",
        output.content
    );
    let output = tool(100_000).call(&alice(), json!({"method": "GET", "url": "file:///etc/passwd"})).await;
    assert!(output.content.contains("only http:// and https://"), "{}", output.content);
    assert!(server.requests().is_empty(), "nothing reached the server");
}

#[tokio::test]
async fn a_connection_without_a_person_or_without_the_grant_says_what_to_do() {
    let server = EchoServer::start().await;
    let url = format!("{}/user", server.base_url());
    let nobody = tool(100_000).call(&ctx(), json!({"method": "GET", "url": url, "connection": "github"})).await;
    assert!(nobody.is_error());
    assert!(
        nobody.content.contains("runs for nobody") && nobody.content.contains("kesoku grants set USER github"),
        "{}",
        nobody.content
    );
    let missing = tool(100_000).call(&alice(), json!({"method": "GET", "url": url, "connection": "drive"})).await;
    assert!(missing.is_error());
    assert!(missing.content.contains("user `alice` has no connection `drive`"), "{}", missing.content);
    assert!(missing.content.contains("kesoku grants set alice drive"), "{}", missing.content);
    assert!(server.requests().is_empty(), "nothing was sent without the grant");
    // Without `connection`, the same call goes out with no credentials.
    let plain = tool(100_000).call(&alice(), json!({"method": "GET", "url": url})).await;
    assert!(!plain.is_error(), "{plain:?}");
    assert_eq!(server.requests()[0].header("authorization"), None);
}

#[tokio::test]
async fn an_authorization_header_beside_a_connection_is_refused() {
    let server = EchoServer::start().await;
    let output = tool(100_000)
        .call(
            &alice(),
            json!({"method": "GET", "url": server.base_url(), "headers": {"Authorization": "Bearer x"}, "connection": "github"}),
        )
        .await;
    assert!(output.is_error() && output.content.contains("Authorization"), "{}", output.content);
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn a_big_body_is_cut_with_a_note_and_an_error_status_is_a_tool_error() {
    let server = EchoServer::start().await;
    let big =
        tool(1_000).call(&ctx(), json!({"method": "GET", "url": format!("{}/big/5000", server.base_url())})).await;
    assert!(!big.is_error(), "{big:?}");
    let (_, body) = big.content.split_once("\n\n").expect("head and body");
    assert!(body.starts_with(&"x".repeat(1_000)) && !body.starts_with(&"x".repeat(1_001)), "{body}");
    assert!(
        body.ends_with("[response truncated: only the first 1000 bytes of 5000 were read (the limit of [tools.http] max_response_bytes)]"),
        "{body}"
    );
    let missing = tool(100_000)
        .call(
            &alice(),
            json!({"method": "DELETE", "url": format!("{}/status/404", server.base_url()), "connection": "github"}),
        )
        .await;
    assert_eq!(missing.error.as_deref(), Some("HTTP 404"));
    assert!(
        missing.content.starts_with("HTTP 404 Not Found") && missing.content.contains("[redacted]"),
        "{}",
        missing.content
    );
    assert!(!missing.content.contains(SECRET));
}

#[test]
fn a_grant_secret_never_prints() {
    let secret = GrantSecret::new(SECRET);
    assert_eq!(format!("{secret:?} {secret}"), "[redacted] [redacted]");
    assert_eq!(secret.scrub(&format!("token={SECRET}; again {SECRET}")), "token=[redacted]; again [redacted]");
}

#[tokio::test]
async fn a_connection_bound_to_other_hosts_is_not_sent_to_this_one() {
    let server = EchoServer::start().await;
    let config = HttpConfig {
        allowed_hosts: vec!["127.0.0.1".into(), "api.github.com".into()],
        connection_hosts: std::collections::BTreeMap::from([("github".into(), vec!["api.github.com".into()])]),
        ..HttpConfig::default()
    };
    let output = HttpTool::new(&config)
        .call(&alice(), json!({"method": "GET", "url": server.base_url(), "connection": "github"}))
        .await;
    assert!(output.is_error());
    assert!(output.content.contains("connection `github` may not be sent to `127.0.0.1`"), "{}", output.content);
    assert!(server.requests().is_empty(), "the token never left");
}
