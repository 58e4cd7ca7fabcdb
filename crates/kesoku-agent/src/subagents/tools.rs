//! The model's `delegate(task, agent?)` tool.

use async_trait::async_trait;
use kesoku_tools::{Tool, ToolContext, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Subagents;

pub const DELEGATE: &str = "delegate";

/// `delegate(task, agent?)`: start a sub-agent; its answer comes back later as a message.
pub struct DelegateTool {
    spec: ToolSpec,
    subagents: Subagents,
}

#[derive(Deserialize)]
struct Params {
    task: String,
    #[serde(default)]
    agent: Option<String>,
}

impl DelegateTool {
    pub fn new(subagents: Subagents) -> Self {
        let names: Vec<&str> = subagents.personas().all().iter().map(|p| p.name.as_str()).collect();
        let agent_help = if names.is_empty() {
            "Optional: the name of a configured agent to hand the task to (none is configured).".to_owned()
        } else {
            format!(
                "Optional: the name of a configured agent to hand the task to (it answers with its own instructions, \
                 model and tools): one of {}. Default: a sub-agent like you.",
                names.join(", ")
            )
        };
        let spec = ToolSpec {
            name: DELEGATE.to_owned(),
            description: "Hand a self-contained task to a sub-agent. It works on its own, in a conversation of its \
                          own, with the same tools as you; it does not see this conversation, so put everything \
                          it needs in the task. This returns at once: do not wait for it. When the sub-agent \
                          finishes, its answer comes back to this conversation as a message and you continue \
                          then. Sub-agents may delegate in turn, up to a fixed depth; beyond it delegation is \
                          refused."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "task": {
                        "type": "string",
                        "description": "What the sub-agent should do and answer, with all the context it needs."
                    },
                    "agent": {
                        "type": "string",
                        "description": agent_help
                    }
                },
                "required": ["task"]
            }),
        };
        DelegateTool { spec, subagents }
    }
}

#[async_trait]
impl Tool for DelegateTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: Params = match serde_json::from_value(arguments) {
            Ok(params) => params,
            Err(error) => return ToolOutput::failure(format!("invalid arguments for tool `{DELEGATE}`: {error}")),
        };
        match self.subagents.delegate_to(ctx, &params.task, params.agent.as_deref()).await {
            Ok(child) => ToolOutput::success(format!(
                "Delegated to sub-agent session {} (depth {}); its result will come back to this conversation as \
                 a message when it finishes. You need not wait for it.",
                child.session_id, child.depth
            ))
            .with_summary(format!("sub-agent {}", child.session_id)),
            Err(error) if error.is_refusal() => ToolOutput::failure(error.to_string()),
            Err(error) => {
                tracing::error!(%error, "delegating to a sub-agent failed");
                ToolOutput::failure(format!("{error}; try again in a moment"))
            }
        }
    }
}
