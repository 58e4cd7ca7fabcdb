//! Staging files posted with a message into `<workspace>/sessions/<session>/attachments/`.
//!
//! Names are checked (no directories, no `..`, no absolute path, no NUL: those are rejected, not
//! repaired) and then made safe for any file system (control and reserved characters replaced,
//! length capped); an existing file is never overwritten. Everything is decoded before anything
//! is written, so a bad attachment leaves no trace. This module does not guess media types:
//! the client states them.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use kesoku_core::{Attachment, SessionId};
use tokio::io::AsyncWriteExt;

use crate::error::AppError;
use crate::views::AttachmentParams;

/// Standard alphabet; padding optional; lenient about the unused bits of the last symbol.
const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Longest staged file name, in bytes (file systems allow 255; room is left for a `N-` prefix).
const MAX_NAME_BYTES: usize = 200;

/// An attachment decoded and named, not yet written.
#[derive(Debug)]
pub struct DecodedAttachment {
    /// The name the user gave, as sent.
    pub filename: String,
    /// The name on disk.
    pub safe_name: String,
    pub mime_type: String,
    pub bytes: Vec<u8>,
}

/// Check and decode every attachment; the first bad one fails the whole request.
pub fn decode_all(attachments: &[AttachmentParams]) -> Result<Vec<DecodedAttachment>, AppError> {
    attachments
        .iter()
        .enumerate()
        .map(|(index, attachment)| {
            let safe_name = safe_file_name(&attachment.filename)
                .map_err(|reason| AppError::invalid_field(format!("`attachments[{index}].filename` {reason}")))?;
            let bytes = LENIENT_BASE64.decode(&attachment.content_base64).map_err(|error| {
                AppError::invalid_field(format!("`attachments[{index}].content_base64` is not valid base64: {error}"))
            })?;
            Ok(DecodedAttachment {
                filename: attachment.filename.clone(),
                safe_name,
                mime_type: attachment.mime_type.clone(),
                bytes,
            })
        })
        .collect()
}

/// The on-disk name for a user-given file name, or why it is refused.
pub fn safe_file_name(name: &str) -> Result<String, &'static str> {
    if name.contains('\0') {
        return Err("must not contain NUL characters");
    }
    if name.contains('/') || name.contains('\\') {
        return Err("must be a plain file name: no directories and no absolute path");
    }
    if name.chars().all(|c| c == '.') {
        return Err("must not be `.` or `..`");
    }
    let safe: String = name
        .chars()
        .map(|c| if c.is_control() || matches!(c, ':' | '*' | '?' | '"' | '<' | '>' | '|') { '_' } else { c })
        .collect();
    if safe.len() > MAX_NAME_BYTES {
        return Ok(cap_length(&safe));
    }
    Ok(safe)
}

/// Cut a name to [`MAX_NAME_BYTES`], keeping a short extension.
fn cap_length(name: &str) -> String {
    let (stem, extension) = match name.rsplit_once('.') {
        Some((stem, extension)) if !stem.is_empty() && extension.len() <= 16 => (stem, Some(extension)),
        Some(_) | None => (name, None),
    };
    let budget = MAX_NAME_BYTES - extension.map_or(0, |e| e.len() + 1);
    let mut cut = String::new();
    for c in stem.chars() {
        if cut.len() + c.len_utf8() > budget {
            break;
        }
        cut.push(c);
    }
    match extension {
        Some(extension) => format!("{cut}.{extension}"),
        None => cut,
    }
}

/// Whether a session id can name a folder (ids come from the store and are normally `sess_…`).
fn is_safe_component(id: &str) -> bool {
    !id.is_empty() && id != "." && id != ".." && !id.contains(['/', '\\', '\0']) && id.len() <= 255
}

/// The staging folder of a session's attachments.
pub fn attachments_dir(workspace: &Path, session_id: &SessionId) -> Result<PathBuf, AppError> {
    if !is_safe_component(session_id.as_str()) {
        return Err(AppError::internal(format!("session id `{session_id}` cannot name a folder")));
    }
    Ok(workspace.join("sessions").join(session_id.as_str()).join("attachments"))
}

/// Write decoded attachments into the session's folder; returns their metadata entries, with
/// paths relative to the workspace.
pub async fn stage(
    workspace: &Path,
    session_id: &SessionId,
    attachments: Vec<DecodedAttachment>,
) -> Result<Vec<Attachment>, AppError> {
    let dir = attachments_dir(workspace, session_id)?;
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|error| AppError::internal(format!("creating {}: {error}", dir.display())))?;
    let mut staged = Vec::with_capacity(attachments.len());
    for attachment in attachments {
        let path = write_new(&dir, &attachment.safe_name, &attachment.bytes).await?;
        let relative = path.strip_prefix(workspace).unwrap_or(&path);
        staged.push(Attachment {
            path: relative.display().to_string(),
            mime_type: attachment.mime_type,
            filename: attachment.filename,
        });
    }
    Ok(staged)
}

/// Create `dir/name` (or `dir/N-name` when taken) and write `bytes`; never overwrites.
async fn write_new(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, AppError> {
    for n in 1..=1000u32 {
        let candidate = if n == 1 { dir.join(name) } else { dir.join(format!("{n}-{name}")) };
        match tokio::fs::OpenOptions::new().write(true).create_new(true).open(&candidate).await {
            Ok(mut file) => {
                let written = async {
                    file.write_all(bytes).await?;
                    file.flush().await
                }
                .await;
                return match written {
                    Ok(()) => Ok(candidate),
                    Err(error) => {
                        let _ = tokio::fs::remove_file(&candidate).await;
                        Err(AppError::internal(format!("writing {}: {error}", candidate.display())))
                    }
                };
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(AppError::internal(format!("creating {}: {error}", candidate.display()))),
        }
    }
    Err(AppError::internal(format!("no free file name for `{name}` in {}", dir.display())))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_made_safe() {
        assert_eq!(safe_file_name("data.csv").as_deref(), Ok("data.csv"));
        assert_eq!(safe_file_name("a:b?.txt").as_deref(), Ok("a_b_.txt"));
        assert_eq!(safe_file_name(".hidden").as_deref(), Ok(".hidden"));
        assert_eq!(safe_file_name("\u{7}bell").as_deref(), Ok("_bell"));
        for bad in ["../x", "/etc/passwd", "a/b", "..\\x", "C:\\x", "..", ".", "...", "a\0b"] {
            assert!(safe_file_name(bad).is_err(), "{bad:?}");
        }
        let long = format!("{}.pdf", "é".repeat(300));
        let capped = safe_file_name(&long).expect("capped");
        assert!(capped.len() <= MAX_NAME_BYTES && capped.ends_with(".pdf"), "{capped}");
    }

    #[test]
    fn base64_is_lenient_about_padding() {
        assert_eq!(LENIENT_BASE64.decode("YQ").ok(), Some(b"a".to_vec()));
        assert_eq!(LENIENT_BASE64.decode("YQ==").ok(), Some(b"a".to_vec()));
        assert!(LENIENT_BASE64.decode("Y").is_err());
        assert!(LENIENT_BASE64.decode("%%%%").is_err());
    }
}
