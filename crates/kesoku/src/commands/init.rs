//! `kesoku init`: write the commented config template and create the workspace.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::cli::InitArgs;
use crate::config::{Config, TEMPLATE};
use crate::wiring;

pub async fn run(path: &Path, args: &InitArgs) -> anyhow::Result<ExitCode> {
    if path.exists() && !args.force {
        println!("{} exists; keeping it (use --force to overwrite)", path.display());
    } else {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(path, TEMPLATE).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let config = Config::load(path)?;
    let sessions = config.workspace_dir.join("sessions");
    std::fs::create_dir_all(&sessions).with_context(|| format!("creating {}", sessions.display()))?;
    let handle = wiring::open_store(&config, true).await?;
    if handle.store.current_rev().await.is_err() {
        bail!("the store at {} is not readable", config.database_url);
    }
    if !args.no_model {
        for (name, entry) in &config.models {
            let crate::config::ModelEntry::Local(local) = entry else { continue };
            if local.path.exists() {
                continue;
            }
            let file = local.path.file_name().and_then(|f| f.to_str()).unwrap_or_default();
            if file != kesoku_local::DEFAULT_MODEL_FILE {
                println!(
                    "model `{name}`: {} is missing; fetch it with `kesoku models pull SOURCE --dir DIR`",
                    local.path.display()
                );
                continue;
            }
            let dir = local.path.parent().unwrap_or(Path::new("."));
            println!(
                "fetching the local model `{name}` ({}) into {}…",
                kesoku_local::DEFAULT_MODEL_SOURCE,
                dir.display()
            );
            let pulled = super::models::pull_into(kesoku_local::DEFAULT_MODEL_SOURCE, dir).await?;
            println!("model ready: {}", pulled.display());
        }
    }
    println!("workspace ready: {}", config.workspace_dir.display());
    println!("store ready: {}", config.database_url);
    Ok(ExitCode::SUCCESS)
}
