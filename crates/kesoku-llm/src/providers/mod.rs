//! The vendors' wire formats, one module each, and what they share: request defaults,
//! attachment loading, tool-call ids and provider-tagged signatures.
//!
//! Signatures are tagged with the provider that issued them (`gemini:…`, `anthropic:…`) before
//! they are handed out, and each provider sends back only its own: a Gemini signature must never
//! reach Anthropic (it would be rejected), which can happen when a fallback model takes over a
//! turn. Untagged signatures (history written by the Python reference, which only spoke Gemini)
//! are treated as Gemini's.

pub mod anthropic;
pub mod gemini;
pub mod openai;

use std::borrow::Cow;
use std::path::Path;

use crate::config::ModelConfig;
use crate::conversation::{Attachment, AttachmentSource, Part, Request, ThinkingLevel};
use crate::error::{LlmError, LlmErrorKind};

/// Prefix of tool-call ids made up when the provider gave none; not sent back to the provider.
pub(crate) const GENERATED_CALL_ID_PREFIX: &str = "kesoku_call_";

/// The id for the `index`-th call of a response that came without one.
pub(crate) fn generated_call_id(index: usize) -> String {
    format!("{GENERATED_CALL_ID_PREFIX}{index}")
}

/// Which provider issued a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignatureIssuer {
    Gemini,
    Anthropic,
    AnthropicRedacted,
}

impl SignatureIssuer {
    fn prefix(self) -> &'static str {
        match self {
            SignatureIssuer::Gemini => "gemini:",
            SignatureIssuer::Anthropic => "anthropic:",
            SignatureIssuer::AnthropicRedacted => "anthropic-redacted:",
        }
    }

    /// Tag a raw signature.
    pub fn tag(self, raw: &str) -> String {
        format!("{}{raw}", self.prefix())
    }
}

/// The issuer and raw value of a tagged signature. Untagged values count as Gemini's.
pub(crate) fn untag(signature: &str) -> (SignatureIssuer, &str) {
    for issuer in [SignatureIssuer::Gemini, SignatureIssuer::AnthropicRedacted, SignatureIssuer::Anthropic] {
        if let Some(raw) = signature.strip_prefix(issuer.prefix()) {
            return (issuer, raw);
        }
    }
    (SignatureIssuer::Gemini, signature)
}

/// The raw signature if `issuer` issued it.
pub(crate) fn signature_for(signature: Option<&String>, issuer: SignatureIssuer) -> Option<String> {
    let (found, raw) = untag(signature?);
    (found == issuer).then(|| raw.to_owned())
}

/// Request settings after applying the model's configured defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Settings {
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub thinking: Option<ThinkingLevel>,
}

/// A model's configured defaults for requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Defaults {
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub thinking: Option<ThinkingLevel>,
}

impl Defaults {
    pub fn from_config(config: &ModelConfig) -> Self {
        Defaults {
            max_output_tokens: config.max_output_tokens,
            temperature: config.temperature,
            thinking: config.thinking,
        }
    }

    pub fn apply(&self, request: &Request) -> Settings {
        Settings {
            max_output_tokens: request.max_output_tokens.or(self.max_output_tokens),
            temperature: request.temperature.or(self.temperature),
            thinking: request.thinking.or(self.thinking),
        }
    }
}

/// How a provider can show an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttachmentKind {
    Image,
    Pdf,
    Audio,
    Video,
    /// Text the model can read as text (plain, CSV, JSON, Markdown, source code, …).
    Text,
    Other,
}

pub(crate) fn attachment_kind(mime_type: &str) -> AttachmentKind {
    let mime = mime_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if mime.starts_with("image/") {
        AttachmentKind::Image
    } else if mime == "application/pdf" {
        AttachmentKind::Pdf
    } else if mime.starts_with("audio/") {
        AttachmentKind::Audio
    } else if mime.starts_with("video/") {
        AttachmentKind::Video
    } else if mime.starts_with("text/")
        || matches!(
            mime.as_str(),
            "application/json"
                | "application/xml"
                | "application/x-yaml"
                | "application/yaml"
                | "application/toml"
                | "application/javascript"
                | "application/x-sh"
                | "application/sql"
        )
    {
        AttachmentKind::Text
    } else {
        AttachmentKind::Other
    }
}

/// An attachment's bytes (it must have been loaded with [`load_attachments`]).
pub(crate) fn attachment_bytes(attachment: &Attachment) -> &[u8] {
    match &attachment.source {
        AttachmentSource::Inline(bytes) => bytes,
        AttachmentSource::File(_) => &[],
    }
}

/// A text part standing for an attachment: the file's text when it is text, else a note.
pub(crate) fn attachment_as_text(attachment: &Attachment) -> String {
    let bytes = attachment_bytes(attachment);
    match (attachment_kind(&attachment.mime_type), std::str::from_utf8(bytes)) {
        (AttachmentKind::Text, Ok(text)) => format!("[File: {}]\n{text}", attachment.filename),
        _ => format!("[Attachment {} ({}) cannot be shown to this model]", attachment.filename, attachment.mime_type),
    }
}

/// A temperature as the JSON number the user wrote (`0.2`, not `0.20000000298023224`).
pub(crate) fn wire_temperature(temperature: f32) -> f64 {
    temperature.to_string().parse().unwrap_or(f64::from(temperature))
}

pub(crate) fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The request with every file attachment read into memory (borrowed unchanged when there is none).
pub(crate) async fn load_attachments<'a>(request: &'a Request, model_name: &str) -> Result<Cow<'a, Request>, LlmError> {
    let has_files = request
        .turns
        .iter()
        .flat_map(|turn| &turn.parts)
        .any(|part| matches!(part, Part::Attachment(Attachment { source: AttachmentSource::File(_), .. })));
    if !has_files {
        return Ok(Cow::Borrowed(request));
    }
    let mut loaded = request.clone();
    for part in loaded.turns.iter_mut().flat_map(|turn| turn.parts.iter_mut()) {
        if let Part::Attachment(attachment) = part
            && let AttachmentSource::File(path) = &attachment.source
        {
            let bytes = read_file(path, &attachment.filename, model_name).await?;
            attachment.source = AttachmentSource::Inline(bytes);
        }
    }
    Ok(Cow::Owned(loaded))
}

async fn read_file(path: &Path, filename: &str, model_name: &str) -> Result<Vec<u8>, LlmError> {
    tokio::fs::read(path).await.map_err(|error| {
        LlmError::new(
            LlmErrorKind::Attachment,
            format!("could not read attachment `{filename}` at {}: {error}", path.display()),
        )
        .with_model(model_name)
    })
}
