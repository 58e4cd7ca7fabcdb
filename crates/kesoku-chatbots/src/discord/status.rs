//! The status message of one Discord turn: the text and the buttons it shows (spec §4.3, §5.3).
//!
//! [`TurnStatus`] folds a turn's intermediate steps into one Discord message that
//! [`super::progress`] creates once and then edits in place: a header line (`⏳ Working…`
//! while the turn runs, `⚡ …` with the turn's figures when its answer is delivered,
//! `🛑 Interrupted`, `❌ Failed`), then one line per step — `💭` the first line of a thought,
//! `🛠️ name: arguments` with ⏳ until its result switches it to ✅ or ❌ and a short error.
//! Older steps fold into one `… N earlier steps` line so the text never nears Discord's
//! 2,000-character limit. While the turn runs the message carries a 🛑 Stop button.
//!
//! Pure: no I/O, no clock, no async. It does not decide when to create, edit or delete the
//! message (that is [`super::progress`]) and does not render final answers (the seam chunks those).

use kesoku_core::{Message, MessageId, MessageType, Role, SessionId, TurnMetrics};
use serde_json::{Value, json};

use super::custom_id::stop_custom_id;
use crate::commands::thousands;

/// Discord's limit on a message's content.
pub const DISCORD_MAX_CHARS: usize = 2_000;
/// What a status text may use, counted in UTF-16 units ([`discord_len`]): under the limit with a
/// margin, because emoji with variation selectors count differently depending on who counts.
pub const STATUS_MAX_CHARS: usize = 1_900;
/// Step lines shown below the header before older ones fold into a `… N earlier steps` line.
pub const VISIBLE_STEPS: usize = 8;
/// Longest compact argument summary of a tool call, in characters.
pub const ARGUMENTS_MAX_CHARS: usize = 80;
/// Longest thought line, in characters.
pub const THOUGHT_MAX_CHARS: usize = 200;
/// Longest error snippet after ❌, in characters.
pub const ERROR_SNIPPET_MAX_CHARS: usize = 100;
/// Longest single step line (a long tool name could otherwise make one line huge), in characters.
pub const STEP_LINE_MAX_CHARS: usize = 300;

/// Header of a running turn.
pub const HEADER_RUNNING: &str = "⏳ Working…";
/// Header of an interrupted turn (spec §6.3).
pub const HEADER_INTERRUPTED: &str = "🛑 Interrupted";
/// Header of a turn that ended in an error.
pub const HEADER_FAILED: &str = "❌ Failed";
/// Header of a finished turn whose answer carried no figures.
pub const HEADER_DONE: &str = "⚡ Done";

/// Where a turn stands, as its status message shows it.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnPhase {
    Running,
    /// The answer was delivered; the figures come from its `turn_metrics`.
    Finished(Option<TurnMetrics>),
    Interrupted,
    Failed,
}

/// How a tool call went, as far as the status message knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    Running,
    Succeeded,
    /// Failed, with a short snippet saying why (may be empty).
    Failed {
        snippet: String,
    },
}

/// One line of the status message.
#[derive(Debug, Clone, PartialEq)]
struct Step {
    /// The message the line shows (the call for a tool line), so a step delivered twice (a
    /// retry after a failed create) updates its line instead of adding a second one.
    message_id: MessageId,
    kind: StepKind,
}

#[derive(Debug, Clone, PartialEq)]
enum StepKind {
    Thought {
        text: String,
    },
    /// Intermediate assistant text (a user-facing notice inside a running turn).
    Note {
        text: String,
    },
    Tool {
        name: String,
        arguments: String,
        provider_call_id: Option<String>,
        outcome: ToolOutcome,
    },
}

/// The status message of one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnStatus {
    session_id: SessionId,
    phase: TurnPhase,
    steps: Vec<Step>,
}

impl TurnStatus {
    /// A running turn of `session_id` with nothing shown yet.
    pub fn new(session_id: SessionId) -> Self {
        TurnStatus { session_id, phase: TurnPhase::Running, steps: Vec::new() }
    }

    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    pub fn phase(&self) -> &TurnPhase {
        &self.phase
    }

    pub fn is_running(&self) -> bool {
        self.phase == TurnPhase::Running
    }

    /// Whether no step line has been added yet.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Take one intermediate step into the status: a thought, a tool call, a tool result (matched
    /// to its call by `parent_id`, else by `metadata.tool_call_id`), or intermediate assistant
    /// text. Returns whether the shown text changed. Other messages change nothing, and applying
    /// the same message twice changes nothing the second time.
    pub fn apply(&mut self, message: &Message) -> bool {
        let before = self.steps.clone();
        match message.message_type {
            MessageType::Thought => {
                let text = first_line(&message.content, THOUGHT_MAX_CHARS);
                if !text.is_empty() {
                    self.upsert(&message.id, StepKind::Thought { text });
                }
            }
            MessageType::ToolCall => {
                let name = tool_name(message);
                let arguments = message.metadata.tool_arguments.as_ref().map(argument_summary).unwrap_or_default();
                let provider_call_id = message.metadata.tool_call_id.clone();
                // A call delivered again keeps the outcome its result may already have set.
                if !self.steps.iter().any(|step| step.message_id == message.id) {
                    self.steps.push(Step {
                        message_id: message.id.clone(),
                        kind: StepKind::Tool { name, arguments, provider_call_id, outcome: ToolOutcome::Running },
                    });
                }
            }
            MessageType::ToolResult => self.apply_result(message),
            MessageType::Text => {
                if message.role == Role::Assistant {
                    let text = first_line(&message.content, THOUGHT_MAX_CHARS);
                    if !text.is_empty() {
                        self.upsert(&message.id, StepKind::Note { text });
                    }
                }
            }
        }
        self.steps != before
    }

    fn upsert(&mut self, message_id: &MessageId, kind: StepKind) {
        match self.steps.iter_mut().find(|step| &step.message_id == message_id) {
            Some(step) => step.kind = kind,
            None => self.steps.push(Step { message_id: message_id.clone(), kind }),
        }
    }

    fn apply_result(&mut self, result: &Message) {
        let outcome = result_outcome(result);
        let by_parent =
            result.parent_id.as_ref().and_then(|parent| self.steps.iter().position(|step| &step.message_id == parent));
        let by_provider_id = || {
            let wanted = result.metadata.tool_call_id.as_deref()?;
            self.steps.iter().position(
                |step| matches!(&step.kind, StepKind::Tool { provider_call_id: Some(id), .. } if id == wanted),
            )
        };
        // A result delivered again whose call this status never saw was added under its own id.
        let by_own_id = || self.steps.iter().position(|step| step.message_id == result.id);
        match by_parent.or_else(by_provider_id).or_else(by_own_id) {
            Some(index) => {
                if let StepKind::Tool { outcome: shown, .. } = &mut self.steps[index].kind {
                    *shown = outcome;
                }
            }
            // The call was shown before a restart (or not at all): show the result on its own line.
            None => self.steps.push(Step {
                message_id: result.id.clone(),
                kind: StepKind::Tool {
                    name: tool_name(result),
                    arguments: String::new(),
                    provider_call_id: result.metadata.tool_call_id.clone(),
                    outcome,
                },
            }),
        }
    }

    /// The answer was delivered: the message becomes the header with the turn's figures.
    pub fn finish(&mut self, metrics: Option<TurnMetrics>) {
        self.phase = TurnPhase::Finished(metrics);
    }

    /// The turn was interrupted (the message is normally deleted; this is what shows if not).
    pub fn interrupt(&mut self) {
        self.phase = TurnPhase::Interrupted;
    }

    /// The turn ended in an error: the steps stay, so the user sees where it failed.
    pub fn fail(&mut self) {
        self.phase = TurnPhase::Failed;
    }

    /// The header line.
    pub fn header(&self) -> String {
        match &self.phase {
            TurnPhase::Running => HEADER_RUNNING.to_owned(),
            TurnPhase::Finished(Some(metrics)) => metrics_header(metrics),
            TurnPhase::Finished(None) => HEADER_DONE.to_owned(),
            TurnPhase::Interrupted => HEADER_INTERRUPTED.to_owned(),
            TurnPhase::Failed => HEADER_FAILED.to_owned(),
        }
    }

    /// The message text: the header, then (while running or after a failure) the step lines,
    /// older ones folded. Always within [`STATUS_MAX_CHARS`] UTF-16 units.
    pub fn text(&self) -> String {
        let header = self.header();
        match self.phase {
            // A finished turn's answer says what happened; the status folds down to its figures.
            TurnPhase::Finished(_) | TurnPhase::Interrupted => return cut_to_len(&header, STATUS_MAX_CHARS),
            TurnPhase::Running | TurnPhase::Failed => {}
        }
        let lines: Vec<String> = self.steps.iter().map(step_line).collect();
        let mut visible = lines.len().min(VISIBLE_STEPS);
        loop {
            let folded = lines.len() - visible;
            let mut text = header.clone();
            if folded > 0 {
                text.push('\n');
                text.push_str(&fold_line(&self.steps[..folded]));
            }
            for line in &lines[folded..] {
                text.push('\n');
                text.push_str(line);
            }
            if discord_len(&text) <= STATUS_MAX_CHARS || visible == 0 {
                return cut_to_len(&text, STATUS_MAX_CHARS);
            }
            visible -= 1;
        }
    }

    /// The message components: the Stop button while the turn runs, none after (an edit with
    /// an empty list removes the button).
    pub fn components(&self) -> Value {
        match self.phase {
            TurnPhase::Running => stop_button(&self.session_id),
            TurnPhase::Finished(_) | TurnPhase::Interrupted | TurnPhase::Failed => json!([]),
        }
    }

    /// The JSON body of a create or edit: content, components, and no mentions (a thought that
    /// quotes `@everyone` or a user must not ping anyone).
    pub fn body(&self) -> Value {
        json!({
            "content": self.text(),
            "components": self.components(),
            "allowed_mentions": { "parse": [] },
        })
    }
}

/// The header of a finished turn: `⚡ 3 turns · context 8,421 tokens · 1 tool call · 1,042 tokens · 2.1 s`.
pub fn metrics_header(metrics: &TurnMetrics) -> String {
    format!(
        "⚡ {} turn{} · context {} tokens · {} tool call{} · {} tokens · {:.1} s",
        metrics.session_turns,
        plural(metrics.session_turns),
        thousands(metrics.context_tokens),
        metrics.turn_tool_calls,
        plural(metrics.turn_tool_calls),
        thousands(metrics.turn_tokens),
        metrics.turn_time
    )
}

/// A tool call's arguments on one line: a lone string argument as its value, otherwise
/// `key=value` pairs (strings with spaces quoted), cut to [`ARGUMENTS_MAX_CHARS`] with `…`.
pub fn argument_summary(arguments: &Value) -> String {
    let summary = match arguments {
        Value::Object(object) => match object.iter().next() {
            Some((_, Value::String(value))) if object.len() == 1 => value.clone(),
            _ => object
                .iter()
                .map(|(key, value)| format!("{key}={}", compact_value(value)))
                .collect::<Vec<_>>()
                .join(" "),
        },
        Value::Null => String::new(),
        Value::String(value) => value.clone(),
        Value::Bool(_) | Value::Number(_) | Value::Array(_) => arguments.to_string(),
    };
    cut(&one_line(&summary), ARGUMENTS_MAX_CHARS)
}

fn compact_value(value: &Value) -> String {
    match value {
        Value::String(text) if !text.is_empty() && !text.chars().any(char::is_whitespace) => text.clone(),
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => {
            value.to_string()
        }
    }
}

/// The components of a running turn's status message: one action row with a red Stop button.
pub fn stop_button(session_id: &SessionId) -> Value {
    json!([{
        "type": 1,
        "components": [{
            "type": 2,
            "style": 4,
            "label": "Stop",
            "emoji": { "name": "🛑" },
            "custom_id": stop_custom_id(session_id),
        }],
    }])
}

/// Length as Discord's limit is checked here: UTF-16 code units, never fewer than characters,
/// so a text within this length is within the limit however Discord counts.
pub fn discord_len(text: &str) -> usize {
    text.encode_utf16().count()
}

fn plural(count: u64) -> &'static str {
    if count == 1 { "" } else { "s" }
}

fn tool_name(message: &Message) -> String {
    let name = message.metadata.tool_name.as_deref().map(str::trim).filter(|name| !name.is_empty());
    match (name, message.message_type) {
        (Some(name), _) => one_line(name),
        // A result's sender is the tool that ran (spec §3).
        (None, MessageType::ToolResult) if !message.sender.trim().is_empty() => one_line(&message.sender),
        (None, _) => "tool".to_owned(),
    }
}

fn result_outcome(result: &Message) -> ToolOutcome {
    let Some(error) = &result.metadata.tool_error else {
        return ToolOutcome::Succeeded;
    };
    let candidates = [
        Some(error.as_str()),
        result.metadata.tool_result.as_deref(),
        result.content.lines().rev().find(|line| !line.trim().is_empty()),
    ];
    let snippet = candidates
        .into_iter()
        .flatten()
        .map(|text| first_line(text, ERROR_SNIPPET_MAX_CHARS))
        .find(|text| !text.is_empty())
        .unwrap_or_default();
    ToolOutcome::Failed { snippet }
}

fn step_line(step: &Step) -> String {
    let line = match &step.kind {
        StepKind::Thought { text } => format!("💭 {text}"),
        StepKind::Note { text } => format!("🔔 {text}"),
        StepKind::Tool { name, arguments, outcome, .. } => {
            let call = if arguments.is_empty() { name.clone() } else { format!("{name}: {arguments}") };
            match outcome {
                ToolOutcome::Running => format!("🛠️ {call} ⏳"),
                ToolOutcome::Succeeded => format!("🛠️ {call} ✅"),
                ToolOutcome::Failed { snippet } if snippet.is_empty() => format!("🛠️ {call} ❌"),
                ToolOutcome::Failed { snippet } => format!("🛠️ {call} ❌ {snippet}"),
            }
        }
    };
    cut(&line, STEP_LINE_MAX_CHARS)
}

/// `… 42 earlier steps ✅` when every folded tool succeeded, else with the counts.
fn fold_line(folded: &[Step]) -> String {
    let (mut succeeded, mut failed, mut running) = (0, 0, 0);
    for step in folded {
        match &step.kind {
            StepKind::Tool { outcome: ToolOutcome::Succeeded, .. } => succeeded += 1,
            StepKind::Tool { outcome: ToolOutcome::Failed { .. }, .. } => failed += 1,
            StepKind::Tool { outcome: ToolOutcome::Running, .. } => running += 1,
            StepKind::Thought { .. } | StepKind::Note { .. } => {}
        }
    }
    let count = folded.len();
    let steps = if count == 1 { "step" } else { "steps" };
    if failed == 0 && running == 0 {
        return format!("… {count} earlier {steps} ✅");
    }
    let counts: Vec<String> = [(succeeded, "✅"), (failed, "❌"), (running, "⏳")]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, emoji)| format!("{n} {emoji}"))
        .collect();
    format!("… {count} earlier {steps} ({})", counts.join(" · "))
}

/// The first non-empty line of `text`, trimmed, on one line, cut to `max` characters.
fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty()).unwrap_or_default();
    cut(&one_line(line), max)
}

/// Whitespace runs (newlines included) become one space; a code fence is broken up so one
/// line cannot open a code block that swallows the lines after it.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace("```", "`\u{200b}`\u{200b}`")
}

/// `text` cut to at most `max` characters, ending with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `text` cut to at most `max` UTF-16 units, ending with `…` when cut.
fn cut_to_len(text: &str, max: usize) -> String {
    if discord_len(text) <= max {
        return text.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for ch in text.chars() {
        if used + ch.len_utf16() > max.saturating_sub(1) {
            break;
        }
        used += ch.len_utf16();
        out.push(ch);
    }
    out.push('…');
    out
}

/// The messages of the spec's example 6.1, built as the worker builds them, with the spec's ids.
#[cfg(test)]
pub(super) mod spec {
    use kesoku_core::{Message, MessageId, SessionId, Status, TurnMetrics, TurnOrigin};
    use serde_json::json;

    pub const CHANNEL: &str = "1234567890123";
    pub const CHANNEL_ID: u64 = 1_234_567_890_123;
    pub const THOUGHT: &str =
        "I need to run the unit tests for the history module using uv. I will search for the test file first.";

    pub fn root() -> Message {
        root_in("msg_user_001", "sess_agent_history", CHANNEL)
    }

    pub fn root_in(id: &str, session: &str, channel: &str) -> Message {
        let mut message = Message::user_text(
            &SessionId::from(session),
            "discord",
            channel,
            "Chii",
            "`Chii` <@112233> at `2026-05-27 20:50:00 SGT`:\nRun tests for agent history module",
        );
        message.id = MessageId::from(id);
        message
    }

    pub fn with_status(mut message: Message, status: Status) -> Message {
        message.status = status;
        message
    }

    fn with_id(mut message: Message, id: &str) -> Message {
        message.id = MessageId::from(id);
        message
    }

    pub fn thought(root: &Message) -> Message {
        thought_text(root, "msg_thought_001", THOUGHT)
    }

    pub fn thought_text(root: &Message, id: &str, text: &str) -> Message {
        with_id(TurnOrigin::of(root, "Kesoku").thought(1, text, None), id)
    }

    pub fn call(root: &Message) -> Message {
        call_with(
            root,
            "msg_call_001",
            "run_shell_command",
            json!({ "command": "uv run pytest tests/test_history.py" }),
        )
    }

    pub fn call_with(root: &Message, id: &str, tool: &str, arguments: serde_json::Value) -> Message {
        with_id(TurnOrigin::of(root, "Kesoku").tool_call(1, &format!("provider_{id}"), tool, arguments), id)
    }

    pub fn result(root: &Message, call: &Message) -> Message {
        let content = "=== STDOUT ===\n============================= test session starts =============================\nplugins: anyio-4.3.0\ncollected 5 items\n\ntests/test_history.py .....                                              [100%]\n============================== 5 passed in 0.42s ===============================\n=== STDERR ===\n";
        let result = TurnOrigin::of(root, "Kesoku").tool_result(call, content, Some("5 passed in 0.42s".into()), None);
        with_id(result, "msg_result_001")
    }

    pub fn failed_result(root: &Message, call: &Message, id: &str, error: &str) -> Message {
        let result = TurnOrigin::of(root, "Kesoku").tool_result(call, "=== STDERR ===\nboom", None, Some(error.into()));
        with_id(result, id)
    }

    pub fn metrics() -> TurnMetrics {
        TurnMetrics { session_turns: 3, context_tokens: 8421, turn_tool_calls: 1, turn_tokens: 1042, turn_time: 2.1 }
    }

    pub fn reply(root: &Message) -> Message {
        let reply = TurnOrigin::of(root, "Kesoku").final_text(
            2,
            "I have successfully executed the tests for the agent history module. All 5 tests passed in 0.42 seconds.",
            Some(metrics()),
        );
        with_id(reply, "msg_reply_001")
    }

    /// Exact texts of the status message along example 6.1.
    pub const AFTER_THOUGHT: &str = "⏳ Working…\n💭 I need to run the unit tests for the history module using uv. I will search for the test file first.";
    pub const AFTER_CALL: &str = "⏳ Working…\n💭 I need to run the unit tests for the history module using uv. I will search for the test file first.\n🛠️ run_shell_command: uv run pytest tests/test_history.py ⏳";
    pub const AFTER_RESULT: &str = "⏳ Working…\n💭 I need to run the unit tests for the history module using uv. I will search for the test file first.\n🛠️ run_shell_command: uv run pytest tests/test_history.py ✅";
    pub const FOLDED: &str = "⚡ 3 turns · context 8,421 tokens · 1 tool call · 1,042 tokens · 2.1 s";
}

#[cfg(test)]
mod tests {
    use kesoku_core::{Message, MessageId, SessionId, TurnMetrics};
    use serde_json::json;

    use super::spec;
    use super::*;

    /// Apply `steps` to a fresh status of the spec's session and compare its whole text.
    fn check(steps: &[Message], expected: &str) -> TurnStatus {
        let mut status = TurnStatus::new(SessionId::from("sess_agent_history"));
        for step in steps {
            status.apply(step);
        }
        assert_eq!(status.text(), expected);
        status
    }

    fn summary_line(arguments: Value) -> String {
        let root = spec::root();
        let call = spec::call_with(&root, "msg_call_x", "tool_x", arguments);
        let mut status = TurnStatus::new(root.session_id.clone());
        status.apply(&call);
        status.text().lines().nth(1).expect("a step line").to_owned()
    }

    #[test]
    fn spec_6_1_steps_render_as_the_spec_shows() {
        let root = spec::root();
        let (thought, call) = (spec::thought(&root), spec::call(&root));
        let result = spec::result(&root, &call);
        check(std::slice::from_ref(&thought), spec::AFTER_THOUGHT);
        check(&[thought.clone(), call.clone()], spec::AFTER_CALL);
        let mut status = check(&[thought, call, result], spec::AFTER_RESULT);
        assert_eq!(status.components(), stop_button(&root.session_id));
        status.finish(Some(spec::metrics()));
        assert_eq!(status.text(), spec::FOLDED);
        assert_eq!(status.components(), json!([]));
    }

    #[test]
    fn a_thought_shows_its_first_non_empty_line_trimmed() {
        let root = spec::root();
        let thought = spec::thought_text(&root, "msg_t", "\n  \n   First idea.   \nSecond line");
        check(&[thought], "⏳ Working…\n💭 First idea.");
        let mut status = TurnStatus::new(root.session_id.clone());
        assert!(!status.apply(&spec::thought_text(&root, "msg_empty", " \n\t\n")), "an empty thought shows nothing");
        assert!(status.is_empty());
        let long = "x".repeat(THOUGHT_MAX_CHARS + 50);
        let status = check(
            &[spec::thought_text(&root, "msg_long", &long)],
            &format!("⏳ Working…\n💭 {}…", "x".repeat(THOUGHT_MAX_CHARS - 1)),
        );
        assert!(status.is_running());
    }

    #[test]
    fn argument_summaries_are_one_short_line() {
        assert_eq!(summary_line(json!({ "command": "ls -la" })), "🛠️ tool_x: ls -la ⏳");
        assert_eq!(
            summary_line(json!({ "path": "src/main.rs", "limit": 20, "query": "Tokyo weather" })),
            "🛠️ tool_x: path=src/main.rs limit=20 query=\"Tokyo weather\" ⏳"
        );
        assert_eq!(summary_line(json!({ "count": 3 })), "🛠️ tool_x: count=3 ⏳");
        assert_eq!(summary_line(json!({ "script": "echo a\n\necho   b" })), "🛠️ tool_x: echo a echo b ⏳");
        assert_eq!(summary_line(json!({})), "🛠️ tool_x ⏳");
        assert_eq!(summary_line(Value::Null), "🛠️ tool_x ⏳");
        let long = summary_line(json!({ "command": "a".repeat(500) }));
        assert_eq!(long, format!("🛠️ tool_x: {}… ⏳", "a".repeat(ARGUMENTS_MAX_CHARS - 1)));
        assert_eq!(argument_summary(&json!({ "command": "a".repeat(500) })).chars().count(), ARGUMENTS_MAX_CHARS);
        assert_eq!(
            argument_summary(&json!({ "items": [1, 2], "nested": { "k": "v" } })),
            r#"items=[1,2] nested={"k":"v"}"#
        );
    }

    #[test]
    fn a_result_finds_its_call_by_parent_then_by_provider_call_id() {
        let root = spec::root();
        let first = spec::call_with(&root, "msg_call_a", "read_file", json!({ "path": "a.txt" }));
        let second = spec::call_with(&root, "msg_call_b", "read_file", json!({ "path": "b.txt" }));
        let mut second_result = spec::result(&root, &second);
        second_result.id = MessageId::from("msg_result_b");
        // The parent is unknown here (an id this status never saw): the provider's call id still matches.
        second_result.parent_id = Some(MessageId::from("msg_elsewhere"));
        check(
            &[first.clone(), second.clone(), second_result],
            "⏳ Working…\n🛠️ read_file: a.txt ⏳\n🛠️ read_file: b.txt ✅",
        );
        let mut first_result = spec::result(&root, &first);
        first_result.id = MessageId::from("msg_result_a");
        first_result.metadata.tool_call_id = None;
        check(&[first, second, first_result], "⏳ Working…\n🛠️ read_file: a.txt ✅\n🛠️ read_file: b.txt ⏳");
    }

    #[test]
    fn an_error_result_shows_a_cross_and_a_snippet() {
        let root = spec::root();
        let call = spec::call_with(&root, "msg_call_f", "run_shell_command", json!({ "command": "false" }));
        let failed = spec::failed_result(&root, &call, "msg_result_f", "exit code 1\nmore detail");
        check(&[call.clone(), failed], "⏳ Working…\n🛠️ run_shell_command: false ❌ exit code 1");
        // An empty tool_error falls back to the result's own words: its last non-empty line.
        let silent = spec::failed_result(&root, &call, "msg_result_g", "  ");
        check(&[call.clone(), silent], "⏳ Working…\n🛠️ run_shell_command: false ❌ boom");
        let long = spec::failed_result(&root, &call, "msg_result_h", &"e".repeat(400));
        let text = check(
            &[call, long],
            &format!("⏳ Working…\n🛠️ run_shell_command: false ❌ {}…", "e".repeat(ERROR_SNIPPET_MAX_CHARS - 1)),
        );
        assert!(text.is_running());
    }

    #[test]
    fn a_result_whose_call_is_unknown_gets_its_own_line() {
        let root = spec::root();
        let call = spec::call(&root);
        let mut result = spec::result(&root, &call);
        result.metadata.tool_call_id = None;
        let mut status = check(std::slice::from_ref(&result), "⏳ Working…\n🛠️ run_shell_command ✅");
        assert!(!status.apply(&result), "the same result again adds no second line");
    }

    #[test]
    fn applying_a_step_twice_changes_nothing() {
        let root = spec::root();
        let (thought, call) = (spec::thought(&root), spec::call(&root));
        let result = spec::result(&root, &call);
        let mut status = TurnStatus::new(root.session_id.clone());
        assert!(status.apply(&thought));
        assert!(status.apply(&call));
        assert!(status.apply(&result));
        assert!(!status.apply(&thought));
        assert!(!status.apply(&call), "a call delivered again keeps its ✅");
        assert!(!status.apply(&result));
        assert!(!status.apply(&spec::root()), "a user message is no step");
        assert_eq!(status.text(), spec::AFTER_RESULT);
    }

    #[test]
    fn older_steps_fold_after_eight_lines() {
        let root = spec::root();
        let mut steps = Vec::new();
        for n in 1..=10 {
            let call = spec::call_with(&root, &format!("msg_call_{n}"), "step", json!({ "n": n.to_string() }));
            let mut result = spec::result(&root, &call);
            result.id = MessageId::from(format!("msg_result_{n}"));
            steps.push(call);
            steps.push(result);
        }
        let expected = "⏳ Working…\n… 2 earlier steps ✅\n🛠️ step: 3 ✅\n🛠️ step: 4 ✅\n🛠️ step: 5 ✅\n🛠️ step: 6 ✅\n🛠️ step: 7 ✅\n🛠️ step: 8 ✅\n🛠️ step: 9 ✅\n🛠️ step: 10 ✅";
        check(&steps, expected);

        // A failure among the folded steps is still counted, and a thought folds too.
        steps[1] = spec::failed_result(&root, &steps[0], "msg_result_1", "denied");
        steps.insert(0, spec::thought(&root));
        let expected = "⏳ Working…\n… 3 earlier steps (1 ✅ · 1 ❌)\n🛠️ step: 3 ✅\n🛠️ step: 4 ✅\n🛠️ step: 5 ✅\n🛠️ step: 6 ✅\n🛠️ step: 7 ✅\n🛠️ step: 8 ✅\n🛠️ step: 9 ✅\n🛠️ step: 10 ✅";
        check(&steps, expected);
    }

    #[test]
    fn fifty_long_tool_calls_stay_under_the_limit() {
        let root = spec::root();
        let mut status = TurnStatus::new(root.session_id.clone());
        for n in 1..=50 {
            status.apply(&spec::thought_text(&root, &format!("msg_thought_{n}"), &"think ".repeat(100)));
            let call = spec::call_with(
                &root,
                &format!("msg_call_{n}"),
                "run_shell_command",
                json!({ "command": format!("{n} {}", "é🛠".repeat(300)) }),
            );
            status.apply(&call);
            let text = status.text();
            assert!(
                text.chars().count() <= DISCORD_MAX_CHARS && discord_len(&text) <= STATUS_MAX_CHARS,
                "{}",
                discord_len(&text)
            );
            assert!(text.ends_with('⏳'), "the newest call stays visible");
            if n % 3 == 0 {
                status.apply(&spec::failed_result(&root, &call, &format!("msg_result_{n}"), &"x".repeat(1_000)));
            } else {
                let mut result = spec::result(&root, &call);
                result.id = MessageId::from(format!("msg_result_{n}"));
                status.apply(&result);
            }
            assert!(discord_len(&status.text()) <= STATUS_MAX_CHARS);
        }
        let text = status.text();
        assert_eq!(text.lines().count(), 2 + VISIBLE_STEPS);
        assert_eq!(text.lines().nth(1), Some("… 92 earlier steps (31 ✅ · 15 ❌)"));
    }

    #[test]
    fn huge_tool_names_fold_more_lines_to_stay_within_the_budget() {
        let root = spec::root();
        let mut status = TurnStatus::new(root.session_id.clone());
        for n in 1..=20 {
            status.apply(&spec::call_with(
                &root,
                &format!("msg_call_{n}"),
                &format!("{n}{}", "n".repeat(1_000)),
                json!({}),
            ));
        }
        let text = status.text();
        assert!(discord_len(&text) <= STATUS_MAX_CHARS);
        let step_lines = text.lines().filter(|line| line.starts_with("🛠️")).count();
        assert!(step_lines < VISIBLE_STEPS && step_lines > 0, "{step_lines} lines");
        assert!(text.lines().all(|line| line.chars().count() <= STEP_LINE_MAX_CHARS));
        assert!(text.lines().last().is_some_and(|line| line.starts_with("🛠️ 20n")));
    }

    #[test]
    fn headers_say_how_the_turn_ended() {
        let root = spec::root();
        let call = spec::call(&root);
        let mut status = check(
            std::slice::from_ref(&call),
            "⏳ Working…\n🛠️ run_shell_command: uv run pytest tests/test_history.py ⏳",
        );
        status.fail();
        assert_eq!(status.text(), "❌ Failed\n🛠️ run_shell_command: uv run pytest tests/test_history.py ⏳");
        assert_eq!(status.components(), json!([]));
        status.interrupt();
        assert_eq!(status.text(), "🛑 Interrupted");
        status.finish(None);
        assert_eq!(status.text(), "⚡ Done");
        let one = TurnMetrics {
            session_turns: 1,
            context_tokens: 999,
            turn_tool_calls: 0,
            turn_tokens: 1_234_567,
            turn_time: 0.04,
        };
        assert_eq!(metrics_header(&one), "⚡ 1 turn · context 999 tokens · 0 tool calls · 1,234,567 tokens · 0.0 s");
    }

    #[test]
    fn the_stop_button_is_a_red_button_naming_the_session() {
        let session = SessionId::from("sess_agent_history");
        assert_eq!(
            stop_button(&session),
            json!([{ "type": 1, "components": [{
                "type": 2, "style": 4, "label": "Stop", "emoji": { "name": "🛑" },
                "custom_id": "kesoku:stop:sess_agent_history"
            }] }])
        );
        let body = TurnStatus::new(session.clone()).body();
        assert_eq!(body["content"], "⏳ Working…");
        assert_eq!(body["allowed_mentions"], json!({ "parse": [] }));
        assert_eq!(body["components"], stop_button(&session));
    }

    #[test]
    fn a_code_fence_in_a_step_cannot_open_a_code_block() {
        let root = spec::root();
        let thought = spec::thought_text(&root, "msg_t", "Let me write ```rust");
        let status = check(&[thought], "⏳ Working…\n💭 Let me write `\u{200b}`\u{200b}`rust");
        assert!(!status.text().contains("```"));
    }
}
