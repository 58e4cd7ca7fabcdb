//! Helpers to run the binary on a fresh workspace.

use std::path::{Path, PathBuf};
use std::process::Output;

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
