//! One session's trajectory as a self-contained HTML page, for sharing (`kesoku history show ID
//! --html`, the console's export button).
//!
//! The page has inline CSS, no script, no external font or image, and a Content-Security-Policy
//! that forbids loading anything. Every piece of text from a message is HTML-escaped: message
//! content is data, never markup. Turns are grouped by their root message; thoughts and tool
//! output fold away in `<details>`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use kesoku_core::{Message, MessageId, MessageType, Role, Session, Status};

/// The policy sent with (and embedded in) exported pages: nothing may be loaded or run.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";

const STYLE: &str = r#"
:root{--bg:#f7f7f8;--card:#fff;--ink:#1d1d1f;--muted:#6b6b76;--line:#e3e3e8;--user:#e8f0fe;--accent:#3b5bdb;--bad:#c92a2a;--ok:#2b8a3e}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--ink);font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header,main,footer{max-width:860px;margin:0 auto;padding:16px}header h1{margin:0 0 4px;font-size:20px}
.meta{color:var(--muted);font-size:13px}.turn{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px;margin:14px 0}
.msg{margin:8px 0}.who{font-weight:600;font-size:13px;color:var(--muted)}.who .time{font-weight:400;margin-left:6px}
.text{white-space:pre-wrap;word-wrap:break-word}.user .text{background:var(--user);padding:8px 10px;border-radius:8px}
.badge{display:inline-block;font-size:11px;padding:0 6px;border-radius:8px;background:var(--line);color:var(--muted);margin-left:6px}
.badge.error,.badge.interrupted{background:#ffe3e3;color:var(--bad)}
details{border-left:3px solid var(--line);padding:2px 0 2px 10px;margin:6px 0}summary{cursor:pointer;color:var(--muted);font-size:14px}
details pre{white-space:pre-wrap;word-wrap:break-word;background:#f1f3f5;padding:8px;border-radius:6px;font:13px/1.4 ui-monospace,Menlo,Consolas,monospace;max-height:480px;overflow:auto}
.tool-error{color:var(--bad)}.notification .text{color:var(--accent);font-style:italic}.system .text{color:var(--muted);font-size:13px}
.metrics{color:var(--muted);font-size:12px;margin-top:4px}.attachments{font-size:13px;color:var(--muted)}
"#;

/// Escape text for HTML element content and attribute values.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn time_of(message: &Message) -> String {
    message.created_at.map(|at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string()).unwrap_or_default()
}

fn status_badge(status: Status) -> String {
    format!("<span class=\"badge {status}\">{status}</span>")
}

fn tool_icon(call: &Message, result: Option<&Message>) -> &'static str {
    match result {
        Some(result) if result.metadata.tool_error.is_some() => "❌",
        Some(_) => "✅",
        None if call.status == Status::Interrupted => "⛔",
        None => "⏳",
    }
}

/// Render `session`'s trajectory (its messages in phased order) as one self-contained page.
pub fn render_trajectory_html(session: &Session, messages: &[Message]) -> String {
    let title = session.title.clone().unwrap_or_else(|| format!("Session {}", session.id));
    let results: HashMap<&MessageId, &Message> = messages
        .iter()
        .filter(|m| m.message_type == MessageType::ToolResult)
        .filter_map(|m| m.parent_id.as_ref().map(|parent| (parent, m)))
        .collect();
    let calls: HashSet<&MessageId> =
        messages.iter().filter(|m| m.message_type == MessageType::ToolCall).map(|m| &m.id).collect();

    let mut body = String::new();
    let mut open_turn = false;
    for message in messages {
        if message.parent_id.is_none() || !open_turn {
            if open_turn {
                body.push_str("</section>\n");
            }
            body.push_str("<section class=\"turn\">\n");
            open_turn = true;
        }
        match message.message_type {
            MessageType::ToolResult => {
                // Rendered with its call, unless the call is not in this history.
                if message.parent_id.as_ref().is_some_and(|parent| calls.contains(parent)) {
                    continue;
                }
                let _ = writeln!(
                    body,
                    "<details class=\"tool\"><summary>📄 Result of {}</summary><pre>{}</pre></details>",
                    escape_html(message.metadata.tool_name.as_deref().unwrap_or(&message.sender)),
                    escape_html(&message.content)
                );
            }
            MessageType::ToolCall => {
                let result = results.get(&message.id).copied();
                let name = message.metadata.tool_name.as_deref().unwrap_or("tool");
                let _ = write!(
                    body,
                    "<details class=\"tool\"><summary>{} 🛠️ {}</summary><pre>{}</pre>",
                    tool_icon(message, result),
                    escape_html(name),
                    escape_html(&message.content)
                );
                if let Some(result) = result {
                    if let Some(error) = &result.metadata.tool_error {
                        let _ = write!(body, "<div class=\"tool-error\">{}</div>", escape_html(error));
                    }
                    let _ = write!(body, "<pre>{}</pre>", escape_html(&result.content));
                }
                body.push_str("</details>\n");
            }
            MessageType::Thought => {
                let _ = writeln!(
                    body,
                    "<details class=\"thought\"><summary>💭 Thought</summary><pre>{}</pre></details>",
                    escape_html(&message.content)
                );
            }
            MessageType::Text => render_text(&mut body, message),
        }
    }
    if open_turn {
        body.push_str("</section>\n");
    }
    if messages.is_empty() {
        body.push_str("<p class=\"meta\">This session has no messages.</p>\n");
    }

    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">\n\
         <title>{title} · Kesoku</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <header><h1>{title}</h1><div class=\"meta\">{chatbot} · {channel} · started {created} · {count} messages</div></header>\n\
         <main>\n{body}</main>\n<footer class=\"meta\">Exported from Kesoku · session {id}</footer>\n</body>\n</html>\n",
        csp = CONTENT_SECURITY_POLICY,
        title = escape_html(&title),
        chatbot = escape_html(&session.chatbot_id),
        channel = escape_html(&session.channel_id),
        created = session.created_at.format("%Y-%m-%d %H:%M UTC"),
        count = messages.len(),
        id = escape_html(session.id.as_str()),
    )
}

fn render_text(body: &mut String, message: &Message) {
    let class = match message.role {
        Role::User => "user",
        Role::Assistant if message.is_notification() => "notification",
        Role::Assistant | Role::Tool => "assistant",
        Role::System => "system",
    };
    let badge = match message.role {
        Role::User | Role::System if message.parent_id.is_none() => status_badge(message.status),
        Role::User | Role::System | Role::Assistant | Role::Tool => String::new(),
    };
    let _ = write!(
        body,
        "<div class=\"msg {class}\"><div class=\"who\">{}<span class=\"time\">{}</span>{badge}</div><div class=\"text\">{}</div>",
        escape_html(&message.sender),
        escape_html(&time_of(message)),
        escape_html(&message.content)
    );
    let attachments = message.attachments();
    if !attachments.is_empty() {
        let names: Vec<String> = attachments.iter().map(|a| escape_html(&a.filename)).collect();
        let _ = write!(body, "<div class=\"attachments\">📎 {}</div>", names.join(", "));
    }
    if let Some(metrics) = &message.metadata.turn_metrics {
        let _ = write!(
            body,
            "<div class=\"metrics\">⏱ {:.1} s · 🛠️ {} tool calls · {} tokens this turn · context {} tokens · turn {}</div>",
            metrics.turn_time,
            metrics.turn_tool_calls,
            metrics.turn_tokens,
            metrics.context_tokens,
            metrics.session_turns
        );
    }
    body.push_str("</div>\n");
}
