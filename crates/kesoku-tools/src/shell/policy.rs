//! Which commands `run_shell_command` agrees to run.
//!
//! Patterns are guard rails against accidents and over-eager models, not a security boundary:
//! shell syntax is too rich for regular expressions to contain a determined command. Isolation
//! comes from what the process inherits (see `process`) and from how Kesoku is deployed.

use std::fmt;

use crate::config::{CommandPattern, PolicyMode, ShellConfig};

#[derive(Debug, Clone)]
pub(crate) struct ShellPolicy {
    mode: PolicyMode,
    blocklist: Vec<CommandPattern>,
    allowlist: Vec<CommandPattern>,
}

/// Why a command was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    Blocked { pattern: String },
    NotAllowed { allowed: Vec<String> },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Blocked { pattern } => write!(
                f,
                "command refused by the shell policy: it matches the blocked pattern `{pattern}` \
                 (tools.shell.blocklist_patterns); it was not run. Use a different command, or ask the user"
            ),
            Refusal::NotAllowed { allowed } => write!(
                f,
                "command refused by the shell policy: only commands matching one of these patterns as a whole \
                 may run (tools.shell.allowlist_patterns): {}; it was not run",
                allowed.iter().map(|pattern| format!("`{pattern}`")).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

impl ShellPolicy {
    pub(crate) fn new(config: &ShellConfig) -> Self {
        Self {
            mode: config.mode,
            blocklist: config.blocklist_patterns.clone(),
            allowlist: config.allowlist_patterns.clone(),
        }
    }

    pub(crate) fn check(&self, command: &str) -> Result<(), Refusal> {
        if let Some(pattern) = self.blocklist.iter().find(|pattern| pattern.is_found_in(command)) {
            return Err(Refusal::Blocked { pattern: pattern.as_str().to_owned() });
        }
        match self.mode {
            PolicyMode::Blocklist => Ok(()),
            PolicyMode::Allowlist => {
                let command = command.trim();
                if self.allowlist.iter().any(|pattern| pattern.matches_whole(command)) {
                    Ok(())
                } else {
                    Err(Refusal::NotAllowed {
                        allowed: self.allowlist.iter().map(|pattern| pattern.as_str().to_owned()).collect(),
                    })
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    fn refused(command: &str) -> bool {
        ShellPolicy::new(&ShellConfig::default()).check(command).is_err()
    }

    #[test]
    fn default_blocklist_refuses_the_obvious_accidents() {
        for command in [
            "rm -rf /",
            "rm -rf /*",
            "rm -fr / ",
            "rm -r -f /",
            "sudo rm -rf --no-preserve-root /",
            "rm -rf ~",
            "rm -rf ~/",
            "rm -rf $HOME/*",
            "cd /tmp && rm -Rf \"/\"",
            "mkfs.ext4 /dev/sdb1",
            "mkfs -t ext4 /dev/sdb1",
            "shutdown -h now",
            "sudo reboot",
            "make && poweroff",
            "echo hi\nhalt",
            "systemctl reboot",
            ":(){ :|:& };:",
            ": () { : | : & } ; :",
            "dd if=/dev/zero of=/dev/sda bs=1M",
            "cat image > /dev/nvme0n1",
        ] {
            assert!(refused(command), "`{command}` should be refused");
        }
    }

    #[test]
    fn default_blocklist_lets_ordinary_commands_through() {
        for command in [
            "rm -rf build/",
            "rm -rf /tmp/kesoku-test",
            "rm -rf ~/project/target",
            "rm -f /",
            "git log --grep=reboot",
            "echo 'do not reboot'",
            "grep -r shutdown_hook src/",
            "dd if=/dev/zero of=disk.img bs=1M count=10",
            "ls /dev/sda",
        ] {
            assert!(!refused(command), "`{command}` should run");
        }
    }

    #[test]
    fn allowlist_patterns_must_match_the_whole_command() {
        let config = ShellConfig {
            mode: PolicyMode::Allowlist,
            allowlist_patterns: vec![
                CommandPattern::new("git status").expect("valid pattern"),
                CommandPattern::new("ls( [-a-z./]+)*").expect("valid pattern"),
            ],
            ..ShellConfig::default()
        };
        let policy = ShellPolicy::new(&config);
        assert_eq!(policy.check("git status"), Ok(()));
        assert_eq!(policy.check("  ls -la src/ "), Ok(()));
        assert!(policy.check("git status; rm -rf build").is_err());
        assert!(policy.check("echo git status").is_err());
        assert!(matches!(policy.check("ls; mkfs"), Err(Refusal::Blocked { .. })));
    }
}
