//! Bearer tokens, the bind check, the query token of the event stream, and the Host guard.

use std::net::SocketAddr;

use axum::body::Body;
use http::{Request, StatusCode};
use kesoku_server::{ServerError, Token, check_bind};

use crate::harness::{TestServer, assert_error, get, send};

const SECRET: &str = "s3cret-token-value";

fn with_auth(uri: &str, value: &str) -> Request<Body> {
    Request::builder().uri(uri).header("authorization", value).body(Body::empty()).expect("a request")
}

#[tokio::test]
async fn with_a_token_every_route_but_health_needs_it() {
    let server = TestServer::new().await;
    let app = kesoku_server::app(server.state().with_token(Token::new(SECRET).expect("a token")));
    let session = server.session("api", "web").await;
    let protected = [
        "/v1/sessions".to_owned(),
        format!("/v1/sessions/{}", session.id),
        format!("/v1/sessions/{}/messages", session.id),
        format!("/v1/sessions/{}/state", session.id),
        format!("/v1/sessions/{}/export", session.id),
        "/v1/activations".to_owned(),
        "/v1/runtime".to_owned(),
        "/v1/events".to_owned(),
        "/metrics".to_owned(),
        "/openapi.json".to_owned(),
    ];
    for uri in &protected {
        let reply = send(&app, get(uri)).await;
        assert_error(&reply, StatusCode::UNAUTHORIZED, "unauthorized");
        assert_eq!(reply.headers.get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer"), "{uri}");
        let wrong = send(&app, with_auth(uri, "Bearer not-it")).await;
        assert_error(&wrong, StatusCode::UNAUTHORIZED, "unauthorized");
    }
    for uri in
        ["/v1/messages", "/v1/activations", "/v1/sessions/x/stop", "/v1/sessions/x/compact", "/v1/sessions/x/clear"]
    {
        let request = Request::builder().method("POST").uri(uri).body(Body::empty()).expect("a request");
        assert_error(&send(&app, request).await, StatusCode::UNAUTHORIZED, "unauthorized");
    }
    // The right token opens them (the scheme is case-insensitive).
    for uri in protected.iter().filter(|uri| !uri.ends_with("/events")) {
        let reply = send(&app, with_auth(uri, &format!("bearer {SECRET}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}: {reply:?}");
    }
    // Health, readiness and the console's static files stay open.
    for uri in ["/healthz", "/readyz", "/", "/console/app.js", "/console/app.css"] {
        assert_eq!(send(&app, get(uri)).await.status, StatusCode::OK, "{uri}");
    }
}

#[tokio::test]
async fn the_query_token_is_accepted_on_the_event_stream_only() {
    let server = TestServer::new().await;
    let app = kesoku_server::app(server.state().with_token(Token::new(SECRET).expect("a token")));
    let response = tower::ServiceExt::oneshot(app.clone(), get(&format!("/v1/events?access_token={SECRET}")))
        .await
        .expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let wrong = send(&app, get("/v1/events?access_token=nope")).await;
    assert_error(&wrong, StatusCode::UNAUTHORIZED, "unauthorized");
    let elsewhere = send(&app, get(&format!("/v1/sessions?access_token={SECRET}"))).await;
    assert_error(&elsewhere, StatusCode::UNAUTHORIZED, "unauthorized");
}

#[test]
fn binding_beyond_loopback_needs_a_token() {
    let any: SocketAddr = "0.0.0.0:8787".parse().expect("addr");
    let lan: SocketAddr = "192.168.1.5:8787".parse().expect("addr");
    let loopback: SocketAddr = "127.0.0.1:8787".parse().expect("addr");
    let loopback6: SocketAddr = "[::1]:8787".parse().expect("addr");
    assert!(matches!(check_bind(any, None), Err(ServerError::TokenRequired { .. })));
    let error = check_bind(lan, None).expect_err("refused").to_string();
    assert!(error.contains("token_env") && error.contains("192.168.1.5"), "{error}");
    assert!(check_bind(loopback, None).is_ok());
    assert!(check_bind(loopback6, None).is_ok());
    let token = Token::new(SECRET).expect("a token");
    assert!(check_bind(any, Some(&token)).is_ok());
}

#[test]
fn tokens_never_print_and_must_be_usable() {
    let token = Token::new(SECRET).expect("a token");
    assert!(!format!("{token:?}").contains(SECRET));
    assert!(token.matches(SECRET));
    assert!(!token.matches("s3cret-token-valuE"));
    assert!(!token.matches(""));
    assert!(matches!(Token::new(""), Err(ServerError::BadToken { .. })));
    assert!(matches!(Token::new("has space"), Err(ServerError::BadToken { .. })));
}

#[tokio::test]
async fn without_a_token_only_local_host_names_are_served() {
    let server = TestServer::new().await;
    let app = server.app();
    let request =
        |host: &str| Request::builder().uri("/v1/sessions").header("host", host).body(Body::empty()).expect("req");
    for host in ["127.0.0.1:8787", "localhost:8787", "[::1]:8787", "localhost"] {
        assert_eq!(send(&app, request(host)).await.status, StatusCode::OK, "{host}");
    }
    for host in ["attacker.example", "attacker.example:8787", "192.168.1.5:8787"] {
        assert_error(&send(&app, request(host)).await, StatusCode::FORBIDDEN, "forbidden_host");
    }
    // With a token, any host name is fine (the token is the guard).
    let app = kesoku_server::app(server.state().with_token(Token::new(SECRET).expect("a token")));
    let request = Request::builder()
        .uri("/v1/sessions")
        .header("host", "kesoku.example")
        .header("authorization", format!("Bearer {SECRET}"))
        .body(Body::empty())
        .expect("req");
    assert_eq!(send(&app, request).await.status, StatusCode::OK);
}
