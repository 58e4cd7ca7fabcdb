//! `POST /v1/messages`: a person's message enters the system as a Standard User Message,
//! through the one ingest path every chatbot uses ([`kesoku_chatbots::ingest`]).

use axum::Json;
use axum::extract::State;
use http::StatusCode;
use kesoku_chatbots::staging::Staging;
use kesoku_chatbots::{Inbound, Ingested, ingest};
use kesoku_core::activation::{ActivationKind, ActivationRequest};
use kesoku_core::{MessageId, ThreadRef};

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
/// stored, then staged in the session's folder and listed in `metadata.attachments`. With a
/// `client_message_id` the post is idempotent: the same id again (per chatbot) stores nothing
/// and answers `200` with the first message.
#[utoipa::path(
    post,
    path = "/v1/messages",
    tag = "messages",
    request_body = PostMessageParams,
    responses(
        (status = 202, description = "Accepted: the message waits for the agent.", body = PostMessageResponse),
        (status = 200, description = "A message with this `client_message_id` was posted before; nothing new was \
                                      stored.", body = PostMessageResponse),
        BodyErrors,
        CommonErrors
    )
)]
pub(crate) async fn post_message(
    State(state): State<AppState>,
    ApiJson(params): ApiJson<PostMessageParams>,
) -> Result<(StatusCode, Json<PostMessageResponse>), AppError> {
    let files = attachments::decode_all(&params.attachments)?;
    let chatbot_id = params.chatbot_id.as_deref().unwrap_or(API_CHATBOT);
    let mut inbound = Inbound::text(chatbot_id, &params.channel_id, &params.sender, params.content);
    inbound.platform_key = params.client_message_id;
    inbound.files = files;
    // Work for a person (their grants reach the tools): the root asks for a plain `message`
    // activation that carries the delegation user.
    if let Some(user) = params.delegation_user {
        let request =
            ActivationRequest { delegation_user: Some(user), ..ActivationRequest::new(ActivationKind::Message) };
        inbound.metadata.activation = Some(Box::new(request));
    }
    if let Some(thread) = params.thread {
        inbound.metadata.thread = Some(Box::new(ThreadRef {
            parent_channel_id: thread.parent_channel_id,
            root_message_id: thread.root_message_id.map(MessageId::from),
        }));
    }
    let staging = Staging::new(&state.workspace);
    match ingest(&state.gateway, &staging, inbound).await? {
        Ingested::Posted(message) => {
            tracing::debug!(message = %message.id, session = %message.session_id, "message posted");
            Ok((StatusCode::ACCEPTED, Json(PostMessageResponse { id: message.id, session_id: message.session_id })))
        }
        Ingested::Duplicate(id) => {
            let first = state
                .gateway
                .store()
                .get_message(&id)
                .await?
                .ok_or_else(|| AppError::internal(format!("message {id} was posted before but cannot be read")))?;
            tracing::debug!(message = %id, "message posted before; nothing stored");
            Ok((StatusCode::OK, Json(PostMessageResponse { id: first.id, session_id: first.session_id })))
        }
    }
}
