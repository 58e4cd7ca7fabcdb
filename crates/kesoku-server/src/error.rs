//! Errors: what a request gets back when it fails, and what starting the server can fail with.
//!
//! Every error response is JSON, `{"error": {"code": "...", "message": "..."}}`, with a code from
//! one closed list ([`ErrorCode`]). Client errors say what was wrong; internal errors are logged
//! with their cause and answered with a generic 500 that leaks nothing. [`json_errors`] is the
//! safety net that turns any non-JSON error response produced below the handlers (an unknown
//! method, a body over the size limit) into the same shape.
//!
//! This module does not decide *which* error a situation is; handlers and extractors do.

use std::fmt;
use std::net::SocketAddr;

use axum::Json;
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use kesoku_chatbots::ChatbotError;
use kesoku_chatbots::ingest::IngestError;
use kesoku_chatbots::staging::StagingError;
use kesoku_gateway::GatewayError;
use kesoku_store::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// The closed list of error codes a client can see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The body is not JSON (syntax error, truncated).
    BadJson,
    /// The body is JSON but not the expected shape (missing or mistyped field).
    InvalidBody,
    /// A field has the right type but a value that is not allowed.
    InvalidField,
    /// The body is not valid UTF-8.
    InvalidUtf8,
    /// The body is not `application/json`.
    UnsupportedMediaType,
    /// The body is larger than the configured limit.
    PayloadTooLarge,
    /// A query parameter is missing, malformed or out of range.
    BadQuery,
    /// A path segment is malformed.
    BadPath,
    /// A header is malformed (for example `Last-Event-ID`).
    BadHeader,
    /// No such resource (unknown session, unknown route).
    NotFound,
    /// The route exists but not with this method.
    MethodNotAllowed,
    /// A bearer token is required and was missing or wrong.
    Unauthorized,
    /// The `Host` header names no local host while the server runs without a token.
    ForbiddenHost,
    /// The store cannot be reached.
    NotReady,
    /// Something failed on our side; details are in the server log.
    Internal,
    /// Any other client error produced by the HTTP machinery.
    BadRequest,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadJson => "bad_json",
            ErrorCode::InvalidBody => "invalid_body",
            ErrorCode::InvalidField => "invalid_field",
            ErrorCode::InvalidUtf8 => "invalid_utf8",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::BadQuery => "bad_query",
            ErrorCode::BadPath => "bad_path",
            ErrorCode::BadHeader => "bad_header",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::ForbiddenHost => "forbidden_host",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::Internal => "internal",
            ErrorCode::BadRequest => "bad_request",
        }
    }

    /// The HTTP status this code is sent with.
    pub const fn status(self) -> StatusCode {
        match self {
            ErrorCode::BadJson
            | ErrorCode::InvalidUtf8
            | ErrorCode::BadQuery
            | ErrorCode::BadPath
            | ErrorCode::BadHeader
            | ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::InvalidBody | ErrorCode::InvalidField => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::ForbiddenHost => StatusCode::FORBIDDEN,
            ErrorCode::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error response.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// A sentence for people: what was wrong and, where it helps, what to do.
    pub message: String,
}

/// The message of every internal error: the cause goes to the log, never to the client.
pub const INTERNAL_MESSAGE: &str = "internal error";

/// A failed request.
#[derive(Debug)]
pub enum AppError {
    /// The client's fault, or a state it can see (not found, not ready): sent as it is.
    Client { code: ErrorCode, message: String },
    /// Our fault: logged with its cause, answered with a generic 500.
    Internal(Box<dyn std::error::Error + Send + Sync>),
}

impl AppError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        AppError::Client { code, message: message.into() }
    }

    pub fn not_found(what: &str, id: &str) -> Self {
        AppError::new(ErrorCode::NotFound, format!("{what} `{}` not found", shorten(id, 200)))
    }

    pub fn invalid_field(message: impl Into<String>) -> Self {
        AppError::new(ErrorCode::InvalidField, message)
    }

    pub fn internal(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        AppError::Internal(error.into())
    }

    /// The code this error is answered with.
    pub fn code(&self) -> ErrorCode {
        match self {
            AppError::Client { code, .. } => *code,
            AppError::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppError::Client { code, message } => write!(f, "{code}: {message}"),
            AppError::Internal(error) => write!(f, "internal: {error}"),
        }
    }
}

impl From<StoreError> for AppError {
    fn from(error: StoreError) -> Self {
        AppError::internal(error)
    }
}

impl From<GatewayError> for AppError {
    fn from(error: GatewayError) -> Self {
        AppError::internal(error)
    }
}

/// A message [`kesoku_chatbots::ingest`] refused is the client's mistake, answered with what
/// was wrong (a file name in the API's field-path words); any other failure is ours.
impl From<IngestError> for AppError {
    fn from(error: IngestError) -> Self {
        if !error.is_refusal() {
            return AppError::internal(error);
        }
        match error {
            IngestError::Staging(StagingError::BadName { index, reason, .. }) => {
                AppError::invalid_field(format!("`attachments[{index}].filename` {reason}"))
            }
            IngestError::Staging(StagingError::TooLarge { .. }) => {
                AppError::new(ErrorCode::PayloadTooLarge, error.to_string())
            }
            IngestError::Empty
            | IngestError::TooLong { .. }
            | IngestError::MissingField { .. }
            | IngestError::ForeignSession { .. }
            | IngestError::Staging(StagingError::BadSession(_) | StagingError::Io { .. })
            | IngestError::Gateway(_) => AppError::invalid_field(error.to_string()),
        }
    }
}

impl From<ChatbotError> for AppError {
    fn from(error: ChatbotError) -> Self {
        AppError::internal(error)
    }
}

/// An error response with `code` and `message`.
pub fn error_response(code: ErrorCode, message: impl Into<String>) -> Response {
    let body = ErrorBody { error: ErrorDetail { code, message: message.into() } };
    let mut response = (code.status(), Json(body)).into_response();
    if code == ErrorCode::Unauthorized {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::Client { code, message } => error_response(code, message),
            AppError::Internal(error) => {
                tracing::error!(error = %error, "request failed");
                error_response(ErrorCode::Internal, INTERNAL_MESSAGE)
            }
        }
    }
}

/// Cut `text` to at most `max` characters (for echoing client input in messages).
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}

/// Middleware: any error response that is not JSON yet (an unknown method, a body over the
/// limit, a rejection we did not foresee) becomes the standard JSON error, keeping its status
/// and headers such as `Allow`.
pub async fn json_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&response) {
        return response;
    }
    let (code, message) = match status {
        StatusCode::NOT_FOUND => (ErrorCode::NotFound, format!("no route for {method} {}", shorten(&path, 200))),
        StatusCode::METHOD_NOT_ALLOWED => {
            (ErrorCode::MethodNotAllowed, format!("{method} is not allowed on {}", shorten(&path, 200)))
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            (ErrorCode::PayloadTooLarge, "the request body is larger than the server accepts".to_owned())
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            (ErrorCode::UnsupportedMediaType, "send the body as application/json".to_owned())
        }
        status if status.is_server_error() => {
            tracing::error!(%status, %method, path = %path, "a layer answered with a server error");
            (ErrorCode::Internal, INTERNAL_MESSAGE.to_owned())
        }
        status => (ErrorCode::BadRequest, status.canonical_reason().unwrap_or("bad request").to_lowercase()),
    };
    let (mut parts, _) = response.into_parts();
    let fresh = error_response(code, message);
    // Keep the original status (e.g. 408) and headers (e.g. `Allow`), take body and type from `fresh`.
    let (fresh_parts, body) = fresh.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &fresh_parts.headers {
        parts.headers.insert(name.clone(), value.clone());
    }
    Response::from_parts(parts, body)
}

/// Why the server cannot start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Listening beyond loopback without a token would expose the agent to the network.
    #[error(
        "refusing to listen on {addr} without a token: it is not a loopback address; set [http] token_env to \
         the name of an environment variable holding a token, or listen on 127.0.0.1"
    )]
    TokenRequired { addr: SocketAddr },
    /// The configured token cannot be used.
    #[error("the http token is unusable: {reason}")]
    BadToken { reason: &'static str },
    #[error("serving http failed: {0}")]
    Io(#[from] std::io::Error),
}
