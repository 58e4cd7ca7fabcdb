//! Staging the files people send into `<workspace>/sessions/<session>/attachments/`.
//!
//! Names are checked (no directories, no `..`, no absolute path, no NUL: refused, not
//! repaired), then made safe for any file system (control and reserved characters replaced,
//! length capped); an existing file is never overwritten (`report.pdf`, `2-report.pdf`, …).
//! Every file is checked before anything is written, so a refused batch leaves no trace.
//!
//! Not here: downloading from a platform (the chatbot does it, within [`Staging::max_file_bytes`]).

use std::path::{Path, PathBuf};

use kesoku_core::{Attachment, SessionId};
use tokio::io::AsyncWriteExt;

/// Longest staged file name, in bytes (file systems allow 255; room is left for a `N-` prefix).
const MAX_NAME_BYTES: usize = 200;

/// A file someone sent, not yet written.
#[derive(Clone, PartialEq, Eq)]
pub struct IncomingFile {
    /// The name the sender gave.
    pub filename: String,
    /// The media type the platform or client stated; guessed from the name when `None`.
    pub mime_type: Option<String>,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for IncomingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncomingFile")
            .field("filename", &self.filename)
            .field("mime_type", &self.mime_type)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    #[error("attachment {index} (`{filename}`) {reason}")]
    BadName { index: usize, filename: String, reason: &'static str },
    #[error("attachment `{filename}` is {size} bytes, over the limit of {limit} bytes: send a smaller file")]
    TooLarge { filename: String, size: u64, limit: u64 },
    #[error("session id `{0}` cannot name a folder")]
    BadSession(String),
    #[error("staging `{path}` failed: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where and how much a chatbot may stage.
#[derive(Debug, Clone)]
pub struct Staging {
    pub workspace_dir: PathBuf,
    /// Largest single file accepted.
    pub max_file_bytes: u64,
}

/// Default cap on one staged file (Discord's own upload limit for most servers is lower).
pub const DEFAULT_MAX_FILE_BYTES: u64 = 25 * 1024 * 1024;

impl Staging {
    pub fn new(workspace_dir: impl Into<PathBuf>) -> Self {
        Staging { workspace_dir: workspace_dir.into(), max_file_bytes: DEFAULT_MAX_FILE_BYTES }
    }

    /// The attachments folder of a session.
    pub fn attachments_dir(&self, session_id: &SessionId) -> Result<PathBuf, StagingError> {
        let id = session_id.as_str();
        let safe = !id.is_empty() && id != "." && id != ".." && !id.contains(['/', '\\', '\0']) && id.len() <= 255;
        if !safe {
            return Err(StagingError::BadSession(id.to_owned()));
        }
        Ok(self.workspace_dir.join("sessions").join(id).join("attachments"))
    }

    /// Check every file, then write each into the session's folder; returns their metadata
    /// entries with paths relative to the workspace.
    pub async fn stage(
        &self,
        session_id: &SessionId,
        files: Vec<IncomingFile>,
    ) -> Result<Vec<Attachment>, StagingError> {
        if files.is_empty() {
            return Ok(Vec::new());
        }
        let mut named = Vec::with_capacity(files.len());
        for (index, file) in files.into_iter().enumerate() {
            let safe = safe_file_name(&file.filename).map_err(|reason| StagingError::BadName {
                index,
                filename: file.filename.clone(),
                reason,
            })?;
            let size = file.bytes.len() as u64;
            if size > self.max_file_bytes {
                return Err(StagingError::TooLarge { filename: file.filename, size, limit: self.max_file_bytes });
            }
            named.push((safe, file));
        }
        let dir = self.attachments_dir(session_id)?;
        tokio::fs::create_dir_all(&dir).await.map_err(|source| StagingError::Io { path: dir.clone(), source })?;
        let mut staged = Vec::with_capacity(named.len());
        for (safe, file) in named {
            let path = write_new(&dir, &safe, &file.bytes).await?;
            let relative = path.strip_prefix(&self.workspace_dir).unwrap_or(&path);
            let mime_type = file.mime_type.unwrap_or_else(|| mime_type_of(&file.filename).to_owned());
            staged.push(Attachment { path: relative.display().to_string(), mime_type, filename: file.filename });
        }
        Ok(staged)
    }
}

/// The on-disk name for a user-given file name, or why it is refused.
pub fn safe_file_name(name: &str) -> Result<String, &'static str> {
    if name.contains('\0') {
        return Err("must not contain NUL characters");
    }
    if name.contains('/') || name.contains('\\') {
        return Err("must be a plain file name: no directories and no absolute path");
    }
    if name.is_empty() || name.chars().all(|c| c == '.') {
        return Err("must not be empty, `.` or `..`");
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

/// Create `dir/name` (or `dir/N-name` when taken) and write `bytes`; never overwrites.
async fn write_new(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, StagingError> {
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
                    Err(source) => {
                        let _ = tokio::fs::remove_file(&candidate).await;
                        Err(StagingError::Io { path: candidate, source })
                    }
                };
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(StagingError::Io { path: candidate, source }),
        }
    }
    Err(StagingError::Io {
        path: dir.join(name),
        source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, "no free file name left"),
    })
}

/// MIME type by file extension (the types models accept; anything else is a plain file).
pub fn mime_type_of(filename: &str) -> &'static str {
    let extension = filename.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
    match extension.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "html" | "htm" => "text/html",
        _ => "application/octet-stream",
    }
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
        for bad in ["../x", "/etc/passwd", "a/b", "..\\x", "C:\\x", "..", ".", "...", "a\0b", ""] {
            assert!(safe_file_name(bad).is_err(), "{bad:?}");
        }
        let long = format!("{}.pdf", "é".repeat(300));
        let capped = safe_file_name(&long).expect("capped");
        assert!(capped.len() <= MAX_NAME_BYTES && capped.ends_with(".pdf"), "{capped}");
    }

    #[tokio::test]
    async fn files_are_staged_without_overwriting_and_refused_batches_leave_nothing() {
        let workspace = tempfile::tempdir().expect("tempdir");
        let staging = Staging { workspace_dir: workspace.path().to_owned(), max_file_bytes: 10 };
        let session = SessionId::from("sess_a");
        let file =
            |name: &str, bytes: &[u8]| IncomingFile { filename: name.into(), mime_type: None, bytes: bytes.to_vec() };
        let first = staging.stage(&session, vec![file("a.txt", b"one"), file("a.txt", b"two")]).await.expect("staged");
        assert_eq!(first[0].path, "sessions/sess_a/attachments/a.txt");
        assert_eq!(first[1].path, "sessions/sess_a/attachments/2-a.txt");
        assert_eq!(first[1].mime_type, "text/plain");
        let read = std::fs::read(workspace.path().join(&first[1].path)).expect("read");
        assert_eq!(read, b"two");
        let refused = staging.stage(&session, vec![file("b.txt", b"ok"), file("c.txt", &[0; 11])]).await;
        assert!(matches!(refused, Err(StagingError::TooLarge { size: 11, .. })), "{refused:?}");
        assert!(!workspace.path().join("sessions/sess_a/attachments/b.txt").exists());
    }
}
