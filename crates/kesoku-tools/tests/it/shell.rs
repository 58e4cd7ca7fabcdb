//! `run_shell_command`: output layout, cutting, exit statuses, policy and argument handling.

use kesoku_tools::{PolicyMode, RUN_SHELL_COMMAND, ToolOutput, ToolsConfig, builtin_registry};
use serde_json::{Value, json};

use crate::support::{Fixture, TestResult, saved_output_path, with_shell};

async fn run(fixture: &Fixture, config: &ToolsConfig, command: &str) -> ToolOutput {
    builtin_registry(config).call(RUN_SHELL_COMMAND, &fixture.ctx, json!({ "command": command })).await
}

#[tokio::test]
async fn output_is_laid_out_as_in_spec_example_6_1() -> TestResult {
    let fixture = Fixture::new()?;
    let pytest = "============================= test session starts =============================\n\
                  plugins: anyio-4.3.0\n\
                  collected 5 items\n\
                  \n\
                  tests/test_history.py .....                                              [100%]\n\
                  ============================== 5 passed in 0.42s ===============================\n";
    fixture.write("pytest.out", pytest)?;

    let output = run(&fixture, &ToolsConfig::default(), "cat pytest.out").await;

    // The content and the summary of msg_result_001, character for character.
    let expected = "=== STDOUT ===\n============================= test session starts =============================\nplugins: anyio-4.3.0\ncollected 5 items\n\ntests/test_history.py .....                                              [100%]\n============================== 5 passed in 0.42s ===============================\n=== STDERR ===\n";
    assert_eq!(output.content, expected);
    assert_eq!(output.summary.as_deref(), Some("5 passed in 0.42s"));
    assert_eq!(output.error, None);
    Ok(())
}

#[tokio::test]
async fn stdout_and_stderr_are_both_shown() -> TestResult {
    let fixture = Fixture::new()?;
    let output = run(&fixture, &ToolsConfig::default(), "echo out; echo err >&2").await;
    assert_eq!(output.content, "=== STDOUT ===\nout\n=== STDERR ===\nerr\n");
    assert_eq!(output.summary.as_deref(), Some("out"));
    assert_eq!(output.error, None);
    Ok(())
}

#[tokio::test]
async fn a_non_zero_exit_is_an_error_with_the_output_as_content() -> TestResult {
    let fixture = Fixture::new()?;
    let output = run(&fixture, &ToolsConfig::default(), "echo partial; echo 'oops: broken' >&2; exit 3").await;
    assert_eq!(output.error.as_deref(), Some("exit code 3"));
    assert_eq!(output.content, "=== STDOUT ===\npartial\n=== STDERR ===\noops: broken\n");
    Ok(())
}

#[tokio::test]
async fn death_by_signal_is_an_error_naming_it() -> TestResult {
    let fixture = Fixture::new()?;
    let output = run(&fixture, &ToolsConfig::default(), "echo before; kill -KILL $$").await;
    assert_eq!(output.error.as_deref(), Some("killed by signal 9 (SIGKILL)"));
    assert_eq!(output.content, "=== STDOUT ===\nbefore\n=== STDERR ===\n");
    Ok(())
}

#[tokio::test]
async fn long_output_keeps_its_end_and_the_whole_is_saved() -> TestResult {
    let fixture = Fixture::new()?;
    let output = run(&fixture, &ToolsConfig::default(), "seq 1 20000; echo 'last words' >&2").await;

    assert_eq!(output.error, None);
    assert!(output.content.chars().count() <= 5_000, "{} characters", output.content.chars().count());
    assert!(output.content.starts_with("=== STDOUT ===\n[output cut: only its end is shown; the full output is in "));
    assert!(output.content.ends_with("19999\n20000\n=== STDERR ===\nlast words\n"), "{}", output.content);
    assert_eq!(output.summary.as_deref(), Some("20000"));

    let saved = saved_output_path(&output).ok_or("the marker names no file")?;
    assert_eq!(saved, ".kesoku/sessions/sess_test/tool_outputs/run_shell_command-call_1.txt");
    let numbers: Vec<String> = (1..=20_000).map(|n| n.to_string()).collect();
    let expected = format!("=== STDOUT ===\n{}\n=== STDERR ===\nlast words\n", numbers.join("\n"));
    assert_eq!(fixture.read(&saved)?, expected);

    // The model can open the saved file with read_file, by the path it was given.
    let read = builtin_registry(&ToolsConfig::default())
        .call("read_file", &fixture.ctx, json!({ "path": saved, "offset": 20000, "limit": 2 }))
        .await;
    assert_eq!(read.error, None, "{}", read.content);
    assert!(read.content.starts_with("19999\n20000\n"), "{}", read.content);
    Ok(())
}

#[tokio::test]
async fn a_second_cut_output_of_the_same_call_id_gets_its_own_file() -> TestResult {
    let fixture = Fixture::new()?;
    let first = run(&fixture, &ToolsConfig::default(), "seq 1 3000").await;
    let second = run(&fixture, &ToolsConfig::default(), "seq 1 4000").await;
    let (first, second) = (saved_output_path(&first), saved_output_path(&second));
    assert_ne!(first, second);
    assert!(second.is_some_and(|path| path.ends_with("run_shell_command-call_1-2.txt")));
    Ok(())
}

#[tokio::test]
async fn a_huge_stream_keeps_its_start_and_end_in_bounded_memory() -> TestResult {
    let fixture = Fixture::new()?;
    let config = with_shell(|shell| shell.max_saved_output_bytes = 20_000);
    let output = run(&fixture, &config, "seq 1 200000").await;

    assert!(output.content.ends_with("199999\n200000\n=== STDERR ===\n"), "{}", output.content);
    let saved = fixture.read(&saved_output_path(&output).ok_or("no saved file")?)?;
    assert!(saved.starts_with("=== STDOUT ===\n1\n2\n3\n"));
    assert!(saved.ends_with("199999\n200000\n=== STDERR ===\n"));
    assert!(saved.contains("bytes left out here"), "the saved file should mark the gap");
    // 10,000 bytes from the start, 20,000 from the end (4 bytes for each of the 5,000 characters
    // shown), the headers and the marker.
    assert!(saved.len() < 30_300, "saved {} bytes", saved.len());
    Ok(())
}

#[tokio::test]
async fn runs_in_the_workspace_with_no_input_and_a_staging_dir() -> TestResult {
    let fixture = Fixture::new()?;
    // `cat` would wait forever if stdin were inherited.
    let output = run(&fixture, &ToolsConfig::default(), "pwd; echo \"$STAGING_DIR\"; cat").await;
    let expected = format!(
        "=== STDOUT ===\n{}\n{}\n=== STDERR ===\n",
        fixture.workspace.display(),
        fixture.workspace.join(".kesoku/sessions/sess_test").display()
    );
    assert_eq!(output.content, expected);
    assert!(fixture.path(".kesoku/sessions/sess_test").is_dir(), "the staging folder is created");
    Ok(())
}

#[tokio::test]
async fn refused_commands_say_which_rule_and_never_run() -> TestResult {
    let fixture = Fixture::new()?;
    let output = run(&fixture, &ToolsConfig::default(), "touch ran.txt; mkfs.ext4 /dev/sdz9").await;
    let error = output.error.as_deref().unwrap_or_default();
    assert!(error.starts_with("command refused by the shell policy"), "{error}");
    assert!(error.contains(r"`\bmkfs(\.\w+)?\b`"), "{error}");
    assert!(!fixture.path("ran.txt").exists(), "a refused command must not run");

    let custom = with_shell(|shell| shell.blocklist_patterns = vec!["curl".parse_pattern()]);
    let output = run(&fixture, &custom, "touch ran.txt && curl example.invalid").await;
    assert!(output.error.as_deref().unwrap_or_default().contains("`curl`"));
    assert!(!fixture.path("ran.txt").exists());
    // With the defaults replaced, what they refused now runs.
    let output = run(&fixture, &custom, "echo mkfs").await;
    assert_eq!(output.error, None, "{}", output.content);
    Ok(())
}

#[tokio::test]
async fn allowlist_mode_runs_only_matching_commands() -> TestResult {
    let fixture = Fixture::new()?;
    let config = with_shell(|shell| {
        shell.mode = PolicyMode::Allowlist;
        shell.allowlist_patterns = vec!["echo [a-z ]*".parse_pattern(), "ls( -[a-z]+)?".parse_pattern()];
    });

    let output = run(&fixture, &config, "echo hello world").await;
    assert_eq!(output.content, "=== STDOUT ===\nhello world\n=== STDERR ===\n");

    for refused in ["touch made.txt", "echo hi; touch made.txt", "echo $(touch made.txt)"] {
        let output = run(&fixture, &config, refused).await;
        let error = output.error.as_deref().unwrap_or_default();
        assert!(error.contains("only commands matching one of these patterns"), "{refused}: {error}");
        assert!(error.contains("`echo [a-z ]*`, `ls( -[a-z]+)?`"), "{error}");
        assert!(!fixture.path("made.txt").exists(), "`{refused}` must not run");
    }
    // The blocklist still applies in allowlist mode.
    let config = with_shell(|shell| {
        shell.mode = PolicyMode::Allowlist;
        shell.allowlist_patterns = vec![".*".parse_pattern()];
    });
    let output = run(&fixture, &config, "reboot").await;
    assert!(output.error.as_deref().unwrap_or_default().contains("blocked pattern"));
    Ok(())
}

#[tokio::test]
async fn bad_arguments_are_error_outputs() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    let tool = registry.get(RUN_SHELL_COMMAND).ok_or("no shell tool")?;
    let huge = "echo ".to_owned() + &"a".repeat(1_000_000);
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "missing field `command`"),
        (json!({ "command": 5 }), "invalid type"),
        (json!("ls"), "invalid type"),
        (json!({ "command": "ls", "timeout_s": -1 }), "invalid value"),
        (json!({ "command": "   " }), "`command` is empty"),
        (json!({ "command": "echo a\u{0}b" }), "NUL character"),
        (json!({ "command": huge }), "more than the 20000 allowed"),
    ];
    for (arguments, expected) in cases {
        // Called directly, without the registry's schema check in front.
        let output = tool.call(&fixture.ctx, arguments.clone()).await;
        let error = output.error.as_deref().unwrap_or_default();
        assert!(error.contains(expected), "{arguments:.60}: `{error}` should mention `{expected}`");
    }
    Ok(())
}

#[tokio::test]
async fn a_missing_workspace_is_an_error_output() -> TestResult {
    let fixture = Fixture::new()?;
    let mut ctx = fixture.ctx.clone();
    ctx.workspace = fixture.path("does-not-exist");
    let output =
        builtin_registry(&ToolsConfig::default()).call(RUN_SHELL_COMMAND, &ctx, json!({ "command": "true" })).await;
    assert!(output.error.as_deref().unwrap_or_default().contains("cannot be opened"), "{output:?}");
    Ok(())
}

trait ParsePattern {
    fn parse_pattern(&self) -> kesoku_tools::CommandPattern;
}

impl ParsePattern for &str {
    #[allow(clippy::expect_used)]
    fn parse_pattern(&self) -> kesoku_tools::CommandPattern {
        kesoku_tools::CommandPattern::new(self).expect("test patterns are valid")
    }
}

#[tokio::test]
async fn without_a_background_keeper_background_is_refused_and_not_offered() -> TestResult {
    let fixture = Fixture::new()?;
    let registry = builtin_registry(&ToolsConfig::default());
    for arguments in [
        json!({ "command": "touch ran", "background": true }),
        json!({ "command": "touch ran", "on_timeout": "background" }),
    ] {
        let output = registry.call(RUN_SHELL_COMMAND, &fixture.ctx, arguments).await;
        let error = output.error.unwrap_or_default();
        assert!(error.starts_with("background jobs are not available here"), "{error}");
    }
    assert!(!fixture.path("ran").exists(), "a refused command is not run");
    let spec = &registry.get(RUN_SHELL_COMMAND).ok_or("no shell tool")?.spec().parameters;
    assert_eq!(spec["properties"].get("background"), None);
    Ok(())
}
