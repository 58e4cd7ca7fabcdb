//! OpenAPI schemas for the vocabulary types of `kesoku-core`, which do not know about OpenAPI.
//!
//! Enums get a marker type whose schema lists the enum's wire names taken from its `ALL` table
//! (so the document cannot drift from the code); records get a documentation-only struct with
//! the same fields and serde behaviour as the real type. The responses themselves serialize the
//! real types, so the JSON is exactly the spec's; a test checks every documented record against
//! real serialized values.
//!
//! Nothing here is ever constructed or serialized.

use std::borrow::Cow;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use kesoku_core::{ActivationKind, Lane, MessageType, Outcome, Role, Status};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

fn string_enum(description: &str, values: impl IntoIterator<Item = &'static str>) -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(Type::String).description(Some(description)).enum_values(Some(values)).into()
}

macro_rules! enum_schema {
    ($marker:ident, $name:literal, $ty:ty, $description:literal) => {
        #[doc = $description]
        pub(crate) struct $marker;

        impl PartialSchema for $marker {
            fn schema() -> RefOr<Schema> {
                string_enum($description, <$ty>::ALL.iter().map(|value| value.as_str()))
            }
        }

        impl ToSchema for $marker {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

enum_schema!(RoleSchema, "Role", Role, "Who authored a message.");
enum_schema!(MessageTypeSchema, "MessageType", MessageType, "The structural kind of a message.");
enum_schema!(StatusSchema, "Status", Status, "Where a message is in the pipeline.");
enum_schema!(LaneSchema, "Lane", Lane, "Priority lane of the queue.");
enum_schema!(ActivationKindSchema, "ActivationKind", ActivationKind, "The kind of an activation.");
enum_schema!(OutcomeSchema, "Outcome", Outcome, "How an activation ended.");

/// An IANA time zone name, listed from the time zone table the server checks against.
pub(crate) struct TimezoneSchema;

impl PartialSchema for TimezoneSchema {
    fn schema() -> RefOr<Schema> {
        string_enum("An IANA time zone name.", chrono_tz::TZ_VARIANTS.iter().map(|zone| zone.name()))
    }
}

impl ToSchema for TimezoneSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Timezone")
    }
}

/// A message, exactly as the message specification writes it.
#[derive(ToSchema)]
#[schema(as = Message)]
#[allow(dead_code)] // Documentation only: responses serialize `kesoku_core::Message`.
pub(crate) struct MessageDoc {
    id: String,
    session_id: String,
    /// The message this one answers: a turn's root for its steps, the call for a tool result.
    parent_id: Option<String>,
    chatbot_id: String,
    channel_id: String,
    sender: String,
    role: RoleSchema,
    #[schema(rename = "type")]
    message_type: MessageTypeSchema,
    content: String,
    status: StatusSchema,
    /// Typed keys of the spec (`tool_name`, `tool_arguments`, `tool_result`, `tool_error`,
    /// `attachments`, `turn_metrics`, `is_cronjob`, `is_compaction`, …) plus platform keys.
    metadata: Option<HashMap<String, serde_json::Value>>,
    /// Which model response of its turn produced this message (absent for 0).
    #[schema(minimum = 1)]
    step: Option<u32>,
    created_at: Option<DateTime<Utc>>,
    updated_at: Option<DateTime<Utc>>,
}

/// Resource use of one activation.
#[derive(ToSchema)]
#[schema(as = Usage)]
#[allow(dead_code)] // Documentation only: responses serialize `kesoku_core::Usage`.
pub(crate) struct UsageDoc {
    model_calls: u64,
    tool_calls: u64,
    input_tokens: u64,
    output_tokens: u64,
}

/// One row of the execution ledger.
#[derive(ToSchema)]
#[schema(as = LedgerEntry)]
#[allow(dead_code)] // Documentation only: responses serialize `kesoku_core::LedgerEntry`.
pub(crate) struct LedgerEntryDoc {
    id: String,
    kind: ActivationKindSchema,
    lane: LaneSchema,
    session_id: String,
    message_id: Option<String>,
    triggered_by: String,
    delegation_user: Option<String>,
    depth: u32,
    enqueued_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    outcome: Option<OutcomeSchema>,
    error: Option<String>,
    usage: UsageDoc,
}
