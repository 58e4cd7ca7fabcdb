//! `run_shell_command`: run a command with `/bin/sh -c` in the workspace.
//!
//! Order of a call: check the arguments, ask the policy, wait for a process slot, run the
//! command in its own process group with a rebuilt environment, lay the output out for the
//! model (saving the whole of a long output to the staging folder). It is not a sandbox: the
//! command runs as the agent's user and can read what that user can; what it cannot get is the
//! agent's environment (keys, tokens) and a life beyond the call — unless the tool was given a
//! [`Background`] keeper and the model asked for one (`background`, `on_timeout`), in which case
//! the same checked command with the same environment becomes a background job.

mod background;
mod capture;
mod policy;
mod process;
mod render;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sys::signal::Signal;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{MIN_OUTPUT_CHARS, ShellConfig};
use crate::limiter::ProcessLimiter;
use crate::output::{save_full_output, summary_line};
use crate::tool::{Tool, ToolContext, ToolOutput, ToolSpec, parse_arguments};
pub use background::{Background, DetachedCommand, JobFiles, MovedCommand};
use policy::ShellPolicy;
use process::{OnTimeout, Run, RunEnd, RunRequest};

pub const RUN_SHELL_COMMAND: &str = "run_shell_command";

/// The `run_shell_command` tool.
pub struct ShellTool {
    spec: ToolSpec,
    config: ShellConfig,
    policy: ShellPolicy,
    limiter: ProcessLimiter,
    /// Keeps background jobs; without one, `background` and `on_timeout` are not offered.
    background: Option<Arc<dyn Background>>,
}

#[derive(Deserialize)]
struct Params {
    command: String,
    #[serde(default)]
    timeout_s: Option<u64>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    on_timeout: TimeoutChoice,
}

/// `on_timeout`: what happens to a foreground command at its timeout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum TimeoutChoice {
    #[default]
    Kill,
    Background,
}

impl ShellTool {
    /// The tool with `config`, sharing `limiter` with every other process-starting tool.
    /// Out-of-range settings are brought into range (see [`ToolsConfig::validate`](crate::ToolsConfig::validate)
    /// for the check that reports them).
    pub fn new(config: &ShellConfig, limiter: ProcessLimiter) -> Self {
        let mut config = config.clone();
        config.max_timeout_s = config.max_timeout_s.max(1);
        config.default_timeout_s = config.default_timeout_s.clamp(1, config.max_timeout_s);
        config.max_output_chars = config.max_output_chars.max(MIN_OUTPUT_CHARS);
        config.max_saved_output_bytes = config.max_saved_output_bytes.max(config.max_output_chars);
        config.max_command_chars = config.max_command_chars.max(1);
        // A bare `*` would pass the whole environment on; it is never what the allow-list means.
        config.env_allowlist.retain(|name| !name.trim_end_matches('*').is_empty());
        Self { spec: spec(&config, false), policy: ShellPolicy::new(&config), config, limiter, background: None }
    }

    /// Offer background jobs (`background`, `on_timeout`), kept by `background`.
    pub fn with_background(mut self, background: Arc<dyn Background>) -> Self {
        self.spec = spec(&self.config, true);
        self.background = Some(background);
        self
    }

    /// The command's environment: the allow-listed variables of this process, then `env_set`,
    /// then `STAGING_DIR`. Nothing else of this process's environment is passed on.
    fn environment(&self, ctx: &ToolContext) -> Vec<(OsString, OsString)> {
        let allowed = |name: &str| {
            self.config.env_allowlist.iter().any(|entry| match entry.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == entry,
            })
        };
        let mut environment: BTreeMap<OsString, OsString> =
            std::env::vars_os().filter(|(name, _)| name.to_str().is_some_and(allowed)).collect();
        for (name, value) in &self.config.env_set {
            environment.insert(name.into(), value.into());
        }
        environment.insert("STAGING_DIR".into(), ctx.staging_path().into_os_string());
        environment.into_iter().collect()
    }

    fn check_command(&self, command: &str) -> Result<(), ToolOutput> {
        if command.trim().is_empty() {
            return Err(ToolOutput::failure("`command` is empty; give the shell command to run"));
        }
        let length = command.chars().count();
        if length > self.config.max_command_chars {
            return Err(ToolOutput::failure(format!(
                "the command is {length} characters long, more than the {} allowed; write a long script to a \
                 file with write_file and run that file",
                self.config.max_command_chars
            )));
        }
        if command.contains('\0') {
            return Err(ToolOutput::failure("the command contains a NUL character, which no shell command can hold"));
        }
        if let Err(refusal) = self.policy.check(command) {
            return Err(ToolOutput::failure(refusal.to_string()));
        }
        Ok(())
    }

    /// Hand a command that reached its timeout to the background keeper; the result shows its
    /// output so far and what became of it.
    async fn move_to_background(
        &self,
        ctx: &ToolContext,
        background: &Arc<dyn Background>,
        command: &str,
        moved: Box<process::Moved>,
        started: Instant,
    ) -> ToolOutput {
        let max_chars = self.config.max_output_chars;
        // Shown as a finished command's output is (without the shell's last line feed); the
        // logs get it as written.
        let mut stdout_shown = moved.stdout_so_far.clone();
        stdout_shown.strip_final_newline();
        let so_far = render::whole_if_fits(&stdout_shown, &moved.stderr_so_far, max_chars).unwrap_or_else(|| {
            let marker = "[output so far cut: only its end is shown; all of it is in the job's logs]\n";
            render::cut(&stdout_shown, &moved.stderr_so_far, max_chars, marker)
        });
        let moved = *moved;
        let command = MovedCommand {
            command: command.to_owned(),
            child: moved.child,
            pid: moved.pid,
            stdout: moved.stdout,
            stderr: moved.stderr,
            stdout_so_far: moved.stdout_so_far.with_omission_marker(),
            stderr_so_far: moved.stderr_so_far.with_omission_marker(),
            running_for: started.elapsed(),
        };
        match background.adopt(ctx, command).await {
            Ok(note) => ToolOutput::success(with_note(so_far, &note)).with_summary("moved to the background"),
            Err(error) => ToolOutput::failure_with_content(with_note(so_far, &error), error),
        }
    }

    /// Lay the output out, saving the whole of it when it has to be cut.
    async fn content(&self, ctx: &ToolContext, finished: &process::Finished) -> String {
        let max_chars = self.config.max_output_chars;
        if let Some(whole) = render::whole_if_fits(&finished.stdout, &finished.stderr, max_chars) {
            return whole;
        }
        let full = render::full(&finished.stdout, &finished.stderr);
        let marker = match save_full_output(ctx, RUN_SHELL_COMMAND, &full).await {
            Ok(path) => format!("[output cut: only its end is shown; the full output is in {path}]\n"),
            Err(error) => {
                tracing::warn!(call_id = %ctx.call_id, %error, "could not save a command's full output");
                format!("[output cut: only its end is shown; the full output could not be saved: {error}]\n")
            }
        };
        render::cut(&finished.stdout, &finished.stderr, max_chars, &marker)
    }
}

#[async_trait]
impl Tool for ShellTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, ctx: &ToolContext, arguments: Value) -> ToolOutput {
        let params: Params = match parse_arguments(RUN_SHELL_COMMAND, arguments) {
            Ok(params) => params,
            Err(output) => return output,
        };
        if let Err(output) = self.check_command(&params.command) {
            return output;
        }
        let timeout_s = params.timeout_s.unwrap_or(self.config.default_timeout_s).clamp(1, self.config.max_timeout_s);
        let wants_background = params.background || params.on_timeout == TimeoutChoice::Background;
        let background = match (&self.background, wants_background) {
            (_, false) => None,
            (Some(background), true) if ctx.origin.is_some() => Some(background),
            (Some(_), true) => {
                return ToolOutput::failure(
                    "background jobs need a conversation turn to report to, and this call belongs to none; \
                     run the command without `background` and `on_timeout`",
                );
            }
            (None, true) => {
                return ToolOutput::failure(
                    "background jobs are not available here (they need the `kesoku start` service); run the \
                     command without `background` and `on_timeout`, with a `timeout_s` long enough for it",
                );
            }
        };

        match tokio::fs::metadata(&ctx.workspace).await {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                return ToolOutput::failure(format!("the workspace `{}` is not a folder", ctx.workspace.display()));
            }
            Err(error) => {
                return ToolOutput::failure(format!(
                    "the workspace `{}` cannot be opened: {error}",
                    ctx.workspace.display()
                ));
            }
        }
        let staging = ctx.staging_path();
        if let Err(error) = tokio::fs::create_dir_all(&staging).await {
            return ToolOutput::failure(format!(
                "could not create the session's staging folder `{}`: {error}",
                staging.display()
            ));
        }

        if params.background
            && let Some(background) = background
        {
            let command = DetachedCommand {
                command: params.command.clone(),
                cwd: ctx.workspace.clone(),
                env: self.environment(ctx),
            };
            return match background.start(ctx, command).await {
                Ok(text) => ToolOutput::success(text).with_summary("started as a background job"),
                Err(error) => ToolOutput::failure(error),
            };
        }

        let slot = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                return ToolOutput::failure("cancelled while waiting for a free process slot; the command was not run");
            }
            slot = self.limiter.acquire() => slot,
        };
        let started = Instant::now();
        let request = RunRequest {
            command: &params.command,
            cwd: &ctx.workspace,
            env: self.environment(ctx),
            timeout: Duration::from_secs(timeout_s),
            kill_grace: Duration::from_secs(self.config.kill_grace_s),
            on_timeout: if background.is_some() { OnTimeout::Move } else { OnTimeout::Kill },
            head_bytes: self.config.max_saved_output_bytes / 2,
            // The end shown to the model must be in memory: up to 4 bytes per character.
            tail_bytes: (self.config.max_saved_output_bytes / 2).max(self.config.max_output_chars.saturating_mul(4)),
        };
        let run = process::run(request, &ctx.cancel).await;
        drop(slot);
        let mut finished = match run {
            Ok(Run::Finished(finished)) => finished,
            Ok(Run::Moved(moved)) => {
                return match background {
                    Some(background) => self.move_to_background(ctx, background, &params.command, moved, started).await,
                    // Unreachable: `Move` is asked for only with a keeper. Should it happen, the
                    // command must not be left running unwatched.
                    None => {
                        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(moved.pid), Signal::SIGKILL);
                        ToolOutput::failure(format!("timed out after {timeout_s} s; the command was stopped"))
                    }
                };
            }
            Err(error) => return ToolOutput::failure(format!("could not start the command: {error}")),
        };
        tracing::debug!(
            call_id = %ctx.call_id,
            end = ?finished.end,
            elapsed_ms = started.elapsed().as_millis(),
            stdout_bytes = finished.stdout.total_bytes,
            stderr_bytes = finished.stderr.total_bytes,
            "shell command finished"
        );

        finished.stdout.strip_final_newline();
        let summary = summary_line(&finished.stdout.text).or_else(|| summary_line(&finished.stderr.text));
        let content = self.content(ctx, &finished).await;
        let output = match &finished.end {
            RunEnd::Exited(status) if status.success() => ToolOutput::success(content),
            RunEnd::Exited(status) => ToolOutput::failure_with_content(content, describe_exit(*status)),
            RunEnd::TimedOut => {
                let error =
                    format!("timed out after {timeout_s} s; the command and every process it started were stopped");
                ToolOutput::failure_with_content(with_note(content, &error), error)
            }
            RunEnd::Cancelled => {
                let error =
                    "cancelled: the turn was interrupted; the command and every process it started were stopped";
                ToolOutput::failure_with_content(with_note(content, error), error)
            }
            RunEnd::WaitFailed(wait_error) => {
                let error =
                    format!("lost track of the command ({wait_error}); it and every process it started were stopped");
                ToolOutput::failure_with_content(with_note(content, &error), error)
            }
        };
        match summary {
            Some(summary) => output.with_summary(summary),
            None => output,
        }
    }
}

/// The tool's description and schema; `background`: whether background jobs are offered.
fn spec(config: &ShellConfig, background: bool) -> ToolSpec {
    let mut description = format!(
        "Run a shell command with `/bin/sh -c` in the workspace folder and return its output as \
         `=== STDOUT ===` followed by `=== STDERR ===`. Output longer than {max} characters is cut to \
         its end, and the whole output is saved to a file whose path is given (read it with \
         read_file). The command gets no input and only a few environment variables; \
         `$STAGING_DIR` is this session's folder for scratch files. It is stopped after `timeout_s` \
         seconds (default {default}, at most {most}), and processes it leaves running in the \
         background are stopped when it finishes. A non-zero exit status is reported as an error.",
        max = config.max_output_chars,
        default = config.default_timeout_s,
        most = config.max_timeout_s,
    );
    let mut parameters = json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The command line, e.g. `cargo test -p kesoku-core` or `ls -la src`."
            },
            "timeout_s": {
                "type": "integer",
                "minimum": 1,
                "description": format!(
                    "Seconds before the command is stopped (default {}, at most {}).",
                    config.default_timeout_s, config.max_timeout_s
                )
            }
        },
        "required": ["command"]
    });
    if background {
        description.push_str(
            " For long work (builds, test suites, downloads, servers) set `background: true`: the command \
             starts as a background job and the call returns at once with the job's id and log files; no \
             timeout applies, and when the job ends you are woken by a system alert with its exit code and \
             the end of its output. See list_jobs, job_output and cancel_job. With `on_timeout: \"background\"` \
             a command still running at its timeout becomes such a job instead of being stopped.",
        );
        if let Some(properties) = parameters.get_mut("properties").and_then(Value::as_object_mut) {
            properties.insert(
                "background".to_owned(),
                json!({
                    "type": "boolean",
                    "description": "Start the command as a background job and return at once (default false)."
                }),
            );
            properties.insert(
                "on_timeout".to_owned(),
                json!({
                    "type": "string",
                    "enum": ["kill", "background"],
                    "description": "What happens when the command reaches timeout_s: `kill` (default) stops it; \
                                    `background` moves it, still running, to a background job."
                }),
            );
        }
    }
    ToolSpec { name: RUN_SHELL_COMMAND.to_owned(), description, parameters }
}

/// `content` followed by `[note]` on a line of its own.
fn with_note(content: String, note: &str) -> String {
    let newline = if content.ends_with('\n') { "" } else { "\n" };
    format!("{content}{newline}[{note}]")
}

fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    match status.signal() {
        Some(number) => match Signal::try_from(number) {
            Ok(signal) => format!("killed by signal {number} ({})", signal.as_str()),
            Err(_) => format!("killed by signal {number}"),
        },
        None => format!("ended abnormally ({status})"),
    }
}
