//! A local fake of the WeChat iLink bot API and its media CDN, for the WeChat adapter's tests,
//! written from the public client `@tencent-weixin/openclaw-weixin` (the API has no published
//! reference).
//!
//! One axum server on `127.0.0.1:0`: the API under `/ilink/bot/…` ([`FakeWeChat::base_url`])
//! and the CDN under `/c2c` ([`FakeWeChat::cdn_base_url`]). It enforces what a client meets:
//! the auth headers (`AuthorizationType: ilink_bot_token`, `Authorization: Bearer`, a base64
//! `X-WECHAT-UIN`) and `base_info` on every call, `getupdates` as a long poll with an opaque
//! cursor (held until a message after the cursor arrives or the hold time passes),
//! `sendmessage` only to a peer with the `context_token` it was given, one item per message,
//! `client_id` deduplication, uploads whose sizes and MD5 match what `getuploadurl` announced,
//! and `errcode -14` once the session is expired.
//!
//! Tests play the people ([`FakeWeChat::user_says`], [`FakeWeChat::room_says`],
//! [`FakeWeChat::user_sends`], [`FakeWeChat::redeliver`]), the phone during pairing
//! ([`FakeWeChat::scan`], [`FakeWeChat::confirm`], [`FakeWeChat::expire_qr`]), inject faults
//! ([`FakeWeChat::fail_next`], [`FakeWeChat::expire_session`]) and read what the bot did
//! ([`FakeWeChat::sent`], [`FakeWeChat::typing`], [`FakeWeChat::calls`]).
//!
//! It is not WeChat: one bot, no rate limits, no thumbnails, and a `client_id` seen before is
//! answered with the first message's id (an assumption the real server may not share).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use aes::Aes128;
use aes::cipher::block_padding::Pkcs7;
use aes::cipher::{BlockModeDecrypt, KeyInit};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use md5::{Digest, Md5};
use serde_json::{Value, json};
use tokio::sync::watch;

/// How the fake is set up.
#[derive(Debug, Clone)]
pub struct FakeWeChatOptions {
    /// The bot token issued at pairing and required on every call.
    pub token: String,
    pub bot_id: String,
    /// The WeChat user who scans the QR code.
    pub owner: String,
    /// How long `getupdates` and `get_qrcode_status` hold a request with nothing new.
    pub hold: Duration,
}

impl Default for FakeWeChatOptions {
    fn default() -> Self {
        FakeWeChatOptions {
            token: "fake-wechat-bot-token".to_owned(),
            bot_id: "kesokubot@im.bot".to_owned(),
            owner: "wxid_owner@im.wechat".to_owned(),
            hold: Duration::from_millis(500),
        }
    }
}

/// A fault the next calls meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// HTTP 500.
    ServerError,
    /// The connection breaks in the middle of the answer.
    Drop,
    /// `ret: -1` with a message (a failure the body reports).
    Ret,
    /// HTTP 400: a request the server will never accept.
    BadRequest,
}

/// A message the bot sent, as the person sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    pub to: String,
    pub client_id: String,
    pub message_id: String,
    /// The item type (1 text, 2 image, 4 file, 5 video).
    pub item_type: i64,
    pub text: Option<String>,
    /// A media item: the file name (files) and the decrypted bytes.
    pub file_name: Option<String>,
    pub file: Option<Vec<u8>>,
    pub item: Value,
}

/// A media file the fake serves on its CDN: the reference to put in an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdnRef {
    pub encrypt_query_param: String,
}

#[derive(Debug, Clone)]
struct Upload {
    filekey: String,
    aeskey: Vec<u8>,
    rawsize: u64,
    filesize: u64,
    md5: String,
}

/// The fake's state.
#[derive(Debug, Default)]
pub struct FakeState {
    options: FakeWeChatOptions,
    base_url: String,
    updates: Vec<Value>,
    next_message_id: u64,
    /// Context tokens given to each peer (user or room).
    context_tokens: HashMap<String, HashSet<String>>,
    sent: Vec<SentMessage>,
    sent_by_client_id: HashMap<String, String>,
    typing: Vec<(String, i64)>,
    calls: Vec<String>,
    /// Faults queued per endpoint name (`getupdates`, `sendmessage`, …).
    faults: Vec<(String, Fault)>,
    /// Calls per endpoint still answered normally before its queued faults apply.
    passes: HashMap<String, usize>,
    /// The `get_updates_buf` of each `getupdates`, oldest first.
    cursors: Vec<String>,
    session_expired: bool,
    qr_codes: Vec<(String, String)>,
    /// The number the phone shows for a code in `need_verifycode`.
    verify_codes: HashMap<String, String>,
    uploads: HashMap<String, Upload>,
    cdn: HashMap<String, Vec<u8>>,
    next_id: u64,
}

impl FakeState {
    fn options(&self) -> &FakeWeChatOptions {
        &self.options
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

#[derive(Clone)]
struct Server {
    state: Arc<Mutex<FakeState>>,
    /// The number of updates, for long polls to wait on.
    updates: watch::Sender<usize>,
    qr: watch::Sender<usize>,
}

impl Server {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The running fake; stops when dropped.
pub struct FakeWeChat {
    server: Server,
    base_url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeWeChat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn api_error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "ret": -1, "errmsg": message }))).into_response()
}

fn expired() -> Response {
    axum::Json(json!({ "ret": -14, "errcode": -14, "errmsg": "session timeout" })).into_response()
}

/// A 200 whose body breaks off: the client sees the connection drop mid-answer.
fn dropped() -> Response {
    let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(Bytes::from_static(b"{\"ret\":0,")),
        Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "the fake drops the connection")),
    ];
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

impl Server {
    /// Check an authenticated call; the fault or refusal to answer instead, if any.
    fn check(&self, endpoint: &str, headers: &HeaderMap, body: &Value) -> Result<(), Box<Response>> {
        self.check_unboxed(endpoint, headers, body).map_err(Box::new)
    }

    #[allow(clippy::result_large_err)] // Boxed by `check`, its only caller.
    fn check_unboxed(&self, endpoint: &str, headers: &HeaderMap, body: &Value) -> Result<(), Response> {
        let mut state = self.lock();
        state.calls.push(endpoint.to_owned());
        if headers.get("AuthorizationType").and_then(|v| v.to_str().ok()) != Some("ilink_bot_token") {
            return Err(api_error(StatusCode::BAD_REQUEST, "AuthorizationType must be ilink_bot_token"));
        }
        let uin_ok = headers
            .get("X-WECHAT-UIN")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| STANDARD.decode(v).ok())
            .and_then(|v| String::from_utf8(v).ok())
            .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()));
        if !uin_ok {
            return Err(api_error(StatusCode::BAD_REQUEST, "X-WECHAT-UIN must be base64 of a decimal uint32"));
        }
        if !body.get("base_info").is_some_and(Value::is_object) {
            return Err(api_error(StatusCode::BAD_REQUEST, "base_info is required"));
        }
        let passing = state.passes.get(endpoint).copied().unwrap_or(0);
        if passing > 0 {
            state.passes.insert(endpoint.to_owned(), passing - 1);
        } else if let Some(index) = state.faults.iter().position(|(name, _)| name == endpoint) {
            let (_, fault) = state.faults.remove(index);
            return Err(match fault {
                Fault::BadRequest => api_error(StatusCode::BAD_REQUEST, "the fake refuses this call"),
                Fault::ServerError => api_error(StatusCode::INTERNAL_SERVER_ERROR, "the fake failed this call"),
                Fault::Drop => dropped(),
                Fault::Ret => axum::Json(json!({ "ret": -1, "errmsg": "system busy" })).into_response(),
            });
        }
        let expected = format!("Bearer {}", state.options().token);
        let authorized = headers.get("Authorization").and_then(|v| v.to_str().ok()) == Some(expected.as_str());
        if state.session_expired || !authorized {
            return Err(expired());
        }
        Ok(())
    }
}

async fn getupdates(State(server): State<Server>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    if let Err(response) = server.check("getupdates", &headers, &body) {
        return *response;
    }
    let Some(cursor) = body.get("get_updates_buf").and_then(Value::as_str).map(str::to_owned) else {
        return api_error(StatusCode::BAD_REQUEST, "get_updates_buf is required (\"\" at first)");
    };
    server.lock().cursors.push(cursor.clone());
    let from: usize = cursor.strip_prefix("cur-").and_then(|n| n.parse().ok()).unwrap_or(0);
    let mut changes = server.updates.subscribe();
    let hold = server.lock().options().hold;
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        {
            let state = server.lock();
            if state.updates.len() > from || tokio::time::Instant::now() >= deadline {
                let msgs: Vec<Value> = state.updates.iter().skip(from).cloned().collect();
                let next = format!("cur-{}", state.updates.len().max(from));
                return axum::Json(json!({
                    "ret": 0, "msgs": msgs, "get_updates_buf": next,
                    "longpolling_timeout_ms": hold.as_millis() as u64,
                }))
                .into_response();
            }
        }
        let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
    }
}

fn decrypt(key: &[u8], bytes: &[u8]) -> Option<Vec<u8>> {
    let cipher = ecb::Decryptor::<Aes128>::new_from_slice(key).ok()?;
    cipher.decrypt_padded_vec::<Pkcs7>(bytes).ok()
}

fn media_key(item: &Value) -> Option<Vec<u8>> {
    let encoded = item.get("media")?.get("aes_key")?.as_str()?;
    let decoded = STANDARD.decode(encoded).ok()?;
    match decoded.len() {
        16 => Some(decoded),
        32 => {
            let hex = std::str::from_utf8(&decoded).ok()?;
            (0..32).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect()
        }
        _ => None,
    }
}

async fn sendmessage(
    State(server): State<Server>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    if let Err(response) = server.check("sendmessage", &headers, &body) {
        return *response;
    }
    let msg = &body["msg"];
    let to = msg["to_user_id"].as_str().unwrap_or_default().to_owned();
    let client_id = msg["client_id"].as_str().unwrap_or_default().to_owned();
    let items = msg["item_list"].as_array().cloned().unwrap_or_default();
    if to.is_empty() || client_id.is_empty() {
        return api_error(StatusCode::BAD_REQUEST, "msg.to_user_id and msg.client_id are required");
    }
    if msg["message_type"] != json!(2) || msg["message_state"] != json!(2) {
        return api_error(StatusCode::BAD_REQUEST, "a bot message has message_type 2 and message_state 2");
    }
    if items.len() != 1 {
        return api_error(StatusCode::BAD_REQUEST, "send exactly one item per message");
    }
    let mut state = server.lock();
    let token = msg["context_token"].as_str().unwrap_or_default();
    if !state.context_tokens.get(&to).is_some_and(|tokens| tokens.contains(token)) {
        return axum::Json(json!({ "ret": -2, "errmsg": "invalid context_token for this peer" })).into_response();
    }
    if let Some(message_id) = state.sent_by_client_id.get(&client_id) {
        return axum::Json(json!({ "ret": 0, "message_id": message_id })).into_response();
    }
    let item = items[0].clone();
    let item_type = item["type"].as_i64().unwrap_or_default();
    let text = item["text_item"]["text"].as_str().map(str::to_owned);
    let (media, file_name) = match item_type {
        2 => (item.get("image_item").cloned(), None),
        4 => (item.get("file_item").cloned(), item["file_item"]["file_name"].as_str().map(str::to_owned)),
        5 => (item.get("video_item").cloned(), None),
        _ => (None, None),
    };
    let file = match &media {
        Some(media) => {
            let param = media["media"]["encrypt_query_param"].as_str().unwrap_or_default();
            let key = media_key(media);
            let plain = state.cdn.get(param).and_then(|bytes| key.and_then(|key| decrypt(&key, bytes)));
            match plain {
                Some(plain) => Some(plain),
                None => return api_error(StatusCode::BAD_REQUEST, "the media item names no uploaded file it can open"),
            }
        }
        None if text.is_some() => None,
        None => return api_error(StatusCode::BAD_REQUEST, "an item of an unknown type"),
    };
    let id = state.id();
    let message_id = (7_000_000_000_000_000_000u64 + id).to_string();
    state.sent_by_client_id.insert(client_id.clone(), message_id.clone());
    state.sent.push(SentMessage {
        to,
        client_id,
        message_id: message_id.clone(),
        item_type,
        text,
        file_name,
        file,
        item,
    });
    // uint64 on the wire, as a number.
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(format!("{{\"ret\":0,\"message_id\":{message_id}}}")))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn getconfig(State(server): State<Server>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    if let Err(response) = server.check("getconfig", &headers, &body) {
        return *response;
    }
    let user = body["ilink_user_id"].as_str().unwrap_or_default();
    axum::Json(json!({ "ret": 0, "typing_ticket": STANDARD.encode(format!("ticket:{user}")) })).into_response()
}

async fn sendtyping(State(server): State<Server>, headers: HeaderMap, axum::Json(body): axum::Json<Value>) -> Response {
    if let Err(response) = server.check("sendtyping", &headers, &body) {
        return *response;
    }
    let user = body["ilink_user_id"].as_str().unwrap_or_default().to_owned();
    let ticket = body["typing_ticket"].as_str().unwrap_or_default();
    if ticket != STANDARD.encode(format!("ticket:{user}")) {
        return api_error(StatusCode::BAD_REQUEST, "typing_ticket is not the one getconfig gave for this user");
    }
    let status = body["status"].as_i64().unwrap_or(1);
    server.lock().typing.push((user, status));
    axum::Json(json!({ "ret": 0 })).into_response()
}

async fn getuploadurl(
    State(server): State<Server>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response {
    if let Err(response) = server.check("getuploadurl", &headers, &body) {
        return *response;
    }
    let hex = body["aeskey"].as_str().unwrap_or_default();
    let aeskey: Option<Vec<u8>> = (hex.len() == 32)
        .then(|| (0..32).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect())
        .flatten();
    let (Some(aeskey), Some(filekey), Some(rawsize), Some(filesize), Some(md5)) = (
        aeskey,
        body["filekey"].as_str(),
        body["rawsize"].as_u64(),
        body["filesize"].as_u64(),
        body["rawfilemd5"].as_str(),
    ) else {
        return api_error(
            StatusCode::BAD_REQUEST,
            "filekey, rawsize, rawfilemd5, filesize and a hex aeskey are required",
        );
    };
    if !matches!(body["media_type"].as_i64(), Some(1..=4)) || body["to_user_id"].as_str().is_none_or(str::is_empty) {
        return api_error(StatusCode::BAD_REQUEST, "media_type (1-4) and to_user_id are required");
    }
    let mut state = server.lock();
    let param = format!("up-{}", state.id());
    let upload = Upload { filekey: filekey.to_owned(), aeskey, rawsize, filesize, md5: md5.to_owned() };
    state.uploads.insert(param.clone(), upload);
    let full = format!("{}/c2c/upload?encrypted_query_param={param}&filekey={filekey}", state.base_url);
    axum::Json(json!({ "upload_param": param, "upload_full_url": full })).into_response()
}

async fn cdn_upload(
    State(server): State<Server>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let mut state = server.lock();
    state.calls.push("cdn_upload".to_owned());
    let param = query.get("encrypted_query_param").cloned().unwrap_or_default();
    let Some(upload) = state.uploads.get(&param).cloned() else {
        return (StatusCode::BAD_REQUEST, [("x-error-message", "unknown upload param")]).into_response();
    };
    if query.get("filekey") != Some(&upload.filekey) || body.len() as u64 != upload.filesize {
        return (StatusCode::BAD_REQUEST, [("x-error-message", "filekey or size differs from getuploadurl")])
            .into_response();
    }
    let Some(plain) = decrypt(&upload.aeskey, &body) else {
        return (StatusCode::BAD_REQUEST, [("x-error-message", "the bytes do not open with the announced aeskey")])
            .into_response();
    };
    let md5: String = Md5::digest(&plain).iter().map(|b| format!("{b:02x}")).collect();
    if plain.len() as u64 != upload.rawsize || md5 != upload.md5 {
        return (StatusCode::BAD_REQUEST, [("x-error-message", "rawsize or md5 differs")]).into_response();
    }
    let download = format!("dl-{}", state.id());
    state.cdn.insert(download.clone(), body.to_vec());
    let mut response = StatusCode::OK.into_response();
    if let Ok(value) = HeaderValue::from_str(&download) {
        response.headers_mut().insert("x-encrypted-param", value);
    }
    response
}

async fn cdn_download(State(server): State<Server>, Query(query): Query<HashMap<String, String>>) -> Response {
    let mut state = server.lock();
    state.calls.push("cdn_download".to_owned());
    let param = query.get("encrypted_query_param").cloned().unwrap_or_default();
    match state.cdn.get(&param) {
        Some(bytes) => bytes.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn get_bot_qrcode(State(server): State<Server>, Query(query): Query<HashMap<String, String>>) -> Response {
    if query.get("bot_type").map(String::as_str) != Some("3") {
        return api_error(StatusCode::BAD_REQUEST, "bot_type=3 is required");
    }
    let mut state = server.lock();
    state.calls.push("get_bot_qrcode".to_owned());
    let code = format!("qr-{}", state.id());
    let url = format!("https://liteapp.weixin.qq.com/q/{code}?qrcode={code}&bot_type=3");
    state.qr_codes.push((code.clone(), "wait".to_owned()));
    let count = state.qr_codes.len();
    drop(state);
    server.qr.send_replace(count);
    axum::Json(json!({ "qrcode": code, "qrcode_img_content": url })).into_response()
}

async fn get_qrcode_status(State(server): State<Server>, Query(query): Query<HashMap<String, String>>) -> Response {
    let code = query.get("qrcode").cloned().unwrap_or_default();
    let mut changes = server.qr.subscribe();
    let hold = server.lock().options().hold;
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        {
            let mut state = server.lock();
            state.calls.push("get_qrcode_status".to_owned());
            let Some(mut status) = state.qr_codes.iter().find(|(c, _)| *c == code).map(|(_, s)| s.clone()) else {
                return api_error(StatusCode::BAD_REQUEST, "unknown qrcode");
            };
            if status == "need_verifycode"
                && query.contains_key("verify_code")
                && query.get("verify_code") == state.verify_codes.get(&code)
            {
                status = "scaned".to_owned();
                if let Some(entry) = state.qr_codes.iter_mut().find(|(c, _)| *c == code) {
                    entry.1 = status.clone();
                }
            }
            if status != "wait" || tokio::time::Instant::now() >= deadline {
                let options = state.options().clone();
                let body = if status == "confirmed" {
                    json!({
                        "status": status, "bot_token": options.token, "ilink_bot_id": options.bot_id,
                        "baseurl": state.base_url, "ilink_user_id": options.owner,
                    })
                } else {
                    json!({ "status": status })
                };
                return axum::Json(body).into_response();
            }
        }
        let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
    }
}

impl FakeWeChat {
    pub async fn start(options: FakeWeChatOptions) -> FakeWeChat {
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", 0)).await {
            Ok(listener) => listener,
            Err(error) => panic!("binding the fake wechat on 127.0.0.1 failed: {error}"),
        };
        let address = match listener.local_addr() {
            Ok(address) => address,
            Err(error) => panic!("the fake wechat's address is unknown: {error}"),
        };
        let base_url = format!("http://{address}");
        let state = FakeState { options, base_url: base_url.clone(), ..FakeState::default() };
        let server =
            Server { state: Arc::new(Mutex::new(state)), updates: watch::channel(0).0, qr: watch::channel(0).0 };
        let app = Router::new()
            .route("/ilink/bot/getupdates", post(getupdates))
            .route("/ilink/bot/sendmessage", post(sendmessage))
            .route("/ilink/bot/getconfig", post(getconfig))
            .route("/ilink/bot/sendtyping", post(sendtyping))
            .route("/ilink/bot/getuploadurl", post(getuploadurl))
            .route("/ilink/bot/get_bot_qrcode", post(get_bot_qrcode))
            .route("/ilink/bot/get_qrcode_status", get(get_qrcode_status))
            .route("/c2c/upload", post(cdn_upload))
            .route("/c2c/download", get(cdn_download))
            .with_state(server.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeWeChat { server, base_url, task }
    }

    /// The iLink API's address (`base_url`).
    pub fn base_url(&self) -> String {
        self.base_url.clone()
    }

    /// The CDN's address (`cdn_base_url`).
    pub fn cdn_base_url(&self) -> String {
        format!("{}/c2c", self.base_url)
    }

    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.server.lock()
    }

    fn push_update(&self, mut message: Value, peer: &str) -> String {
        let mut state = self.server.lock();
        state.next_message_id += 1;
        let id = 6_000_000_000_000_000_000u64 + state.next_message_id;
        let token = format!("ctx-{peer}-{}", state.next_message_id);
        state.context_tokens.entry(peer.to_owned()).or_default().insert(token.clone());
        let bot = state.options().bot_id.clone();
        let seq = state.updates.len() + 1;
        message["message_id"] = json!(id);
        message["seq"] = json!(seq);
        message["to_user_id"] = json!(bot);
        message["message_type"] = json!(1);
        message["message_state"] = json!(2);
        message["context_token"] = json!(token);
        message["create_time_ms"] = json!(chrono::Utc::now().timestamp_millis());
        state.updates.push(message);
        let count = state.updates.len();
        drop(state);
        self.server.updates.send_replace(count);
        id.to_string()
    }

    /// `user` writes `items` to the bot directly; returns the message id.
    pub fn user_sends(&self, user: &str, items: Vec<Value>) -> String {
        self.push_update(json!({ "from_user_id": user, "item_list": items }), user)
    }

    /// `user` writes `text` to the bot directly; returns the message id.
    pub fn user_says(&self, user: &str, text: &str) -> String {
        self.user_sends(user, vec![json!({ "type": 1, "text_item": { "text": text } })])
    }

    /// `user` writes `text` in the group `room` (`…@chatroom`); returns the message id.
    pub fn room_says(&self, room: &str, user: &str, text: &str) -> String {
        let items = vec![json!({ "type": 1, "text_item": { "text": text } })];
        self.push_update(json!({ "from_user_id": user, "group_id": room, "item_list": items }), room)
    }

    /// Deliver the message `message_id` once more (a duplicate delivery).
    pub fn redeliver(&self, message_id: &str) {
        let mut state = self.server.lock();
        let again = state
            .updates
            .iter()
            .find(|m| m["message_id"].as_u64().map(|id| id.to_string()).as_deref() == Some(message_id))
            .cloned();
        if let Some(again) = again {
            state.updates.push(again);
        }
        let count = state.updates.len();
        drop(state);
        self.server.updates.send_replace(count);
    }

    /// Put already-encrypted bytes on the CDN; the reference for an item's `media`.
    pub fn put_cdn(&self, encrypted: Vec<u8>) -> CdnRef {
        let mut state = self.server.lock();
        let param = format!("dl-{}", state.id());
        state.cdn.insert(param.clone(), encrypted);
        CdnRef { encrypt_query_param: param }
    }

    /// The next `n` calls of `endpoint` (`getupdates`, `sendmessage`, `getuploadurl`, …) meet
    /// `fault`.
    pub fn fail_next(&self, endpoint: &str, n: usize, fault: Fault) {
        self.server.lock().faults.extend(std::iter::repeat_n((endpoint.to_owned(), fault), n));
    }

    /// The next `pass` calls of `endpoint` succeed, then `n` meet `fault`.
    pub fn fail_after(&self, endpoint: &str, pass: usize, n: usize, fault: Fault) {
        let mut state = self.server.lock();
        state.passes.insert(endpoint.to_owned(), pass);
        state.faults.extend(std::iter::repeat_n((endpoint.to_owned(), fault), n));
    }

    /// Forget every queued fault: the API works again.
    pub fn clear_faults(&self) {
        let mut state = self.server.lock();
        state.faults.clear();
        state.passes.clear();
    }

    /// A context token for `peer`, as if it had written to the bot (a room that spoke before
    /// the test began).
    pub fn grant_context_token(&self, peer: &str) -> String {
        let mut state = self.server.lock();
        let token = format!("ctx-{peer}-granted-{}", state.id());
        state.context_tokens.entry(peer.to_owned()).or_default().insert(token.clone());
        token
    }

    /// The `get_updates_buf` each `getupdates` carried, oldest first.
    pub fn cursors(&self) -> Vec<String> {
        self.server.lock().cursors.clone()
    }

    /// From now on every authenticated call answers errcode -14 (until [`Self::renew_session`]).
    pub fn expire_session(&self) {
        self.server.lock().session_expired = true;
    }

    pub fn renew_session(&self) {
        self.server.lock().session_expired = false;
    }

    /// What the bot sent, oldest first.
    pub fn sent(&self) -> Vec<SentMessage> {
        self.server.lock().sent.clone()
    }

    /// The texts shown to `peer`, oldest first.
    pub fn texts_to(&self, peer: &str) -> Vec<String> {
        self.sent().into_iter().filter(|m| m.to == peer).filter_map(|m| m.text).collect()
    }

    /// Typing indicators sent: (user, status 1 on / 2 off).
    pub fn typing(&self) -> Vec<(String, i64)> {
        self.server.lock().typing.clone()
    }

    /// The calls received, by endpoint name, oldest first.
    pub fn calls(&self) -> Vec<String> {
        self.server.lock().calls.clone()
    }

    /// The QR codes issued, oldest first.
    pub fn qr_codes(&self) -> Vec<String> {
        self.server.lock().qr_codes.iter().map(|(code, _)| code.clone()).collect()
    }

    fn set_qr(&self, code: &str, status: &str) {
        let mut state = self.server.lock();
        if let Some(entry) = state.qr_codes.iter_mut().find(|(c, _)| c == code) {
            entry.1 = status.to_owned();
        }
        let count = state.qr_codes.len();
        drop(state);
        // Wake held status polls.
        self.server.qr.send_replace(count + 1_000_000);
        self.server.qr.send_replace(count);
    }

    /// The phone shows `number`; the code waits in `need_verifycode` until a poll carries it.
    pub fn ask_verify_code(&self, code: &str, number: &str) {
        self.server.lock().verify_codes.insert(code.to_owned(), number.to_owned());
        self.set_qr(code, "need_verifycode");
    }

    /// The status of a QR code now.
    pub fn qr_status(&self, code: &str) -> Option<String> {
        self.server.lock().qr_codes.iter().find(|(c, _)| c == code).map(|(_, status)| status.clone())
    }

    pub fn scan(&self, code: &str) {
        self.set_qr(code, "scaned");
    }

    pub fn confirm(&self, code: &str) {
        self.set_qr(code, "confirmed");
    }

    pub fn expire_qr(&self, code: &str) {
        self.set_qr(code, "expired");
    }

    /// Wait until `ready` holds for the state, at most `within`; false on a timeout.
    pub async fn wait_for(&self, ready: impl Fn(&FakeState) -> bool, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if ready(&self.server.lock()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl FakeState {
    pub fn sent(&self) -> &[SentMessage] {
        &self.sent
    }

    pub fn calls(&self) -> &[String] {
        &self.calls
    }

    pub fn pending_faults(&self) -> usize {
        self.faults.len()
    }

    pub fn qr_count(&self) -> usize {
        self.qr_codes.len()
    }

    pub fn typing(&self) -> &[(String, i64)] {
        &self.typing
    }
}
