//! Helpers of the reliability suite: a temporary workspace with a `kesoku.toml` pointing at a
//! local mock model, the real `kesoku` binary run on it, and the store read back directly.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use kesoku_core::{Message, MessageFilter, MessageType, Role, Status};
use kesoku_store::StoreHandle;
use tempfile::TempDir;

/// The environment variable the mock model's key is read from in these tests.
pub const KEY_VAR: &str = "KESOKU_RELIABILITY_MODEL_KEY";

/// A temporary folder with a `kesoku.toml`.
pub struct Workspace {
    pub dir: TempDir,
    pub config: PathBuf,
}

impl Workspace {
    /// A workspace whose model `mock` is the OpenAI-style server at `base_url`, plus `extra` TOML.
    pub fn new(base_url: &str, extra: &str) -> Workspace {
        let dir = tempfile::Builder::new().prefix("kesoku-reliability-").tempdir().expect("temp dir");
        let config = dir.path().join("kesoku.toml");
        let text = format!(
            "[agent]\nmodel = \"mock\"\n{extra}\n\n[models.mock]\nprovider = \"openai\"\nmodel = \"mock-model\"\n\
             base_url = \"{base_url}\"\napi_key_env = \"{KEY_VAR}\"\n\n[models.mock.retry]\nmax_attempts = 2\n\
             base_delay_seconds = 0.05\nmax_delay_seconds = 0.5\n"
        );
        std::fs::write(&config, text).expect("write config");
        Workspace { dir, config }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The store URL `kesoku init` creates for this config.
    pub fn store_url(&self) -> String {
        format!("sqlite://{}", self.path().join(".kesoku").join("kesoku.db").display())
    }

    /// `kesoku -c CONFIG args…`, with `env` set and nothing inherited that names a config.
    pub fn command(&self, args: &[&str], env: &[(&str, &str)]) -> tokio::process::Command {
        let binary = kesoku_bench::binaries::kesoku_binary().unwrap_or_else(|error| panic!("{error}"));
        let mut command = tokio::process::Command::new(binary);
        command
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .current_dir(self.path())
            .env_remove("KESOKU_CONFIG")
            .env_remove("KESOKU_LOG")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        command
    }

    pub async fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let output = self.command(args, env).output();
        tokio::time::timeout(Duration::from_secs(60), output)
            .await
            .expect("kesoku finished within a minute")
            .expect("run kesoku")
    }

    /// `kesoku init` (the config file is kept).
    pub async fn init(&self) {
        let output = self.run(&["init", "--no-model"], &[]).await;
        assert!(output.status.success(), "init failed: {}", text(&output.stderr));
    }

    pub async fn store(&self) -> StoreHandle {
        kesoku_store::open_existing(&self.store_url()).await.expect("open the workspace's store")
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Root user messages of the store.
pub async fn roots(store: &StoreHandle) -> Vec<Message> {
    let filter = MessageFilter::default().with_roles(&[Role::User]).with_types(&[MessageType::Text]);
    store.store.list_messages(&filter).await.expect("list").into_iter().filter(|m| m.parent_id.is_none()).collect()
}

pub fn is_terminal(status: Status) -> bool {
    matches!(status, Status::Processed | Status::Error | Status::Interrupted)
}

/// Wait until every root user message is terminal.
pub async fn wait_all_terminal(store: &StoreHandle, limit: Duration) -> Vec<Message> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let roots = roots(store).await;
        if roots.iter().all(|m| is_terminal(m.status)) {
            return roots;
        }
        if tokio::time::Instant::now() > deadline {
            let open: Vec<String> =
                roots.iter().filter(|m| !is_terminal(m.status)).map(|m| format!("{} {}", m.id, m.status)).collect();
            panic!("{} messages never finished: {open:?}", open.len());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The agent's answers to `root`: assistant texts whose parent is the root, minus notifications
/// and the error notification.
pub fn answers_of<'a>(history: &'a [Message], root: &Message) -> Vec<&'a Message> {
    history
        .iter()
        .filter(|m| {
            m.parent_id.as_ref() == Some(&root.id)
                && m.role == Role::Assistant
                && m.message_type == MessageType::Text
                && !m.is_notification()
                && !m.content.starts_with("⚠️")
        })
        .collect()
}

/// Whether `root` got the error notification.
pub fn has_error_notification(history: &[Message], root: &Message) -> bool {
    history
        .iter()
        .any(|m| m.parent_id.as_ref() == Some(&root.id) && m.role == Role::Assistant && m.content.starts_with("⚠️"))
}

/// A running `kesoku start`, its log lines kept for inspection.
pub struct Service {
    pub child: tokio::process::Child,
    /// The HTTP API's address, when `[http]` is configured.
    pub addr: Option<std::net::SocketAddr>,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Service {
    /// Start the service with `-v` (plus `extra_args` before `start`) and wait until it says it
    /// started.
    pub async fn start(workspace: &Workspace, extra_args: &[&str], env: &[(&str, &str)]) -> Service {
        use tokio::io::AsyncBufReadExt;
        let mut args: Vec<&str> = vec!["-v"];
        args.extend_from_slice(extra_args);
        args.push("start");
        let mut child = workspace
            .command(&args, env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the service");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let log = std::sync::Arc::clone(&log);
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    log.lock().expect("log").push(strip_ansi(&line));
                }
            });
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let started = log.lock().expect("log").iter().any(|line| line.contains("kesoku service started"));
            if started {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the service exited ({status}): {}", log.lock().expect("log").join("\n"));
            }
            assert!(tokio::time::Instant::now() < deadline, "the service did not start in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let addr =
            log.lock().expect("log").iter().find(|line| line.contains("HTTP API and console listening")).and_then(
                |line| {
                    let start = line.find("addr=")? + 5;
                    line[start..].split_whitespace().next()?.parse().ok()
                },
            );
        Service { child, addr, log }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr.expect("the service serves HTTP"))
    }

    pub fn log_text(&self) -> String {
        self.log.lock().expect("log").join("\n")
    }

    /// SIGTERM, then wait for a clean exit.
    pub async fn stop(mut self) -> String {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id().expect("running")).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the service stops")
            .expect("reap");
        // Let the log readers take the last lines.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = self.log_text();
        assert!(status.success(), "a clean stop exits 0 ({status}): {log}");
        log
    }
}

pub use kesoku_bench::bench::memory::strip_ansi;
