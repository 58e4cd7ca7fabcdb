//! QR pairing: `get_bot_qrcode`, the QR shown in the terminal (Unicode half blocks) with its
//! URL, then `get_qrcode_status` until the phone confirms (an expired code is replaced a few
//! times). The result is the bot's credentials; storing them is the binary's job.

use std::io::Write;
use std::time::Duration;

use qrcode::QrCode;
use qrcode::render::unicode::Dense1x2;
use serde::{Deserialize, Serialize};

use super::api::{ApiError, BotToken, get_bot_qrcode, get_qrcode_status};

/// How many QR codes are shown before giving up.
pub const MAX_QR_CODES: usize = 3;

/// What pairing gives: the bot token and who the bot is. Its `Debug` hides the token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pairing {
    pub token: String,
    pub bot_id: String,
    /// The API address the server named for this bot (absent: the configured one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The WeChat user who scanned the code (answered when `allowed_users` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
}

impl Pairing {
    pub fn bot_token(&self) -> BotToken {
        BotToken::new(self.token.clone())
    }
}

impl std::fmt::Debug for Pairing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pairing")
            .field("token", &"[redacted]")
            .field("bot_id", &self.bot_id)
            .field("base_url", &self.base_url)
            .field("user_id", &self.user_id)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PairError {
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error("the QR code expired {MAX_QR_CODES} times without being confirmed: run `kesoku wechat pair` again")]
    Expired,
    #[error("the server confirmed the pairing without a bot token or bot id")]
    Incomplete,
    #[error("writing to the terminal failed: {0}")]
    Terminal(#[from] std::io::Error),
}

/// The QR code of `content` as Unicode half blocks (two rows of modules per line).
pub fn render_qr(content: &str) -> String {
    match QrCode::new(content.as_bytes()) {
        Ok(code) => code.render::<Dense1x2>().quiet_zone(true).build(),
        Err(error) => format!("(the QR code could not be drawn: {error})"),
    }
}

/// Pair a bot at `base_url`, showing codes and progress on `out`.
pub async fn pair(base_url: &str, out: &mut (dyn Write + Send)) -> Result<Pairing, PairError> {
    let http = reqwest::Client::new();
    let mut shown = 0;
    let mut qrcode = None;
    let mut scanned = false;
    loop {
        let code = match &qrcode {
            Some(code) => code,
            None => {
                shown += 1;
                let fresh = get_bot_qrcode(&http, base_url).await?;
                writeln!(out, "Scan this QR code with WeChat on your phone ({shown}/{MAX_QR_CODES}):\n")?;
                writeln!(out, "{}", render_qr(&fresh.qrcode_img_content))?;
                writeln!(
                    out,
                    "If the code does not show, open this link on your phone:\n{}\n",
                    fresh.qrcode_img_content
                )?;
                out.flush()?;
                qrcode.insert(fresh.qrcode)
            }
        };
        let status = match get_qrcode_status(&http, base_url, code).await {
            Ok(status) => status,
            Err(error @ (ApiError::Transient { .. } | ApiError::TimedOut { .. })) => {
                tracing::debug!(%error, "polling the qr status failed; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        match status.status.as_str() {
            "confirmed" => {
                let (Some(token), Some(bot_id)) = (status.bot_token, status.ilink_bot_id) else {
                    return Err(PairError::Incomplete);
                };
                writeln!(out, "Paired: bot {bot_id}.")?;
                return Ok(Pairing {
                    token,
                    bot_id,
                    base_url: status.baseurl.filter(|url| !url.is_empty()),
                    user_id: status.ilink_user_id.filter(|id| !id.is_empty()),
                });
            }
            "expired" => {
                if shown >= MAX_QR_CODES {
                    return Err(PairError::Expired);
                }
                writeln!(out, "The QR code expired; here is a new one.")?;
                qrcode = None;
                scanned = false;
            }
            "scaned" if !scanned => {
                scanned = true;
                writeln!(out, "Scanned: confirm on your phone.")?;
                out.flush()?;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_qr_is_drawn_with_half_blocks_and_the_token_is_hidden() {
        let drawn = render_qr("https://liteapp.weixin.qq.com/q/abc");
        assert!(drawn.contains('▀') || drawn.contains('▄') || drawn.contains('█'), "{drawn}");
        let pairing = Pairing { token: "s3cret".into(), bot_id: "b@im.bot".into(), base_url: None, user_id: None };
        assert!(!format!("{pairing:?}").contains("s3cret"));
    }
}
