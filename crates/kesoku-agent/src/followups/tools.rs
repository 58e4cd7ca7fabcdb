//! The model's follow-up tools: `schedule_followup`, `cancel_followup`, `list_followups`.
//!
//! Each acts on the calling session only. Times in answers are in the turn's time zone (else
//! the default), absolute and relative ("in 2h"). A refusal or a store failure is an error
//! output the model reads, never a failed turn.

use async_trait::async_trait;
use kesoku_core::FollowUpId;
use kesoku_tools::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{FollowUpError, Followups, format_local, relative};

pub const SCHEDULE_FOLLOWUP: &str = "schedule_followup";
pub const CANCEL_FOLLOWUP: &str = "cancel_followup";
pub const LIST_FOLLOWUPS: &str = "list_followups";

fn parse<T: serde::de::DeserializeOwned>(tool: &str, arguments: Value) -> Result<T, ToolOutput> {
    serde_json::from_value(arguments)
        .map_err(|error| ToolOutput::failure(format!("invalid arguments for tool `{tool}`: {error}")))
}

fn failure(error: &FollowUpError) -> ToolOutput {
    if error.is_refusal() {
        ToolOutput::failure(error.to_string())
    } else {
        tracing::error!(%error, "a follow-up tool failed");
        ToolOutput::failure(format!("{error}; try again in a moment"))
    }
}

/// `schedule_followup(when, task)`.
pub struct ScheduleFollowupTool {
    spec: ToolSpec,
    followups: Followups,
}

#[derive(Deserialize)]
struct ScheduleParams {
    when: String,
    task: String,
}

impl ScheduleFollowupTool {
    pub fn new(followups: Followups) -> Self {
        let spec = ToolSpec {
            name: SCHEDULE_FOLLOWUP.to_owned(),
            description: "Schedule a follow-up for yourself in this conversation: at the given time you get a \
                          reminder with the task and can act on it then (check on something, remind the user). \
                          It survives restarts and fires once. Use it when the user asks to be reminded or when \
                          something must be looked at again later."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "when": {
                        "type": "string",
                        "description": "When it is due: a delay from now such as `90s`, `10m`, `2h`, `1d` or \
                                        `1h30m` (largest unit first), or a time: RFC 3339 with an offset \
                                        (`2026-12-06T09:00:00+01:00`) or local (`2026-12-06 09:00`, in the \
                                        user's time zone). At most a year ahead."
                    },
                    "task": {
                        "type": "string",
                        "description": "What to do when it comes due, written as a note to yourself."
                    }
                },
                "required": ["when", "task"]
            }),
        };
        ScheduleFollowupTool { spec, followups }
    }
}

#[async_trait]
impl Tool for ScheduleFollowupTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: ScheduleParams = match parse(SCHEDULE_FOLLOWUP, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        let Some(origin) = &ctx.origin else { return failure(&FollowUpError::NoTurn) };
        match self.followups.schedule(&ctx.session_id, origin, &params.when, &params.task).await {
            Ok(followup) => {
                let zone = self.followups.zone_for(Some(origin));
                let due = format_local(followup.due_at, zone);
                let ahead = relative(followup.due_at, followup.created_at);
                ToolOutput::success(format!(
                    "Follow-up {} scheduled for {due} ({ahead}). You will get a reminder in this conversation \
                     then, with the task: {}",
                    followup.id, followup.task
                ))
                .with_summary(format!("{} due {due} ({ahead})", followup.id))
            }
            Err(error) => failure(&error),
        }
    }
}

/// `cancel_followup(followup_id)`.
pub struct CancelFollowupTool {
    spec: ToolSpec,
    followups: Followups,
}

#[derive(Deserialize)]
struct CancelParams {
    followup_id: String,
}

impl CancelFollowupTool {
    pub fn new(followups: Followups) -> Self {
        let spec = ToolSpec {
            name: CANCEL_FOLLOWUP.to_owned(),
            description: "Cancel a pending follow-up of this conversation, by the id schedule_followup or \
                          list_followups gave."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "followup_id": {"type": "string", "description": "The follow-up's id (`fu_…`)."}
                },
                "required": ["followup_id"]
            }),
        };
        CancelFollowupTool { spec, followups }
    }
}

#[async_trait]
impl Tool for CancelFollowupTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: CancelParams = match parse(CANCEL_FOLLOWUP, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        let id = FollowUpId::from(params.followup_id.trim());
        match self.followups.cancel(&id, Some(&ctx.session_id)).await {
            Ok(followup) => {
                let due = format_local(followup.due_at, self.followups.zone_for(ctx.origin.as_ref()));
                ToolOutput::success(format!("Follow-up {} (due {due}) is cancelled: {}", followup.id, followup.task))
                    .with_summary(format!("{} cancelled", followup.id))
            }
            Err(error) => failure(&error),
        }
    }
}

/// `list_followups()`.
pub struct ListFollowupsTool {
    spec: ToolSpec,
    followups: Followups,
}

impl ListFollowupsTool {
    pub fn new(followups: Followups) -> Self {
        let spec = ToolSpec {
            name: LIST_FOLLOWUPS.to_owned(),
            description: "List this conversation's pending follow-ups, soonest first, with their ids, due times \
                          and tasks."
                .to_owned(),
            parameters: json!({"type": "object", "properties": {}}),
        };
        ListFollowupsTool { spec, followups }
    }
}

#[async_trait]
impl Tool for ListFollowupsTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, _arguments: Value) -> ToolOutput {
        let pending = match self.followups.pending(Some(&ctx.session_id)).await {
            Ok(pending) => pending,
            Err(error) => return failure(&error),
        };
        if pending.is_empty() {
            return ToolOutput::success("No pending follow-ups in this conversation.").with_summary("none pending");
        }
        let zone = self.followups.zone_for(ctx.origin.as_ref());
        let now = self.followups.store().clock().now();
        let lines: Vec<String> = pending
            .iter()
            .map(|followup| {
                format!(
                    "- {}: due {} ({}): {}",
                    followup.id,
                    format_local(followup.due_at, zone),
                    relative(followup.due_at, now),
                    followup.task
                )
            })
            .collect();
        ToolOutput::success(format!("Pending follow-ups, soonest first:\n{}", lines.join("\n")))
            .with_summary(format!("{} pending", pending.len()))
    }
}
