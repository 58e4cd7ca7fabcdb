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
    #[error(
        "this WeChat account is already bound to a bot here: the stored pairing still works (delete it and pair again to start over)"
    )]
    AlreadyBound,
    #[error("nobody confirmed the QR code in time: run `kesoku wechat pair` again")]
    TimedOut,
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

/// How a pairing runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairOptions {
    /// Pause between status polls (the reference client: 1 s).
    pub poll_pause: Duration,
    /// Give up after this long.
    pub timeout: Duration,
}

impl Default for PairOptions {
    fn default() -> Self {
        PairOptions { poll_pause: Duration::from_secs(1), timeout: Duration::from_secs(8 * 60) }
    }
}

/// Where a pairing asks for the number WeChat shows on the phone (`need_verifycode`).
pub trait VerifyCodes: Send {
    fn ask(&mut self, prompt: &str) -> std::io::Result<String>;
}

/// Reads the number from standard input (blocking: pairing is an interactive command that
/// does nothing else meanwhile).
#[derive(Debug, Default)]
pub struct StdinCodes;

impl VerifyCodes for StdinCodes {
    fn ask(&mut self, _prompt: &str) -> std::io::Result<String> {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        Ok(line.trim().to_owned())
    }
}

/// Pair a bot at `base_url`, showing codes and progress on `out`.
pub async fn pair(
    base_url: &str,
    out: &mut (dyn Write + Send),
    codes: &mut dyn VerifyCodes,
    options: PairOptions,
) -> Result<Pairing, PairError> {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + options.timeout;
    let mut poll_base = base_url.to_owned();
    let mut shown = 0;
    let mut qrcode = None;
    let mut scanned = false;
    let mut verify_code: Option<String> = None;
    loop {
        if tokio::time::Instant::now() >= deadline {
            return Err(PairError::TimedOut);
        }
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
                poll_base = base_url.to_owned();
                qrcode.insert(fresh.qrcode)
            }
        };
        let status = match get_qrcode_status(&http, &poll_base, code, verify_code.as_deref()).await {
            Ok(status) => status,
            Err(error @ (ApiError::Transient { .. } | ApiError::TimedOut { .. })) => {
                tracing::debug!(%error, "polling the qr status failed; trying again");
                tokio::time::sleep(options.poll_pause).await;
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
            "expired" | "verify_code_blocked" => {
                if shown >= MAX_QR_CODES {
                    return Err(PairError::Expired);
                }
                let why = if status.status == "expired" { "expired" } else { "was blocked after wrong numbers" };
                writeln!(out, "The QR code {why}; here is a new one.")?;
                qrcode = None;
                scanned = false;
                verify_code = None;
                continue;
            }
            "need_verifycode" => {
                let prompt = if verify_code.is_some() {
                    "That number did not match; type the number WeChat shows on your phone: "
                } else {
                    "Type the number WeChat shows on your phone: "
                };
                write!(out, "{prompt}")?;
                out.flush()?;
                verify_code = Some(codes.ask(prompt)?);
                continue;
            }
            "binded_redirect" => return Err(PairError::AlreadyBound),
            "scaned_but_redirect" => {
                if let Some(host) = status.redirect_host.filter(|host| !host.is_empty()) {
                    poll_base = format!("https://{host}");
                }
            }
            "scaned" if !scanned => {
                scanned = true;
                verify_code = None;
                writeln!(out, "Scanned: confirm on your phone.")?;
                out.flush()?;
            }
            _ => {}
        }
        tokio::time::sleep(options.poll_pause).await;
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
