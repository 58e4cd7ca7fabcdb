//! `run_shell_command` and the processes it starts: timeouts, cancellation, dropped calls, the
//! environment, the concurrency cap.

use std::time::{Duration, Instant};

use kesoku_tools::{RUN_SHELL_COMMAND, ToolsConfig, builtin_registry};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{Fixture, TestResult, gone_within, is_alive, read_pid, with_shell};

/// A script that records its shell's pid and a background child's pid, then waits.
const SHELL_AND_CHILD: &str = "echo $$ > shell.pid; sleep 30 & echo $! > child.pid; echo started; wait";

#[tokio::test]
async fn a_timeout_stops_the_whole_group_with_sigterm_then_sigkill() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&with_shell(|shell| shell.kill_grace_s = 1));
    // Both the shell and its child ignore SIGTERM, so only the SIGKILL after the grace ends them.
    let command = format!("trap '' TERM; {SHELL_AND_CHILD}");

    let started = Instant::now();
    let output = registry.call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": command, "timeout_s": 1 })).await;
    let elapsed = started.elapsed();

    let error = "timed out after 1 s; the command and every process it started were stopped";
    assert_eq!(output.error.as_deref(), Some(error));
    assert_eq!(output.content, format!("=== STDOUT ===\nstarted\n=== STDERR ===\n[{error}]"));
    assert!(elapsed >= Duration::from_secs(2), "SIGKILL came before the grace was over: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    for pid_file in ["shell.pid", "child.pid"] {
        let pid = read_pid(&fixture.path(pid_file)).await?;
        assert!(gone_within(pid, Duration::from_secs(5)).await, "{pid_file} ({pid}) still runs");
    }
    Ok(())
}

#[tokio::test]
async fn a_timed_out_command_that_honours_sigterm_does_not_wait_the_grace() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&with_shell(|shell| shell.kill_grace_s = 60));
    let started = Instant::now();
    let output = registry.call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": "sleep 30", "timeout_s": 1 })).await;
    assert!(output.error.as_deref().unwrap_or_default().starts_with("timed out after 1 s"));
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    Ok(())
}

#[tokio::test]
async fn timeouts_above_the_maximum_are_lowered_to_it() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&with_shell(|shell| {
        shell.max_timeout_s = 1;
        shell.default_timeout_s = 1;
    }));
    let output =
        registry.call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": "sleep 30", "timeout_s": 3600 })).await;
    assert!(output.error.as_deref().unwrap_or_default().starts_with("timed out after 1 s"), "{output:?}");
    Ok(())
}

#[tokio::test]
async fn cancellation_stops_the_whole_group_promptly() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    let cancel = CancellationToken::new();
    let ctx = fixture.ctx.clone().with_cancel(cancel.clone());

    let call = async {
        let output = registry.call(RUN_SHELL_COMMAND, &ctx, json!({ "command": SHELL_AND_CHILD })).await;
        (output, Instant::now())
    };
    let canceller = async {
        let shell = read_pid(&fixture.path("shell.pid")).await;
        let child = read_pid(&fixture.path("child.pid")).await;
        cancel.cancel();
        (shell, child, Instant::now())
    };
    let ((output, returned_at), (shell, child, cancelled_at)) = tokio::join!(call, canceller);
    let (shell, child) = (shell?, child?);

    let waited = returned_at.saturating_duration_since(cancelled_at);
    assert!(waited < Duration::from_millis(1_500), "the call took {waited:?} to return after cancellation");
    assert_eq!(
        output.error.as_deref(),
        Some("cancelled: the turn was interrupted; the command and every process it started were stopped")
    );
    assert!(gone_within(shell, Duration::from_secs(2)).await, "the shell ({shell}) still runs");
    assert!(gone_within(child, Duration::from_secs(2)).await, "the background child ({child}) still runs");
    Ok(())
}

#[tokio::test]
async fn dropping_the_call_stops_the_whole_group() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    let call = registry.call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": SHELL_AND_CHILD }));
    // As when the agent aborts a turn's task: the call's future is dropped mid-run.
    let pids = tokio::select! {
        output = call => return Err(format!("the command should still be running: {output:?}").into()),
        pids = async { (read_pid(&fixture.path("shell.pid")).await, read_pid(&fixture.path("child.pid")).await) } => pids,
    };
    let (shell, child) = (pids.0?, pids.1?);
    assert!(gone_within(shell, Duration::from_secs(2)).await, "the shell ({shell}) still runs");
    assert!(gone_within(child, Duration::from_secs(2)).await, "the background child ({child}) still runs");
    Ok(())
}

#[tokio::test]
async fn background_processes_do_not_outlive_a_finished_command() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    let started = Instant::now();
    let output = registry
        .call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": "sleep 30 > /dev/null 2>&1 & echo $! > child.pid" }))
        .await;
    assert_eq!(output.error, None, "{}", output.content);
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    let child = read_pid(&fixture.path("child.pid")).await?;
    assert!(gone_within(child, Duration::from_secs(2)).await, "the background child ({child}) still runs");
    Ok(())
}

#[tokio::test]
async fn a_background_process_holding_the_pipe_does_not_hold_the_call() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    // `setsid` leaves the group, so the group kill cannot reach it, and it keeps stdout open.
    // The command waits until it has left, so that the group kill cannot win the race.
    let command = "setsid sh -c 'echo $$ > escaped.pid; exec sleep 30' & \
                   while [ ! -s escaped.pid ]; do sleep 0.05; done; echo done";
    let started = Instant::now();
    let output = registry.call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": command })).await;
    let elapsed = started.elapsed();

    let escaped = read_pid(&fixture.path("escaped.pid")).await?;
    let escaped_was_alive = is_alive(escaped);
    // Clean up after ourselves: this one escaped by design.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(escaped), nix::sys::signal::Signal::SIGKILL);

    assert!(escaped_was_alive, "the escaped process should have outlived the group kill");
    assert!(elapsed < Duration::from_secs(8), "took {elapsed:?}");
    assert_eq!(output.content, "=== STDOUT ===\ndone\n=== STDERR ===\n");
    Ok(())
}

const ENV_CHILD_FLAG: &str = "KESOKU_TOOLS_IT_ENV_CHILD";
const SECRET_NAME: &str = "KESOKU_IT_PROVIDER_API_KEY_5C1F9A";
const SECRET_VALUE: &str = "sk-live-5c1f9a-do-not-leak";
const VISIBLE_NAME: &str = "KESOKU_IT_VISIBLE_5C1F9A";

/// The secret must be in the environment of the process running the tool, which a test cannot
/// arrange for itself without `unsafe` (`set_var`): so the test re-runs this test binary, with
/// the variables set, filtered to this one test.
#[test]
fn the_environment_is_rebuilt_from_the_allowlist() -> TestResult {
    if std::env::var_os(ENV_CHILD_FLAG).is_some() {
        return environment_checks_in_child();
    }
    let output = std::process::Command::new(std::env::current_exe()?)
        .args(["--exact", "shell_processes::the_environment_is_rebuilt_from_the_allowlist", "--nocapture"])
        .env(ENV_CHILD_FLAG, "1")
        .env(SECRET_NAME, SECRET_VALUE)
        .env(VISIBLE_NAME, "visible-value")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the child run failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("environment checks passed"), "the child did not run the checks:\n{stdout}");
    Ok(())
}

fn environment_checks_in_child() -> TestResult {
    assert_eq!(std::env::var(SECRET_NAME).ok().as_deref(), Some(SECRET_VALUE), "the secret is set in this process");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let fixture = Fixture::new()?;

        let defaults = builtin_registry(&ToolsConfig::default());
        let output = defaults.call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": "env" })).await;
        assert_eq!(output.error, None, "{}", output.content);
        assert!(!output.content.contains(SECRET_NAME) && !output.content.contains(SECRET_VALUE), "{}", output.content);
        assert!(!output.content.contains(VISIBLE_NAME), "not allow-listed by default");
        assert!(!output.content.contains(ENV_CHILD_FLAG));
        assert!(output.content.contains("\nSTAGING_DIR="), "{}", output.content);

        let custom = builtin_registry(&with_shell(|shell| {
            shell.env_allowlist = vec!["PATH".to_owned(), "KESOKU_IT_VISIBLE_*".to_owned(), "*".to_owned()];
            shell.env_set.insert("PAGER".to_owned(), "cat".to_owned());
        }));
        let output = custom.call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": "env | sort" })).await;
        let lines: Vec<&str> = output.content.lines().filter(|line| !line.starts_with("===")).collect();
        let names: Vec<&str> = lines.iter().filter_map(|line| line.split_once('=').map(|(name, _)| name)).collect();
        // `sh` adds PWD, SHLVL and `_` itself; nothing else comes from this process (a bare `*` is ignored).
        let expected = ["PAGER", "PATH", "PWD", "SHLVL", "STAGING_DIR", VISIBLE_NAME, "_"];
        let unexpected: Vec<&&str> = names.iter().filter(|name| !expected.contains(name)).collect();
        assert!(unexpected.is_empty(), "unexpected variables {unexpected:?} in {lines:?}");
        assert!(lines.contains(&format!("{VISIBLE_NAME}=visible-value").as_str()), "{lines:?}");
        assert!(lines.contains(&"PAGER=cat"), "{lines:?}");
        println!("environment checks passed");
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

#[tokio::test]
async fn a_cap_of_one_process_runs_commands_one_after_the_other() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig { max_concurrent_processes: 1, ..ToolsConfig::default() });
    let command = |tag: &str| json!({ "command": format!("echo start {tag} >> order.log; sleep 0.3; echo end {tag} >> order.log") });
    let (ctx_a, ctx_b) = (fixture.ctx.for_call("a"), fixture.ctx.for_call("b"));
    let (a, b) = tokio::join!(
        registry.call(RUN_SHELL_COMMAND, &ctx_a, command("a")),
        registry.call(RUN_SHELL_COMMAND, &ctx_b, command("b")),
    );
    assert_eq!((a.error, b.error), (None, None));
    let log = fixture.read("order.log")?;
    let lines: Vec<&str> = log.lines().collect();
    let one_after_the_other =
        lines == ["start a", "end a", "start b", "end b"] || lines == ["start b", "end b", "start a", "end a"];
    assert!(one_after_the_other, "the commands overlapped: {lines:?}");
    Ok(())
}

#[tokio::test]
async fn a_cap_of_two_processes_lets_two_commands_overlap() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig { max_concurrent_processes: 2, ..ToolsConfig::default() });
    // Each command succeeds only if it sees the other one running (within 10 s).
    let command = |me: &str, other: &str| {
        json!({ "command": format!(
            "touch {me}.running; i=0; while [ ! -e {other}.running ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; test -e {other}.running"
        ) })
    };
    let (ctx_a, ctx_b) = (fixture.ctx.for_call("a"), fixture.ctx.for_call("b"));
    let (a, b) = tokio::join!(
        registry.call(RUN_SHELL_COMMAND, &ctx_a, command("a", "b")),
        registry.call(RUN_SHELL_COMMAND, &ctx_b, command("b", "a")),
    );
    assert_eq!((a.error, b.error), (None, None));
    Ok(())
}

#[tokio::test]
async fn a_call_waiting_for_a_slot_can_be_cancelled_and_never_runs() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig { max_concurrent_processes: 1, ..ToolsConfig::default() });
    let (first_cancel, second_cancel) = (CancellationToken::new(), CancellationToken::new());
    let first_ctx = fixture.ctx.for_call("first").with_cancel(first_cancel.clone());
    let second_ctx = fixture.ctx.for_call("second").with_cancel(second_cancel.clone());

    let first = registry.call(RUN_SHELL_COMMAND, &first_ctx, json!({ "command": "echo $$ > first.pid; sleep 30" }));
    let second = async {
        // Start waiting only once the first command holds the slot.
        let pid = read_pid(&fixture.path("first.pid")).await;
        let canceller = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            second_cancel.cancel();
        };
        let (output, ()) = tokio::join!(
            registry.call(RUN_SHELL_COMMAND, &second_ctx, json!({ "command": "touch second.ran" })),
            canceller
        );
        first_cancel.cancel();
        (pid, output)
    };
    let (first, (pid, second)) = tokio::join!(first, second);
    pid?;
    assert_eq!(
        second.error.as_deref(),
        Some("cancelled while waiting for a free process slot; the command was not run")
    );
    assert!(!fixture.path("second.ran").exists());
    assert!(first.error.as_deref().unwrap_or_default().starts_with("cancelled"), "{first:?}");
    Ok(())
}
