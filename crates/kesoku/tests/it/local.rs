//! The embedded default: `kesoku chat` answering with the real local model (SmolLM2-135M).
//!
//! The model file comes from `KESOKU_TEST_LOCAL_MODEL` (scripts/test fetches it once). Without
//! it these tests say they skipped, unless `KESOKU_REQUIRE_LOCAL_MODEL=1`, when they fail.

use kesoku_core::{Message, MessageType, Role, Status};

use crate::support::{Workspace, stderr, stdout};

fn model_path() -> Option<String> {
    match std::env::var("KESOKU_TEST_LOCAL_MODEL") {
        Ok(path) if std::path::Path::new(&path).exists() => Some(path),
        _ if std::env::var("KESOKU_REQUIRE_LOCAL_MODEL").as_deref() == Ok("1") => {
            panic!("KESOKU_REQUIRE_LOCAL_MODEL=1 but KESOKU_TEST_LOCAL_MODEL does not name a model file")
        }
        _ => {
            eprintln!("skipped: KESOKU_TEST_LOCAL_MODEL is not set (scripts/test sets it)");
            None
        }
    }
}

/// The local model with its defaults: the small-model profile (no tools, the short system
/// prompt, greedy sampling).
fn local_config(path: &str) -> String {
    format!("[models.local]\nprovider = \"local\"\npath = \"{path}\"\n")
}

/// The answer to "What is 25 + 15?" is about that sum and stops by itself: it names the sum
/// (SmolLM2-135M, greedy, says "25 + 15 = 30" whatever the prompt: the model's arithmetic, not
/// the prompt, so the right figure is not asserted) and is a few lines, not a ramble to the
/// output cap.
fn assert_on_topic(answer: &str) {
    let answer = answer.trim();
    assert!(answer.contains("40") || answer.contains("25 + 15"), "about the question: {answer:?}");
    assert!(answer.len() <= 300, "a short answer, not a ramble: {answer:?}");
}

async fn history(workspace: &Workspace) -> Vec<Message> {
    let list = workspace.run(&["history", "list"], &[]).await;
    let session = stdout(&list).split_whitespace().next().expect("a session id").to_owned();
    let show = workspace.run(&["history", "show", &session, "--json"], &[]).await;
    serde_json::from_slice(&show.stdout).expect("history --json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_job_answers_with_the_local_model_and_no_key() {
    let Some(path) = model_path() else { return };
    let workspace = Workspace::with_config(&local_config(&path));
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "{}", stderr(&init));
    let output = workspace.run(&["chat", "What is 25 + 15?"], &[]).await;
    let out = stdout(&output);
    assert!(output.status.success(), "{}\n{out}", stderr(&output));
    assert!(stderr(&output).contains("local model"), "says so in one line: {}", stderr(&output));
    let messages = history(&workspace).await;
    assert_eq!(messages[0].status, Status::Processed);
    let answer = messages.iter().rev().find(|m| m.role == Role::Assistant && m.message_type == MessageType::Text);
    let answer = answer.expect("a final answer");
    assert_on_topic(&answer.content);
    assert!(out.contains(answer.content.trim().lines().next().unwrap_or_default()), "printed: {out}");
    assert!(answer.metadata.turn_metrics.as_ref().is_some_and(|m| m.context_tokens > 0), "real usage reported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_turn_with_the_local_model_keeps_the_trajectory_shape() {
    let Some(path) = model_path() else { return };
    // The small-model profile offers no tools; this model is told it may use them.
    let workspace = Workspace::with_config(&format!("{}tools = true\n", local_config(&path)));
    let init = workspace.run(&["init", "--no-model"], &[]).await;
    assert!(init.status.success(), "{}", stderr(&init));
    let prompt = "Use the run_shell_command tool to run `echo 40` and tell me what it printed.";
    let output = workspace.run(&["chat", prompt], &[]).await;
    assert!(output.status.success(), "{}\n{}", stderr(&output), stdout(&output));
    // Whatever the small model chose, the trajectory has the spec's shape: every call has one
    // result answering it, the turn ends with one final text, and the root is processed.
    let messages = history(&workspace).await;
    assert_eq!((messages[0].role, messages[0].status), (Role::User, Status::Processed));
    let calls: Vec<&Message> = messages.iter().filter(|m| m.message_type == MessageType::ToolCall).collect();
    for call in &calls {
        let results = messages.iter().filter(|m| m.parent_id.as_ref() == Some(&call.id)).count();
        assert_eq!(results, 1, "call {} has exactly one result", call.id);
    }
    let last = messages.last().expect("messages");
    assert_eq!((last.role, last.message_type), (Role::Assistant, MessageType::Text));
    eprintln!("local model made {} tool call(s)", calls.len());
}

/// `kesoku chat` in a folder with no config, as on a fresh checkout: no `-c`, the default
/// `kesoku.toml`, everything set up in the current folder.
async fn chat_in(dir: &std::path::Path, cache: &std::path::Path) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kesoku"))
        .args(["chat", "What is 25 + 15?"])
        .current_dir(dir)
        .env_remove("KESOKU_CONFIG")
        .env("KESOKU_MODELS_CACHE", cache)
        // Nothing may be downloaded: a cache miss fails at once against a closed port.
        .env("KESOKU_PYPI_INDEX_URL", "http://127.0.0.1:9/pypi")
        .output()
        .await
        .expect("run kesoku")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_chat_in_an_empty_folder_sets_up_and_answers() {
    let Some(path) = model_path() else { return };
    // The shared cache holds the default model under its own name.
    let cache = tempfile::tempdir().expect("temp dir");
    std::os::unix::fs::symlink(&path, cache.path().join(kesoku_local::DEFAULT_MODEL_FILE)).expect("link");
    let dir = tempfile::tempdir().expect("temp dir");

    let output = chat_in(dir.path(), cache.path()).await;
    let (out, err) = (stdout(&output), stderr(&output));
    assert!(output.status.success(), "{err}\n{out}");
    let setup: Vec<&str> = err.lines().filter(|line| line.starts_with("kesoku: ")).collect();
    assert_eq!(setup.len(), 3, "one line each for the config, the workspace and the model: {err}");
    assert!(setup[0].starts_with("kesoku: wrote kesoku.toml"), "{err}");
    assert!(setup[1].starts_with("kesoku: created the workspace"), "{err}");
    assert!(setup[2].starts_with("kesoku: copying the local model"), "{err}");
    assert_on_topic(out.lines().take_while(|line| !line.starts_with("[turn ")).collect::<Vec<_>>().join("\n").as_str());
    for made in ["kesoku.toml", ".kesoku/kesoku.db", ".kesoku/sessions"] {
        assert!(dir.path().join(made).exists(), "{made} was made");
    }
    let model = dir.path().join(".kesoku/models").join(kesoku_local::DEFAULT_MODEL_FILE);
    assert_eq!(std::fs::metadata(&model).expect("model copied").len(), std::fs::metadata(&path).expect("source").len());

    // The second time, nothing is set up again.
    let again = chat_in(dir.path(), cache.path()).await;
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(!stderr(&again).lines().any(|line| line.starts_with("kesoku: ")), "{}", stderr(&again));
}

#[tokio::test]
async fn models_pull_copies_a_local_file_and_refuses_a_corrupt_one_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let corrupt = dir.path().join("broken.gguf");
    std::fs::write(&corrupt, b"GGUF but not really a model").expect("write");
    let workspace = Workspace::with_config("");
    let target = dir.path().join("models");
    let output = workspace
        .run(&["models", "pull", corrupt.to_str().expect("utf-8 path"), "--dir", target.to_str().expect("utf-8")], &[])
        .await;
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("broken.gguf"), "names the file: {err}");
    assert!(!target.join("broken.gguf").exists(), "a failed pull leaves no file");

    let Some(path) = model_path() else { return };
    let output = workspace.run(&["models", "pull", &path, "--dir", target.to_str().expect("utf-8")], &[]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let pulled = stdout(&output).trim().to_owned();
    assert_eq!(std::fs::metadata(&pulled).expect("pulled").len(), std::fs::metadata(&path).expect("source").len());
}
