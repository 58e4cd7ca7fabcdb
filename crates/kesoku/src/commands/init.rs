//! `kesoku init`: write the commented config template and create the workspace; and the same
//! default set-up made by `kesoku chat` when there is no config yet ([`first_run`]), so that a
//! fresh checkout answers with one command.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::cli::InitArgs;
use crate::config::{Config, ModelEntry, TEMPLATE};
use crate::wiring;

pub async fn run(path: &Path, args: &InitArgs) -> anyhow::Result<ExitCode> {
    if path.exists() && !args.force {
        println!("{} exists; keeping it (use --force to overwrite)", path.display());
    } else {
        write_template(path)?;
        println!("wrote {}", path.display());
    }
    let config = Config::load(path)?;
    create_workspace(&config).await?;
    if !args.no_model {
        fetch_local_models(&config, &|line| println!("{line}")).await?;
    }
    println!("workspace ready: {}", config.workspace_dir.display());
    println!("store ready: {}", config.database_url);
    Ok(ExitCode::SUCCESS)
}

/// The set-up `kesoku chat` makes when `path` does not exist: the template as the config, the
/// workspace and its store, and the local model, each said in one line on stderr (stdout is
/// the answer's). Returns the loaded config.
pub async fn first_run(path: &Path) -> anyhow::Result<Config> {
    write_template(path)?;
    eprintln!(
        "kesoku: wrote {} (the default config: the embedded local model; edit it or run `kesoku init --force` to choose)",
        path.display()
    );
    let config = Config::load(path)?;
    create_workspace(&config).await?;
    eprintln!("kesoku: created the workspace {} (database and session folders)", config.workspace_dir.display());
    fetch_local_models(&config, &|line| eprintln!("kesoku: {line}")).await?;
    Ok(config)
}

fn write_template(path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, TEMPLATE).with_context(|| format!("writing {}", path.display()))
}

/// The session folders and the store.
async fn create_workspace(config: &Config) -> anyhow::Result<()> {
    let sessions = config.workspace_dir.join("sessions");
    std::fs::create_dir_all(&sessions).with_context(|| format!("creating {}", sessions.display()))?;
    let handle = wiring::open_store(config, true).await?;
    if handle.store.current_rev().await.is_err() {
        bail!("the store at {} is not readable", config.database_url);
    }
    Ok(())
}

/// Fetch every configured local model whose file is missing and is the default model (other
/// files are named, not guessed at), telling `say` what happens in one line per model.
async fn fetch_local_models(config: &Config, say: &dyn Fn(String)) -> anyhow::Result<()> {
    for (name, entry) in &config.models {
        let ModelEntry::Local(local) = entry else { continue };
        if local.path.exists() {
            continue;
        }
        let file = local.path.file_name().and_then(|f| f.to_str()).unwrap_or_default();
        if file != kesoku_local::DEFAULT_MODEL_FILE {
            say(format!(
                "model `{name}`: {} is missing; fetch it with `kesoku models pull SOURCE --dir DIR`",
                local.path.display()
            ));
            continue;
        }
        let dir = local.path.parent().unwrap_or(Path::new("."));
        match super::models::default_model_copy() {
            Some(copy) => {
                say(format!("copying the local model `{name}` from {} into {}", copy.display(), dir.display()))
            }
            None => say(format!(
                "fetching the local model `{name}` ({}, about 98 MB, once) into {}",
                kesoku_local::DEFAULT_MODEL_SOURCE,
                dir.display()
            )),
        }
        super::models::pull_into(kesoku_local::DEFAULT_MODEL_SOURCE, dir).await?;
    }
    Ok(())
}
