//! A final text as a platform sends it: text chunks, files, a question with options.
//!
//! The agent names files and asks multiple-choice questions in its answer with two markers,
//! each on a line of its own or inline:
//!
//! - `[file: PATH]`: upload the file (PATH relative to the workspace, or absolute inside it);
//! - `[question: PROMPT | OPTION | OPTION …]`: show the options as buttons; a click posts the
//!   option as the user's next message.
//!
//! [`plan`] turns a message into numbered [`OutboundPart`]s for a chatbot's [`Capabilities`]:
//! a platform without files gets a short text naming each file, one without buttons a numbered
//! list to answer by typing. A file that is missing, outside the workspace or too large becomes
//! a one-line warning, never an error. Part numbers are stable for a given text, so delivery
//! records (one per part) let a restarted delivery go on where it stopped.
//!
//! Not here: sending ([`crate::Chatbot::send_part`]).

use std::path::{Path, PathBuf};

use kesoku_core::{Message, MessageId};

use crate::capabilities::Capabilities;
use crate::chunk::chunk_text;

/// One thing to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Text(String),
    /// A file to upload: its full path (checked to exist inside the workspace) and its name.
    File {
        path: PathBuf,
        name: String,
    },
    /// A question with options (buttons).
    Question {
        prompt: String,
        options: Vec<String>,
    },
}

/// A numbered part of a message, with the key that makes sending it effectively once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundPart {
    /// Position among the message's parts, from 0.
    pub index: u32,
    pub part: Part,
    /// Stable for (message, index): a platform's idempotency key or nonce is derived from it.
    pub key: String,
}

impl OutboundPart {
    pub fn key_for(message_id: &MessageId, index: u32) -> String {
        format!("{message_id}:{index}")
    }
}

/// What the markers in a text asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Markers {
    /// The text with the markers removed (blank lines they leave collapsed).
    pub text: String,
    /// Paths named by `[file: …]`, in order.
    pub files: Vec<String>,
    /// The last `[question: …]`, when its options are not empty.
    pub question: Option<(String, Vec<String>)>,
}

/// Find the `[file: …]` and `[question: …]` markers in `text`.
pub fn markers(text: &str) -> Markers {
    let mut found = Markers::default();
    let mut kept = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('[') {
        let after = &rest[start + 1..];
        let marker = ["file:", "question:"].into_iter().find(|name| starts_with_ignore_case(after, name));
        let (Some(name), Some(end)) = (marker, after.find(']')) else {
            kept.push_str(&rest[..=start]);
            rest = after;
            continue;
        };
        let body = after[name.len()..end].trim();
        kept.push_str(&rest[..start]);
        rest = &after[end + 1..];
        if name == "file:" {
            if !body.is_empty() {
                found.files.push(body.to_owned());
            }
        } else {
            let mut fields = body.split('|').map(str::trim);
            let prompt = fields.next().unwrap_or_default().to_owned();
            let options: Vec<String> = fields.filter(|o| !o.is_empty()).map(str::to_owned).collect();
            if !options.is_empty() {
                found.question = Some((prompt, options));
            }
        }
    }
    kept.push_str(rest);
    found.text = collapse_blank_lines(&kept);
    found
}

fn starts_with_ignore_case(text: &str, prefix: &str) -> bool {
    text.get(..prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

/// Trim trailing spaces per line and keep at most one blank line in a row.
fn collapse_blank_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.trim().lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim_end().to_owned()
}

/// The parts to send for `message` on a platform with `capabilities`; file paths are resolved
/// against `workspace`.
pub fn plan(message: &Message, capabilities: &Capabilities, workspace: &Path) -> Vec<OutboundPart> {
    let found = markers(&message.content);
    let mut parts: Vec<Part> =
        chunk_text(&found.text, capabilities.max_message_chars).into_iter().map(Part::Text).collect();
    for file in &found.files {
        parts.push(file_part(file, capabilities, workspace));
    }
    if let Some((prompt, options)) = found.question {
        if capabilities.buttons {
            parts.push(Part::Question { prompt, options });
        } else {
            let mut text = prompt;
            for (number, option) in options.iter().enumerate() {
                text.push_str(&format!("\n{}. {option}", number + 1));
            }
            text.push_str("\n(Answer with the option's text.)");
            parts.extend(chunk_text(&text, capabilities.max_message_chars).into_iter().map(Part::Text));
        }
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(index, part)| {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            OutboundPart { index, key: OutboundPart::key_for(&message.id, index), part }
        })
        .collect()
}

/// An upload, or the warning that replaces it.
fn file_part(named: &str, capabilities: &Capabilities, workspace: &Path) -> Part {
    let name = Path::new(named).file_name().and_then(|n| n.to_str()).unwrap_or(named).to_owned();
    let warn = |why: &str| Part::Text(format!("⚠️ `{name}` was not attached: {why}."));
    let candidate = if Path::new(named).is_absolute() { PathBuf::from(named) } else { workspace.join(named) };
    let (Ok(path), Ok(root)) = (candidate.canonicalize(), workspace.canonicalize()) else {
        return warn("the file does not exist");
    };
    if !path.starts_with(&root) {
        return warn("only files inside the workspace can be sent");
    }
    let size = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => meta.len(),
        Ok(_) => return warn("it is not a file"),
        Err(_) => return warn("the file cannot be read"),
    };
    if !capabilities.files {
        return Part::Text(format!("📎 `{named}` (this platform cannot receive files; it is in the workspace)"));
    }
    if size > capabilities.max_file_bytes {
        return warn(&format!("it is {size} bytes, over this platform's limit of {}", capabilities.max_file_bytes));
    }
    Part::File { path, name }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use kesoku_core::SessionId;

    use super::*;

    fn caps() -> Capabilities {
        Capabilities {
            edits_in_place: true,
            threads: true,
            buttons: true,
            files: true,
            typing: true,
            max_message_chars: 2000,
            max_file_bytes: 1000,
            shows_intermediates: true,
        }
    }

    fn answer(content: &str) -> Message {
        let mut message = Message::user_text(&SessionId::from("s"), "discord", "c", "Kesoku", content);
        message.id = MessageId::from("msg_reply");
        message
    }

    #[test]
    fn markers_are_found_and_removed() {
        let found =
            markers("Here it is:\n[file: out/report.pdf]\n\nAnd [question: Which one? | A | B ]\nBye [link](x)");
        assert_eq!(found.files, vec!["out/report.pdf"]);
        assert_eq!(found.question, Some(("Which one?".to_owned(), vec!["A".to_owned(), "B".to_owned()])));
        assert_eq!(found.text, "Here it is:\n\nAnd\nBye [link](x)");
        assert_eq!(markers("[question: no options]").question, None);
        assert_eq!(markers("[FILE: a.txt]").files, vec!["a.txt"]);
    }

    #[test]
    fn files_inside_the_workspace_are_uploaded_and_others_warned_about() {
        let workspace = tempfile::tempdir().expect("tempdir");
        std::fs::write(workspace.path().join("report.txt"), "data").expect("write");
        std::fs::write(workspace.path().join("big.bin"), vec![0u8; 2000]).expect("write");
        let message = answer("Done. [file: report.txt] [file: missing.txt] [file: /etc/hostname] [file: big.bin]");
        let parts = plan(&message, &caps(), workspace.path());
        assert_eq!(parts[0].part, Part::Text("Done.".to_owned()));
        assert!(matches!(&parts[1].part, Part::File { name, .. } if name == "report.txt"));
        assert_eq!(parts[2].part, Part::Text("⚠️ `missing.txt` was not attached: the file does not exist.".to_owned()));
        let Part::Text(outside) = &parts[3].part else { panic!("{:?}", parts[3]) };
        assert!(outside.contains("not attached"), "{outside}");
        let Part::Text(big) = &parts[4].part else { panic!("{:?}", parts[4]) };
        assert!(big.contains("over this platform's limit"), "{big}");
        assert_eq!(parts.iter().map(|p| p.key.as_str()).collect::<Vec<_>>()[..2], ["msg_reply:0", "msg_reply:1"]);
    }

    #[test]
    fn without_buttons_a_question_is_a_numbered_list() {
        let message = answer("Pick. [question: Which? | Red | Blue]");
        let parts = plan(&message, &Capabilities::text_only(2000), Path::new("/nonexistent"));
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1].part, Part::Text("Which?\n1. Red\n2. Blue\n(Answer with the option's text.)".to_owned()));
        let with_buttons = plan(&message, &caps(), Path::new("/nonexistent"));
        assert_eq!(
            with_buttons[1].part,
            Part::Question { prompt: "Which?".to_owned(), options: vec!["Red".to_owned(), "Blue".to_owned()] }
        );
    }
}
