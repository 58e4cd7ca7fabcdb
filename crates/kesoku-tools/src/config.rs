//! Configuration of the built-in tools: the `[tools]` section of `kesoku.toml`.
//!
//! Every field has a default, so an absent section means "the defaults"; unknown keys are
//! rejected so that a typo is an error, not a silently ignored setting. Regular expressions are
//! compiled while the file is parsed, so a config that parsed holds no invalid pattern. This
//! module reads no file and no environment variable: the binary does, and hands the struct over.
//!
//! ```toml
//! [tools]
//! max_concurrent_processes = 4
//! disabled = []
//!
//! [tools.shell]
//! default_timeout_s = 120
//! max_timeout_s = 600
//! kill_grace_s = 5
//! max_background_jobs = 8
//! max_output_chars = 5000
//! max_saved_output_bytes = 2097152
//! max_command_chars = 20000
//! env_allowlist = ["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ", "USER"]
//! env_set = { PAGER = "cat" }
//! mode = "blocklist"
//! blocklist_patterns = ['\bmkfs\b']
//! allowlist_patterns = []
//!
//! [tools.files]
//! max_read_chars = 50000
//! max_file_bytes = 10485760
//!
//! [tools.http]
//! allowed_hosts = []   # empty: http_request is not offered
//! timeout_s = 30
//! max_response_bytes = 100000
//!
//! [tools.http.connection_hosts]   # where each connection's token may go
//! github = ["api.github.com"]
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::files::{EDIT_FILE, READ_FILE, WRITE_FILE};
use crate::http::HttpConfig;
use crate::shell::RUN_SHELL_COMMAND;

/// Names of the built-in tools, in the order they are documented.
pub const BUILTIN_TOOL_NAMES: [&str; 4] = [RUN_SHELL_COMMAND, READ_FILE, WRITE_FILE, EDIT_FILE];

/// The `[tools]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Built-in tools not offered to the model, by name (`run_shell_command`, `read_file`,
    /// `write_file`, `edit_file`). Default: none.
    pub disabled: Vec<String>,
    /// Most tool processes (shell commands) running at the same time across every session of the
    /// process; further calls wait for a free slot (a cancelled turn stops waiting). Default: 4.
    pub max_concurrent_processes: usize,
    /// `run_shell_command`.
    pub shell: ShellConfig,
    /// `read_file`, `write_file` and `edit_file`.
    pub files: FilesConfig,
    /// `http_request` (offered only when `allowed_hosts` is non-empty).
    pub http: HttpConfig,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            disabled: Vec::new(),
            max_concurrent_processes: 4,
            shell: ShellConfig::default(),
            files: FilesConfig::default(),
            http: HttpConfig::default(),
        }
    }
}

/// How `run_shell_command` decides which commands may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    /// Every command runs unless it matches one of `blocklist_patterns`.
    Blocklist,
    /// Only commands matching one of `allowlist_patterns` (as a whole) run, and
    /// `blocklist_patterns` still apply.
    Allowlist,
}

/// The `[tools.shell]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShellConfig {
    /// Seconds a command may run when the model gives no `timeout_s`. Default: 120.
    pub default_timeout_s: u64,
    /// Longest `timeout_s` the model may ask for; longer requests are lowered to it. Default: 600.
    pub max_timeout_s: u64,
    /// Seconds between SIGTERM and SIGKILL when a command times out. Default: 5.
    pub kill_grace_s: u64,
    /// Background jobs (`"background": true`) running at once, across every session of the
    /// store; one more is refused until one ends or is cancelled. Default: 8.
    pub max_background_jobs: usize,
    /// Longest result shown to the model, in characters. Longer output keeps its end (the
    /// end is where errors and summaries are) and the whole output is saved to a file in the
    /// session's staging folder, whose path the result names. Default: 5,000.
    pub max_output_chars: usize,
    /// Bytes of each stream (stdout, stderr) kept in memory and in the saved file; of a longer
    /// stream, the first half of this and the last half (at least 4 bytes for each character of
    /// `max_output_chars`) are kept, with a line saying how much was left out in between. This
    /// bounds the memory a command printing without end can take. Default: 2 MiB.
    pub max_saved_output_bytes: usize,
    /// Longest command accepted, in characters. Default: 20,000.
    pub max_command_chars: usize,
    /// Environment variables passed on to commands, by name; a name ending in `*` matches every
    /// variable with that prefix (`LC_*`). Every other variable of the agent's process
    /// (provider keys, bot tokens…) is withheld. Default: PATH, HOME, LANG, LC_ALL, TERM, TZ, USER.
    pub env_allowlist: Vec<String>,
    /// Variables set for every command, after the allow-list (e.g. `PAGER = "cat"`). Commands
    /// also get `STAGING_DIR`, the session's staging folder. Default: none.
    pub env_set: BTreeMap<String, String>,
    /// `blocklist` (default) or `allowlist`.
    pub mode: PolicyMode,
    /// Regular expressions searched anywhere in the command; a match refuses it, in both modes.
    /// A guard rail against obvious accidents, not a sandbox: a determined command can always be
    /// spelled differently. Default: recursive `rm` of `/` or the home folder, `mkfs`,
    /// `shutdown`/`reboot`/`poweroff`/`halt`, the `:(){ :|:& };:` fork bomb, writes to raw disks.
    pub blocklist_patterns: Vec<CommandPattern>,
    /// In `allowlist` mode, regular expressions one of which must match the WHOLE command (they
    /// are anchored for you: `git status` allows exactly `git status`, `git (status|diff)( .*)?`
    /// allows those subcommands with any arguments). Ignored in `blocklist` mode. Default: none.
    pub allowlist_patterns: Vec<CommandPattern>,
}

impl Default for ShellConfig {
    fn default() -> Self {
        Self {
            default_timeout_s: 120,
            max_timeout_s: 600,
            kill_grace_s: 5,
            max_background_jobs: 8,
            max_output_chars: 5_000,
            max_saved_output_bytes: 2 * 1024 * 1024,
            max_command_chars: 20_000,
            env_allowlist: ["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ", "USER"].map(str::to_owned).to_vec(),
            env_set: BTreeMap::new(),
            mode: PolicyMode::Blocklist,
            blocklist_patterns: default_blocklist(),
            allowlist_patterns: Vec::new(),
        }
    }
}

/// The default `blocklist_patterns`.
pub fn default_blocklist() -> Vec<CommandPattern> {
    const PATTERNS: [&str; 7] = [
        // Recursive removal of the filesystem root or the home folder (`rm -rf /`, `rm -fr ~/*`).
        r#"\brm\s+(-\S+\s+)*(-[a-zA-Z]*[rR][a-zA-Z]*|--recursive)\s+(-\S+\s+)*["']?(/|~|\$HOME|\$\{HOME\})/?\*?["']?(\s|;|&|\||$)"#,
        r"--no-preserve-root",
        r"\bmkfs(\.\w+)?\b",
        // Power commands in command position (not `git log --grep=reboot`).
        r"(^|[;&|(`\n]|\$\(|\bsudo\s+|\bexec\s+)\s*(shutdown|reboot|poweroff|halt)\b",
        r"\bsystemctl\s+(-\S+\s+)*(reboot|poweroff|halt|kexec)\b",
        // The classic fork bomb, with or without spaces.
        r":\s*\(\s*\)\s*\{",
        // Writing to a raw disk device.
        r"(\bof=|>\s*)/dev/(sd[a-z]|nvme\d|hd[a-z]|vd[a-z]|xvd[a-z]|mmcblk\d)",
    ];
    PATTERNS.iter().map(|source| CommandPattern::builtin(source)).collect()
}

/// The `[tools.files]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilesConfig {
    /// Most characters `read_file` returns in one call; it stops at a line boundary and says
    /// which `offset` continues. Default: 50,000.
    pub max_read_chars: usize,
    /// Largest file `write_file` writes or `edit_file` edits, in bytes. Default: 10 MiB.
    pub max_file_bytes: usize,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self { max_read_chars: 50_000, max_file_bytes: 10 * 1024 * 1024 }
    }
}

/// A regular expression over shell commands. One from the config is compiled when the config
/// is parsed (a bad pattern is a config error); the built-in defaults, known to compile, are
/// compiled on first use, so commands that never run a shell command never pay for them.
#[derive(Clone)]
pub struct CommandPattern {
    source: String,
    /// `None` inside: the pattern does not compile (only possible for `whole`, in theory);
    /// such a pattern refuses every command in a blocklist and allows none in an allowlist.
    anywhere: OnceLock<Option<Regex>>,
    whole: OnceLock<Option<Regex>>,
}

impl CommandPattern {
    pub fn new(source: &str) -> Result<Self, regex::Error> {
        let pattern = Self::builtin(source);
        let anywhere = Regex::new(source)?;
        let _ = pattern.anywhere.set(Some(anywhere));
        Ok(pattern)
    }

    /// A pattern compiled on first use (for the built-in defaults, tested to compile).
    fn builtin(source: &str) -> Self {
        Self { source: source.to_owned(), anywhere: OnceLock::new(), whole: OnceLock::new() }
    }

    /// The pattern as written in the config.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the pattern occurs anywhere in `command` (blocklist semantics).
    pub fn is_found_in(&self, command: &str) -> bool {
        self.anywhere.get_or_init(|| Regex::new(&self.source).ok()).as_ref().is_none_or(|regex| regex.is_match(command))
    }

    /// Whether the pattern matches all of `command` (allowlist semantics).
    pub fn matches_whole(&self, command: &str) -> bool {
        self.whole
            .get_or_init(|| Regex::new(&format!("^(?:{})$", self.source)).ok())
            .as_ref()
            .is_some_and(|regex| regex.is_match(command))
    }
}

impl fmt::Debug for CommandPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CommandPattern").field(&self.source).finish()
    }
}

impl PartialEq for CommandPattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for CommandPattern {}

impl Serialize for CommandPattern {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.source)
    }
}

impl<'de> Deserialize<'de> for CommandPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let source = String::deserialize(deserializer)?;
        CommandPattern::new(&source)
            .map_err(|error| serde::de::Error::custom(format!("invalid regular expression `{source}`: {error}")))
    }
}

/// A `[tools]` setting that parsed but cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolsConfigError {
    #[error("tools.{field} is invalid: {reason}")]
    InvalidValue { field: &'static str, reason: String },
    #[error("tools.disabled names `{name}`, which is not a built-in tool; the built-in tools are: {known}")]
    UnknownTool { name: String, known: String },
}

/// Smallest `max_output_chars` accepted: room for the headers, a cut marker and some output.
pub const MIN_OUTPUT_CHARS: usize = 500;

impl ToolsConfig {
    /// Check the settings that parse but cannot work. The binary calls this at start-up;
    /// [`builtin_registry`](crate::builtin_registry) itself copes with any value (it raises
    /// zero limits to one and lowers a default timeout above the maximum to the maximum).
    pub fn validate(&self) -> Result<(), ToolsConfigError> {
        let invalid =
            |field: &'static str, reason: &str| ToolsConfigError::InvalidValue { field, reason: reason.to_owned() };
        if let Some(name) = self.disabled.iter().find(|name| !BUILTIN_TOOL_NAMES.contains(&name.as_str())) {
            return Err(ToolsConfigError::UnknownTool { name: name.clone(), known: BUILTIN_TOOL_NAMES.join(", ") });
        }
        if self.max_concurrent_processes == 0 {
            return Err(invalid("max_concurrent_processes", "must be at least 1"));
        }
        let shell = &self.shell;
        if shell.max_timeout_s == 0 {
            return Err(invalid("shell.max_timeout_s", "must be at least 1"));
        }
        if shell.default_timeout_s == 0 || shell.default_timeout_s > shell.max_timeout_s {
            return Err(invalid("shell.default_timeout_s", "must be between 1 and shell.max_timeout_s"));
        }
        if shell.max_output_chars < MIN_OUTPUT_CHARS {
            return Err(invalid("shell.max_output_chars", "must be at least 500"));
        }
        if shell.max_saved_output_bytes < shell.max_output_chars {
            return Err(invalid("shell.max_saved_output_bytes", "must be at least shell.max_output_chars"));
        }
        if shell.max_command_chars == 0 {
            return Err(invalid("shell.max_command_chars", "must be at least 1"));
        }
        let bad_name = |name: &str| name.is_empty() || name.contains('=') || name.contains('\0');
        if shell.env_allowlist.iter().any(|name| bad_name(name.trim_end_matches('*'))) {
            return Err(invalid("shell.env_allowlist", "variable names must be non-empty and contain no `=`"));
        }
        if shell.env_set.iter().any(|(name, value)| bad_name(name) || value.contains('\0')) {
            return Err(invalid("shell.env_set", "variable names must be non-empty and contain no `=`"));
        }
        if shell.mode == PolicyMode::Allowlist && shell.allowlist_patterns.is_empty() {
            return Err(invalid(
                "shell.allowlist_patterns",
                "allowlist mode with no pattern refuses every command; add patterns, use mode = \"blocklist\", \
                 or disable run_shell_command with tools.disabled",
            ));
        }
        if self.files.max_read_chars < 1_000 {
            return Err(invalid("files.max_read_chars", "must be at least 1000"));
        }
        if let Err((field, reason)) = self.http.check() {
            return Err(ToolsConfigError::InvalidValue { field, reason });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_pattern_compiles_both_ways() {
        // The defaults are compiled on first use; a typo in one must fail here, not silently
        // refuse every command in production.
        for pattern in default_blocklist() {
            let source = pattern.as_str();
            assert!(Regex::new(source).is_ok(), "built-in pattern `{source}` does not compile");
            assert!(Regex::new(&format!("^(?:{source})$")).is_ok(), "`{source}` does not compile anchored");
        }
        let patterns = default_blocklist();
        assert!(patterns.iter().any(|p| p.is_found_in("rm -rf /")));
        assert!(!patterns.iter().any(|p| p.is_found_in("git log --grep=reboot")));
    }

    #[test]
    fn a_bad_pattern_from_the_config_is_an_error_when_parsed() {
        let error = CommandPattern::new("(unclosed").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("unclosed"), "{error}");
        let pattern = CommandPattern::new(r"ls( -l)?").expect("valid");
        assert!(pattern.matches_whole("ls -l"));
        assert!(!pattern.matches_whole("ls -l; rm x"));
        assert!(pattern.is_found_in("cd x && ls"));
    }
}
