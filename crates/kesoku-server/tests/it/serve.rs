//! `serve` on a real loopback socket: it answers, refuses an open bind without a token, and
//! shuts down gracefully even with an event stream open.

use std::time::Duration;

use kesoku_server::{ServerError, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::harness::TestServer;

async fn raw_get(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    stream
}

#[tokio::test]
async fn serves_then_shuts_down_with_an_open_event_stream() {
    let server = TestServer::new().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(serve(listener, server.state(), shutdown.clone()));

    let mut health = raw_get(addr, "/healthz").await;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), health.read_to_string(&mut text))
        .await
        .expect("in time")
        .expect("read");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("{\"status\":\"ok\"}"), "{text}");

    let mut events = raw_get(addr, "/v1/events").await;
    let mut first = [0u8; 256];
    let n =
        tokio::time::timeout(Duration::from_secs(5), events.read(&mut first)).await.expect("in time").expect("read");
    assert!(String::from_utf8_lossy(&first[..n]).contains("text/event-stream"));

    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), running).await.expect("shutdown in time").expect("join");
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn serve_refuses_a_non_loopback_listener_without_token() {
    let server = TestServer::new().await;
    let listener = TcpListener::bind("0.0.0.0:0").await.expect("bind");
    let result = serve(listener, server.state(), CancellationToken::new()).await;
    assert!(matches!(result, Err(ServerError::TokenRequired { .. })), "{result:?}");
}
