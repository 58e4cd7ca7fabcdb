//! Helpers to run the binary on a fresh workspace.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use tempfile::TempDir;

/// A temp folder with a `kesoku.toml`.
pub struct Workspace {
    pub dir: TempDir,
    pub config: PathBuf,
}

impl Workspace {
    /// A workspace whose config is the template plus `extra` TOML.
    pub fn with_config(extra: &str) -> Workspace {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("kesoku.toml");
        std::fs::write(&config, extra).expect("write config");
        Workspace { dir, config }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Run `kesoku -c CONFIG args…` with extra environment variables.
    pub async fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_kesoku"));
        command.arg("-c").arg(&self.config).args(args).current_dir(self.path()).env_remove("KESOKU_CONFIG");
        for (key, value) in env {
            command.env(key, value);
        }
        command.output().await.expect("run kesoku")
    }
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A `[models.mock]` entry pointing at a mock OpenAI-style server.
pub fn mock_model(base_url: &str) -> String {
    format!(
        "[agent]\nmodel = \"mock\"\n\n[models.mock]\nprovider = \"openai\"\nmodel = \"mock-model\"\nbase_url = \"{base_url}\"\napi_key_env = \"KESOKU_TEST_MOCK_KEY\"\n\n[models.mock.retry]\nmax_attempts = 2\nbase_delay_seconds = 0.05\nmax_delay_seconds = 0.1\n"
    )
}

/// How long a service test waits for one thing.
pub const SERVICE_WAIT: Duration = Duration::from_secs(20);

/// Poll until `condition` holds, for at most [`SERVICE_WAIT`].
pub async fn eventually<F, Fut>(what: &str, condition: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + SERVICE_WAIT;
    while !condition().await {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `kesoku start` running in the background, its JSON log going to a file.
pub struct Service {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Service {
    /// Start `kesoku start` on `workspace` with `env` added (`KESOKU_LOG` unset unless given).
    pub fn spawn(workspace: &Workspace, log_name: &str, env: &[(&str, &str)]) -> Service {
        Self::spawn_with(workspace, log_name, env, &["start"])
    }

    /// Start `kesoku start …` with these arguments (`["start", "--role", "worker"]`).
    pub fn spawn_with(workspace: &Workspace, log_name: &str, env: &[(&str, &str)], args: &[&str]) -> Service {
        let log = workspace.path().join(log_name);
        let file = std::fs::File::create(&log).expect("create the log file");
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_kesoku"));
        command
            .arg("-c")
            .arg(&workspace.config)
            .args(["--log-format", "json"])
            .args(args)
            .current_dir(workspace.path())
            .env_remove("KESOKU_CONFIG")
            .env_remove("KESOKU_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        Service { child: command.spawn().expect("start kesoku"), log }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id().expect("a running service")).expect("a pid"))
    }

    /// The log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The JSON log lines so far.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        self.log()
            .lines()
            .map(|line| {
                serde_json::from_str(line).unwrap_or_else(|error| panic!("a log line is not JSON ({error}): {line}"))
            })
            .collect()
    }

    pub fn logged(&self, message: &str) -> Option<serde_json::Value> {
        self.log_lines().into_iter().find(|line| line["fields"]["message"] == message)
    }

    /// SIGTERM, then wait for the exit.
    /// Wait until the service logs `message`.
    pub async fn wait_logged(&self, message: &str) {
        eventually(&format!("the log line {message:?}"), || async { self.logged(message).is_some() }).await;
    }

    /// The base URL (`http://ADDR`) of the HTTP API, once the service says it listens.
    pub async fn api_base(&self) -> String {
        const LISTENING: &str = "HTTP API and console listening";
        self.wait_logged(LISTENING).await;
        let logged = self.logged(LISTENING).unwrap_or_default();
        let addr = logged["fields"]["addr"].as_str().expect("the listening line names its address");
        format!("http://{addr}")
    }

    pub async fn terminate(mut self) -> (std::process::ExitStatus, Service) {
        kill(self.pid(), Signal::SIGTERM).expect("send SIGTERM");
        let status = tokio::time::timeout(SERVICE_WAIT, self.child.wait())
            .await
            .expect("the service exits after SIGTERM")
            .expect("wait for the service");
        (status, self)
    }

    /// SIGKILL: no shutdown path runs, as in a power cut or an OOM kill.
    pub async fn kill(mut self) {
        kill(self.pid(), Signal::SIGKILL).expect("send SIGKILL");
        tokio::time::timeout(SERVICE_WAIT, self.child.wait())
            .await
            .expect("the service dies")
            .expect("wait for the service");
    }
}
