//! Several agents in one channel (seed 003, "Orchestration"): what a configured agent's turn
//! adds to the default agent's (its tools, the `pass` tool, the words that tell it about its
//! peers), how a pass is resolved, and the root an agent's mention of another posts.
//!
//! Invariants:
//! - The round lives in the activation and, between dispatches, on the root's
//!   `metadata.activation`; the model is told its peers' names and how to pass, never an index,
//!   a streak or a lane.
//! - A pass in a round writes the next dispatch onto the root **before** the root goes back to
//!   `pending_agent`: a crash in between leaves a `processing` root that orphan recovery returns
//!   to `pending_agent` with the next agent already named, so the round goes on where it was.
//! - Agents never call each other: an agent's mention of another is a new root at depth + 1
//!   (its id derived from the answer and the name, so a rerun posts it once), refused by the
//!   worker beyond `[agent] max_depth`.

use async_trait::async_trait;
use kesoku_core::{Activation, ActivationKind, ActivationRequest, Message, MessageId, Metadata, Orchestration};
use kesoku_tools::{Registry, Tool, ToolContext, ToolOutput, ToolSpec};
use serde_json::{Value, json};

use crate::personas::{AgentPersona, Personas};

/// The tool an agent calls when a message is not for it.
pub const PASS: &str = "pass";

/// Whether a final text is a pass: empty, or `pass` (any case) after trimming.
pub fn is_pass_text(text: &str) -> bool {
    let text = text.trim();
    text.is_empty() || text.eq_ignore_ascii_case(PASS)
}

/// `pass()`: let another agent of the channel answer.
pub struct PassTool {
    spec: ToolSpec,
}

impl Default for PassTool {
    fn default() -> Self {
        PassTool {
            spec: ToolSpec {
                name: PASS.to_owned(),
                description: "Pass: the message is not for you (another agent of this channel is better placed, or \
                              nothing needs saying). Nothing you would answer is posted; another agent may answer \
                              instead."
                    .to_owned(),
                parameters: json!({ "type": "object", "properties": {} }),
            },
        }
    }
}

#[async_trait]
impl Tool for PassTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _ctx: &ToolContext, _arguments: Value) -> ToolOutput {
        ToolOutput::success("Passed: you will not answer this message.").with_summary("passed")
    }
}

/// The tools of a configured agent's turn: the registry's, cut to the agent's `tools` when it
/// lists them, and `pass` when the turn is part of a round.
pub fn tools_of(registry: &Registry, persona: &AgentPersona, in_round: bool) -> Registry {
    let mut tools = match &persona.tools {
        Some(names) => registry.subset(names),
        None => registry.clone(),
    };
    if in_round && tools.get(PASS).is_none() {
        // `pass` is a valid name with an empty object schema: registering it cannot fail.
        if let Err(error) = tools.register(PassTool::default()) {
            tracing::error!(%error, "the pass tool could not be registered");
        }
    }
    tools
}

/// What an agent in a round is told (the activation context entry's lines): who else sits in
/// the channel, by name, and how to pass. No index, streak or order.
pub fn round_lines(agent: &str, round: &Orchestration) -> Vec<String> {
    let others: Vec<&str> = round.others().collect();
    vec![
        format!("you are: {agent}"),
        format!("other agents in this channel: {}", others.join(", ")),
        format!(
            "if this message is not for you, call the `{PASS}` tool (or answer exactly `{PASS}`) and another agent \
             will take it; otherwise answer it yourself"
        ),
    ]
}

/// The root's metadata with the next dispatch of a round written in: the agent the next one,
/// the round; the rest of the request (its kind, task, trigger, depth, delegation user) kept, so
/// the next agent gets the same work (a person's message: a `message` request made now).
pub fn next_dispatch(root: &Message, activation: &Activation, next: Orchestration) -> Metadata {
    let mut metadata = root.metadata.clone();
    let mut request = metadata.activation.take().unwrap_or_else(|| {
        Box::new(ActivationRequest {
            depth: activation.depth,
            delegation_user: activation.delegation_user.clone(),
            ..ActivationRequest::new(activation.kind())
        })
    });
    request.agent = next.current().map(str::to_owned);
    request.orchestration = Some(next);
    metadata.activation = Some(request);
    metadata
}

/// The configured agent, other than `from`, that an answer mentions first among those sitting
/// in the root's channel.
pub fn mentioned_peer<'p>(
    personas: &'p Personas,
    from: &str,
    root: &Message,
    answer: &str,
) -> Option<&'p AgentPersona> {
    let parent = root.metadata.thread.as_ref().map(|t| t.parent_channel_id.as_str());
    personas.mentioned_in(answer).into_iter().find(|p| {
        !p.name.eq_ignore_ascii_case(from)
            && (p.sits_in(&root.chatbot_id, &root.channel_id) || parent.is_some_and(|c| p.sits_in(&root.chatbot_id, c)))
    })
}

/// The id of the root an answer's mention of `to` posts: one per answer and name.
pub fn mention_root_id(answer: &MessageId, to: &str) -> MessageId {
    MessageId::from(format!("{answer}.to.{}", to.to_lowercase()))
}

/// The root that hands `answer` (by `from`) to the agent `to`, one level deeper than the turn
/// that answered: a user message in the same session, channel and thread, sent by `from`.
pub fn mention_root(answer: &Message, root: &Message, activation: &Activation, from: &str, to: &str) -> Message {
    let mut message = Message::user_text(&root.session_id, &root.chatbot_id, &root.channel_id, from, &answer.content);
    message.id = mention_root_id(&answer.id, to);
    message.metadata.thread = root.metadata.thread.clone();
    message.metadata.activation = Some(Box::new(ActivationRequest {
        triggered_by: Some(format!("agent:{from}")),
        depth: activation.depth.saturating_add(1),
        delegation_user: activation.delegation_user.clone(),
        agent: Some(to.to_owned()),
        ..ActivationRequest::new(ActivationKind::Message)
    }));
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_texts() {
        for text in ["", "  ", "pass", " PASS\n", "Pass"] {
            assert!(is_pass_text(text), "{text:?}");
        }
        for text in ["passing", "I pass on this one", "pass."] {
            assert!(!is_pass_text(text), "{text:?}");
        }
    }

    fn activation_of(root: &Message, workflow: bool) -> Activation {
        use kesoku_core::activation::{ActivationPayload, ExpectedResponse, Lane, TriggerContext};
        let payload = if workflow {
            ActivationPayload::Workflow {
                message_id: root.id.clone(),
                task: "report".into(),
                trigger: TriggerContext {
                    name: "daily".into(),
                    source: "cron".into(),
                    schedule: None,
                    fired_at: chrono::Utc::now(),
                },
            }
        } else {
            ActivationPayload::Message { message_id: root.id.clone() }
        };
        Activation {
            id: kesoku_core::ActivationId::generate(),
            session_id: root.session_id.clone(),
            chatbot_id: root.chatbot_id.clone(),
            channel_id: root.channel_id.clone(),
            triggered_by: "Chii".into(),
            delegation_user: Some("chii".into()),
            depth: 1,
            agent: Some("Ana".into()),
            orchestration: None,
            lane: Lane::Interactive,
            expected_response: ExpectedResponse::default(),
            locale: None,
            timezone: None,
            model: None,
            output_schema: None,
            created_at: chrono::Utc::now(),
            payload,
        }
    }

    #[test]
    fn the_next_dispatch_names_the_next_agent_and_keeps_the_work() {
        let round = Orchestration::start(vec!["Ana".into(), "Ben".into()]).expect("round");
        let kesoku_core::activation::AfterPass::Dispatch(next) = round.after_pass() else { panic!("Ben is next") };
        let session = kesoku_core::SessionId::from("sess_1");
        // A person's message: a message request made now, depth and delegation user carried.
        let root = Message::user_text(&session, "api", "room", "Chii", "hello");
        let request = next_dispatch(&root, &activation_of(&root, false), next.clone()).activation.expect("a request");
        assert_eq!((request.kind, request.agent.as_deref(), request.depth), (ActivationKind::Message, Some("Ben"), 1));
        assert_eq!((request.delegation_user.as_deref(), request.orchestration.as_ref()), (Some("chii"), Some(&next)));
        // A workflow stays a workflow with its task.
        let mut cron = Message::user_text(&session, "api", "room", "cron", "report");
        cron.metadata.activation = Some(Box::new(ActivationRequest {
            task: Some("report".into()),
            ..ActivationRequest::new(ActivationKind::Workflow)
        }));
        let request = next_dispatch(&cron, &activation_of(&cron, true), next).activation.expect("a request");
        assert_eq!(
            (request.kind, request.task.as_deref(), request.agent.as_deref()),
            (ActivationKind::Workflow, Some("report"), Some("Ben"))
        );
    }

    #[test]
    fn the_round_is_told_by_name_only() {
        let round =
            Orchestration { agents: vec!["Ana".into(), "Ben".into(), "Cai".into()], index: 1, no_reply_streak: 1 };
        let text = round_lines("Ben", &round).join("\n");
        assert!(text.contains("other agents in this channel: Ana, Cai"), "{text}");
        assert!(!text.contains('1') && !text.contains("index") && !text.contains("streak"), "{text}");
    }
}
