//! The fake's world and the rules that change it: users, guilds, channels, messages, threads,
//! interactions, registered commands, uploaded files, gateway sessions with their dispatch
//! logs, recorded REST requests and queued faults. Also Discord's JSON shapes of these objects.
//!
//! No I/O here: the gateway and REST modules translate frames and requests into calls on
//! [`FakeState`]; sending frames is pushing onto a connection's channel.

mod payloads;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::{
    ChannelId, FakeAttachment, FakeDiscordOptions, FakeMessage, Fault, GuildId, InteractionId, MessageId,
    RecordedRequest, SayOptions, ThreadId, UserId, intents,
};

/// Discord's epoch (2015-01-01T00:00:00Z) in Unix milliseconds, for snowflakes.
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;

/// Message flags.
pub(super) const FLAG_HAS_THREAD: u64 = 1 << 5;
pub(super) const FLAG_LOADING: u64 = 1 << 7;

/// Channel types.
const GUILD_TEXT: u8 = 0;
const DM: u8 = 1;
pub(super) const PUBLIC_THREAD: u8 = 11;
pub(super) const PRIVATE_THREAD: u8 = 12;

/// Permissions reported for the bot and members (all of them: the fake has no permission model).
const ALL_PERMISSIONS: &str = "2251799813685247";

pub(super) fn now_timestamp() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6f+00:00").to_string()
}

/// What a connection task is asked to do.
#[derive(Debug)]
pub(super) enum Outbound {
    /// Send this text frame.
    Frame(String),
    /// Drop the socket without a close frame.
    Drop,
}

/// A connection attached to a session.
#[derive(Debug)]
pub(super) struct Live {
    pub(super) connection: u64,
    pub(super) sender: mpsc::UnboundedSender<Outbound>,
}

/// A gateway session: what Identify created and Resume continues.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: String,
    pub(super) intents: u64,
    pub(super) shard: (u64, u64),
    pub(super) sequence: u64,
    /// Every dispatch sent in this session as (sequence, frame), for replay on Resume.
    pub(super) log: Vec<(u64, String)>,
    pub(super) live: Option<Live>,
}

impl Session {
    fn receives(&self, guild: Option<GuildId>) -> bool {
        let (shard_id, shard_count) = self.shard;
        match guild {
            // Discord's sharding formula; DMs go to shard 0.
            Some(guild) => (guild.0 >> 22) % shard_count.max(1) == shard_id,
            None => shard_id == 0,
        }
    }

    /// Number and log a dispatch, and send it if a connection is attached.
    pub(super) fn push_dispatch(&mut self, event: &str, data: Value) {
        self.sequence += 1;
        let frame = json!({"op": 0, "d": data, "s": self.sequence, "t": event}).to_string();
        self.log.push((self.sequence, frame.clone()));
        if let Some(live) = &self.live {
            // A closed receiver means the connection is going away; the frame stays in the log.
            let _ = live.sender.send(Outbound::Frame(frame));
        }
    }
}

#[derive(Debug, Clone)]
struct User {
    name: String,
    display_name: String,
    bot: bool,
}

#[derive(Debug, Clone)]
struct Guild {
    name: String,
    joined_at: String,
}

#[derive(Debug, Clone)]
struct Channel {
    kind: u8,
    guild: Option<GuildId>,
    name: String,
    /// The parent channel of a thread.
    parent: Option<ChannelId>,
    /// The other user of a DM.
    recipient: Option<UserId>,
    owner: Option<UserId>,
    auto_archive_duration: u64,
    created_at: String,
}

#[derive(Debug, Clone)]
pub(super) struct StoredMessage {
    pub(super) id: MessageId,
    pub(super) channel: ChannelId,
    pub(super) author: UserId,
    pub(super) content: String,
    pub(super) nonce: Option<Value>,
    pub(super) attachments: Vec<FakeAttachment>,
    pub(super) components: Value,
    pub(super) embeds: Value,
    pub(super) mentions: Vec<UserId>,
    pub(super) timestamp: String,
    pub(super) edited_timestamp: Option<String>,
    pub(super) edits: usize,
    pub(super) thread: Option<ThreadId>,
    pub(super) flags: u64,
    pub(super) reply_to: Option<MessageId>,
    pub(super) interaction: Option<InteractionId>,
    pub(super) deleted: bool,
}

/// What a message is made of when created or edited over REST.
#[derive(Debug, Clone, Default)]
pub(super) struct MessageParts {
    pub(super) content: Option<String>,
    pub(super) components: Option<Value>,
    pub(super) embeds: Option<Value>,
    pub(super) flags: Option<u64>,
    /// Attachments to keep on an edit (by id); `None` keeps them all.
    pub(super) keep_attachments: Option<Vec<u64>>,
    pub(super) new_files: Vec<UploadedFile>,
    pub(super) reply_to: Option<MessageId>,
}

/// A file from a multipart body.
#[derive(Debug, Clone)]
pub(super) struct UploadedFile {
    pub(super) filename: String,
    pub(super) content_type: Option<String>,
    pub(super) bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InteractionKind {
    Command,
    Component,
}

#[derive(Debug, Clone)]
struct Interaction {
    token: String,
    kind: InteractionKind,
    channel: ChannelId,
    user: UserId,
    /// The message a component was on.
    message: Option<MessageId>,
    acknowledged: bool,
    original: Option<MessageId>,
    responses: Vec<Value>,
}

/// A Discord API error answer.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ApiError {
    pub(super) status: u16,
    pub(super) code: u32,
    pub(super) message: String,
    /// The `errors` tree of 50035 Invalid Form Body.
    pub(super) errors: Option<Value>,
}

impl ApiError {
    pub(super) fn new(status: u16, code: u32) -> ApiError {
        ApiError { status, code, message: error_message(status, code).to_owned(), errors: None }
    }

    pub(super) fn invalid_form(field: &str, error_code: &str, message: &str) -> ApiError {
        let mut errors = Map::new();
        errors.insert(field.to_owned(), json!({"_errors": [{"code": error_code, "message": message}]}));
        ApiError { errors: Some(Value::Object(errors)), ..ApiError::new(400, 50035) }
    }

    pub(super) fn body(&self) -> Value {
        let mut body = json!({"message": self.message, "code": self.code});
        if let Some(errors) = &self.errors {
            body["errors"] = errors.clone();
        }
        body
    }
}

/// Discord's message for an error code (its documented texts).
fn error_message(status: u16, code: u32) -> &'static str {
    match code {
        0 if status == 401 => "401: Unauthorized",
        0 if status == 404 => "404: Not Found",
        0 if status == 405 => "405: Method Not Allowed",
        0 if status >= 500 => "500: Internal Server Error",
        10003 => "Unknown Channel",
        10004 => "Unknown Guild",
        10008 => "Unknown Message",
        10013 => "Unknown User",
        10015 => "Unknown Webhook",
        10062 => "Unknown interaction",
        40060 => "Interaction has already been acknowledged",
        50001 => "Missing Access",
        50003 => "Cannot execute action on a DM channel",
        50005 => "Cannot edit a message authored by another user",
        50006 => "Cannot send an empty message",
        50013 => "Missing Permissions",
        50024 => "Cannot execute action on this channel type",
        50035 => "Invalid Form Body",
        160004 => "A thread has already been created for this message",
        _ => "fake discord failure",
    }
}

/// The fake's whole state; read it in [`super::FakeDiscord::wait_for`] predicates.
#[derive(Debug)]
pub struct FakeState {
    pub(super) options: FakeDiscordOptions,
    pub(super) base_url: String,
    pub(super) gateway_url: String,
    last_id: u64,
    users: BTreeMap<UserId, User>,
    guilds: BTreeMap<GuildId, Guild>,
    channels: BTreeMap<ChannelId, Channel>,
    messages: BTreeMap<ChannelId, Vec<StoredMessage>>,
    deleted: BTreeMap<ChannelId, Vec<MessageId>>,
    /// (channel, nonce) → the first message sent with it, for `enforce_nonce`.
    nonces: HashMap<(ChannelId, String), MessageId>,
    /// Uploaded files by attachment id: (channel, filename, content type, bytes).
    files: HashMap<u64, (ChannelId, String, Option<String>, Vec<u8>)>,
    requests: Vec<RecordedRequest>,
    typing: BTreeMap<ChannelId, usize>,
    threads: Vec<(ThreadId, ChannelId, String)>,
    global_commands: Vec<Value>,
    guild_commands: BTreeMap<GuildId, Vec<Value>>,
    interactions: BTreeMap<InteractionId, Interaction>,
    faults: VecDeque<Fault>,
    /// Channels the bot has lost access to (every REST call on them answers 403).
    denied: BTreeSet<ChannelId>,
    pub(super) sessions: Vec<Session>,
    pub(super) next_connection: u64,
    identifies: usize,
    resumes: usize,
}

impl FakeState {
    pub(super) fn new(options: FakeDiscordOptions, base_url: String, gateway_url: String) -> FakeState {
        let bot = User { name: options.bot_name.clone(), display_name: options.bot_name.clone(), bot: true };
        let mut state = FakeState {
            last_id: 0,
            users: BTreeMap::new(),
            guilds: BTreeMap::new(),
            channels: BTreeMap::new(),
            messages: BTreeMap::new(),
            deleted: BTreeMap::new(),
            nonces: HashMap::new(),
            files: HashMap::new(),
            requests: Vec::new(),
            typing: BTreeMap::new(),
            threads: Vec::new(),
            global_commands: Vec::new(),
            guild_commands: BTreeMap::new(),
            interactions: BTreeMap::new(),
            faults: VecDeque::new(),
            denied: BTreeSet::new(),
            sessions: Vec::new(),
            next_connection: 0,
            identifies: 0,
            resumes: 0,
            options,
            base_url,
            gateway_url,
        };
        state.users.insert(UserId(state.options.bot_user_id), bot);
        state
    }

    /// A fresh snowflake: the current time in its top bits, strictly increasing.
    pub(super) fn next_id(&mut self) -> u64 {
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as u64);
        let from_clock = now_ms.saturating_sub(DISCORD_EPOCH_MS) << 22;
        self.last_id = from_clock.max(self.last_id + 1);
        self.last_id
    }

    fn bot(&self) -> UserId {
        UserId(self.options.bot_user_id)
    }

    // ----- read side (public, for tests and `wait_for` predicates) -----

    /// The messages now visible in `channel`, oldest first.
    pub fn messages(&self, channel: ChannelId) -> Vec<FakeMessage> {
        self.messages
            .get(&channel)
            .into_iter()
            .flatten()
            .filter(|message| !message.deleted)
            .map(|message| FakeMessage {
                id: message.id,
                channel: message.channel,
                author: message.author,
                content: message.content.clone(),
                nonce: message.nonce.as_ref().map(nonce_key),
                attachments: message.attachments.clone(),
                components: message.components.clone(),
                embeds: message.embeds.clone(),
                flags: message.flags,
                edits: message.edits,
                thread: message.thread,
                reply_to: message.reply_to,
                interaction: message.interaction,
            })
            .collect()
    }

    /// Messages deleted from `channel`, in deletion order.
    pub fn deleted(&self, channel: ChannelId) -> Vec<MessageId> {
        self.deleted.get(&channel).cloned().unwrap_or_default()
    }

    /// REST requests received, oldest first.
    pub fn requests(&self) -> &[RecordedRequest] {
        &self.requests
    }

    pub fn typing_count(&self, channel: ChannelId) -> usize {
        self.typing.get(&channel).copied().unwrap_or(0)
    }

    /// Threads: (thread, parent channel, name), in creation order.
    pub fn threads(&self) -> Vec<(ThreadId, ChannelId, String)> {
        self.threads.clone()
    }

    /// `{"global": [...], "guilds": {"<guild id>": [...]}}`.
    pub fn registered_commands(&self) -> Value {
        let guilds: Map<String, Value> = self
            .guild_commands
            .iter()
            .map(|(guild, commands)| (guild.to_string(), Value::Array(commands.clone())))
            .collect();
        json!({"global": self.global_commands, "guilds": guilds})
    }

    /// What the bot sent for an interaction, each as `{"route": …, "body": …}`.
    pub fn interaction_responses(&self, id: InteractionId) -> Vec<Value> {
        self.interactions.get(&id).map(|interaction| interaction.responses.clone()).unwrap_or_default()
    }

    /// Successful Identifies.
    pub fn identifies(&self) -> usize {
        self.identifies
    }

    /// Successful Resumes.
    pub fn resumes(&self) -> usize {
        self.resumes
    }

    /// Sessions with a connection attached now.
    pub fn live_connections(&self) -> usize {
        self.sessions.iter().filter(|session| session.live.is_some()).count()
    }

    // ----- world building -----

    pub(super) fn add_user(&mut self, name: &str, display_name: &str, bot: bool) -> UserId {
        let id = UserId(self.next_id());
        self.users.insert(id, User { name: name.to_owned(), display_name: display_name.to_owned(), bot });
        id
    }

    pub(super) fn add_guild(&mut self, name: &str) -> GuildId {
        let id = GuildId(self.next_id());
        self.guilds.insert(id, Guild { name: name.to_owned(), joined_at: now_timestamp() });
        let guild = self.guild_json(id);
        self.dispatch("GUILD_CREATE", Some(id), intents::GUILDS, |_| guild.clone());
        id
    }

    pub(super) fn add_text_channel(&mut self, guild: GuildId, name: &str) -> ChannelId {
        assert!(self.guilds.contains_key(&guild), "add_text_channel: unknown guild {guild}");
        let id = ChannelId(self.next_id());
        self.channels.insert(
            id,
            Channel {
                kind: GUILD_TEXT,
                guild: Some(guild),
                name: name.to_owned(),
                parent: None,
                recipient: None,
                owner: None,
                auto_archive_duration: 1440,
                created_at: now_timestamp(),
            },
        );
        let channel = self.channel_json(id);
        self.dispatch("CHANNEL_CREATE", Some(guild), intents::GUILDS, |_| channel.clone());
        id
    }

    pub(super) fn add_dm(&mut self, user: UserId) -> ChannelId {
        assert!(self.users.contains_key(&user), "add_dm: unknown user {user}");
        let id = ChannelId(self.next_id());
        self.channels.insert(
            id,
            Channel {
                kind: DM,
                guild: None,
                name: String::new(),
                parent: None,
                recipient: Some(user),
                owner: None,
                auto_archive_duration: 0,
                created_at: now_timestamp(),
            },
        );
        id
    }

    // ----- what users do -----

    pub(super) fn user_says(
        &mut self,
        channel: ChannelId,
        user: UserId,
        content: &str,
        options: SayOptions,
    ) -> MessageId {
        assert!(self.channels.contains_key(&channel), "user_says: unknown channel {channel}");
        assert!(self.users.contains_key(&user), "user_says: unknown user {user}");
        let id = MessageId(self.next_id());
        let attachments = options
            .attachments
            .into_iter()
            .map(|(filename, bytes)| {
                self.store_file(channel, UploadedFile { content_type: guess_content_type(&filename), filename, bytes })
            })
            .collect();
        let message = StoredMessage {
            id,
            channel,
            author: user,
            content: content.to_owned(),
            nonce: None,
            attachments,
            components: json!([]),
            embeds: json!([]),
            mentions: options.mentions,
            timestamp: now_timestamp(),
            edited_timestamp: None,
            edits: 0,
            thread: None,
            flags: 0,
            reply_to: None,
            interaction: None,
            deleted: false,
        };
        self.insert_message(message);
        id
    }

    pub(super) fn click_button(
        &mut self,
        channel: ChannelId,
        message: MessageId,
        custom_id: &str,
        user: UserId,
    ) -> InteractionId {
        let stored = match self.find_message(channel, message) {
            Some(stored) => stored.clone(),
            None => panic!("click_button: no message {message} in channel {channel}"),
        };
        let component_type = find_component(&stored.components, custom_id)
            .unwrap_or_else(|| panic!("click_button: message {message} has no component `{custom_id}`"));
        let id = InteractionId(self.next_id());
        let message_json = self.message_json(&stored, false);
        let data = json!({"custom_id": custom_id, "component_type": component_type});
        self.create_interaction(
            id,
            InteractionKind::Component,
            3,
            channel,
            user,
            Some(message),
            data,
            Some(message_json),
        )
    }

    pub(super) fn slash_command(
        &mut self,
        channel: ChannelId,
        user: UserId,
        name: &str,
        options: Value,
    ) -> InteractionId {
        assert!(self.channels.contains_key(&channel), "slash_command: unknown channel {channel}");
        let guild = self.channels.get(&channel).and_then(|channel| channel.guild);
        let registered = guild
            .and_then(|guild| self.guild_commands.get(&guild))
            .into_iter()
            .flatten()
            .chain(&self.global_commands)
            .find(|command| command["name"] == name)
            .and_then(|command| command["id"].as_str().map(str::to_owned));
        let command_id = registered.unwrap_or_else(|| self.next_id().to_string());
        let id = InteractionId(self.next_id());
        let mut data = json!({"id": command_id, "name": name, "type": 1});
        if options.as_array().is_some_and(|options| !options.is_empty()) {
            data["options"] = options;
        }
        if let Some(guild) = guild {
            data["guild_id"] = json!(guild.to_string());
        }
        self.create_interaction(id, InteractionKind::Command, 2, channel, user, None, data, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_interaction(
        &mut self,
        id: InteractionId,
        kind: InteractionKind,
        wire_type: u8,
        channel: ChannelId,
        user: UserId,
        message: Option<MessageId>,
        data: Value,
        message_json: Option<Value>,
    ) -> InteractionId {
        let token = format!("aW50ZXJhY3Rpb246{}", ulid::Ulid::generate());
        let guild = self.channels.get(&channel).and_then(|channel| channel.guild);
        let mut payload = json!({
            "id": id.to_string(),
            "application_id": self.options.application_id.to_string(),
            "type": wire_type,
            "data": data,
            "channel_id": channel.to_string(),
            "channel": self.channel_json(channel),
            "token": token,
            "version": 1,
            "app_permissions": ALL_PERMISSIONS,
            "locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {"0": guild.map_or_else(|| user.to_string(), |guild| guild.to_string())},
            "context": if guild.is_some() { 0 } else { 1 },
            "attachment_size_limit": 10_485_760,
        });
        match guild {
            Some(guild) => {
                payload["guild_id"] = json!(guild.to_string());
                payload["guild_locale"] = json!("en-US");
                let mut member = self.member_json(guild);
                member["user"] = self.user_json(user);
                member["permissions"] = json!(ALL_PERMISSIONS);
                payload["member"] = member;
            }
            None => payload["user"] = self.user_json(user),
        }
        if let Some(message_json) = message_json {
            payload["message"] = message_json;
        }
        self.interactions.insert(
            id,
            Interaction {
                token,
                kind,
                channel,
                user,
                message,
                acknowledged: false,
                original: None,
                responses: Vec::new(),
            },
        );
        self.dispatch("INTERACTION_CREATE", guild, 0, |_| payload.clone());
        id
    }

    // ----- gateway -----

    /// Send a dispatch to every session that should get it: the right shard, the intent.
    /// `build` gets the session's intents (to leave out message content without it).
    pub(super) fn dispatch(
        &mut self,
        event: &str,
        guild: Option<GuildId>,
        required_intent: u64,
        build: impl Fn(u64) -> Value,
    ) {
        for session in &mut self.sessions {
            if session.intents & required_intent == required_intent && session.receives(guild) {
                let data = build(session.intents);
                session.push_dispatch(event, data);
            }
        }
    }

    pub(super) fn drop_all_connections(&mut self) {
        for session in &mut self.sessions {
            if let Some(live) = session.live.take() {
                let _ = live.sender.send(Outbound::Drop);
            }
        }
    }

    pub(super) fn request_reconnect(&mut self) {
        for session in &mut self.sessions {
            if let Some(live) = &session.live {
                let _ =
                    live.sender.send(Outbound::Frame(json!({"op": 7, "d": null, "s": null, "t": null}).to_string()));
            }
        }
    }

    /// Whether `token` (with or without the `Bot ` prefix) is the bot's.
    pub(super) fn token_matches(&self, token: &str) -> bool {
        token.strip_prefix("Bot ").unwrap_or(token) == self.options.token
    }

    /// A new session after a good Identify: READY, then GUILD_CREATE per guild of its shard.
    pub(super) fn identify(&mut self, intents: u64, shard: (u64, u64), live: Live) {
        self.identifies += 1;
        let session_id = ulid::Ulid::generate().to_string().to_lowercase();
        let guilds: Vec<GuildId> = self.guilds.keys().copied().collect();
        let mut session =
            Session { id: session_id.clone(), intents, shard, sequence: 0, log: Vec::new(), live: Some(live) };
        let own_guilds: Vec<GuildId> = guilds.into_iter().filter(|guild| session.receives(Some(*guild))).collect();
        let ready = json!({
            "v": 10,
            "user": self.current_user_json(),
            "guilds": own_guilds.iter().map(|guild| json!({"id": guild.to_string(), "unavailable": true})).collect::<Vec<_>>(),
            "session_id": session_id,
            "resume_gateway_url": self.gateway_url,
            "shard": [shard.0, shard.1],
            "application": {"id": self.options.application_id.to_string(), "flags": 0},
            "private_channels": [],
            "presences": [],
            "relationships": [],
            "_trace": ["[\"fake-discord\"]"],
        });
        session.push_dispatch("READY", ready);
        if intents & intents::GUILDS != 0 {
            for guild in own_guilds {
                session.push_dispatch("GUILD_CREATE", self.guild_json(guild));
            }
        }
        self.sessions.push(session);
    }

    /// Resume a session: replay what came after `sequence`, then RESUMED. `false` if there is
    /// no such session (the caller answers op 9).
    pub(super) fn resume(&mut self, session_id: &str, sequence: u64, live: Live) -> bool {
        let Some(session) = self.sessions.iter_mut().find(|session| session.id == session_id) else {
            return false;
        };
        if sequence > session.sequence {
            return false;
        }
        if let Some(previous) = session.live.take() {
            let _ = previous.sender.send(Outbound::Drop);
        }
        for (_, frame) in session.log.iter().filter(|(logged, _)| *logged > sequence) {
            let _ = live.sender.send(Outbound::Frame(frame.clone()));
        }
        session.live = Some(live);
        session.push_dispatch("RESUMED", Value::Null);
        self.resumes += 1;
        true
    }

    /// A connection went away: its session stays, detached (resumable).
    pub(super) fn detach(&mut self, connection: u64) {
        for session in &mut self.sessions {
            if session.live.as_ref().is_some_and(|live| live.connection == connection) {
                session.live = None;
            }
        }
    }

    // ----- REST side -----

    pub(super) fn push_faults(&mut self, n: usize, fault: Fault) {
        self.faults.extend(std::iter::repeat_n(fault, n));
    }

    pub(super) fn next_fault(&mut self) -> Option<Fault> {
        self.faults.pop_front()
    }

    pub(super) fn record(&mut self, request: RecordedRequest) {
        self.requests.push(request);
    }

    pub(super) fn deny_access(&mut self, channel: ChannelId) {
        self.denied.insert(channel);
    }

    pub(super) fn access_denied(&self, channel: ChannelId) -> bool {
        self.denied.contains(&channel)
    }

    pub(super) fn channel_exists(&self, channel: ChannelId) -> bool {
        self.channels.contains_key(&channel)
    }

    pub(super) fn file(&self, attachment: u64) -> Option<&(ChannelId, String, Option<String>, Vec<u8>)> {
        self.files.get(&attachment)
    }

    pub(super) fn find_message(&self, channel: ChannelId, message: MessageId) -> Option<&StoredMessage> {
        self.messages.get(&channel)?.iter().find(|stored| stored.id == message && !stored.deleted)
    }

    fn find_message_mut(&mut self, channel: ChannelId, message: MessageId) -> Option<&mut StoredMessage> {
        self.messages.get_mut(&channel)?.iter_mut().find(|stored| stored.id == message && !stored.deleted)
    }

    fn store_file(&mut self, channel: ChannelId, file: UploadedFile) -> FakeAttachment {
        let id = self.next_id();
        let attachment = FakeAttachment {
            id,
            url: format!("{}/attachments/{channel}/{id}/{}", self.base_url, file.filename),
            filename: file.filename.clone(),
            size: file.bytes.len(),
            content_type: file.content_type.clone(),
        };
        self.files.insert(id, (channel, file.filename, file.content_type, file.bytes));
        attachment
    }

    fn insert_message(&mut self, message: StoredMessage) {
        self.messages.entry(message.channel).or_default().push(message.clone());
        self.dispatch_message_create(&message);
    }

    /// Dispatch MESSAGE_CREATE for an existing message again, as Discord's at-least-once
    /// gateway may (a replay after a resume from an older sequence). Panics if there is no
    /// such message (a bug in the test).
    pub(super) fn redeliver(&mut self, message: MessageId) {
        let stored = self
            .messages
            .values()
            .flatten()
            .find(|stored| stored.id == message && !stored.deleted)
            .cloned()
            .unwrap_or_else(|| panic!("redeliver: no message {message}"));
        self.dispatch_message_create(&stored);
    }

    fn dispatch_message_create(&mut self, message: &StoredMessage) {
        let guild = self.channels.get(&message.channel).and_then(|channel| channel.guild);
        let intent = if guild.is_some() { intents::GUILD_MESSAGES } else { intents::DIRECT_MESSAGES };
        let bot = self.bot();
        // Discord sends content without MESSAGE_CONTENT for DMs, messages that mention the bot
        // and the bot's own messages.
        let content_exempt = guild.is_none() || message.author == bot || message.mentions.contains(&bot);
        let full = self.message_json(message, true);
        self.dispatch("MESSAGE_CREATE", guild, intent, |session_intents| {
            if content_exempt || session_intents & intents::MESSAGE_CONTENT != 0 {
                full.clone()
            } else {
                without_content(&full)
            }
        });
    }

    /// POST /channels/{id}/messages (and interaction and webhook messages): validate, dedupe on
    /// an enforced nonce, store, dispatch. Returns the message JSON.
    pub(super) fn create_message(
        &mut self,
        channel: ChannelId,
        parts: MessageParts,
        nonce: Option<Value>,
        enforce_nonce: bool,
        interaction: Option<InteractionId>,
    ) -> Result<Value, ApiError> {
        if !self.channels.contains_key(&channel) {
            return Err(ApiError::new(404, 10003));
        }
        if let Some(nonce) = &nonce {
            let key = nonce_key(nonce);
            if key.chars().count() > 25 {
                return Err(ApiError::invalid_form("nonce", "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length."));
            }
            if enforce_nonce
                && let Some(first) = self.nonces.get(&(channel, key)).copied()
                && let Some(stored) = self.find_message(channel, first)
            {
                return Ok(self.message_json(stored, false));
            }
        }
        let content = parts.content.clone().unwrap_or_default();
        validate_content(&content)?;
        let components = parts.components.clone().unwrap_or_else(|| json!([]));
        let embeds = parts.embeds.clone().unwrap_or_else(|| json!([]));
        let empty = |value: &Value| value.as_array().is_none_or(Vec::is_empty);
        if content.is_empty() && parts.new_files.is_empty() && empty(&components) && empty(&embeds) {
            return Err(ApiError::new(400, 50006));
        }
        if let Some(reply_to) = parts.reply_to
            && self.find_message(channel, reply_to).is_none()
        {
            return Err(ApiError::invalid_form(
                "message_reference",
                "MESSAGE_REFERENCE_UNKNOWN_MESSAGE",
                "Unknown message",
            ));
        }
        let id = MessageId(self.next_id());
        let attachments = parts.new_files.into_iter().map(|file| self.store_file(channel, file)).collect();
        let mentions = mentioned_users(&content).into_iter().filter(|user| self.users.contains_key(user)).collect();
        let message = StoredMessage {
            id,
            channel,
            author: self.bot(),
            content,
            nonce: nonce.clone(),
            attachments,
            components,
            embeds,
            mentions,
            timestamp: now_timestamp(),
            edited_timestamp: None,
            edits: 0,
            thread: None,
            flags: parts.flags.unwrap_or(0),
            reply_to: parts.reply_to,
            interaction,
            deleted: false,
        };
        if enforce_nonce && let Some(nonce) = &nonce {
            self.nonces.insert((channel, nonce_key(nonce)), id);
        }
        let json = self.message_json(&message, false);
        self.insert_message(message);
        Ok(json)
    }

    /// PATCH a message the bot wrote.
    pub(super) fn edit_message(
        &mut self,
        channel: ChannelId,
        message: MessageId,
        parts: MessageParts,
    ) -> Result<Value, ApiError> {
        if !self.channels.contains_key(&channel) {
            return Err(ApiError::new(404, 10003));
        }
        if let Some(content) = &parts.content {
            validate_content(content)?;
        }
        let bot = self.bot();
        let timestamp = now_timestamp();
        let mut new_attachments = Vec::new();
        for file in parts.new_files {
            new_attachments.push(self.store_file(channel, file));
        }
        let users: Vec<UserId> = self.users.keys().copied().collect();
        let Some(stored) = self.find_message_mut(channel, message) else {
            return Err(ApiError::new(404, 10008));
        };
        if stored.author != bot {
            return Err(ApiError::new(403, 50005));
        }
        if let Some(content) = parts.content {
            stored.mentions = mentioned_users(&content).into_iter().filter(|user| users.contains(user)).collect();
            stored.content = content;
        }
        if let Some(components) = parts.components {
            stored.components = components;
        }
        if let Some(embeds) = parts.embeds {
            stored.embeds = embeds;
        }
        if let Some(flags) = parts.flags {
            stored.flags = flags;
        }
        if let Some(keep) = parts.keep_attachments {
            stored.attachments.retain(|attachment| keep.contains(&attachment.id));
        }
        stored.attachments.extend(new_attachments);
        // An edit of a deferred interaction answer replaces the "thinking" state.
        stored.flags &= !FLAG_LOADING;
        stored.edits += 1;
        stored.edited_timestamp = Some(timestamp);
        let stored = stored.clone();
        let rest_json = self.message_json(&stored, false);
        let gateway_json = self.message_json(&stored, true);
        let guild = self.channels.get(&channel).and_then(|channel| channel.guild);
        let intent = if guild.is_some() { intents::GUILD_MESSAGES } else { intents::DIRECT_MESSAGES };
        self.dispatch("MESSAGE_UPDATE", guild, intent, |session_intents| {
            if guild.is_none() || session_intents & intents::MESSAGE_CONTENT != 0 {
                gateway_json.clone()
            } else {
                without_content(&gateway_json)
            }
        });
        Ok(rest_json)
    }

    pub(super) fn delete_message(&mut self, channel: ChannelId, message: MessageId) -> Result<(), ApiError> {
        let Some(kind) = self.channels.get(&channel).map(|channel| channel.kind) else {
            return Err(ApiError::new(404, 10003));
        };
        let bot = self.bot();
        let Some(stored) = self.find_message_mut(channel, message) else {
            return Err(ApiError::new(404, 10008));
        };
        // In a DM nobody may delete the other side's messages.
        if kind == DM && stored.author != bot {
            return Err(ApiError::new(403, 50003));
        }
        stored.deleted = true;
        self.deleted.entry(channel).or_default().push(message);
        let guild = self.channels.get(&channel).and_then(|channel| channel.guild);
        let intent = if guild.is_some() { intents::GUILD_MESSAGES } else { intents::DIRECT_MESSAGES };
        let mut data = json!({"id": message.to_string(), "channel_id": channel.to_string()});
        if let Some(guild) = guild {
            data["guild_id"] = json!(guild.to_string());
        }
        self.dispatch("MESSAGE_DELETE", guild, intent, |_| data.clone());
        Ok(())
    }

    pub(super) fn trigger_typing(&mut self, channel: ChannelId) -> Result<(), ApiError> {
        if !self.channels.contains_key(&channel) {
            return Err(ApiError::new(404, 10003));
        }
        *self.typing.entry(channel).or_default() += 1;
        Ok(())
    }

    /// The text channel a thread may start in: 10003 when unknown, 50024 when not a text channel.
    fn thread_parent(&self, channel: ChannelId) -> Result<Channel, ApiError> {
        let Some(parent) = self.channels.get(&channel).cloned() else {
            return Err(ApiError::new(404, 10003));
        };
        if parent.kind != GUILD_TEXT {
            return Err(ApiError::new(400, 50024));
        }
        Ok(parent)
    }

    /// POST /channels/{id}/messages/{mid}/threads: the thread gets the message's id.
    pub(super) fn start_thread_from_message(
        &mut self,
        channel: ChannelId,
        message: MessageId,
        name: &str,
        auto_archive_duration: Option<u64>,
    ) -> Result<Value, ApiError> {
        let parent = self.thread_parent(channel)?;
        let Some(stored) = self.find_message(channel, message) else {
            return Err(ApiError::new(404, 10008));
        };
        if stored.thread.is_some() || self.channels.contains_key(&ChannelId(message.0)) {
            return Err(ApiError::new(400, 160004));
        }
        validate_thread_name(name)?;
        let thread = ChannelId(message.0);
        self.insert_thread(thread, channel, &parent, PUBLIC_THREAD, name, auto_archive_duration);
        if let Some(stored) = self.find_message_mut(channel, message) {
            stored.thread = Some(thread);
            stored.flags |= FLAG_HAS_THREAD;
        }
        Ok(self.thread_json(thread))
    }

    /// POST /channels/{id}/threads: a thread without a starter message.
    pub(super) fn start_thread(
        &mut self,
        channel: ChannelId,
        name: &str,
        kind: Option<u8>,
        auto_archive_duration: Option<u64>,
    ) -> Result<Value, ApiError> {
        let parent = self.thread_parent(channel)?;
        validate_thread_name(name)?;
        // Discord's documented default for a thread without a message is a private thread.
        let kind = kind.unwrap_or(PRIVATE_THREAD);
        if kind != PUBLIC_THREAD && kind != PRIVATE_THREAD {
            return Err(ApiError::invalid_form("type", "BASE_TYPE_CHOICES", "Value must be one of {11, 12}."));
        }
        let thread = ChannelId(self.next_id());
        self.insert_thread(thread, channel, &parent, kind, name, auto_archive_duration);
        Ok(self.thread_json(thread))
    }

    fn insert_thread(
        &mut self,
        thread: ChannelId,
        parent_id: ChannelId,
        parent: &Channel,
        kind: u8,
        name: &str,
        auto_archive_duration: Option<u64>,
    ) {
        let bot = self.bot();
        self.channels.insert(
            thread,
            Channel {
                kind,
                guild: parent.guild,
                name: name.to_owned(),
                parent: Some(parent_id),
                recipient: None,
                owner: Some(bot),
                auto_archive_duration: auto_archive_duration.unwrap_or(parent.auto_archive_duration),
                created_at: now_timestamp(),
            },
        );
        self.threads.push((thread, parent_id, name.to_owned()));
        let mut created = self.thread_json(thread);
        created["newly_created"] = json!(true);
        self.dispatch("THREAD_CREATE", parent.guild, intents::GUILDS, |_| created.clone());
    }

    pub(super) fn bulk_overwrite_commands(
        &mut self,
        guild: Option<GuildId>,
        commands: Vec<Value>,
    ) -> Result<Value, ApiError> {
        if let Some(guild) = guild
            && !self.guilds.contains_key(&guild)
        {
            return Err(ApiError::new(404, 10004));
        }
        let previous = match guild {
            Some(guild) => self.guild_commands.get(&guild).cloned().unwrap_or_default(),
            None => self.global_commands.clone(),
        };
        let mut stored = Vec::with_capacity(commands.len());
        for (index, mut command) in commands.into_iter().enumerate() {
            let Some(name) = command.get("name").and_then(Value::as_str).map(str::to_owned) else {
                return Err(ApiError::invalid_form(
                    &format!("{index}.name"),
                    "BASE_TYPE_REQUIRED",
                    "This field is required",
                ));
            };
            // Discord keeps a command's id across overwrites when the name stays.
            let id = previous
                .iter()
                .find(|old| old["name"] == name.as_str())
                .and_then(|old| old["id"].as_str().map(str::to_owned))
                .unwrap_or_else(|| self.next_id().to_string());
            let version = self.next_id().to_string();
            let Some(object) = command.as_object_mut() else {
                return Err(ApiError::invalid_form(
                    &index.to_string(),
                    "DICT_TYPE_CONVERT",
                    "Only dictionaries may be used in a DictType",
                ));
            };
            object.insert("id".to_owned(), json!(id));
            object.insert("application_id".to_owned(), json!(self.options.application_id.to_string()));
            object.insert("version".to_owned(), json!(version));
            object.entry("type").or_insert(json!(1));
            object.entry("description").or_insert(json!(""));
            object.entry("default_member_permissions").or_insert(Value::Null);
            object.entry("nsfw").or_insert(json!(false));
            if let Some(guild) = guild {
                object.insert("guild_id".to_owned(), json!(guild.to_string()));
            }
            stored.push(command);
        }
        match guild {
            Some(guild) => {
                self.guild_commands.insert(guild, stored.clone());
            }
            None => self.global_commands = stored.clone(),
        }
        Ok(Value::Array(stored))
    }

    fn interaction_by_token(&self, id: Option<InteractionId>, token: &str) -> Option<InteractionId> {
        self.interactions
            .iter()
            .find(|(candidate, interaction)| interaction.token == token && id.is_none_or(|id| id == **candidate))
            .map(|(candidate, _)| *candidate)
    }

    /// POST /interactions/{id}/{token}/callback.
    pub(super) fn interaction_callback(
        &mut self,
        id: InteractionId,
        token: &str,
        body: Value,
        parts: MessageParts,
    ) -> Result<Option<Value>, ApiError> {
        let Some(id) = self.interaction_by_token(Some(id), token) else {
            return Err(ApiError::new(404, 10062));
        };
        let Some(interaction) = self.interactions.get(&id).cloned() else {
            return Err(ApiError::new(404, 10062));
        };
        if interaction.acknowledged {
            return Err(ApiError::new(400, 40060));
        }
        let callback_type = body.get("type").and_then(Value::as_u64);
        let invalid_type = || {
            ApiError::invalid_form("type", "BASE_TYPE_CHOICES", "Value must be one of {1, 4, 5, 6, 7, 8, 9, 10, 12}.")
        };
        let result = match callback_type {
            // CHANNEL_MESSAGE_WITH_SOURCE / DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE.
            Some(4) => {
                let message = self.create_message(interaction.channel, parts, None, false, Some(id))?;
                self.set_original(id, &message);
                Some(message)
            }
            Some(5) => {
                let flags = parts.flags.unwrap_or(0) | FLAG_LOADING;
                let loading = MessageParts { flags: Some(flags), ..MessageParts::default() };
                let message = self.create_loading_message(interaction.channel, loading, id);
                self.set_original(id, &message);
                Some(message)
            }
            // DEFERRED_UPDATE_MESSAGE / UPDATE_MESSAGE: only for components.
            Some(6) | Some(7) if interaction.kind == InteractionKind::Component => {
                let Some(message) = interaction.message else {
                    return Err(invalid_type());
                };
                if callback_type == Some(7) {
                    self.edit_message(interaction.channel, message, parts)?;
                }
                if let Some(stored) = self.interactions.get_mut(&id) {
                    stored.original = Some(message);
                }
                None
            }
            Some(_) | None => return Err(invalid_type()),
        };
        if let Some(stored) = self.interactions.get_mut(&id) {
            stored.acknowledged = true;
            stored.responses.push(json!({"route": "callback", "body": body}));
        }
        Ok(result)
    }

    fn set_original(&mut self, id: InteractionId, message: &Value) {
        let message_id = message["id"].as_str().and_then(|id| id.parse().ok()).map(MessageId);
        if let Some(stored) = self.interactions.get_mut(&id) {
            stored.original = message_id;
        }
    }

    /// The "is thinking…" placeholder of a deferred answer (it may have no content).
    fn create_loading_message(&mut self, channel: ChannelId, parts: MessageParts, interaction: InteractionId) -> Value {
        let message = StoredMessage {
            id: MessageId(self.next_id()),
            channel,
            author: self.bot(),
            content: String::new(),
            nonce: None,
            attachments: Vec::new(),
            components: json!([]),
            embeds: json!([]),
            mentions: Vec::new(),
            timestamp: now_timestamp(),
            edited_timestamp: None,
            edits: 0,
            thread: None,
            flags: parts.flags.unwrap_or(FLAG_LOADING),
            reply_to: None,
            interaction: Some(interaction),
            deleted: false,
        };
        let json = self.message_json(&message, false);
        self.insert_message(message);
        json
    }

    /// POST /webhooks/{app}/{token}: a follow-up message of an acknowledged interaction.
    pub(super) fn followup(
        &mut self,
        application: u64,
        token: &str,
        body: Value,
        parts: MessageParts,
    ) -> Result<Value, ApiError> {
        let id = self.webhook_interaction(application, token)?;
        let Some(interaction) = self.interactions.get(&id).cloned() else {
            return Err(ApiError::new(404, 10015));
        };
        if !interaction.acknowledged {
            return Err(ApiError::new(404, 10015));
        }
        let message = self.create_message(interaction.channel, parts, None, false, Some(id))?;
        if let Some(stored) = self.interactions.get_mut(&id) {
            stored.responses.push(json!({"route": "followup", "body": body}));
        }
        Ok(message)
    }

    /// PATCH /webhooks/{app}/{token}/messages/{@original | id}.
    pub(super) fn edit_interaction_message(
        &mut self,
        application: u64,
        token: &str,
        target: &str,
        body: Value,
        parts: MessageParts,
    ) -> Result<Value, ApiError> {
        let id = self.webhook_interaction(application, token)?;
        let Some(interaction) = self.interactions.get(&id).cloned() else {
            return Err(ApiError::new(404, 10015));
        };
        let (message, route) = match target {
            "@original" => (interaction.original, "edit_original"),
            other => (other.parse().ok().map(MessageId), "edit_followup"),
        };
        let Some(message) = message else {
            return Err(ApiError::new(404, 10008));
        };
        let edited = self.edit_message(interaction.channel, message, parts)?;
        if let Some(stored) = self.interactions.get_mut(&id) {
            stored.responses.push(json!({"route": route, "body": body}));
        }
        Ok(edited)
    }

    /// DELETE /webhooks/{app}/{token}/messages/@original.
    pub(super) fn delete_original(&mut self, application: u64, token: &str) -> Result<(), ApiError> {
        let id = self.webhook_interaction(application, token)?;
        let Some(interaction) = self.interactions.get(&id).cloned() else {
            return Err(ApiError::new(404, 10015));
        };
        let Some(message) = interaction.original else {
            return Err(ApiError::new(404, 10008));
        };
        self.delete_message(interaction.channel, message)?;
        if let Some(stored) = self.interactions.get_mut(&id) {
            stored.responses.push(json!({"route": "delete_original", "body": null}));
        }
        Ok(())
    }

    /// GET /webhooks/{app}/{token}/messages/@original.
    pub(super) fn original(&self, application: u64, token: &str) -> Result<Value, ApiError> {
        let id = self.webhook_interaction(application, token)?;
        let interaction = self.interactions.get(&id).ok_or_else(|| ApiError::new(404, 10015))?;
        let message = interaction.original.ok_or_else(|| ApiError::new(404, 10008))?;
        let stored = self.find_message(interaction.channel, message).ok_or_else(|| ApiError::new(404, 10008))?;
        Ok(self.message_json(stored, false))
    }

    fn webhook_interaction(&self, application: u64, token: &str) -> Result<InteractionId, ApiError> {
        if application != self.options.application_id {
            return Err(ApiError::new(404, 10015));
        }
        self.interaction_by_token(None, token).ok_or_else(|| ApiError::new(404, 10015))
    }
}

/// A nonce's string form (Discord accepts a string or an integer).
fn nonce_key(nonce: &Value) -> String {
    match nonce {
        Value::String(text) => text.clone(),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => nonce.to_string(),
    }
}

/// What a session without MESSAGE_CONTENT sees of a message.
fn without_content(message: &Value) -> Value {
    let mut message = message.clone();
    message["content"] = json!("");
    message["embeds"] = json!([]);
    message["attachments"] = json!([]);
    message["components"] = json!([]);
    message
}

fn validate_content(content: &str) -> Result<(), ApiError> {
    if content.chars().count() > 2000 {
        return Err(ApiError::invalid_form("content", "BASE_TYPE_MAX_LENGTH", "Must be 2000 or fewer in length."));
    }
    Ok(())
}

fn validate_thread_name(name: &str) -> Result<(), ApiError> {
    let length = name.chars().count();
    if length == 0 || length > 100 {
        return Err(ApiError::invalid_form("name", "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length."));
    }
    Ok(())
}

/// User ids mentioned as `<@id>` or `<@!id>` in a text.
fn mentioned_users(content: &str) -> Vec<UserId> {
    let mut users = Vec::new();
    let mut rest = content;
    while let Some(start) = rest.find("<@") {
        rest = &rest[start + 2..];
        let digits = rest.strip_prefix('!').unwrap_or(rest);
        let end = digits.find('>').unwrap_or(0);
        if let Ok(id) = digits[..end].parse::<u64>()
            && !users.contains(&UserId(id))
        {
            users.push(UserId(id));
        }
    }
    users
}

/// The component type of the component `custom_id` anywhere in a components tree.
fn find_component(components: &Value, custom_id: &str) -> Option<u64> {
    match components {
        Value::Array(items) => items.iter().find_map(|item| find_component(item, custom_id)),
        Value::Object(object) => {
            if object.get("custom_id").and_then(Value::as_str) == Some(custom_id) {
                return object.get("type").and_then(Value::as_u64);
            }
            object.get("components").and_then(|children| find_component(children, custom_id))
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

fn guess_content_type(filename: &str) -> Option<String> {
    let extension = filename.rsplit_once('.').map(|(_, extension)| extension.to_ascii_lowercase())?;
    let content_type = match extension.as_str() {
        "txt" | "md" => "text/plain; charset=utf-8",
        "json" => "application/json",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "pdf" => "application/pdf",
        _ => return None,
    };
    Some(content_type.to_owned())
}

pub(super) fn file_content_type(filename: &str) -> Option<String> {
    guess_content_type(filename)
}
