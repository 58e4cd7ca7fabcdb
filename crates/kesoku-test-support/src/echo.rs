//! An HTTP echo server for tools that call out (`http_request`): axum on `127.0.0.1:0`, any
//! method and path. It records every request (method, path, headers, body) and answers with a
//! JSON echo of the request, headers included, so tests see both what was sent and what a
//! server that echoes credentials would hand back. Two paths behave differently:
//! `/status/CODE` answers with that status, `/big/N` with N bytes of `x`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Map, Value, json};

/// One request the echo server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoRequest {
    pub method: String,
    pub path: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl EchoRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// The running server; stops when dropped.
pub struct EchoServer {
    addr: SocketAddr,
    // Held briefly by the handler and by readers; never across an await.
    requests: Arc<Mutex<Vec<EchoRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EchoServer {
    pub async fn start() -> EchoServer {
        let listener = match tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await {
            Ok(listener) => listener,
            Err(error) => panic!("echo server could not bind 127.0.0.1:0: {error}"),
        };
        let addr = match listener.local_addr() {
            Ok(addr) => addr,
            Err(error) => panic!("echo server has no address: {error}"),
        };
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&requests);
        let app = Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let recorded = Arc::clone(&recorded);
            async move { answer(&recorded, method, uri, headers, body) }
        });
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                eprintln!("echo server stopped: {error}");
            }
        });
        EchoServer { addr, requests, task }
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received, oldest first.
    pub fn requests(&self) -> Vec<EchoRequest> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

fn answer(recorded: &Mutex<Vec<EchoRequest>>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let request = EchoRequest {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
            .collect(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    recorded.lock().unwrap_or_else(PoisonError::into_inner).push(request.clone());
    let path = request.path.clone();
    let respond = |status: StatusCode, content_type: &str, body: Body| {
        Response::builder().status(status).header("content-type", content_type).body(body).unwrap_or_default()
    };
    if let Some(size) = path.strip_prefix("/big/").and_then(|n| n.parse::<usize>().ok()) {
        return respond(StatusCode::OK, "text/plain", Body::from("x".repeat(size)));
    }
    let status = path
        .strip_prefix("/status/")
        .and_then(|code| code.parse::<u16>().ok())
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::OK);
    let headers: Map<String, Value> =
        request.headers.iter().map(|(name, value)| (name.clone(), Value::String(value.clone()))).collect();
    let echo = json!({"method": request.method, "path": request.path, "headers": headers, "body": request.body});
    respond(status, "application/json", Body::from(echo.to_string()))
}
