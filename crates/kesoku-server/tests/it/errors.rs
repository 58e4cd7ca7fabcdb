//! The machinery's own rejections come out as JSON too: unknown routes, wrong methods, bad paths.

use axum::body::Body;
use http::{Request, StatusCode};

use crate::harness::{TestServer, assert_error, get, send};

#[tokio::test]
async fn unknown_routes_are_404_json() {
    let server = TestServer::new().await;
    let app = server.app();
    for uri in ["/v1/nothing", "/v2/sessions", "/console/missing.js", "/v1/sessions/a/b/c"] {
        let reply = send(&app, get(uri)).await;
        assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
    }
}

#[tokio::test]
async fn wrong_methods_are_405_json_with_allow() {
    let server = TestServer::new().await;
    let app = server.app();
    let cases =
        [("DELETE", "/v1/sessions"), ("GET", "/v1/messages"), ("PUT", "/healthz"), ("GET", "/v1/sessions/x/stop")];
    for (method, uri) in cases {
        let request = Request::builder().method(method).uri(uri).body(Body::empty()).expect("a request");
        let reply = send(&app, request).await;
        assert_error(&reply, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
        assert!(reply.headers.contains_key("allow"), "{method} {uri}: {:?}", reply.headers);
    }
}

#[tokio::test]
async fn a_path_with_bad_percent_encoding_is_a_json_400() {
    let server = TestServer::new().await;
    let reply = send(&server.app(), get("/v1/sessions/%FF%FE")).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "bad_path");
}
