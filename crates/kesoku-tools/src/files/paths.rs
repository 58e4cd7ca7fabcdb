//! Confining file tools to the workspace and the session's staging folder.
//!
//! A path from the model is taken relative to the workspace (or as given, if absolute), then
//! resolved the way the operating system would: the longest part that exists is canonicalized
//! (following every symbolic link and `..`), and the part that does not exist yet is appended
//! as plain names. The result must lie under the canonical workspace or staging folder.
//!
//! This closes `..` escapes, absolute paths elsewhere and symbolic links pointing out, including
//! dangling ones (which a write would otherwise follow). It is a check, not a sandbox: a link
//! swapped in between the check and the open is not caught, and the shell tool is not confined.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

/// Longest path accepted (Linux's `PATH_MAX`); it also bounds the paths echoed in messages.
const MAX_PATH_BYTES: usize = 4096;

/// A path that passed the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfinedPath {
    /// Absolute, with every existing component canonical.
    pub path: PathBuf,
    /// What the path names, if it exists (a link followed to its target), as seen by the check:
    /// the tools need not look again.
    pub found: Option<Found>,
}

/// What an existing confined path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    pub is_dir: bool,
    /// A regular file (not a folder, a FIFO, a socket or a device).
    pub is_file: bool,
    /// Size in bytes (of a file).
    pub len: u64,
}

impl Found {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Found { is_dir: metadata.is_dir(), is_file: metadata.is_file(), len: metadata.len() }
    }
}

impl ConfinedPath {
    pub fn exists(&self) -> bool {
        self.found.is_some()
    }
}

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PathError {
    #[error("`path` is empty; give a path relative to the workspace")]
    Empty,
    #[error("`path` is {length} bytes long, longer than any file path can be")]
    TooLong { length: usize },
    #[error("path `{path}` contains a NUL character, which no file name can hold")]
    Nul { path: String },
    #[error(
        "path `{path}` starts with `~`, but file tools do not use a home folder; give a path relative to the workspace"
    )]
    HomeRelative { path: String },
    #[error(
        "path `{path}` resolves to `{resolved}`, which is outside the workspace `{workspace}` and the session's \
         staging folder; file tools only reach files inside them"
    )]
    Outside { path: String, resolved: String, workspace: String },
    #[error("path `{path}` goes through a symbolic link whose target does not exist; it is not followed")]
    DanglingLink { path: String },
    #[error("path `{path}` uses `..` inside a folder that does not exist; give a plain path")]
    Unresolvable { path: String },
    #[error("the workspace `{workspace}` cannot be opened: {source}")]
    Workspace { workspace: String, source: io::Error },
    #[error("could not inspect path `{path}`: {source}")]
    Io { path: String, source: io::Error },
}

/// Check `raw` (the model's `path` argument) against the workspace and staging folder. It makes
/// system calls: call it on a blocking thread (see `files::on_blocking_thread`).
pub(crate) fn confine_blocking(workspace: &Path, staging: &Path, raw: &str) -> Result<ConfinedPath, PathError> {
    if raw.trim().is_empty() {
        return Err(PathError::Empty);
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong { length: raw.len() });
    }
    if raw.contains('\0') {
        return Err(PathError::Nul { path: raw.to_owned() });
    }
    if raw == "~" || raw.starts_with("~/") {
        return Err(PathError::HomeRelative { path: raw.to_owned() });
    }
    let workspace = std::fs::canonicalize(workspace)
        .map_err(|source| PathError::Workspace { workspace: workspace.display().to_string(), source })?;
    // The staging folder may not exist yet; it is usually inside the workspace anyway.
    let staging = std::fs::canonicalize(staging).ok();

    let requested = Path::new(raw);
    let joined = if requested.is_absolute() { requested.to_path_buf() } else { workspace.join(requested) };

    // Split the path into the longest prefix that exists and the names after it.
    let mut existing = joined.as_path();
    let mut missing: Vec<&OsStr> = Vec::new();
    let existing_metadata = loop {
        match std::fs::symlink_metadata(existing) {
            Ok(metadata) => break metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    missing.push(name);
                    existing = parent;
                }
                // The path ends in `..` below a missing folder (or nothing exists at all).
                (None, _) | (_, None) => return Err(PathError::Unresolvable { path: raw.to_owned() }),
            },
            Err(source) => return Err(PathError::Io { path: raw.to_owned(), source }),
        }
    };
    let mut resolved = match std::fs::canonicalize(existing) {
        Ok(resolved) => resolved,
        // It exists (as a link) but cannot be resolved: a link to nowhere.
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(PathError::DanglingLink { path: raw.to_owned() });
        }
        Err(source) => return Err(PathError::Io { path: raw.to_owned(), source }),
    };
    for name in missing.iter().rev() {
        resolved.push(name);
    }

    let inside =
        resolved.starts_with(&workspace) || staging.as_ref().is_some_and(|staging| resolved.starts_with(staging));
    if !inside {
        return Err(PathError::Outside {
            path: raw.to_owned(),
            resolved: resolved.display().to_string(),
            workspace: workspace.display().to_string(),
        });
    }
    let found = if !missing.is_empty() {
        None
    } else if existing_metadata.file_type().is_symlink() {
        // The path itself is a link (inside, as checked above): what it names is its target's.
        let metadata = std::fs::metadata(&resolved).map_err(|source| PathError::Io { path: raw.to_owned(), source })?;
        Some(Found::of(&metadata))
    } else {
        Some(Found::of(&existing_metadata))
    };
    Ok(ConfinedPath { path: resolved, found })
}
