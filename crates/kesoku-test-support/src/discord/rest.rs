//! The REST API under `/api/v10` and the attachment files under `/attachments`: routing,
//! the bot token, JSON and multipart bodies, injected faults, Discord's error and rate-limit
//! shapes, and recording every request.
//!
//! The rules of each endpoint live in the state; this module only translates HTTP.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use axum::routing::{any, get};
use serde_json::{Value, json};

use super::state::{ApiError, MessageParts, UploadedFile, file_content_type};
use super::{ChannelId, FakeMessage, Fault, GuildId, InteractionId, MessageId, RecordedRequest, Shared};

/// Discord's upload limit for bots without boosts is 10 MiB per file; allow a few files.
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// The per-route limit the fake advertises (Discord's typical message bucket).
const ADVERTISED_LIMIT: u32 = 5;

pub(super) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/attachments/{channel}/{attachment}/{filename}", get(attachment))
        .route("/api/v10/{*rest}", any(api))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// A request body: JSON, or multipart with `payload_json` and `files[n]`.
#[derive(Debug, Default)]
struct RequestBody {
    json: Value,
    files: Vec<(String, UploadedFile)>,
}

/// What an endpoint answers.
enum Answer {
    Json(StatusCode, Value),
    NoContent,
}

type Outcome = Result<Answer, ApiError>;

async fn api(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().map(str::to_owned);
    let headers = request.headers().clone();
    let segments: Vec<String> =
        path.trim_start_matches("/api/v10/").split('/').filter(|part| !part.is_empty()).map(str::to_owned).collect();
    let bucket = bucket_of(&method, &segments);

    let body = match read_body(request).await {
        Ok(body) => body,
        Err(error) => {
            let response = error_response(&error, &bucket);
            record(&shared, &method, &path, &query, &RequestBody::default(), response.status());
            return response;
        }
    };

    // Interaction callbacks and webhooks authenticate with their token in the path.
    let needs_bot_token = !matches!(segments.first().map(String::as_str), Some("interactions" | "webhooks"));
    let response = if needs_bot_token && !authorized(&shared, &headers) {
        error_response(&ApiError::new(401, 0), &bucket)
    } else if let Some(fault) = shared.update(|state| state.next_fault()) {
        fault_response(&fault, &bucket)
    } else {
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        match route(&shared, &method, &segments, query.as_deref(), &body) {
            Ok(answer) => answer_response(answer, &bucket),
            Err(error) => error_response(&error, &bucket),
        }
    };
    record(&shared, &method, &path, &query, &body, response.status());
    response
}

fn record(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: &Option<String>,
    body: &RequestBody,
    status: StatusCode,
) {
    let request = RecordedRequest {
        method: method.to_string(),
        path: path.to_owned(),
        query: query.clone(),
        body: body.json.clone(),
        files: body
            .files
            .iter()
            .map(|(field, file)| (field.clone(), file.filename.clone(), file.bytes.len()))
            .collect(),
        status: status.as_u16(),
    };
    shared.update(|state| state.record(request));
}

fn authorized(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok()) else {
        return false;
    };
    shared.read(|state| value.strip_prefix("Bot ").is_some_and(|token| token == state.options.token))
}

async fn read_body(request: Request) -> Result<RequestBody, ApiError> {
    let is_multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("multipart/form-data"));
    if is_multipart {
        return read_multipart(request).await;
    }
    let bytes = axum::body::to_bytes(request.into_body(), BODY_LIMIT)
        .await
        .map_err(|_| ApiError { message: "Request entity too large".to_owned(), ..ApiError::new(413, 40005) })?;
    if bytes.is_empty() {
        return Ok(RequestBody::default());
    }
    let json = serde_json::from_slice(&bytes).map_err(|_| invalid_json())?;
    Ok(RequestBody { json, files: Vec::new() })
}

fn invalid_json() -> ApiError {
    ApiError { message: "The request body contains invalid JSON.".to_owned(), ..ApiError::new(400, 50109) }
}

async fn read_multipart(request: Request) -> Result<RequestBody, ApiError> {
    let mut multipart = Multipart::from_request(request, &()).await.map_err(|_| invalid_json())?;
    let mut body = RequestBody::default();
    while let Some(field) = multipart.next_field().await.map_err(|_| invalid_json())? {
        let name = field.name().unwrap_or("").to_owned();
        let filename = field.file_name().map(str::to_owned);
        let content_type = field.content_type().map(str::to_owned);
        let bytes = field.bytes().await.map_err(|_| invalid_json())?;
        if name == "payload_json" {
            body.json = serde_json::from_slice(&bytes).map_err(|_| invalid_json())?;
        } else if let Some(filename) = filename {
            body.files.push((name, UploadedFile { filename, content_type, bytes: bytes.to_vec() }));
        }
    }
    Ok(body)
}

fn snowflake(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>().ok().filter(|id| *id > 0).ok_or_else(|| {
        ApiError::invalid_form("id", "NUMBER_TYPE_COERCE", &format!("Value \"{text}\" is not snowflake."))
    })
}

fn ok(value: Value) -> Outcome {
    Ok(Answer::Json(StatusCode::OK, value))
}

fn created(value: Value) -> Outcome {
    Ok(Answer::Json(StatusCode::CREATED, value))
}

fn route(shared: &Shared, method: &Method, segments: &[&str], query: Option<&str>, body: &RequestBody) -> Outcome {
    let json = &body.json;
    if let ["channels", channel, ..] = segments
        && shared.read(|state| state.access_denied(ChannelId(snowflake(channel).unwrap_or(0))))
    {
        return Err(ApiError::new(403, 50001));
    }
    match (method.as_str(), segments) {
        ("GET", ["gateway"]) => shared.read(|state| ok(json!({"url": state.gateway_url}))),
        ("GET", ["gateway", "bot"]) => shared.read(|state| {
            ok(json!({
                "url": state.gateway_url,
                "shards": 1,
                "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 86_400_000, "max_concurrency": 1},
            }))
        }),
        ("GET", ["users", "@me"]) => shared.read(|state| ok(state.current_user_json())),
        ("GET", ["applications", "@me"] | ["oauth2", "applications", "@me"]) => {
            shared.read(|state| ok(state.application_json()))
        }
        ("GET", ["channels", channel]) => {
            let channel = ChannelId(snowflake(channel)?);
            shared.read(|state| {
                if state.channel_exists(channel) { ok(state.channel_json(channel)) } else { Err(ApiError::new(404, 10003)) }
            })
        }
        ("GET", ["channels", channel, "messages"]) => {
            let channel = ChannelId(snowflake(channel)?);
            let page = MessagePage::from_query(query)?;
            shared.read(|state| {
                if !state.channel_exists(channel) {
                    return Err(ApiError::new(404, 10003));
                }
                let messages = page
                    .select(&state.messages(channel))
                    .into_iter()
                    .filter_map(|message| state.find_message(channel, message))
                    .map(|stored| state.message_json(stored, false))
                    .collect();
                ok(Value::Array(messages))
            })
        }
        ("GET", ["channels", channel, "messages", message]) => {
            let channel = ChannelId(snowflake(channel)?);
            let message = MessageId(snowflake(message)?);
            shared.read(|state| {
                if !state.channel_exists(channel) {
                    return Err(ApiError::new(404, 10003));
                }
                let stored = state.find_message(channel, message).ok_or_else(|| ApiError::new(404, 10008))?;
                ok(state.message_json(stored, false))
            })
        }
        ("POST", ["channels", channel, "messages"]) => {
            let channel = ChannelId(snowflake(channel)?);
            let parts = message_parts(body)?;
            let nonce = json.get("nonce").filter(|nonce| !nonce.is_null()).cloned();
            let enforce_nonce = json.get("enforce_nonce").and_then(Value::as_bool).unwrap_or(false);
            shared.update(|state| state.create_message(channel, parts, nonce, enforce_nonce, None)).and_then(ok)
        }
        ("PATCH", ["channels", channel, "messages", message]) => {
            let channel = ChannelId(snowflake(channel)?);
            let message = MessageId(snowflake(message)?);
            let parts = message_parts(body)?;
            shared.update(|state| state.edit_message(channel, message, parts)).and_then(ok)
        }
        ("DELETE", ["channels", channel, "messages", message]) => {
            let channel = ChannelId(snowflake(channel)?);
            let message = MessageId(snowflake(message)?);
            shared.update(|state| state.delete_message(channel, message)).map(|()| Answer::NoContent)
        }
        ("POST", ["channels", channel, "messages", message, "threads"]) => {
            let channel = ChannelId(snowflake(channel)?);
            let message = MessageId(snowflake(message)?);
            let name = required_str(json, "name")?;
            let archive = json.get("auto_archive_duration").and_then(Value::as_u64);
            shared.update(|state| state.start_thread_from_message(channel, message, &name, archive)).and_then(created)
        }
        ("POST", ["channels", channel, "threads"]) => {
            let channel = ChannelId(snowflake(channel)?);
            let name = required_str(json, "name")?;
            let kind = json.get("type").and_then(Value::as_u64).and_then(|kind| u8::try_from(kind).ok());
            let archive = json.get("auto_archive_duration").and_then(Value::as_u64);
            shared.update(|state| state.start_thread(channel, &name, kind, archive)).and_then(created)
        }
        ("POST", ["channels", channel, "typing"]) => {
            let channel = ChannelId(snowflake(channel)?);
            shared.update(|state| state.trigger_typing(channel)).map(|()| Answer::NoContent)
        }
        ("PUT", ["applications", application, "commands"]) => {
            check_application(shared, application)?;
            let commands = command_list(json)?;
            shared.update(|state| state.bulk_overwrite_commands(None, commands)).and_then(ok)
        }
        ("PUT", ["applications", application, "guilds", guild, "commands"]) => {
            check_application(shared, application)?;
            let guild = GuildId(snowflake(guild)?);
            let commands = command_list(json)?;
            shared.update(|state| state.bulk_overwrite_commands(Some(guild), commands)).and_then(ok)
        }
        ("GET", ["applications", application, "commands"]) => {
            check_application(shared, application)?;
            shared.read(|state| ok(state.registered_commands()["global"].clone()))
        }
        ("GET", ["applications", application, "guilds", guild, "commands"]) => {
            check_application(shared, application)?;
            let guild = snowflake(guild)?;
            shared.read(|state| {
                ok(state.registered_commands()["guilds"].get(guild.to_string()).cloned().unwrap_or_else(|| json!([])))
            })
        }
        ("POST", ["interactions", interaction, token, "callback"]) => {
            let interaction = InteractionId(snowflake(interaction)?);
            let parts = message_parts(&RequestBody {
                json: json.get("data").cloned().unwrap_or(Value::Null),
                files: body.files.clone(),
            })?;
            let with_response = query_param(query, "with_response") == Some("true");
            let message = shared.update(|state| state.interaction_callback(interaction, token, json.clone(), parts))?;
            if with_response {
                let mut resource = json!({"type": json["type"]});
                if let Some(message) = message {
                    resource["message"] = message;
                }
                ok(json!({"interaction": {"id": interaction.to_string(), "type": json["type"]}, "resource": resource}))
            } else {
                Ok(Answer::NoContent)
            }
        }
        ("POST", ["webhooks", application, token]) => {
            let application = snowflake(application)?;
            let parts = message_parts(body)?;
            shared.update(|state| state.followup(application, token, json.clone(), parts)).and_then(ok)
        }
        ("GET", ["webhooks", application, token, "messages", "@original"]) => {
            let application = snowflake(application)?;
            shared.read(|state| state.original(application, token)).and_then(ok)
        }
        ("PATCH", ["webhooks", application, token, "messages", target]) => {
            let application = snowflake(application)?;
            let parts = message_parts(body)?;
            shared.update(|state| state.edit_interaction_message(application, token, target, json.clone(), parts)).and_then(ok)
        }
        ("DELETE", ["webhooks", application, token, "messages", "@original"]) => {
            let application = snowflake(application)?;
            shared.update(|state| state.delete_original(application, token)).map(|()| Answer::NoContent)
        }
        _ => Err(ApiError::new(404, 0)),
    }
}

fn check_application(shared: &Shared, application: &str) -> Result<(), ApiError> {
    let application = snowflake(application)?;
    if shared.read(|state| state.options.application_id == application) {
        Ok(())
    } else {
        Err(ApiError::new(403, 50001))
    }
}

fn command_list(json: &Value) -> Result<Vec<Value>, ApiError> {
    json.as_array().cloned().ok_or_else(|| {
        ApiError::invalid_form("_errors", "LIST_TYPE_CONVERT", "Only iterables may be used in a ListType")
    })
}

fn required_str(json: &Value, field: &str) -> Result<String, ApiError> {
    json.get(field)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ApiError::invalid_form(field, "BASE_TYPE_REQUIRED", "This field is required"))
}

/// `GET /channels/{id}/messages`'s query: `limit` (1–100, default 50) and one of `after` or
/// `before` (`around` is not used by the adapter and not served).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MessagePage {
    limit: usize,
    after: Option<u64>,
    before: Option<u64>,
}

impl MessagePage {
    fn from_query(query: Option<&str>) -> Result<MessagePage, ApiError> {
        let limit = match query_param(query, "limit") {
            None => 50,
            Some(text) => match text.parse::<usize>() {
                Ok(limit @ 1..=100) => limit,
                Ok(_) | Err(_) => {
                    return Err(ApiError::invalid_form(
                        "limit",
                        "NUMBER_TYPE_MAX",
                        "int value should be less than or equal to 100.",
                    ));
                }
            },
        };
        let id = |name: &str| query_param(query, name).map(snowflake).transpose();
        Ok(MessagePage { limit, after: id("after")?, before: id("before")? })
    }

    /// The ids of this page of `messages` (oldest first), as Discord answers: always newest
    /// first; with `after`, the `limit` messages right after it (so a reader paging forward
    /// takes the highest id of a page as the next `after`); with `before` (or neither), the
    /// `limit` messages right before it (or the latest).
    fn select(self, messages: &[FakeMessage]) -> Vec<MessageId> {
        let ids = messages.iter().map(|message| message.id);
        let mut page: Vec<MessageId> = match (self.after, self.before) {
            (Some(after), before) => {
                ids.filter(|id| id.0 > after && before.is_none_or(|before| id.0 < before)).take(self.limit).collect()
            }
            (None, before) => {
                let older: Vec<MessageId> = ids.filter(|id| before.is_none_or(|before| id.0 < before)).collect();
                older[older.len().saturating_sub(self.limit)..].to_vec()
            }
        };
        page.reverse();
        page
    }
}

fn query_param<'a>(query: Option<&'a str>, name: &str) -> Option<&'a str> {
    query?.split('&').filter_map(|pair| pair.split_once('=')).find(|(key, _)| *key == name).map(|(_, value)| value)
}

/// The message fields of a create or edit body (a present `null` clears a field).
fn message_parts(body: &RequestBody) -> Result<MessageParts, ApiError> {
    let json = &body.json;
    let content = match json.get("content") {
        None => None,
        Some(Value::Null) => Some(String::new()),
        Some(Value::String(content)) => Some(content.clone()),
        Some(_) => {
            return Err(ApiError::invalid_form(
                "content",
                "STRING_TYPE_CONVERT",
                "Could not interpret value as string.",
            ));
        }
    };
    let list = |field: &str| -> Result<Option<Value>, ApiError> {
        match json.get(field) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(json!([]))),
            Some(value @ Value::Array(_)) => Ok(Some(value.clone())),
            Some(_) => {
                Err(ApiError::invalid_form(field, "LIST_TYPE_CONVERT", "Only iterables may be used in a ListType"))
            }
        }
    };
    let attachments = json.get("attachments").and_then(Value::as_array);
    // `files[n]` pairs with the `attachments` entry whose id is n (for its filename).
    let new_files = body
        .files
        .iter()
        .map(|(field, file)| {
            let index = field.strip_prefix("files[").and_then(|rest| rest.strip_suffix(']'));
            let named = attachments
                .into_iter()
                .flatten()
                .find(|entry| index.is_some_and(|index| id_text(&entry["id"]).as_deref() == Some(index)))
                .and_then(|entry| entry["filename"].as_str());
            let filename = named.map_or_else(|| file.filename.clone(), str::to_owned);
            UploadedFile {
                content_type: file.content_type.clone().or_else(|| file_content_type(&filename)),
                filename,
                bytes: file.bytes.clone(),
            }
        })
        .collect();
    let keep_attachments = attachments.map(|entries| {
        entries
            .iter()
            .filter_map(|entry| id_text(&entry["id"])?.parse::<u64>().ok())
            .filter(|id| *id > 1_000_000)
            .collect()
    });
    let reply_to = json
        .get("message_reference")
        .and_then(|reference| id_text(&reference["message_id"]))
        .and_then(|id| id.parse().ok())
        .map(MessageId);
    Ok(MessageParts {
        content,
        components: list("components")?,
        embeds: list("embeds")?,
        flags: json.get("flags").and_then(Value::as_u64),
        keep_attachments,
        new_files,
        reply_to,
    })
}

fn id_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    }
}

/// A route's bucket id: stable per method and route shape, like Discord's opaque hashes.
fn bucket_of(method: &Method, segments: &[String]) -> String {
    let shape: Vec<&str> = segments
        .iter()
        .enumerate()
        .map(|(index, segment)| {
            // The top-level resource id stays (Discord's "major parameter"); other ids do not.
            let is_id = segment.chars().all(|character| character.is_ascii_digit());
            if is_id && index != 1 { "{id}" } else { segment.as_str() }
        })
        .collect();
    let mut hasher = DefaultHasher::new();
    (method.as_str(), shape).hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

fn rate_limit_headers(response: &mut Response, bucket: &str, remaining: u32, reset_after: f64) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |elapsed| elapsed.as_secs_f64());
    let headers = response.headers_mut();
    let mut set = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    };
    set("x-ratelimit-limit", ADVERTISED_LIMIT.to_string());
    set("x-ratelimit-remaining", remaining.to_string());
    set("x-ratelimit-reset", format!("{:.3}", now + reset_after));
    set("x-ratelimit-reset-after", format!("{reset_after:.3}"));
    set("x-ratelimit-bucket", bucket.to_owned());
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn answer_response(answer: Answer, bucket: &str) -> Response {
    let mut response = match answer {
        Answer::Json(status, body) => json_response(status, &body),
        Answer::NoContent => {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
    };
    rate_limit_headers(&mut response, bucket, ADVERTISED_LIMIT - 1, 1.0);
    response
}

fn error_response(error: &ApiError, bucket: &str) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(status, &error.body());
    rate_limit_headers(&mut response, bucket, ADVERTISED_LIMIT - 1, 1.0);
    response
}

fn fault_response(fault: &Fault, bucket: &str) -> Response {
    match fault {
        Fault::RateLimited { retry_after_s } => {
            let body = json!({"message": "You are being rate limited.", "retry_after": retry_after_s, "global": false});
            let mut response = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
            rate_limit_headers(&mut response, bucket, 0, *retry_after_s);
            let headers = response.headers_mut();
            // Discord's Retry-After header is whole seconds, rounded up; the body has the fraction.
            let whole_seconds = retry_after_s.max(0.0).ceil() as u64;
            headers.insert(header::RETRY_AFTER, HeaderValue::from(whole_seconds));
            headers.insert("x-ratelimit-scope", HeaderValue::from_static("user"));
            headers.insert(header::VIA, HeaderValue::from_static("1.1 google"));
            response
        }
        Fault::Fail { status, code } => error_response(&ApiError::new(*status, *code), bucket),
    }
}

/// GET /attachments/{channel}/{id}/{filename}: an uploaded file, as Discord's CDN serves it.
async fn attachment(
    State(shared): State<Arc<Shared>>,
    Path((channel, attachment, filename)): Path<(u64, u64, String)>,
) -> Response {
    let file = shared.read(|state| {
        state
            .file(attachment)
            .filter(|(stored_channel, stored_name, _, _)| stored_channel.0 == channel && *stored_name == filename)
            .cloned()
    });
    let status = if file.is_some() { StatusCode::OK } else { StatusCode::NOT_FOUND };
    record(
        &shared,
        &Method::GET,
        &format!("/attachments/{channel}/{attachment}/{filename}"),
        &None,
        &RequestBody::default(),
        status,
    );
    match file {
        Some((_, _, content_type, bytes)) => {
            let mut response = Response::new(Body::from(bytes));
            let content_type = content_type.unwrap_or_else(|| "application/octet-stream".to_owned());
            if let Ok(value) = HeaderValue::from_str(&content_type) {
                response.headers_mut().insert(header::CONTENT_TYPE, value);
            }
            response
        }
        None => {
            let mut response = Response::new(Body::from("Not Found"));
            *response.status_mut() = StatusCode::NOT_FOUND;
            response
        }
    }
}
