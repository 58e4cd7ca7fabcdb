//! Extractors whose rejections are our JSON errors, never axum's plain-text ones.
//!
//! [`ApiJson`] checks the content type, the size limit, UTF-8, JSON syntax and shape, then runs
//! the type's [`Validate`] rules; [`ApiQuery`] and [`ApiPath`] parse their part of the URI.
//! Each failure names what was wrong. These extractors do not know any route.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use http::header;
use http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::{AppError, ErrorCode};

/// Checks on a parsed value beyond its shape (non-empty names, ranges, …).
pub trait Validate {
    fn validate(&self) -> Result<(), AppError>;
}

/// A JSON body, validated.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

fn is_json_content_type(parts: &http::HeaderMap) -> bool {
    let Some(value) = parts.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = AppError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json_content_type(request.headers()) {
            return Err(AppError::new(
                ErrorCode::UnsupportedMediaType,
                "send the body as JSON with `Content-Type: application/json`",
            ));
        }
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| match rejection {
            BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => {
                AppError::new(ErrorCode::PayloadTooLarge, "the request body is larger than the server accepts")
            }
            other @ (BytesRejection::FailedToBufferBody(_) | _) => {
                AppError::new(ErrorCode::BadRequest, format!("could not read the request body: {}", other.body_text()))
            }
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|error| {
            AppError::new(
                ErrorCode::InvalidUtf8,
                format!("the body is not valid UTF-8 (first bad byte at offset {})", error.valid_up_to()),
            )
        })?;
        let value: T = serde_json::from_str(text).map_err(|error| {
            let code = match error.classify() {
                serde_json::error::Category::Data => ErrorCode::InvalidBody,
                serde_json::error::Category::Io
                | serde_json::error::Category::Syntax
                | serde_json::error::Category::Eof => ErrorCode::BadJson,
            };
            let what = if code == ErrorCode::BadJson { "the body is not valid JSON" } else { "the body does not fit" };
            AppError::new(code, format!("{what}: {error}"))
        })?;
        value.validate()?;
        Ok(ApiJson(value))
    }
}

/// Query parameters, validated.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Query(value) = Query::<T>::try_from_uri(&parts.uri).map_err(|rejection| {
            let text = rejection.body_text();
            let detail = text.strip_prefix("Failed to deserialize query string: ").unwrap_or(&text);
            AppError::new(ErrorCode::BadQuery, format!("bad query string: {detail}"))
        })?;
        value.validate()?;
        Ok(ApiQuery(value))
    }
}

/// Path parameters.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(value) = Path::<T>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| AppError::new(ErrorCode::BadPath, format!("bad path: {}", rejection.body_text())))?;
        Ok(ApiPath(value))
    }
}

/// Reject strings holding NUL (PostgreSQL text cannot store it) or longer than `max` characters,
/// or empty when `required`.
pub(crate) fn check_text(field: &str, value: &str, min: usize, max: usize) -> Result<(), AppError> {
    if value.contains('\0') {
        return Err(AppError::invalid_field(format!("`{field}` must not contain NUL characters")));
    }
    let length = value.chars().count();
    if length < min {
        return Err(AppError::invalid_field(format!("`{field}` must not be empty")));
    }
    if length > max {
        return Err(AppError::invalid_field(format!("`{field}` is too long: at most {max} characters")));
    }
    Ok(())
}
