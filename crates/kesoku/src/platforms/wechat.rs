//! `[[chatbots.wechat]]`: the bot token (from `token_env`, else the one `kesoku wechat pair`
//! stored), the long-poll loop and the delivery routine; and `kesoku wechat pair`.

use anyhow::bail;
use kesoku_chatbots::wechat::WeChatConfig;
use tokio::task::JoinHandle;

use super::Platform;

pub fn start(platform: &Platform<'_>, entry: &WeChatConfig) -> anyhow::Result<Vec<JoinHandle<()>>> {
    bail!("{}: the wechat chatbot is not built yet", platform.entry("wechat", &entry.id))
}

/// `kesoku wechat pair [--id ID]`.
pub async fn pair(config: &crate::config::Config, id: Option<&str>) -> anyhow::Result<std::process::ExitCode> {
    bail!("{}: pairing chatbot {id:?} is not built yet", config.path.display())
}
