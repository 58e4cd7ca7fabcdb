//! Building a [`Response`] from streamed pieces, shared by the providers' decoders.
//!
//! Text and thought deltas are appended to the current part of their kind as long as that part
//! carries no signature yet: a signed part is closed, because a signature belongs to the exact
//! part it came with and must go back on that part. Every delta handed to the assembler is also
//! pushed as a [`StreamEvent`] for the caller.

use crate::StreamEvent;
use crate::conversation::{FinishReason, Part, Response, TokenUsage, ToolCall};

#[derive(Debug, Default)]
pub(crate) struct ResponseAssembler {
    parts: Vec<Part>,
    pub usage: TokenUsage,
    pub finish_reason: Option<FinishReason>,
    pub finish_detail: Option<String>,
    pub model_version: Option<String>,
}

impl ResponseAssembler {
    /// Append visible text (and the signature that came with it, if any).
    pub fn text(&mut self, text: &str, signature: Option<String>, out: &mut Vec<StreamEvent>) {
        if !text.is_empty() {
            out.push(StreamEvent::TextDelta(text.to_owned()));
        }
        if let Some(Part::Text { text: current, signature: current_signature @ None }) = self.parts.last_mut() {
            current.push_str(text);
            *current_signature = signature;
            return;
        }
        if !text.is_empty() || signature.is_some() {
            self.parts.push(Part::Text { text: text.to_owned(), signature });
        }
    }

    /// Append thought text (and the signature that came with it, if any).
    pub fn thought(&mut self, text: &str, signature: Option<String>, out: &mut Vec<StreamEvent>) {
        if !text.is_empty() {
            out.push(StreamEvent::ThoughtDelta(text.to_owned()));
        }
        if let Some(Part::Thought { text: current, signature: current_signature @ None }) = self.parts.last_mut() {
            current.push_str(text);
            *current_signature = signature;
            return;
        }
        if !text.is_empty() || signature.is_some() {
            self.parts.push(Part::Thought { text: text.to_owned(), signature });
        }
    }

    /// Start a new thought part even if the last part is an unsigned thought (Anthropic blocks).
    pub fn new_thought(&mut self) {
        self.parts.push(Part::Thought { text: String::new(), signature: None });
    }

    /// Start a new text part even if the last part is unsigned text (Anthropic blocks).
    pub fn new_text(&mut self) {
        self.parts.push(Part::Text { text: String::new(), signature: None });
    }

    /// Set the signature of the last thought (Anthropic sends it at the end of the block).
    pub fn set_thought_signature(&mut self, signature: String) {
        if let Some(Part::Thought { signature: current, .. }) = self.parts.last_mut() {
            *current = Some(signature);
        } else {
            self.parts.push(Part::Thought { text: String::new(), signature: Some(signature) });
        }
    }

    /// A complete tool call.
    pub fn tool_call(&mut self, call: ToolCall, out: &mut Vec<StreamEvent>) {
        out.push(StreamEvent::ToolCall(call.clone()));
        self.parts.push(Part::ToolCall(call));
    }

    /// The answer so far; the finish reason defaults to `Stop` (`ToolCalls` when there are calls).
    pub fn build(&mut self) -> Response {
        let mut parts = std::mem::take(&mut self.parts);
        // Blocks opened but left empty (an Anthropic text block with no delta) carry nothing.
        parts.retain(|part| match part {
            Part::Text { text, signature } | Part::Thought { text, signature } => {
                !text.is_empty() || signature.is_some()
            }
            Part::ToolCall(_) | Part::ToolResult(_) | Part::Attachment(_) => true,
        });
        let has_calls = parts.iter().any(|part| matches!(part, Part::ToolCall(_)));
        let finish_reason = match self.finish_reason {
            Some(FinishReason::Stop) | None if has_calls => FinishReason::ToolCalls,
            Some(reason) => reason,
            None => FinishReason::Stop,
        };
        Response {
            parts,
            finish_reason,
            finish_detail: self.finish_detail.take(),
            usage: self.usage,
            model_version: self.model_version.take(),
        }
    }
}
