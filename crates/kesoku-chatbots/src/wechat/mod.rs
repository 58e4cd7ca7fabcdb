//! The WeChat chatbot: a personal-account bot on the iLink bot API (QR pairing, long-polled
//! updates, per-peer context tokens, encrypted CDN media).
//!
//! # The protocol, as its public client shows it
//! The iLink bot API has no published reference; what follows is read from the npm package
//! `@tencent-weixin/openclaw-weixin` (2.4.x), a public client of it.
//!
//! - Base URL `https://ilinkai.weixin.qq.com`; CDN `https://novac2c.cdn.weixin.qq.com/c2c`.
//! - Every call: `POST {base}/ilink/bot/<name>`, JSON with `base_info: {channel_version,
//!   bot_agent}`, headers `AuthorizationType: ilink_bot_token`, `Authorization: Bearer
//!   <bot_token>`, `X-WECHAT-UIN: base64(decimal text of a random uint32)`.
//! - Pairing (no token): `POST ilink/bot/get_bot_qrcode?bot_type=3` → `{qrcode,
//!   qrcode_img_content}` (the URL to draw); `GET ilink/bot/get_qrcode_status?qrcode=…`, held
//!   up to ~35 s → `{status: wait|scaned|confirmed|expired, bot_token, ilink_bot_id, baseurl,
//!   ilink_user_id}`.
//! - `getupdates {get_updates_buf}` → `{ret, errcode, errmsg, msgs: [WeixinMessage],
//!   get_updates_buf, longpolling_timeout_ms}`; held up to ~35 s; the buf is an opaque cursor
//!   the client keeps and sends back ("" at first).
//! - `WeixinMessage`: `message_id` (uint64), `seq`, `from_user_id`, `to_user_id`, `client_id`,
//!   `create_time_ms`, `group_id`, `message_type` (1 user, 2 bot), `message_state` (2
//!   finished), `item_list`, `context_token`. Item `type`: 1 text (`text_item.text`), 2 image
//!   (`image_item.media`, `aeskey` hex), 3 voice (`voice_item.media`, `text` = the server's
//!   transcription), 4 file (`file_item.media`, `file_name`, `md5`, `len`), 5 video.
//! - `sendmessage {msg: WeixinMessage}` with `to_user_id`, `client_id`, `message_type: 2`,
//!   `message_state: 2`, one item, and the peer's latest `context_token` → `{message_id}`.
//! - `getconfig {ilink_user_id, context_token}` → `{typing_ticket}`; `sendtyping
//!   {ilink_user_id, typing_ticket, status: 1 typing | 2 cancel}`.
//! - `getuploadurl {filekey, media_type (1 image, 2 video, 3 file), to_user_id, rawsize,
//!   rawfilemd5, filesize (ciphertext), no_need_thumb, aeskey (hex)}` → `{upload_param,
//!   upload_full_url}`; the encrypted bytes are POSTed there (`application/octet-stream`) and
//!   the CDN answers with `x-encrypted-param`, the new item's `encrypt_query_param`.
//! - Media `CDNMedia {encrypt_query_param, aes_key, encrypt_type, full_url}`; download from
//!   `full_url` or `{cdn}/download?encrypted_query_param=…`; AES-128-ECB with PKCS#7; `aes_key`
//!   is base64 of 16 raw bytes or base64 of 32 hex characters.
//! - A non-zero `ret`/`errcode` is a failure; `-14` means the session expired (pair again).
//!
//! Assumptions beyond the client: a group message carries `group_id` and is answered by
//! sending to the group id with the group's latest `context_token`; the server drops a repeat
//! `client_id` (the fake does; if the real one does not, a part in flight during a crash can be
//! shown twice, never lost).
//!
//! Modules: [`config`] (the `[[chatbots.wechat]]` table), [`api`] (the calls), [`crypto`],
//! [`media`], [`text`] (Markdown → plain text), [`inbound`] (the poll), [`outbound`] (the
//! [`crate::Chatbot`]), [`pair`] (QR login).

pub mod api;
pub mod config;
pub mod crypto;
pub mod inbound;
pub mod media;
pub mod outbound;
pub mod pair;
pub mod text;

use std::sync::Arc;

use chrono_tz::Tz;
use kesoku_gateway::Gateway;
use tokio_util::sync::CancellationToken;

pub use self::api::BotToken;
pub use self::config::{WeChatConfig, WeChatConfigError};
pub use self::inbound::PollOptions;
pub use self::outbound::WeChatChatbot;
pub use self::pair::Pairing;
use crate::control::SessionControl;
use crate::staging::Staging;

/// What the poll and the delivery side share.
pub(crate) struct Shared {
    gateway: Gateway,
    config: WeChatConfig,
    client: api::ILinkClient,
    cdn: media::Cdn,
    staging: Staging,
    control: Arc<dyn SessionControl>,
    /// The account that paired: answered when `allowed_users` is empty.
    paired_user: Option<String>,
    timezone: Tz,
    poll: PollOptions,
}

impl Shared {
    fn admits(&self, user: &str) -> bool {
        if self.config.allowed_users.is_empty() {
            self.paired_user.as_deref() == Some(user)
        } else {
            self.config.allowed_users.iter().any(|allowed| allowed == user)
        }
    }

    fn media_limit(&self) -> u64 {
        media::MAX_MEDIA_BYTES.min(self.staging.max_file_bytes)
    }
}

/// One WeChat bot account: [`WeChat::run`] polls, [`WeChat::chatbot`] delivers.
pub struct WeChat {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WeChat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeChat").field("id", &self.shared.config.id).finish_non_exhaustive()
    }
}

impl WeChat {
    /// A bot for `config` with `token`; `paired_user` is who paired it (answered when the
    /// allow-list is empty). The API address is `base_url` when given (the one pairing named),
    /// else the configured one.
    pub fn new(
        gateway: Gateway,
        config: WeChatConfig,
        token: BotToken,
        paired_user: Option<String>,
        staging: Staging,
        control: Arc<dyn SessionControl>,
    ) -> Result<Self, WeChatConfigError> {
        Self::with_options(gateway, config, token, paired_user, staging, control, PollOptions::default())
    }

    /// [`WeChat::new`] with the poll's timing (tests shorten it).
    pub fn with_options(
        gateway: Gateway,
        config: WeChatConfig,
        token: BotToken,
        paired_user: Option<String>,
        staging: Staging,
        control: Arc<dyn SessionControl>,
        poll: PollOptions,
    ) -> Result<Self, WeChatConfigError> {
        let timezone = config.validate()?;
        let client = api::ILinkClient::new(&config.base_url, token);
        let cdn_limit = media::MAX_MEDIA_BYTES.min(staging.max_file_bytes);
        let cdn = media::Cdn::new(client.http().clone(), &config.cdn_base_url, cdn_limit);
        if config.allowed_users.is_empty() && paired_user.is_none() {
            tracing::warn!(
                chatbot_id = %config.id,
                "wechat: allowed_users is empty and no paired user is known, so nobody is answered: set allowed_users or run `kesoku wechat pair`"
            );
        }
        Ok(WeChat {
            shared: Arc::new(Shared { gateway, config, client, cdn, staging, control, paired_user, timezone, poll }),
        })
    }

    pub fn chatbot_id(&self) -> &str {
        &self.shared.config.id
    }

    /// The delivery side.
    pub fn chatbot(&self) -> WeChatChatbot {
        WeChatChatbot::new(Arc::clone(&self.shared))
    }

    /// Poll and ingest until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        inbound::run(self.shared, shutdown).await;
    }
}
