//! `GET /v1/events`: every message created or changed, as Server-Sent Events.
//!
//! Each event's id is the store revision of the change, so a client that reconnects with
//! `Last-Event-ID` (browsers do this on their own) resumes exactly after the last change it
//! saw: the gateway replays the store from there, then goes live. Without a starting point the
//! stream is live only; `?after=REV` starts after a revision (the `rev` of a history read).
//! Keep-alive comments flow every 15 s; the stream ends when the server shuts down.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt, stream};
use http::HeaderMap;
use kesoku_core::{MessageFilter, SessionId};
use kesoku_gateway::ListenFrom;
use kesoku_store::MessageEvent;

use super::load_session;
use crate::error::{AppError, ErrorCode};
use crate::extract::ApiQuery;
use crate::openapi::{CommonErrors, QueryErrors};
use crate::server::AppState;
use crate::views::{EventsQuery, MessageEventView};

/// How long a browser waits before reconnecting.
const RETRY: Duration = Duration::from_secs(2);
/// Interval of keep-alive comments.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The revision in a `Last-Event-ID` header, if any.
fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, AppError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| AppError::new(ErrorCode::BadHeader, "`Last-Event-ID` is not text"))?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    match text.trim().parse::<i64>() {
        Ok(rev) if rev >= 0 => Ok(Some(rev)),
        Ok(_) | Err(_) => Err(AppError::new(
            ErrorCode::BadHeader,
            "`Last-Event-ID` must be an event id of this stream (a non-negative integer)",
        )),
    }
}

fn to_sse(event: MessageEvent) -> Event {
    let rev = event.rev;
    let view = MessageEventView { rev, created: event.created, message: event.message };
    match Event::default().id(rev.to_string()).json_data(&view) {
        Ok(event) => event,
        Err(error) => {
            tracing::error!(%error, rev, "an event does not serialize");
            Event::default().comment("an event could not be encoded")
        }
    }
}

/// Follow message changes live.
///
/// Each event is `{"rev", "created", "message"}` with the SSE id set to `rev`. Reconnect with
/// `Last-Event-ID` (or `after`) to resume without gaps.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id (a store revision)."),
        ("access_token" = Option<String>, Query, description = "The token, for clients that cannot set headers \
          (`EventSource`); only this route reads it.")
    ),
    security(("bearer" = []), ("access_token" = [])),
    responses(
        (status = 200, description = "An endless stream of `MessageEvent` JSON objects.", content_type = "text/event-stream", body = MessageEventView),
        (status = 400, description = "A malformed query parameter or `Last-Event-ID`.", body = crate::error::ErrorBody),
        (status = 404, description = "No session with this id.", body = crate::error::ErrorBody),
        QueryErrors,
        CommonErrors
    )
)]
pub(crate) async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, AppError> {
    let resume = last_event_id(&headers)?.or(query.after);
    let filter = match &query.session_id {
        Some(id) => {
            load_session(&state, id).await?;
            MessageFilter::session(&SessionId::from(id.as_str()))
        }
        None => MessageFilter::default(),
    };
    let from = match resume {
        Some(rev) => ListenFrom::AfterRev(rev),
        None => ListenFrom::Now,
    };
    let gateway = state.gateway.clone();
    // The stream owns its gateway handle (the response outlives this function).
    let listened = async_stream::stream! {
        let mut changes = std::pin::pin!(gateway.listen(filter, from));
        while let Some(item) = changes.next().await {
            yield item;
        }
    };
    let changes = listened
        .filter_map(|item| async move {
            match item {
                Ok(event) => Some(Ok(to_sse(event))),
                Err(error) => {
                    // The gateway retries on its next catch-up; the client sees a comment.
                    tracing::warn!(%error, "event stream read failed");
                    Some(Ok(Event::default().comment("a read failed; catching up")))
                }
            }
        })
        .take_until(state.shutdown.clone().cancelled_owned());
    let hello = stream::once(async { Ok(Event::default().retry(RETRY).comment("connected")) });
    Ok(Sse::new(hello.chain(changes)).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")))
}
