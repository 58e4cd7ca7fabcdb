//! How the terminal shows each kind of message (spec §4.3, §5.3): thoughts in cyan panels, tool
//! calls in yellow, tool results in magenta with ✅ or ❌, answers as rendered Markdown followed
//! by the turn's figures, notifications as a notice line; and the same content uncoloured, without
//! boxes, in [`RenderMode::Plain`].
//!
//! Pure functions from a message to text: no terminal I/O here, so every form is testable.
//! Text from tools and models is cleaned of control characters before it reaches the terminal,
//! so a tool's output cannot move the cursor or change colours.

use console::Style;
use kesoku_core::message::{ERROR_NOTIFICATION_PREFIX, SENDER_NOTIFICATION};
use kesoku_core::{Message, MessageType, Role, TurnMetrics};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use crate::commands::thousands;

/// Lines of a tool result kept on screen (the end of the output, where errors and totals are).
pub const TOOL_RESULT_LINES: usize = 20;
/// Lines of a tool call's arguments kept on screen.
pub const TOOL_CALL_LINES: usize = 20;
/// Lines of a thought kept on screen.
pub const THOUGHT_LINES: usize = 40;
/// Widest a panel or answer gets, whatever the terminal's width.
pub const MAX_WIDTH: usize = 100;
/// Narrowest layout.
pub const MIN_WIDTH: usize = 30;

/// Colours and boxes, or plain text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenderMode {
    /// A terminal: coloured panels, Markdown, a spinner.
    Rich,
    /// Not a terminal, or `NO_COLOR`: uncoloured text, no spinner, Markdown left as written.
    Plain,
}

/// Panel colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Thought,
    ToolCall,
    ToolResult,
    Notice,
    Error,
    Dim,
}

/// Renders messages for a terminal of a given width.
#[derive(Debug, Clone, Copy)]
pub struct Renderer {
    pub mode: RenderMode,
    /// Columns available (clamped to [`MIN_WIDTH`]..=[`MAX_WIDTH`]).
    pub width: usize,
}

impl Renderer {
    pub fn new(mode: RenderMode, columns: usize) -> Self {
        Renderer { mode, width: columns.clamp(MIN_WIDTH, MAX_WIDTH) }
    }

    fn style(&self, tone: Tone) -> Style {
        let style = Style::new().force_styling(true);
        match tone {
            Tone::Thought => style.cyan(),
            Tone::ToolCall => style.yellow(),
            Tone::ToolResult => style.magenta(),
            Tone::Notice => style.blue().bold(),
            Tone::Error => style.red().bold(),
            Tone::Dim => style.dim(),
        }
    }

    fn paint(&self, tone: Tone, text: &str) -> String {
        match self.mode {
            RenderMode::Rich => self.style(tone).apply_to(text).to_string(),
            RenderMode::Plain => text.to_owned(),
        }
    }

    /// The text shown for `message` (ending with a newline), or `None` for messages the user
    /// never sees (nudges and other system text, user messages).
    pub fn render(&self, message: &Message) -> Option<String> {
        match message.message_type {
            MessageType::Thought => {
                Some(self.panel(Tone::Thought, "💭 Thought", &head(&clean(message.content.trim()), THOUGHT_LINES)))
            }
            MessageType::ToolCall => {
                let name = message.metadata.tool_name.as_deref().unwrap_or("tool");
                let body = match &message.metadata.tool_arguments {
                    Some(arguments) => describe_arguments(arguments),
                    None => message.content.trim().to_owned(),
                };
                Some(self.panel(Tone::ToolCall, &format!("🔧 {name}"), &head(&clean(&body), TOOL_CALL_LINES)))
            }
            MessageType::ToolResult => {
                let name = message.metadata.tool_name.as_deref().unwrap_or(&message.sender);
                let title = match &message.metadata.tool_error {
                    Some(error) => format!("❌ {name}: {}", first_line(&clean(error))),
                    None => format!("✅ {name}"),
                };
                Some(self.panel(Tone::ToolResult, &title, &tail(&clean(message.content.trim_end()), TOOL_RESULT_LINES)))
            }
            MessageType::Text => match message.role {
                Role::Assistant if message.sender == SENDER_NOTIFICATION => {
                    Some(self.notice(&format!("🔔 {}", message.content.trim())))
                }
                Role::Assistant if message.content.starts_with(ERROR_NOTIFICATION_PREFIX) => {
                    Some(format!("{}\n", self.paint(Tone::Error, &clean(message.content.trim()))))
                }
                Role::Assistant => {
                    let mut out = self.markdown(&message.content);
                    if let Some(metrics) = &message.metadata.turn_metrics {
                        out.push_str(&self.metrics_line(metrics));
                    }
                    Some(out)
                }
                Role::User | Role::System | Role::Tool => None,
            },
        }
    }

    /// A one-line notice (command replies, "interrupted", notifications).
    pub fn notice(&self, text: &str) -> String {
        let text = clean(text.trim_end());
        format!("{}\n", self.paint(Tone::Notice, &text))
    }

    /// Text in a quieter colour (hints, figures).
    pub fn dim(&self, text: &str) -> String {
        format!("{}\n", self.paint(Tone::Dim, &clean(text.trim_end())))
    }

    /// The figures after an answer.
    pub fn metrics_line(&self, metrics: &TurnMetrics) -> String {
        let line = format!(
            "[turn {} · context {} tokens · {} tool call{} · {} tokens · {:.1} s]",
            metrics.session_turns,
            thousands(metrics.context_tokens),
            metrics.turn_tool_calls,
            if metrics.turn_tool_calls == 1 { "" } else { "s" },
            thousands(metrics.turn_tokens),
            metrics.turn_time
        );
        self.dim(&line)
    }

    /// An answer: rendered Markdown on a terminal, the text as written otherwise.
    pub fn markdown(&self, text: &str) -> String {
        let text = clean(text.trim());
        match self.mode {
            RenderMode::Rich => {
                let skin = termimad::MadSkin::default();
                let rendered = termimad::FmtText::from(&skin, &text, Some(self.width)).to_string();
                format!("{}\n", rendered.trim_end())
            }
            RenderMode::Plain => format!("{text}\n"),
        }
    }

    /// A titled block: a coloured box on a terminal, a title line and the body otherwise.
    pub fn panel(&self, tone: Tone, title: &str, body: &str) -> String {
        let title = clean(title);
        match self.mode {
            RenderMode::Plain => {
                let mut out = format!("{title}\n");
                for line in body.lines() {
                    out.push_str(line);
                    out.push('\n');
                }
                out
            }
            RenderMode::Rich => {
                let inner = self.width - 4;
                let title = truncate_to_width(&title, inner.saturating_sub(2));
                let fill = self.width.saturating_sub(5 + title.width());
                let mut out = String::new();
                out.push_str(&self.paint(tone, &format!("╭─ {title} {}╮", "─".repeat(fill))));
                out.push('\n');
                for line in body.lines().flat_map(|line| wrap(line, inner)) {
                    let pad = inner.saturating_sub(line.width());
                    out.push_str(&self.paint(tone, "│"));
                    out.push_str(&format!(" {line}{} ", " ".repeat(pad)));
                    out.push_str(&self.paint(tone, "│"));
                    out.push('\n');
                }
                out.push_str(&self.paint(tone, &format!("╰{}╯", "─".repeat(self.width - 2))));
                out.push('\n');
                out
            }
        }
    }
}

/// Tool arguments as the user wants to read them: a lone `command` as a shell line, else JSON.
fn describe_arguments(arguments: &serde_json::Value) -> String {
    if let Some(object) = arguments.as_object()
        && object.len() == 1
        && let Some(command) = object.get("command").and_then(serde_json::Value::as_str)
    {
        return format!("$ {command}");
    }
    serde_json::to_string_pretty(arguments).unwrap_or_else(|_| arguments.to_string())
}

/// Drop control characters (escape sequences included) except newlines; tabs become spaces.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push('\n'),
            '\t' => out.push_str("    "),
            '\r' => {}
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}

/// The first `max` lines, and how many were left out.
fn head(text: &str, max: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= max {
        return text.to_owned();
    }
    let mut out = lines[..max].join("\n");
    out.push_str(&format!("\n… ({} more lines not shown)", lines.len() - max));
    out
}

/// The last `max` lines, and how many were left out.
pub fn tail(text: &str, max: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= max {
        return text.to_owned();
    }
    let hidden = lines.len() - max;
    format!("… ({hidden} earlier lines not shown)\n{}", lines[hidden..].join("\n"))
}

/// Split a line into pieces at most `width` columns wide, at spaces where possible.
pub fn wrap(line: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    if line.width() <= width {
        return vec![line.to_owned()];
    }
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut current_width = 0;
    for word in line.split_inclusive(' ') {
        let word_width = word.width();
        if current_width + word_width <= width {
            current.push_str(word);
            current_width += word_width;
            continue;
        }
        if !current.is_empty() {
            pieces.push(current.trim_end().to_owned());
            current = String::new();
            current_width = 0;
        }
        // A word wider than the line is cut wherever it must be.
        for c in word.chars() {
            let c_width = c.width().unwrap_or(0);
            if current_width + c_width > width {
                pieces.push(std::mem::take(&mut current));
                current_width = 0;
            }
            current.push(c);
            current_width += c_width;
        }
    }
    if !current.is_empty() || pieces.is_empty() {
        pieces.push(current.trim_end().to_owned());
    }
    pieces
}

fn truncate_to_width(text: &str, width: usize) -> String {
    if text.width() <= width {
        return text.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let c_width = c.width().unwrap_or(0);
        if used + c_width + 1 > width {
            break;
        }
        out.push(c);
        used += c_width;
    }
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_keeps_every_piece_within_the_width() {
        let line = "the quick brown fox jumps over the lazy dog and a verylongwordthatcannotfit";
        for piece in wrap(line, 12) {
            assert!(piece.width() <= 12, "{piece:?}");
        }
        assert_eq!(wrap("short", 12), vec!["short"]);
        assert_eq!(wrap("", 12), vec![""]);
    }

    #[test]
    fn tail_keeps_the_end_and_says_how_much_is_hidden() {
        let text: String = (1..=30).map(|n| format!("line {n}\n")).collect();
        let kept = tail(text.trim_end(), 20);
        assert!(kept.starts_with("… (10 earlier lines not shown)\nline 11\n"), "{kept}");
        assert!(kept.ends_with("line 30"));
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(clean("a\u{1b}[2Jb\tc\r\n"), "a\u{fffd}[2Jb    c\n");
    }

    #[test]
    fn rich_panels_are_exactly_as_wide_as_the_layout() {
        let renderer = Renderer::new(RenderMode::Rich, 40);
        let panel = renderer.panel(
            Tone::ToolCall,
            "🔧 run_shell_command",
            "$ echo hi\na line that is long enough to wrap around once",
        );
        let plain = console::strip_ansi_codes(&panel);
        for line in plain.lines() {
            assert_eq!(line.width(), 40, "{line:?}");
        }
        assert!(plain.starts_with("╭─ 🔧 run_shell_command "), "{plain}");
    }
}
