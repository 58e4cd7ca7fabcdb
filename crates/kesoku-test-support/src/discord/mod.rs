//! A local fake of Discord (gateway v10 over a websocket, REST v10 over HTTP) for the Discord
//! adapter's tests, written from Discord's published API documentation and checked against how
//! twilight's clients connect.
//!
//! One axum server on `127.0.0.1:0` serves the gateway at `/gateway` (JSON encoding, no
//! compression), the REST API under `/api/v10` and uploaded files under `/attachments`. Tests
//! play the users ([`FakeDiscord::user_says`], [`FakeDiscord::click_button`],
//! [`FakeDiscord::slash_command`], [`FakeDiscord::redeliver`]), inject faults ([`FakeDiscord::drop_connections`],
//! [`FakeDiscord::rate_limit_next`], [`FakeDiscord::fail_next`]) and read back what the bot did
//! ([`FakeDiscord::messages`], [`FakeDiscord::requests`], …) or wait for it
//! ([`FakeDiscord::wait_for`]).
//!
//! It enforces the rules a bot meets on the real service: the token, the privileged message
//! content intent (close 4014), intents deciding which dispatches a session gets and whether
//! they carry message content, resumable sessions with replay, `enforce_nonce`, the 2,000
//! character limit, one thread per message (160004), acknowledging an interaction once, and
//! Discord's error and rate-limit shapes.
//!
//! It is not Discord: one application, no permissions model beyond message authorship, no
//! voice, presences, embeds validation, or real rate limiting (429s come only when a test asks
//! for them). Helper methods panic when a test misuses them (an unknown channel, a button that
//! is not on the message), since that is a bug in the test.

mod gateway;
mod rest;
mod state;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub use state::FakeState;

/// Gateway intents the fake looks at (Discord's bit values).
pub mod intents {
    pub const GUILDS: u64 = 1 << 0;
    pub const GUILD_MESSAGES: u64 = 1 << 9;
    pub const DIRECT_MESSAGES: u64 = 1 << 12;
    pub const MESSAGE_CONTENT: u64 = 1 << 15;
}

macro_rules! snowflake_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u64);

        impl $name {
            pub fn get(self) -> u64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(formatter, "{}", self.0)
            }
        }

        impl From<$name> for u64 {
            fn from(id: $name) -> u64 {
                id.0
            }
        }
    };
}

snowflake_id!(
    /// A guild (server).
    GuildId
);
snowflake_id!(
    /// A channel: a guild text channel, a DM, or a thread.
    ChannelId
);
snowflake_id!(
    /// A user (people and bots alike).
    UserId
);
snowflake_id!(
    /// A message.
    MessageId
);
snowflake_id!(
    /// An interaction (a button click or a slash command).
    InteractionId
);

/// A thread is a channel; a thread started from a message has the message's id.
pub type ThreadId = ChannelId;

/// How the fake is set up.
#[derive(Debug, Clone)]
pub struct FakeDiscordOptions {
    /// The bot token REST (`Authorization: Bot …`) and Identify must carry.
    pub token: String,
    pub application_id: u64,
    pub bot_user_id: u64,
    pub bot_name: String,
    /// Whether the privileged MESSAGE_CONTENT intent is enabled for the application; when
    /// false, an Identify asking for it is closed with 4014 (Disallowed intent(s)).
    pub message_content_intent_enabled: bool,
    /// The `heartbeat_interval` sent in Hello.
    pub heartbeat_interval: Duration,
}

impl Default for FakeDiscordOptions {
    fn default() -> Self {
        FakeDiscordOptions {
            token: "fake-discord-token".to_owned(),
            application_id: 1_100_000_000_000_000_001,
            bot_user_id: 1_100_000_000_000_000_002,
            bot_name: "kesoku".to_owned(),
            message_content_intent_enabled: true,
            heartbeat_interval: Duration::from_millis(41_250),
        }
    }
}

/// Extras of [`FakeDiscord::user_says`].
#[derive(Debug, Clone, Default)]
pub struct SayOptions {
    /// Users mentioned (also written into the content as `<@id>` by the caller if wanted).
    pub mentions: Vec<UserId>,
    /// Files attached: (filename, bytes); served by the fake at the attachment's `url`.
    pub attachments: Vec<(String, Vec<u8>)>,
}

/// A file attached to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeAttachment {
    pub id: u64,
    pub filename: String,
    pub size: usize,
    pub content_type: Option<String>,
    /// Where the fake serves the file (`{api_base_url}/attachments/{channel}/{id}/{filename}`).
    pub url: String,
}

/// A message as it currently stands in a channel.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeMessage {
    pub id: MessageId,
    pub channel: ChannelId,
    pub author: UserId,
    pub content: String,
    /// The nonce as sent, in its string form (a JSON number becomes its digits).
    pub nonce: Option<String>,
    pub attachments: Vec<FakeAttachment>,
    /// The `components` array as last sent (`[]` when none).
    pub components: Value,
    /// The `embeds` array as last sent (`[]` when none).
    pub embeds: Value,
    /// Message flags (e.g. 64 ephemeral, 128 loading for a deferred interaction answer).
    pub flags: u64,
    /// How many times it was edited.
    pub edits: usize,
    /// The thread started from it, if any.
    pub thread: Option<ThreadId>,
    /// The message it replies to (`message_reference`), if any.
    pub reply_to: Option<MessageId>,
    /// The interaction it answers, for interaction responses and follow-ups.
    pub interaction: Option<InteractionId>,
}

/// A REST request as the fake received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    /// The whole path, e.g. `/api/v10/channels/1/messages`.
    pub path: String,
    pub query: Option<String>,
    /// The JSON body, or for multipart the `payload_json` part (`Null` when there is none).
    pub body: Value,
    /// Files of a multipart body: (form field name, filename, size).
    pub files: Vec<(String, String, usize)>,
    /// The status the fake answered with.
    pub status: u16,
}

/// A fault the next REST calls meet.
#[derive(Debug, Clone, PartialEq)]
enum Fault {
    RateLimited { retry_after_s: f64 },
    Fail { status: u16, code: u32 },
}

/// What the server and the test share.
type Shared = crate::watched::Watched<FakeState>;

/// A running fake Discord; stopped when dropped.
pub struct FakeDiscord {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for FakeDiscord {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token stays out of Debug output.
        formatter.debug_struct("FakeDiscord").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl Drop for FakeDiscord {
    fn drop(&mut self) {
        self.task.abort();
        self.shared.update(FakeState::drop_all_connections);
    }
}

impl FakeDiscord {
    /// Start on `127.0.0.1:0`. Must be called inside a tokio runtime; panics if it cannot bind.
    pub fn start(options: FakeDiscordOptions) -> FakeDiscord {
        let listener = match std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
            .and_then(tokio::net::TcpListener::from_std)
        {
            Ok(listener) => listener,
            Err(error) => panic!("fake discord could not bind 127.0.0.1:0: {error}"),
        };
        let addr = match listener.local_addr() {
            Ok(addr) => addr,
            Err(error) => panic!("fake discord has no local address: {error}"),
        };
        let base_url = format!("http://{addr}");
        let gateway_url = format!("ws://{addr}/gateway");
        let shared = Arc::new(Shared::new(FakeState::new(options, base_url, gateway_url)));
        let app = gateway::routes().merge(rest::routes()).with_state(Arc::clone(&shared));
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                eprintln!("fake discord stopped: {error}");
            }
        });
        FakeDiscord { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT`; REST is at `{api_base_url}/api/v10`.
    pub fn api_base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `127.0.0.1:PORT`, what twilight-http's `proxy(…, true)` takes.
    pub fn api_host(&self) -> String {
        self.addr.to_string()
    }

    /// `ws://127.0.0.1:PORT/gateway`, also returned by `GET /api/v10/gateway/bot` and as
    /// READY's `resume_gateway_url`.
    pub fn gateway_url(&self) -> String {
        format!("ws://{}/gateway", self.addr)
    }

    pub fn bot_user_id(&self) -> UserId {
        self.shared.read(|state| UserId(state.options.bot_user_id))
    }

    /// Add a guild the bot is in (dispatched as GUILD_CREATE to connected sessions).
    pub fn add_guild(&self, name: &str) -> GuildId {
        self.shared.update(|state| state.add_guild(name))
    }

    /// Add a text channel (dispatched as CHANNEL_CREATE to connected sessions).
    pub fn add_text_channel(&self, guild: GuildId, name: &str) -> ChannelId {
        self.shared.update(|state| state.add_text_channel(guild, name))
    }

    /// Open a DM channel between the bot and `user`.
    pub fn add_dm(&self, user: UserId) -> ChannelId {
        self.shared.update(|state| state.add_dm(user))
    }

    /// Add a user; every user is a member of every guild.
    pub fn add_user(&self, name: &str, display_name: &str, bot: bool) -> UserId {
        self.shared.update(|state| state.add_user(name, display_name, bot))
    }

    /// `user` posts `content` in `channel`: stored and dispatched as MESSAGE_CREATE to the
    /// sessions that get it. With no bot connected it is only stored, as on Discord: a bot that
    /// identifies afterwards is not told and must read it back (`GET /channels/{id}/messages`);
    /// a detached session that resumes gets it replayed.
    pub async fn user_says(&self, channel: ChannelId, user: UserId, content: &str, options: SayOptions) -> MessageId {
        self.shared.update(|state| state.user_says(channel, user, content, options))
    }

    /// Dispatch MESSAGE_CREATE for `message` (already posted) once more, as Discord's
    /// at-least-once gateway may: the adapter must not ingest it twice.
    pub async fn redeliver(&self, message: MessageId) {
        self.shared.update(|state| state.redeliver(message));
    }

    /// `user` clicks the button `custom_id` on `message`: INTERACTION_CREATE of type 3.
    /// Panics if the message has no such button.
    pub async fn click_button(
        &self,
        channel: ChannelId,
        message: MessageId,
        custom_id: &str,
        user: UserId,
    ) -> InteractionId {
        self.shared.update(|state| state.click_button(channel, message, custom_id, user))
    }

    /// `user` runs the slash command `name` with `options` (Discord's option array, e.g.
    /// `[{"name": "q", "type": 3, "value": "hi"}]`): INTERACTION_CREATE of type 2.
    pub async fn slash_command(&self, channel: ChannelId, user: UserId, name: &str, options: Value) -> InteractionId {
        self.shared.update(|state| state.slash_command(channel, user, name, options))
    }

    /// Close every gateway connection abruptly (no close frame). Sessions stay resumable;
    /// dispatches made meanwhile are replayed on Resume.
    pub async fn drop_connections(&self) {
        self.shared.update(FakeState::drop_all_connections);
    }

    /// Ask every connected session to reconnect (op 7 Reconnect).
    pub async fn request_reconnect(&self) {
        self.shared.update(FakeState::request_reconnect);
    }

    /// The next `n` REST calls answer 429 with Discord's body and headers.
    pub fn rate_limit_next(&self, n: usize, retry_after_s: f64) {
        self.shared.update(|state| state.push_faults(n, Fault::RateLimited { retry_after_s }));
    }

    /// The next `n` REST calls answer `status` with Discord's error body for `code`
    /// (e.g. 404 + 10003 Unknown Channel, 403 + 50001 Missing Access, 500 + 0).
    pub fn fail_next(&self, n: usize, status: u16, code: u32) {
        self.shared.update(|state| state.push_faults(n, Fault::Fail { status, code }));
    }

    /// The bot loses access to `channel` (its View Channel permission is taken away): every
    /// REST call on it answers 403 with code 50001 (Missing Access).
    pub fn deny_access(&self, channel: ChannelId) {
        self.shared.update(|state| state.deny_access(channel));
    }

    /// The messages now visible in `channel`, oldest first.
    pub fn messages(&self, channel: ChannelId) -> Vec<FakeMessage> {
        self.shared.read(|state| state.messages(channel))
    }

    /// Messages deleted from `channel`, in deletion order.
    pub fn deleted(&self, channel: ChannelId) -> Vec<MessageId> {
        self.shared.read(|state| state.deleted(channel))
    }

    /// REST requests received, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.read(|state| state.requests().to_vec())
    }

    /// How many typing indicators were triggered in `channel`.
    pub fn typing_count(&self, channel: ChannelId) -> usize {
        self.shared.read(|state| state.typing_count(channel))
    }

    /// Threads: (thread, parent channel, name), in creation order.
    pub fn threads(&self) -> Vec<(ThreadId, ChannelId, String)> {
        self.shared.read(FakeState::threads)
    }

    /// `{"global": [...], "guilds": {"<guild id>": [...]}}` as last bulk-overwritten.
    pub fn registered_commands(&self) -> Value {
        self.shared.read(FakeState::registered_commands)
    }

    /// What the bot sent for interaction `id`, in order, each as
    /// `{"route": "callback" | "followup" | "edit_original" | "edit_followup" | "delete_original", "body": …}`.
    pub fn interaction_responses(&self, id: InteractionId) -> Vec<Value> {
        self.shared.read(|state| state.interaction_responses(id))
    }

    /// Wait until `what` holds (re-checked after every change), at most `timeout`.
    pub async fn wait_for(&self, what: impl Fn(&FakeState) -> bool, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut changes = self.shared.subscribe();
        loop {
            changes.borrow_and_update();
            if self.shared.read(&what) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return self.shared.read(&what),
            }
        }
    }

    /// How many Identify handshakes succeeded (new sessions).
    pub fn connections(&self) -> usize {
        self.shared.read(FakeState::identifies)
    }

    /// How many Resumes succeeded.
    pub fn resumes(&self) -> usize {
        self.shared.read(FakeState::resumes)
    }

    /// Gateway connections open now that have identified or resumed.
    pub fn live_connections(&self) -> usize {
        self.shared.read(FakeState::live_connections)
    }
}
