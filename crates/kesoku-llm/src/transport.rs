//! The HTTP layer shared by the providers: one reqwest client per model, timeouts (connect,
//! first byte, idle between chunks), Server-Sent Events, retries, and turning HTTP failures into
//! [`LlmError`]s that never contain the key.
//!
//! It knows no vendor JSON: each provider passes a function that reads its error body, and a
//! decoder that turns its events into [`StreamEvent`]s.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::config::{ModelConfig, Provider, TimeoutDurations};
use crate::conversation::Response;
use crate::error::{LlmError, LlmErrorKind, shorten};
use crate::retry::{RetryPolicy, call_with_retries, open_stream_with_retries, parse_retry_after};
use crate::secret::Secret;
use crate::{ResponseStream, StreamEvent};

/// Longest vendor message kept in an error.
const MAX_VENDOR_MESSAGE_CHARS: usize = 400;

/// Who an error is about, and the key to scrub from any text.
#[derive(Debug, Clone)]
pub(crate) struct ErrorContext {
    pub model_name: String,
    pub provider: Provider,
    pub api_key_env: Option<String>,
    pub api_key: Option<Secret>,
}

/// What a provider read from an error body.
#[derive(Debug, Clone, Default)]
pub(crate) struct VendorError {
    /// The vendor's message.
    pub message: String,
    /// A kind the body makes certain (Gemini's `API_KEY_INVALID` on a 400, a context overflow, …).
    pub kind: Option<LlmErrorKind>,
    /// A retry delay given in the body (Gemini's `RetryInfo`).
    pub retry_after: Option<Duration>,
}

impl ErrorContext {
    /// An error about this model, its text scrubbed of the key.
    pub fn error(&self, kind: LlmErrorKind, message: impl AsRef<str>) -> LlmError {
        let message = match &self.api_key {
            Some(key) => key.scrub(message.as_ref()),
            None => message.as_ref().to_owned(),
        };
        LlmError::new(kind, message).with_model(&self.model_name)
    }

    fn auth_message(&self) -> String {
        match &self.api_key_env {
            Some(variable) => format!(
                "{} rejected the API key: check the key in environment variable `{variable}` (valid, not expired, allowed to use this model)",
                self.provider
            ),
            None => format!(
                "{} asked for an API key and none is configured: name the variable holding it with `api_key_env`",
                self.provider
            ),
        }
    }

    /// Classify an HTTP failure.
    pub fn status_error(&self, status: u16, retry_after: Option<Duration>, vendor: VendorError) -> LlmError {
        let kind = vendor.kind.unwrap_or(match status {
            401 | 403 => LlmErrorKind::Auth,
            408 => LlmErrorKind::Timeout,
            429 => LlmErrorKind::RateLimited,
            503 | 529 => LlmErrorKind::Overloaded,
            500..=599 => LlmErrorKind::Server,
            _ => LlmErrorKind::BadRequest,
        });
        let message = match kind {
            // The vendor's text may quote part of the key (OpenAI does): say only what to do.
            LlmErrorKind::Auth => self.auth_message(),
            LlmErrorKind::RateLimited
            | LlmErrorKind::Overloaded
            | LlmErrorKind::Server
            | LlmErrorKind::Network
            | LlmErrorKind::Timeout
            | LlmErrorKind::ContextTooLong
            | LlmErrorKind::BadRequest
            | LlmErrorKind::Protocol
            | LlmErrorKind::Config
            | LlmErrorKind::Attachment
            | LlmErrorKind::Scripted => shorten(&vendor.message, MAX_VENDOR_MESSAGE_CHARS),
        };
        self.error(kind, message).with_status(status).with_retry_after(retry_after.or(vendor.retry_after))
    }

    /// Classify a reqwest failure (connect, send, body). The URL is left out of the text.
    pub fn reqwest_error(&self, error: reqwest::Error, during: &str) -> LlmError {
        let kind = if error.is_timeout() { LlmErrorKind::Timeout } else { LlmErrorKind::Network };
        let what = if error.is_connect() { "could not connect to the provider" } else { during };
        let error = error.without_url();
        let mut text = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        self.error(kind, format!("{what} ({text})"))
    }
}

/// A prepared HTTP call, cheap to repeat for retries.
#[derive(Debug, Clone)]
pub(crate) struct HttpCall {
    pub url: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Reads a vendor's error body.
pub(crate) type ErrorBodyParser = fn(&str) -> VendorError;

/// The HTTP client of one model. A plain-`http://` endpoint (a local llama.cpp or Ollama server,
/// the benchmarks' mock) gets a client without a root store: reading and parsing the system's
/// root certificates costs a few milliseconds and about a megabyte, for nothing. (Clients are
/// not shared between models: a pooled connection is tied to the runtime that opened it.)
fn model_client(connect_timeout: Duration, tls: bool) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder().connect_timeout(connect_timeout).no_proxy();
    if !tls {
        // A redirect to https would fail to verify; providers do not redirect.
        builder = builder.tls_certs_only(std::iter::empty());
    }
    builder.build()
}

/// The client, limits and error context of one model.
#[derive(Debug)]
pub(crate) struct Transport {
    client: reqwest::Client,
    pub timeouts: TimeoutDurations,
    pub retry: RetryPolicy,
    pub context: ErrorContext,
}

impl Transport {
    pub fn new(name: &str, config: &ModelConfig, api_key: Option<Secret>) -> Result<Self, LlmError> {
        let config_error = |message: String| LlmError::new(LlmErrorKind::Config, message).with_model(name);
        let timeouts = config.timeouts.durations().map_err(config_error)?;
        let tls = !config.effective_base_url().starts_with("http://");
        let client = model_client(timeouts.connect, tls)
            .map_err(|error| config_error(format!("could not build the HTTP client: {error}")))?;
        Ok(Transport {
            client,
            timeouts,
            retry: config.retry,
            context: ErrorContext {
                model_name: name.to_owned(),
                provider: config.provider,
                api_key_env: config.effective_api_key_env(),
                api_key,
            },
        })
    }

    /// A header map with `content-type: application/json` and the given secret header, marked
    /// sensitive so it never shows in a `Debug` print.
    pub fn headers(
        &self,
        secret_header: Option<(&'static str, String)>,
        extra: &[(&'static str, &str)],
    ) -> Result<HeaderMap, LlmError> {
        let mut headers = HeaderMap::new();
        headers.insert(reqwest::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some((name, value)) = secret_header {
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                self.context
                    .error(LlmErrorKind::Config, "the API key contains characters a header cannot carry: check it")
            })?;
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static(name), value);
        }
        for (name, value) in extra {
            let value = HeaderValue::from_str(value)
                .map_err(|_| self.context.error(LlmErrorKind::Config, format!("invalid value for header `{name}`")))?;
            headers.insert(HeaderName::from_static(name), value);
        }
        Ok(headers)
    }

    /// Send once; a non-2xx answer becomes an error.
    async fn send(&self, call: &HttpCall, parse_error: ErrorBodyParser) -> Result<reqwest::Response, LlmError> {
        let request = self.client.post(&call.url).headers(call.headers.clone()).body(call.body.clone());
        let response = match tokio::time::timeout(self.timeouts.first_byte, request.send()).await {
            Err(_) => {
                return Err(self.context.error(
                    LlmErrorKind::Timeout,
                    format!("no answer within {:.1}s (first-byte timeout)", self.timeouts.first_byte.as_secs_f64()),
                ));
            }
            Ok(Err(error)) => return Err(self.context.reqwest_error(error, "sending the request failed")),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| parse_retry_after(value, chrono::Utc::now()));
        let body = self.read_body(response).await.unwrap_or_default();
        Err(self.context.status_error(status.as_u16(), retry_after, parse_error(&body)))
    }

    /// Read a whole body, with the idle timeout between chunks.
    async fn read_body(&self, response: reqwest::Response) -> Result<String, LlmError> {
        let mut chunks = Box::pin(timed_chunks(response, self.timeouts, self.context.clone()));
        let mut body = Vec::new();
        while let Some(chunk) = chunks.next().await {
            body.extend_from_slice(&chunk?);
        }
        String::from_utf8(body).map_err(|_| self.context.error(LlmErrorKind::Protocol, "the answer is not UTF-8"))
    }

    /// POST and read the whole answer (non-streaming calls), with retries.
    pub async fn request(&self, call: &HttpCall, parse_error: ErrorBodyParser) -> Result<String, LlmError> {
        call_with_retries(&self.retry, || async {
            let response = self.send(call, parse_error).await?;
            self.read_body(response).await
        })
        .await
    }

    /// POST and decode the Server-Sent Events answer, with retries before the first event.
    pub async fn stream<D, N>(
        &self,
        call: &HttpCall,
        parse_error: ErrorBodyParser,
        new_decoder: N,
    ) -> Result<ResponseStream, LlmError>
    where
        D: StreamDecoder,
        N: Fn() -> D,
    {
        open_stream_with_retries(&self.retry, || async {
            let response = self.send(call, parse_error).await?;
            let events = sse_events(response, self.timeouts, self.context.clone());
            Ok(decode_stream(Box::pin(events), new_decoder()))
        })
        .await
    }
}

/// The body's chunks, each within its time limit: the first byte within `first_byte`, later
/// chunks within `idle` of the previous one. Ends after the first error.
fn timed_chunks(
    response: reqwest::Response,
    timeouts: TimeoutDurations,
    context: ErrorContext,
) -> impl Stream<Item = Result<Bytes, LlmError>> + Send + 'static {
    let body = Box::pin(response.bytes_stream());
    futures::stream::unfold((body, true, false), move |(mut body, first, done)| {
        let context = context.clone();
        async move {
            if done {
                return None;
            }
            let limit = if first { timeouts.first_byte } else { timeouts.idle };
            match tokio::time::timeout(limit, body.next()).await {
                Err(_) => {
                    let which = if first { "first-byte" } else { "idle" };
                    let error = context.error(
                        LlmErrorKind::Timeout,
                        format!("the answer stalled for {:.1}s ({which} timeout)", limit.as_secs_f64()),
                    );
                    Some((Err(error), (body, false, true)))
                }
                Ok(None) => None,
                Ok(Some(Err(error))) => {
                    Some((Err(context.reqwest_error(error, "reading the answer failed")), (body, false, true)))
                }
                Ok(Some(Ok(chunk))) => Some((Ok(chunk), (body, false, false))),
            }
        }
    })
}

/// One Server-Sent Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field (`message` when absent).
    pub event: String,
    pub data: String,
}

fn sse_events(
    response: reqwest::Response,
    timeouts: TimeoutDurations,
    context: ErrorContext,
) -> impl Stream<Item = Result<SseEvent, LlmError>> + Send + 'static {
    let parse_context = context.clone();
    Box::pin(timed_chunks(response, timeouts, context)).eventsource().map(move |item| match item {
        Ok(event) => Ok(SseEvent { event: event.event, data: event.data }),
        Err(EventStreamError::Transport(error)) => Err(error),
        Err(EventStreamError::Utf8(_)) => {
            Err(parse_context.error(LlmErrorKind::Protocol, "the event stream is not UTF-8"))
        }
        Err(EventStreamError::Parser(error)) => {
            Err(parse_context.error(LlmErrorKind::Protocol, format!("malformed event stream: {error}")))
        }
    })
}

/// Turns one provider's events into [`StreamEvent`]s and, at the end, the whole [`Response`].
pub(crate) trait StreamDecoder: Send + 'static {
    /// Handle one event; push what the caller should see to `out`. `Ok(true)` when this event
    /// ends the answer (later events are ignored).
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<StreamEvent>) -> Result<bool, LlmError>;

    /// The stream ended (or `on_event` said it was done): the complete answer, or an error when
    /// it is incomplete (`ended` is false when the connection closed without a final event).
    fn finish(&mut self, ended: bool) -> Result<Response, LlmError>;
}

struct DecodeState<S, D> {
    events: S,
    decoder: D,
    pending: VecDeque<Result<StreamEvent, LlmError>>,
    finished: bool,
}

/// Drive `decoder` over `events`: its events in order, then `Completed`, or an error item last.
fn decode_stream<S, D>(events: S, decoder: D) -> ResponseStream
where
    S: Stream<Item = Result<SseEvent, LlmError>> + Send + Unpin + 'static,
    D: StreamDecoder,
{
    let state = DecodeState { events, decoder, pending: VecDeque::new(), finished: false };
    let stream = futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(item) = state.pending.pop_front() {
                return Some((item, state));
            }
            if state.finished {
                return None;
            }
            match state.events.next().await {
                Some(Ok(event)) => {
                    let mut out = Vec::new();
                    let result = state.decoder.on_event(&event, &mut out);
                    state.pending.extend(out.into_iter().map(Ok));
                    match result {
                        Ok(false) => {}
                        Ok(true) => {
                            state.finished = true;
                            state.pending.push_back(state.decoder.finish(true).map(StreamEvent::Completed));
                        }
                        Err(error) => {
                            state.finished = true;
                            state.pending.push_back(Err(error));
                        }
                    }
                }
                Some(Err(error)) => {
                    state.finished = true;
                    state.pending.push_back(Err(error));
                }
                None => {
                    state.finished = true;
                    state.pending.push_back(state.decoder.finish(false).map(StreamEvent::Completed));
                }
            }
        }
    });
    Box::pin(stream)
}
