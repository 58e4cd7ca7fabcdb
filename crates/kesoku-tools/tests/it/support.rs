//! Shared fixtures: a workspace with a staging folder and a sibling folder outside it, and
//! helpers to watch real processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kesoku_core::SessionId;
use kesoku_tools::{ShellConfig, ToolContext, ToolOutput, ToolsConfig};
use tempfile::TempDir;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `<tmp>/workspace` (with `.kesoku/sessions/sess_test` as staging folder) next to
/// `<tmp>/outside/secret.txt`, which no file tool may reach.
pub struct Fixture {
    _root: TempDir,
    pub workspace: PathBuf,
    pub outside: PathBuf,
    pub ctx: ToolContext,
}

impl Fixture {
    pub fn new() -> std::io::Result<Self> {
        let root = tempfile::tempdir()?;
        // Canonical, so that paths the tools print compare equal to ours.
        let base = std::fs::canonicalize(root.path())?;
        let workspace = base.join("workspace");
        let outside = base.join("outside");
        std::fs::create_dir_all(&workspace)?;
        std::fs::create_dir_all(&outside)?;
        std::fs::write(outside.join("secret.txt"), "outside secret\n")?;
        let staging = workspace.join(".kesoku/sessions/sess_test");
        let ctx = ToolContext::new(&workspace, &staging, SessionId::from("sess_test"), "call_1");
        Ok(Self { _root: root, workspace, outside, ctx })
    }

    /// A path inside the workspace.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.workspace.join(relative)
    }

    pub fn read(&self, relative: &str) -> std::io::Result<String> {
        std::fs::read_to_string(self.path(relative))
    }

    pub fn write(&self, relative: &str, content: &str) -> std::io::Result<()> {
        let path = self.path(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, content)
    }
}

/// Default tool settings with the shell section adjusted.
pub fn with_shell(adjust: impl FnOnce(&mut ShellConfig)) -> ToolsConfig {
    let mut config = ToolsConfig::default();
    adjust(&mut config.shell);
    config
}

/// Whether `pid` names a live process (a zombie counts as gone: it runs no more code).
pub fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z' | 'X'))
        }
    }
}

/// Wait up to `within` for `pid` to be gone.
pub async fn gone_within(pid: i32, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if !is_alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    !is_alive(pid)
}

/// Wait for a script to write a pid (one line) to `path`.
pub async fn read_pid(path: &Path) -> Result<i32, String> {
    for _ in 0..500 {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim().parse().map_err(|error| format!("bad pid in {}: {error}", path.display()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("{} was not written within 10 s", path.display()))
}

/// The path named by a cut output's marker (`… the full output is in PATH]`).
pub fn saved_output_path(output: &ToolOutput) -> Option<String> {
    let start = output.content.find("the full output is in ")? + "the full output is in ".len();
    let end = output.content[start..].find(']')? + start;
    Some(output.content[start..end].to_owned())
}
