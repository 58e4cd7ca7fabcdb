//! `GET /v1/events`: ids are revisions, `Last-Event-ID` resumes without gaps, filters, errors,
//! and the stream ends at shutdown.

use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use futures::StreamExt;
use http::{Request, StatusCode};
use kesoku_core::Status;
use serde_json::Value;
use tower::ServiceExt;

use crate::harness::{TestServer, assert_error, get, send, user};

/// Reads SSE events (id + JSON data) from a streaming body, skipping comments.
struct SseReader {
    body: BodyDataStream,
    buffer: String,
}

impl SseReader {
    async fn open(app: &axum::Router, request: Request<Body>) -> SseReader {
        let response = app.clone().oneshot(request).await.expect("the router answers");
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
        assert_eq!(content_type, "text/event-stream");
        SseReader { body: response.into_body().into_data_stream(), buffer: String::new() }
    }

    /// The next event with data, or `None` when the stream ended (or nothing came for 5 s).
    async fn next(&mut self) -> Option<(i64, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut id = None;
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("id: ") {
                        id = value.parse().ok();
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data.push_str(value);
                    }
                }
                if let (Some(id), false) = (id, data.is_empty()) {
                    return Some((id, serde_json::from_str(&data).expect("event data is JSON")));
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(5), self.body.next()).await.ok()??.ok()?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

fn events_request(uri: &str, last_event_id: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().uri(uri);
    if let Some(id) = last_event_id {
        builder = builder.header("Last-Event-ID", id);
    }
    builder.body(Body::empty()).expect("a request")
}

#[tokio::test]
async fn events_carry_revisions_and_resume_after_last_event_id() {
    let server = TestServer::new().await;
    let session = server.session("api", "web").await;
    let app = server.app();
    let first = server.post(&user(&session, "one")).await;
    let second = server.post(&user(&session, "two")).await;
    server.gateway.update_status(&first.id, Status::Interrupted).await.expect("update");

    let mut all = SseReader::open(&app, events_request("/v1/events?after=0", None)).await;
    let (rev_a, a) = all.next().await.expect("an event");
    assert_eq!(a["message"]["id"], second.id.as_str(), "latest state of each message, in revision order");
    assert_eq!(a["rev"], rev_a);
    let (rev_b, b) = all.next().await.expect("an event");
    assert_eq!(b["message"]["id"], first.id.as_str());
    assert_eq!(b["message"]["status"], "interrupted");
    assert!(rev_b > rev_a);

    // Live: a new message arrives on the open stream.
    let third = server.post(&user(&session, "three")).await;
    let (rev_c, c) = all.next().await.expect("a live event");
    assert_eq!(c["message"]["id"], third.id.as_str());
    assert_eq!(c["created"], true);

    // A client that saw up to rev_a reconnects: it gets exactly what changed after rev_a.
    let mut resumed = SseReader::open(&app, events_request("/v1/events", Some(&rev_a.to_string()))).await;
    let (rev, event) = resumed.next().await.expect("an event");
    assert_eq!((rev, event["message"]["id"].as_str()), (rev_b, Some(first.id.as_str())));
    let (rev, event) = resumed.next().await.expect("an event");
    assert_eq!((rev, event["message"]["id"].as_str()), (rev_c, Some(third.id.as_str())));
    // The header wins over `after`.
    let mut header_wins = SseReader::open(&app, events_request("/v1/events?after=0", Some(&rev_b.to_string()))).await;
    let (rev, _) = header_wins.next().await.expect("an event");
    assert_eq!(rev, rev_c);
}

#[tokio::test]
async fn a_session_filter_keeps_other_sessions_out() {
    let server = TestServer::new().await;
    let mine = server.session("api", "mine").await;
    let other = server.session("api", "other").await;
    let app = server.app();
    let mut stream = SseReader::open(&app, get(&format!("/v1/events?session_id={}&after=0", mine.id))).await;
    server.post(&user(&other, "not for me")).await;
    let posted = server.post(&user(&mine, "for me")).await;
    let (_, event) = stream.next().await.expect("an event");
    assert_eq!(event["message"]["id"], posted.id.as_str());
    assert_eq!(event["message"]["session_id"], mine.id.as_str());
}

#[tokio::test]
async fn bad_event_requests_get_json_errors() {
    let server = TestServer::new().await;
    let app = server.app();
    for bad in ["abc", "-1", "1.5"] {
        let reply = send(&app, events_request("/v1/events", Some(bad))).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "bad_header");
    }
    for bad in ["/v1/events?after=-3", "/v1/events?after=x", "/v1/events?session_id="] {
        let reply = send(&app, get(bad)).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "bad_query");
    }
    let reply = send(&app, get("/v1/events?session_id=ghost")).await;
    assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn streams_end_when_the_server_shuts_down() {
    let server = TestServer::new().await;
    let state = server.state();
    let shutdown = state.shutdown.clone();
    let app = kesoku_server::app(state);
    let response = app.oneshot(get("/v1/events")).await.expect("answer");
    let mut body = response.into_body().into_data_stream();
    let hello = tokio::time::timeout(Duration::from_secs(5), body.next()).await.expect("hello in time");
    assert!(hello.is_some());
    shutdown.cancel();
    let mut ended = false;
    for _ in 0..10 {
        match tokio::time::timeout(Duration::from_secs(5), body.next()).await.expect("the stream moves") {
            None => {
                ended = true;
                break;
            }
            Some(_) => continue,
        }
    }
    assert!(ended, "the event stream should end on shutdown");
}
