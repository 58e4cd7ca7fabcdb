//! `POST /v1/messages`: a person's message enters the system as a Standard User Message.

use axum::Json;
use axum::extract::State;
use http::StatusCode;
use kesoku_core::Message;

use crate::attachments;
use crate::error::AppError;
use crate::extract::ApiJson;
use crate::openapi::{BodyErrors, CommonErrors};
use crate::server::AppState;
use crate::views::{API_CHATBOT, PostMessageParams, PostMessageResponse};

/// Post a user message.
///
/// The message goes to the active session of (`chatbot_id`, `channel_id`), created when there is
/// none, with status `pending_agent`. Attachments are checked and decoded before anything is
/// stored, then staged in the session's folder and listed in `metadata.attachments`.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "messages",
    request_body = PostMessageParams,
    responses(
        (status = 202, description = "Accepted: the message waits for the agent.", body = PostMessageResponse),
        BodyErrors,
        CommonErrors
    )
)]
pub(crate) async fn post_message(
    State(state): State<AppState>,
    ApiJson(params): ApiJson<PostMessageParams>,
) -> Result<(StatusCode, Json<PostMessageResponse>), AppError> {
    let decoded = attachments::decode_all(&params.attachments)?;
    let chatbot_id = params.chatbot_id.as_deref().unwrap_or(API_CHATBOT);
    let session = state.gateway.resolve_session(chatbot_id, &params.channel_id).await?;
    let mut message = Message::user_text(&session.id, chatbot_id, &params.channel_id, &params.sender, params.content);
    if !decoded.is_empty() {
        message.metadata.attachments = Some(attachments::stage(&state.workspace, &session.id, decoded).await?);
    }
    let event = state.gateway.post(&message).await?;
    tracing::debug!(message = %event.message.id, session = %session.id, "message posted");
    Ok((StatusCode::ACCEPTED, Json(PostMessageResponse { id: event.message.id, session_id: session.id })))
}
