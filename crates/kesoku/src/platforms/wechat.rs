//! `[[chatbots.wechat]]`: the bot token (from `token_env`, else the one `kesoku wechat pair`
//! stored), the long-poll loop and the delivery routine; and `kesoku wechat pair`.
//!
//! Pairing stores `{token, bot_id, base_url, user_id}` in
//! `<config dir>/kesoku-secrets/wechat-<id>.json`, mode 0600 in a 0700 folder, never in the
//! config file and never printed. The folder sits beside the config (like `kesoku.env`), not in
//! the workspace (`.kesoku` by default), which the agent's file tools can read.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use kesoku_chatbots::Chatbot;
use kesoku_chatbots::wechat::pair::{PairOptions, Pairing, StdinCodes, pair as run_pairing};
use kesoku_chatbots::wechat::{BotToken, WeChat, WeChatConfig};
use tokio::task::JoinHandle;

use super::Platform;
use crate::config::Config;

/// Where the pairing of entry `id` is kept.
pub fn pairing_path(config: &Config, id: &str) -> PathBuf {
    config.resolve_path(&format!("kesoku-secrets/wechat-{id}.json"))
}

fn read_pairing(path: &Path) -> anyhow::Result<Option<Pairing>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let pairing = serde_json::from_str(&text).with_context(|| {
                format!("{} is not a wechat pairing file: run `kesoku wechat pair` again", path.display())
            })?;
            Ok(Some(pairing))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
    }
}

fn write_pairing(path: &Path, pairing: &Pairing) -> anyhow::Result<()> {
    let dir = path.parent().context("the pairing file has no folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let text = serde_json::to_string_pretty(pairing).context("encoding the pairing")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
        // Written to a private temporary file, then renamed: never readable by others, never
        // half-written.
        let temporary = path.with_extension("json.tmp");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .with_context(|| format!("creating {}", temporary.display()))?;
        std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))?;
        file.write_all(text.as_bytes()).with_context(|| format!("writing {}", temporary.display()))?;
        file.sync_all()?;
        std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))?;
    }
    #[cfg(not(unix))]
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub fn start(platform: &Platform<'_>, entry: &WeChatConfig) -> anyhow::Result<Vec<JoinHandle<()>>> {
    let context = || platform.entry("wechat", &entry.id);
    let path = pairing_path(platform.config, &entry.id);
    let pairing = read_pairing(&path).with_context(context)?;
    let (token, paired_user, config) = match (&entry.token_env, pairing) {
        (Some(variable), pairing) => {
            let Some(token) = std::env::var(variable).ok().filter(|token| !token.trim().is_empty()) else {
                bail!("{}: the environment variable `{variable}` (token_env) is not set", context());
            };
            (BotToken::new(token.trim()), pairing.and_then(|p| p.user_id), entry.clone())
        }
        (None, Some(pairing)) => {
            let mut config = entry.clone();
            // The address the server named at pairing, unless the config names another.
            if let Some(base_url) =
                pairing.base_url.clone().filter(|_| entry.base_url == WeChatConfig::default().base_url)
            {
                config.base_url = base_url;
            }
            (pairing.bot_token(), pairing.user_id.clone(), config)
        }
        (None, None) => bail!(
            "{}: this wechat bot is not paired: run `kesoku wechat pair --id {}` and scan the QR code (or set token_env)",
            context(),
            entry.id
        ),
    };
    let wechat = WeChat::new(
        platform.gateway.clone(),
        config,
        token,
        paired_user,
        platform.staging(),
        Arc::clone(&platform.control),
    )
    .with_context(context)?;
    let chatbot: Arc<dyn Chatbot> = Arc::new(wechat.chatbot());
    let delivery = platform.spawn_delivery(chatbot);
    let shutdown = platform.shutdown.clone();
    let poll = tokio::spawn(wechat.run(shutdown));
    Ok(vec![delivery, poll])
}

/// `kesoku wechat pair [--id ID]`.
pub async fn pair(config: &Config, id: Option<&str>) -> anyhow::Result<std::process::ExitCode> {
    let entries = &config.chatbots.wechat;
    let entry = match id {
        Some(id) => entries
            .iter()
            .find(|entry| entry.id == id)
            .with_context(|| format!("{}: no [[chatbots.wechat]] entry has id = \"{id}\"", config.path.display()))?,
        None => match entries.as_slice() {
            [only] => only,
            [] => bail!(
                "{}: there is no [[chatbots.wechat]] entry: add one (an empty table is enough) and pair again",
                config.path.display()
            ),
            [..] => bail!("{}: several [[chatbots.wechat]] entries: name one with --id", config.path.display()),
        },
    };
    let mut out = std::io::stdout();
    let pairing = run_pairing(&entry.base_url, &mut out, &mut StdinCodes, PairOptions::default())
        .await
        .context("pairing failed")?;
    let path = pairing_path(config, &entry.id);
    write_pairing(&path, &pairing)?;
    println!("Stored the bot's credentials in {} (mode 0600).", path.display());
    match &pairing.user_id {
        Some(user) if entry.allowed_users.is_empty() => {
            println!("The bot answers {user} (the account that scanned); set allowed_users to answer others.")
        }
        Some(_) | None => {}
    }
    println!("Run `kesoku start` to bring the bot online.");
    Ok(std::process::ExitCode::SUCCESS)
}
