//! The iLink bot API: typed requests and responses, and one client for its calls.
//!
//! Every call is `POST {base_url}/ilink/bot/<name>` with a JSON body carrying `base_info`, and
//! the headers `Content-Type: application/json`, `AuthorizationType: ilink_bot_token`,
//! `Authorization: Bearer <token>` and `X-WECHAT-UIN` (base64 of a random uint32's decimal
//! text). The QR login calls are unauthenticated: `POST ilink/bot/get_bot_qrcode?bot_type=3`
//! and `GET ilink/bot/get_qrcode_status?qrcode=…`. A body's `ret`/`errcode` other than 0 is a
//! failure; `-14` means the session expired (pair again).
//!
//! Errors are classified as delivery and polling need them ([`ApiError`]). Not here: what the
//! calls are used for ([`super::inbound`], [`super::outbound`], [`super::pair`]).

use std::time::Duration;

use base64::Engine;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};

/// The errcode of an expired session.
pub const SESSION_EXPIRED: i64 = -14;
/// `message_type` of a person's message and of a bot's.
pub const MESSAGE_TYPE_USER: i64 = 1;
pub const MESSAGE_TYPE_BOT: i64 = 2;
/// `message_state` of a finished message.
pub const MESSAGE_STATE_FINISH: i64 = 2;
/// `sendtyping` statuses.
pub const TYPING_ON: i64 = 1;
pub const TYPING_OFF: i64 = 2;
/// The `bot_type` the reference client pairs as.
pub const BOT_TYPE: &str = "3";
/// What the client reports as its version in `base_info`.
const CHANNEL_VERSION: &str = concat!("kesoku/", env!("CARGO_PKG_VERSION"));

/// A bot token. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct BotToken(String);

impl BotToken {
    pub fn new(token: impl Into<String>) -> Self {
        BotToken(token.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for BotToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BotToken([redacted])")
    }
}

/// Why an iLink call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// Worth trying again: connection, timeout, 5xx, 429, or a non-zero `ret` of unknown cause.
    #[error("wechat `{endpoint}` failed, will retry: {reason}")]
    Transient { endpoint: &'static str, reason: String },
    /// No answer within the request's time limit (worth trying again; for the long poll, an
    /// empty batch).
    #[error("wechat `{endpoint}` did not answer in time, will retry")]
    TimedOut { endpoint: &'static str },
    /// errcode -14: the bot's session is over until someone pairs again.
    #[error(
        "wechat `{endpoint}`: the bot's session expired (errcode -14): run `kesoku wechat pair` and restart the service; messages wait until then"
    )]
    SessionExpired { endpoint: &'static str },
    /// A request the server will never accept (4xx, a malformed answer).
    #[error("wechat `{endpoint}` refused the request: {reason}")]
    Permanent { endpoint: &'static str, reason: String },
}

impl ApiError {
    pub fn is_session_expired(&self) -> bool {
        matches!(self, ApiError::SessionExpired { .. })
    }
}

/// Accepts an id as a JSON number (uint64 on the wire) or string.
fn lossless_id<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<Value>::deserialize(deserializer)? {
        Some(Value::String(text)) => Some(text),
        Some(Value::Number(number)) => Some(number.to_string()),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    })
}

/// A CDN media reference.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CdnMedia {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypt_query_param: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aes_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypt_type: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_url: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextItem {
    #[serde(default)]
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media: Option<CdnMedia>,
    /// The key as 32 hex characters; preferred over `media.aes_key` when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aeskey: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoiceItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media: Option<CdnMedia>,
    /// The server's transcription.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub playtime: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media: Option<CdnMedia>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md5: Option<String>,
    /// The plaintext size, as a decimal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub len: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VideoItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media: Option<CdnMedia>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video_size: Option<u64>,
}

/// Item types of `item_list`.
pub mod item_type {
    pub const TEXT: i64 = 1;
    pub const IMAGE: i64 = 2;
    pub const VOICE: i64 = 3;
    pub const FILE: i64 = 4;
    pub const VIDEO: i64 = 5;
}

/// Upload media types of `getuploadurl`.
pub mod upload_type {
    pub const IMAGE: i64 = 1;
    pub const VIDEO: i64 = 2;
    pub const FILE: i64 = 3;
}

/// One entry of a message's `item_list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageItem {
    #[serde(rename = "type", default)]
    pub item_type: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_item: Option<TextItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_item: Option<ImageItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice_item: Option<VoiceItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_item: Option<FileItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video_item: Option<VideoItem>,
}

impl MessageItem {
    pub fn text(text: impl Into<String>) -> Self {
        MessageItem {
            item_type: item_type::TEXT,
            text_item: Some(TextItem { text: text.into() }),
            ..MessageItem::default()
        }
    }
}

/// A message (`WeixinMessage`), as received and as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeixinMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<i64>,
    #[serde(default, deserialize_with = "lossless_id", skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    #[serde(default)]
    pub from_user_id: String,
    #[serde(default)]
    pub to_user_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_time_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_type: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_state: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub item_list: Vec<MessageItem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_token: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct GetUpdatesResponse {
    #[serde(default)]
    pub ret: Option<i64>,
    #[serde(default)]
    pub errcode: Option<i64>,
    #[serde(default)]
    pub errmsg: Option<String>,
    #[serde(default)]
    pub msgs: Vec<WeixinMessage>,
    #[serde(default)]
    pub get_updates_buf: Option<String>,
    #[serde(default)]
    pub longpolling_timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GetUploadUrlParams {
    pub filekey: String,
    pub media_type: i64,
    pub to_user_id: String,
    pub rawsize: u64,
    pub rawfilemd5: String,
    pub filesize: u64,
    pub no_need_thumb: bool,
    pub aeskey: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct GetUploadUrlResponse {
    #[serde(default)]
    pub upload_param: Option<String>,
    #[serde(default)]
    pub upload_full_url: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct QrCodeResponse {
    pub qrcode: String,
    /// The URL to encode in the QR image.
    pub qrcode_img_content: String,
}

/// `get_qrcode_status`: `wait`, `scaned`, `confirmed`, `expired` (and redirects).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
pub struct QrStatusResponse {
    pub status: String,
    #[serde(default)]
    pub bot_token: Option<String>,
    #[serde(default)]
    pub ilink_bot_id: Option<String>,
    #[serde(default)]
    pub baseurl: Option<String>,
    #[serde(default)]
    pub ilink_user_id: Option<String>,
    /// With `scaned_but_redirect`: the host to poll from now on.
    #[serde(default)]
    pub redirect_host: Option<String>,
}

impl std::fmt::Debug for QrStatusResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QrStatusResponse")
            .field("status", &self.status)
            .field("bot_token", &self.bot_token.as_ref().map(|_| "[redacted]"))
            .field("ilink_bot_id", &self.ilink_bot_id)
            .field("baseurl", &self.baseurl)
            .field("ilink_user_id", &self.ilink_user_id)
            .field("redirect_host", &self.redirect_host)
            .finish()
    }
}

/// A client of one bot account.
#[derive(Clone)]
pub struct ILinkClient {
    http: reqwest::Client,
    base_url: String,
    token: BotToken,
    /// Per-request timeout of the short calls (the long poll has its own).
    timeout: Duration,
}

impl std::fmt::Debug for ILinkClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ILinkClient").field("base_url", &self.base_url).finish_non_exhaustive()
    }
}

fn base_info() -> Value {
    json!({ "channel_version": CHANNEL_VERSION, "bot_agent": CHANNEL_VERSION })
}

fn wechat_uin() -> String {
    let uin: u32 = rand::random();
    base64::engine::general_purpose::STANDARD.encode(uin.to_string())
}

fn url(base_url: &str, endpoint: &str) -> String {
    format!("{}/{endpoint}", base_url.trim_end_matches('/'))
}

fn transport_error(endpoint: &'static str, error: &reqwest::Error) -> ApiError {
    // Only the kind of failure: the error's text would repeat the URL.
    if error.is_timeout() {
        return ApiError::TimedOut { endpoint };
    }
    let reason = if error.is_connect() {
        "could not connect"
    } else if error.is_body() || error.is_decode() {
        "the connection broke while reading the answer"
    } else {
        "the request failed"
    };
    ApiError::Transient { endpoint, reason: reason.to_owned() }
}

/// Read a response: classify the HTTP status and the body's `ret`/`errcode`.
async fn read<T: DeserializeOwned>(endpoint: &'static str, response: reqwest::Response) -> Result<T, ApiError> {
    let status = response.status();
    let body = response.bytes().await.map_err(|error| transport_error(endpoint, &error))?;
    if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
        return Err(ApiError::Transient { endpoint, reason: format!("http {status}") });
    }
    if !status.is_success() {
        return Err(ApiError::Permanent { endpoint, reason: format!("http {status}") });
    }
    let value: Value = serde_json::from_slice(&body)
        .map_err(|error| ApiError::Transient { endpoint, reason: format!("the answer is not json: {error}") })?;
    let code = |key: &str| value.get(key).and_then(Value::as_i64).filter(|code| *code != 0);
    if let Some(code) = code("errcode").or_else(|| code("ret")) {
        if code == SESSION_EXPIRED {
            return Err(ApiError::SessionExpired { endpoint });
        }
        let message = value.get("errmsg").and_then(Value::as_str).unwrap_or("no message");
        return Err(ApiError::Transient { endpoint, reason: format!("ret {code}: {message}") });
    }
    serde_json::from_value(value)
        .map_err(|error| ApiError::Permanent { endpoint, reason: format!("an answer of an unexpected shape: {error}") })
}

impl ILinkClient {
    pub fn new(base_url: &str, token: BotToken) -> Self {
        ILinkClient {
            http: reqwest::Client::new(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            token,
            timeout: Duration::from_secs(15),
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    async fn post<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        mut body: Value,
        timeout: Duration,
    ) -> Result<T, ApiError> {
        body["base_info"] = base_info();
        let response = self
            .http
            .post(url(&self.base_url, endpoint))
            .header("AuthorizationType", "ilink_bot_token")
            .header("Authorization", format!("Bearer {}", self.token.expose()))
            .header("X-WECHAT-UIN", wechat_uin())
            .timeout(timeout)
            .json(&body)
            .send()
            .await
            .map_err(|error| transport_error(endpoint, &error))?;
        read(endpoint, response).await
    }

    /// Long-poll for messages after `cursor`. A client-side timeout is an empty batch at the
    /// same cursor, as the server's own timeout would be.
    pub async fn get_updates(&self, cursor: &str, timeout: Duration) -> Result<GetUpdatesResponse, ApiError> {
        let body = json!({ "get_updates_buf": cursor });
        match self.post("ilink/bot/getupdates", body, timeout + Duration::from_secs(5)).await {
            Err(ApiError::TimedOut { .. }) => {
                Ok(GetUpdatesResponse { get_updates_buf: Some(cursor.to_owned()), ..GetUpdatesResponse::default() })
            }
            other => other,
        }
    }

    /// Send one message; returns the server's message id (or the client id when it names none).
    pub async fn send_message(&self, message: &WeixinMessage) -> Result<String, ApiError> {
        #[derive(Deserialize)]
        struct Sent {
            #[serde(default, deserialize_with = "lossless_id")]
            message_id: Option<String>,
        }
        let sent: Sent = self.post("ilink/bot/sendmessage", json!({ "msg": message }), self.timeout).await?;
        Ok(sent.message_id.or_else(|| message.client_id.clone()).unwrap_or_default())
    }

    pub async fn get_upload_url(&self, params: &GetUploadUrlParams) -> Result<GetUploadUrlResponse, ApiError> {
        let body = serde_json::to_value(params)
            .map_err(|error| ApiError::Permanent { endpoint: "ilink/bot/getuploadurl", reason: error.to_string() })?;
        self.post("ilink/bot/getuploadurl", body, self.timeout).await
    }

    /// The typing ticket for `user` (`getconfig`).
    pub async fn typing_ticket(&self, user: &str, context_token: Option<&str>) -> Result<Option<String>, ApiError> {
        #[derive(Deserialize)]
        struct Config {
            #[serde(default)]
            typing_ticket: Option<String>,
        }
        let body = json!({ "ilink_user_id": user, "context_token": context_token });
        let config: Config = self.post("ilink/bot/getconfig", body, self.timeout).await?;
        Ok(config.typing_ticket)
    }

    pub async fn send_typing(&self, user: &str, ticket: &str, status: i64) -> Result<(), ApiError> {
        let body = json!({ "ilink_user_id": user, "typing_ticket": ticket, "status": status });
        let _: Value = self.post("ilink/bot/sendtyping", body, self.timeout).await?;
        Ok(())
    }
}

/// `get_bot_qrcode`: a new login QR code.
pub async fn get_bot_qrcode(http: &reqwest::Client, base_url: &str) -> Result<QrCodeResponse, ApiError> {
    const ENDPOINT: &str = "ilink/bot/get_bot_qrcode";
    let response = http
        .post(format!("{}?bot_type={BOT_TYPE}", url(base_url, ENDPOINT)))
        .timeout(Duration::from_secs(15))
        .json(&json!({ "local_token_list": [] }))
        .send()
        .await
        .map_err(|error| transport_error(ENDPOINT, &error))?;
    read(ENDPOINT, response).await
}

/// `get_qrcode_status`: held by the server until the status changes or it times out; a
/// client-side timeout is `wait`. `verify_code` answers `need_verifycode`.
pub async fn get_qrcode_status(
    http: &reqwest::Client,
    base_url: &str,
    qrcode: &str,
    verify_code: Option<&str>,
) -> Result<QrStatusResponse, ApiError> {
    const ENDPOINT: &str = "ilink/bot/get_qrcode_status";
    let mut address = reqwest::Url::parse(&url(base_url, ENDPOINT))
        .map_err(|_| ApiError::Permanent { endpoint: ENDPOINT, reason: format!("`{base_url}` is not a url") })?;
    address.query_pairs_mut().append_pair("qrcode", qrcode);
    if let Some(code) = verify_code {
        address.query_pairs_mut().append_pair("verify_code", code);
    }
    let sent = http.get(address).timeout(Duration::from_secs(40)).send().await;
    match sent {
        Ok(response) => read(ENDPOINT, response).await,
        Err(error) if error.is_timeout() => Ok(QrStatusResponse { status: "wait".to_owned(), ..Default::default() }),
        Err(error) => Err(transport_error(ENDPOINT, &error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_parse_losslessly_from_numbers_and_strings() {
        let number: WeixinMessage =
            serde_json::from_str(r#"{"message_id": 18446744073709551615, "from_user_id": "a"}"#).expect("parses");
        assert_eq!(number.message_id.as_deref(), Some("18446744073709551615"));
        let text: WeixinMessage = serde_json::from_str(r#"{"message_id": "7"}"#).expect("parses");
        assert_eq!(text.message_id.as_deref(), Some("7"));
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        assert_eq!(format!("{:?}", BotToken::new("s3cret")), "BotToken([redacted])");
        let status =
            QrStatusResponse { status: "confirmed".into(), bot_token: Some("s3cret".into()), ..Default::default() };
        assert!(!format!("{status:?}").contains("s3cret"));
        let client = ILinkClient::new("http://x", BotToken::new("s3cret"));
        assert!(!format!("{client:?}").contains("s3cret"));
    }

    #[test]
    fn sent_messages_leave_out_empty_fields() {
        let message = WeixinMessage {
            to_user_id: "u@im.wechat".into(),
            client_id: Some("c1".into()),
            message_type: Some(MESSAGE_TYPE_BOT),
            message_state: Some(MESSAGE_STATE_FINISH),
            item_list: vec![MessageItem::text("hi")],
            context_token: Some("ctx".into()),
            ..WeixinMessage::default()
        };
        let value = serde_json::to_value(&message).expect("serializes");
        assert_eq!(
            value,
            json!({
                "from_user_id": "", "to_user_id": "u@im.wechat", "client_id": "c1", "message_type": 2,
                "message_state": 2, "item_list": [{"type": 1, "text_item": {"text": "hi"}}], "context_token": "ctx"
            })
        );
    }
}
