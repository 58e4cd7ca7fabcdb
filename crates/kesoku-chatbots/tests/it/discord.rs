//! The Discord adapter against the fake Discord (gateway + REST): connection, ingestion,
//! admission, commands, interactions, REST errors and rate limits.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use kesoku_broker::MemoryBroker;
use kesoku_chatbots::ChatbotError;
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_chatbots::discord::custom_id::{answer_custom_id, stop_custom_id};
use kesoku_chatbots::discord::rest::ThreadStart;
use kesoku_chatbots::discord::{
    ChannelOverride, Discord, DiscordApi, DiscordApiError, DiscordConfig, DiscordError, DiscordToken,
};
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_chatbots::staging::Staging;
use kesoku_core::{Message, MessageFilter, Session, SessionId, TurnOrigin};
use kesoku_gateway::Gateway;
use kesoku_test_support::discord::{ChannelId, FakeDiscord, FakeDiscordOptions, GuildId, SayOptions, UserId};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "test-token-for-the-fake-discord";
const WAIT: Duration = Duration::from_secs(10);

/// Records stop requests.
#[derive(Default)]
struct RecordingControl {
    stopped: Mutex<Vec<SessionId>>,
}

impl RecordingControl {
    fn stopped(&self) -> Vec<SessionId> {
        self.stopped.lock().expect("lock").clone()
    }
}

#[async_trait]
impl SessionControl for RecordingControl {
    async fn stop_session(&self, session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        self.stopped.lock().expect("lock").push(session_id.clone());
        Ok(StopAck { turn: TurnStop::Requested, interrupted_waiting: 0 })
    }
}

/// The adapter running against a fake with one guild, a `general` channel, and people.
struct Rig {
    fake: FakeDiscord,
    gateway: Gateway,
    control: Arc<RecordingControl>,
    api: Arc<dyn DiscordApi>,
    discord_rest: Arc<kesoku_chatbots::discord::DiscordRest>,
    guild: GuildId,
    channel: ChannelId,
    alice: UserId,
    bob: UserId,
    workspace: PathBuf,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), DiscordError>>>,
    _dirs: (TempDir, TempDir),
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn options() -> FakeDiscordOptions {
    FakeDiscordOptions { token: TOKEN.to_owned(), ..FakeDiscordOptions::default() }
}

fn base_config(fake: &FakeDiscord) -> DiscordConfig {
    DiscordConfig {
        api_base_url: fake.api_base_url(),
        timezone: "Asia/Singapore".to_owned(),
        ..DiscordConfig::default()
    }
}

/// The people of the rig, for configuring an allow-list.
struct People {
    alice: UserId,
}

async fn rig(configure: impl FnOnce(&mut DiscordConfig, &People)) -> Rig {
    let fake = FakeDiscord::start(options());
    let guild = fake.add_guild("Kesoku HQ");
    let channel = fake.add_text_channel(guild, "general");
    let alice = fake.add_user("alice", "Alice", false);
    let bob = fake.add_user("bob", "Bob", false);
    let mut config = base_config(&fake);
    configure(&mut config, &People { alice });

    let (db_dir, url) = kesoku_test_support::db::temp_sqlite_url();
    let handle = kesoku_store::open(&url).await.expect("open a sqlite store");
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    let workspace = TempDir::new().expect("workspace");
    let control = Arc::new(RecordingControl::default());
    let discord = Discord::new(
        gateway.clone(),
        config,
        DiscordToken::new(TOKEN),
        Staging::new(workspace.path()),
        Arc::clone(&control) as Arc<dyn SessionControl>,
    )
    .expect("a valid configuration");
    let api = discord.api();
    let discord_rest = discord.rest();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(discord.run(shutdown.clone()));
    assert!(fake.wait_for(|state| state.live_connections() == 1, WAIT).await, "the adapter connects");
    Rig {
        fake,
        gateway,
        control,
        api,
        discord_rest,
        guild,
        channel,
        alice,
        bob,
        workspace: workspace.path().to_owned(),
        shutdown,
        task: Some(task),
        _dirs: (db_dir, workspace),
    }
}

/// Poll `probe` until it gives a value, at most [`WAIT`].
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, probe: impl Fn() -> F) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Rig {
    /// The stored message for Discord message `id`, once ingested.
    async fn ingested(&self, id: impl std::fmt::Display) -> Message {
        let message_id = platform_message_id("discord", &id.to_string());
        eventually("the message to be ingested", || async {
            self.gateway.store().get_message(&message_id).await.expect("store reads")
        })
        .await
    }

    async fn is_ingested(&self, id: impl std::fmt::Display) -> bool {
        let message_id = platform_message_id("discord", &id.to_string());
        self.gateway.store().get_message(&message_id).await.expect("store reads").is_some()
    }

    async fn say(&self, channel: ChannelId, user: UserId, content: &str) -> u64 {
        self.fake.user_says(channel, user, content, SayOptions::default()).await.get()
    }

    async fn say_mentioning(&self, channel: ChannelId, user: UserId, content: &str, mentions: Vec<UserId>) -> u64 {
        self.fake.user_says(channel, user, content, SayOptions { mentions, ..SayOptions::default() }).await.get()
    }

    /// The bot's messages in `channel`.
    fn bot_messages(&self, channel: ChannelId) -> Vec<kesoku_test_support::discord::FakeMessage> {
        let bot = self.fake.bot_user_id();
        self.fake.messages(channel).into_iter().filter(|message| message.author == bot).collect()
    }

    async fn stop(mut self) -> Result<(), DiscordError> {
        self.shutdown.cancel();
        let task = self.task.take().expect("running");
        tokio::time::timeout(WAIT, task).await.expect("stops in time").expect("no panic")
    }
}

fn extra<'a>(message: &'a Message, key: &str) -> Option<&'a str> {
    message.metadata.extra.get(key).and_then(Value::as_str)
}

#[tokio::test]
async fn a_channel_message_starts_a_thread_and_is_ingested_with_its_header() {
    let rig = rig(|_, _| {}).await;
    let id = rig.say(rig.channel, rig.alice, "Run tests for agent history module").await;
    let message = rig.ingested(id).await;

    assert_eq!(message.chatbot_id, "discord");
    assert_eq!(message.channel_id, id.to_string(), "a thread started from a message has its id");
    assert_eq!(message.sender, "Alice");
    let header = format!("`Alice` <@{}> at `", rig.alice);
    assert!(message.content.starts_with(&header), "{}", message.content);
    assert!(message.content.ends_with(" Asia/Singapore`:\nRun tests for agent history module"), "{}", message.content);
    // `YYYY-MM-DD HH:MM:SS` between the backticks.
    let stamp = &message.content[header.len()..header.len() + 19];
    assert!(chrono::NaiveDateTime::parse_from_str(stamp, "%Y-%m-%d %H:%M:%S").is_ok(), "{stamp}");
    assert_eq!(message.metadata.discord_message_id.as_deref(), Some(id.to_string().as_str()));
    assert_eq!(extra(&message, "discord_author_id"), Some(rig.alice.to_string().as_str()));
    assert_eq!(extra(&message, "discord_channel_id"), Some(rig.channel.to_string().as_str()));
    assert_eq!(extra(&message, "discord_parent_channel_id"), Some(rig.channel.to_string().as_str()));
    assert_eq!(extra(&message, "discord_guild_id"), Some(rig.guild.to_string().as_str()));
    let threads = rig.fake.threads();
    assert_eq!(threads.len(), 1);
    assert_eq!((threads[0].0.get(), threads[0].1), (id, rig.channel));
    assert_eq!(threads[0].2, "Run tests for agent history module");

    // The next message in the thread stays there.
    let thread = ChannelId(id);
    let next = rig.say(thread, rig.alice, "and the store tests too").await;
    let next = rig.ingested(next).await;
    assert_eq!(next.channel_id, id.to_string());
    assert_eq!(next.session_id, message.session_id, "one thread, one session");
    assert_eq!(extra(&next, "discord_channel_id"), Some(id.to_string().as_str()));
    assert_eq!(extra(&next, "discord_parent_channel_id"), Some(rig.channel.to_string().as_str()));
    // Both are inside the thread, which hangs off the channel and was started from the first.
    for inside in [&message, &next] {
        let thread = inside.metadata.thread.as_deref().expect("metadata.thread");
        assert_eq!(thread.parent_channel_id, rig.channel.to_string());
        assert_eq!(thread.root_message_id.as_ref(), Some(&message.id));
    }
    assert_eq!(rig.fake.threads().len(), 1, "no thread is started inside a thread");
    rig.stop().await.expect("a clean stop");
}

#[tokio::test]
async fn auto_thread_can_be_turned_off_by_channel_name() {
    let rig = rig(|config, _| {
        config.channels =
            vec![ChannelOverride { channels: vec!["#general".into()], auto_thread: Some(false), model: None }];
    })
    .await;
    let id = rig.say(rig.channel, rig.alice, "hello").await;
    let message = rig.ingested(id).await;
    assert_eq!(message.channel_id, rig.channel.to_string());
    assert_eq!(extra(&message, "discord_parent_channel_id"), None);
    assert!(message.metadata.thread.is_none());
    assert!(rig.fake.threads().is_empty());
}

#[tokio::test]
async fn direct_messages_follow_the_allow_list() {
    let rig = rig(|config, people| config.allowed_users = vec![people.alice.to_string()]).await;
    let alice_dm = rig.fake.add_dm(rig.alice);
    let bob_dm = rig.fake.add_dm(rig.bob);
    // Bob is not on the allow-list: his DM needs a mention; Alice's is always answered.
    let ignored = rig.say(bob_dm, rig.bob, "hi").await;
    let mention = format!("<@{}> hi", rig.fake.bot_user_id());
    let bob_mentioning = rig.say_mentioning(bob_dm, rig.bob, &mention, vec![rig.fake.bot_user_id()]).await;
    let alice = rig.say(alice_dm, rig.alice, "hi").await;
    let bob_message = rig.ingested(bob_mentioning).await;
    let alice_message = rig.ingested(alice).await;
    assert!(!rig.is_ingested(ignored).await);
    assert_eq!(bob_message.channel_id, bob_dm.to_string());
    assert_eq!(alice_message.channel_id, alice_dm.to_string());
    assert_eq!(extra(&alice_message, "discord_guild_id"), None);
    assert_eq!(extra(&alice_message, "discord_parent_channel_id"), None);
    assert!(rig.fake.threads().is_empty());
}

#[tokio::test]
async fn allow_list_mention_and_bot_rules() {
    let rig = rig(|config, people| config.allowed_users = vec![people.alice.to_string()]).await;
    let bot = rig.fake.bot_user_id();
    let other_bot = rig.fake.add_user("helper", "Helper", true);
    let mention_bot = format!("<@{bot}> please");
    let mention_bob = format!("<@{}> look", rig.bob);

    let ignored = vec![
        rig.say(rig.channel, rig.bob, "hello").await,
        rig.say_mentioning(rig.channel, rig.alice, &mention_bob, vec![rig.bob]).await,
        rig.say(rig.channel, other_bot, "beep").await,
        rig.say_mentioning(rig.channel, other_bot, &mention_bot, vec![bot]).await,
    ];
    let admitted = vec![
        rig.say_mentioning(rig.channel, rig.bob, &mention_bot, vec![bot]).await,
        rig.say(rig.channel, rig.alice, "plain hello").await,
    ];
    // Messages are handled in order: once the last is in, every earlier one was decided.
    for id in &admitted {
        rig.ingested(id).await;
    }
    for id in ignored {
        assert!(!rig.is_ingested(id).await, "message {id} should have been ignored");
    }
    assert_eq!(rig.fake.threads().len(), admitted.len(), "threads only for admitted messages");
}

#[tokio::test]
async fn a_typed_command_runs_and_is_not_ingested() {
    let rig = rig(|_, _| {}).await;
    let id = rig.say(rig.channel, rig.alice, "/stop").await;
    let reply = eventually("the command's reply", || async { rig.bot_messages(rig.channel).into_iter().next() }).await;
    assert!(reply.content.contains("Nothing was running"), "{}", reply.content);
    assert_eq!(reply.reply_to.map(|id| id.get()), Some(id));
    assert_eq!(rig.control.stopped().len(), 1, "the stop went through the control");
    assert!(!rig.is_ingested(id).await);
    assert!(rig.fake.threads().is_empty(), "commands start no thread");
}

#[tokio::test]
async fn slash_commands_are_registered_and_answered_through_the_interaction() {
    let rig = rig(|_, _| {}).await;
    assert!(
        rig.fake
            .wait_for(
                |state| state.registered_commands()["global"].as_array().is_some_and(|list| list.len() == 6),
                WAIT
            )
            .await,
        "the six shared commands are registered"
    );
    let names: Vec<String> = rig.fake.registered_commands()["global"]
        .as_array()
        .expect("list")
        .iter()
        .map(|command| command["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(names, ["help", "status", "stop", "clear", "compact", "sessions"]);

    let interaction = rig.fake.slash_command(rig.channel, rig.alice, "help", json!([])).await;
    assert!(
        rig.fake.wait_for(|state| state.interaction_responses(interaction).len() == 2, WAIT).await,
        "a deferred response, then a follow-up"
    );
    let responses = rig.fake.interaction_responses(interaction);
    assert_eq!(responses[0]["route"], "callback");
    assert_eq!(responses[0]["body"]["type"], 5);
    assert_eq!(responses[1]["route"], "followup");
    let text = responses[1]["body"]["content"].as_str().expect("content");
    assert!(text.starts_with("Commands:") && text.contains("/compact"), "{text}");
}

#[tokio::test]
async fn the_stop_button_stops_the_session_named_in_it() {
    let rig = rig(|_, _| {}).await;
    let session = SessionId::from("sess_stop_button");
    let body = json!({
        "content": "💭 thinking",
        "components": [{"type": 1, "components": [
            {"type": 2, "style": 4, "label": "Stop", "custom_id": stop_custom_id(&session)}
        ]}],
    });
    let status = rig.api.create_message(rig.channel.get(), body).await.expect("status message");
    let interaction = rig
        .fake
        .click_button(
            rig.channel,
            kesoku_test_support::discord::MessageId(status),
            &stop_custom_id(&session),
            rig.alice,
        )
        .await;
    let stopped = eventually("the stop", || async { rig.control.stopped().first().cloned() }).await;
    assert_eq!(stopped, session);
    assert!(rig.fake.wait_for(|state| !state.interaction_responses(interaction).is_empty(), WAIT).await);
    assert_eq!(rig.fake.interaction_responses(interaction)[0]["body"]["type"], 6);
}

#[tokio::test]
async fn an_answer_button_posts_the_option_as_the_next_message() {
    let rig = rig(|_, _| {}).await;
    // A session of this channel with the agent's question in it.
    let session = Session::new("discord", &rig.channel.to_string(), Utc::now());
    rig.gateway.store().create_session(&session).await.expect("session");
    rig.gateway.store().set_active_session("discord", &rig.channel.to_string(), &session.id).await.expect("active");
    let root = Message::user_text(&session.id, "discord", &rig.channel.to_string(), "Alice", "deploy?");
    let question =
        TurnOrigin::of(&root, "Kesoku").final_text(1, "Ready. [question: Deploy now? | Yes | Not yet]", None);
    rig.gateway.post(&root).await.expect("root");
    rig.gateway.post(&question).await.expect("question");

    let buttons: Vec<Value> = ["Yes", "Not yet"]
        .iter()
        .enumerate()
        .map(|(index, label)| json!({"type": 2, "style": 1, "label": label, "custom_id": answer_custom_id(&question.id, index)}))
        .collect();
    let body = json!({"content": "Deploy now?", "components": [{"type": 1, "components": buttons}]});
    let posted = rig.api.create_message(rig.channel.get(), body).await.expect("question message");
    let clicked = answer_custom_id(&question.id, 1);
    let interaction =
        rig.fake.click_button(rig.channel, kesoku_test_support::discord::MessageId(posted), &clicked, rig.alice).await;

    let answer = eventually("the answer message", || async {
        let filter = MessageFilter::session(&session.id);
        let messages = rig.gateway.store().list_messages(&filter).await.expect("list");
        messages.into_iter().find(|message| message.id != root.id && message.role == kesoku_core::Role::User)
    })
    .await;
    assert!(answer.content.ends_with("`:\nNot yet"), "{}", answer.content);
    assert!(answer.content.starts_with(&format!("`Alice` <@{}> at `", rig.alice)), "{}", answer.content);
    assert_eq!(answer.sender, "Alice");
    assert_eq!(answer.channel_id, rig.channel.to_string());
    assert!(rig.fake.wait_for(|state| !state.interaction_responses(interaction).is_empty(), WAIT).await);
    let response = &rig.fake.interaction_responses(interaction)[0]["body"];
    assert_eq!(response["type"], 7, "the message is updated");
    let components = &response["data"]["components"][0]["components"];
    assert_eq!(components[0]["disabled"], true);
    assert_eq!(components[1]["disabled"], true);
    assert_eq!(components[1]["style"], 3, "the choice is marked");
}

#[tokio::test]
async fn attachments_are_staged_and_oversized_ones_named() {
    let rig = rig(|config, _| config.max_attachment_bytes = 64).await;
    let files = vec![("notes.txt".to_owned(), b"first notes".to_vec()), ("big.bin".to_owned(), vec![7u8; 100])];
    let id = rig
        .fake
        .user_says(rig.channel, rig.alice, "see attached", SayOptions { attachments: files, ..SayOptions::default() })
        .await
        .get();
    let message = rig.ingested(id).await;
    let attachments = message.metadata.attachments.clone().expect("attachments");
    assert_eq!(attachments.len(), 1);
    assert_eq!(attachments[0].filename, "notes.txt");
    let staged = rig.workspace.join(&attachments[0].path);
    assert!(attachments[0].path.contains(message.session_id.as_str()), "{}", attachments[0].path);
    assert_eq!(std::fs::read(&staged).expect("staged file"), b"first notes");
    assert!(
        message
            .content
            .contains("[attachment `big.bin` was not received: the file is 100 bytes, over the 64-byte limit"),
        "{}",
        message.content
    );
}

#[tokio::test]
async fn messages_after_a_dropped_connection_still_arrive() {
    let rig = rig(|_, _| {}).await;
    rig.fake.drop_connections().await;
    assert!(rig.fake.wait_for(|state| state.resumes() >= 1 && state.live_connections() == 1, WAIT).await, "resumed");
    let id = rig.say(rig.channel, rig.alice, "still there?").await;
    rig.ingested(id).await;
    assert_eq!(rig.fake.connections(), 1, "resumed, not identified again");
}

#[tokio::test]
async fn rest_retries_429s_and_a_nonce_is_sent_once() {
    let rig = rig(|_, _| {}).await;
    // The adapter's own background call (registering commands) must not meet the 429s.
    assert!(
        rig.fake
            .wait_for(
                |state| state.registered_commands()["global"].as_array().is_some_and(|list| !list.is_empty()),
                WAIT
            )
            .await
    );
    rig.fake.rate_limit_next(3, 0.05);
    let body = json!({"content": "part one", "nonce": "kesoku-1", "enforce_nonce": true});
    let first = rig.api.create_message(rig.channel.get(), body.clone()).await.expect("sent despite 429s");
    let again = rig.api.create_message(rig.channel.get(), body).await.expect("the same nonce again");
    assert_eq!(first, again, "enforce_nonce returns the first message");
    let sent = rig.bot_messages(rig.channel);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].nonce.as_deref(), Some("kesoku-1"));
    let statuses: Vec<u16> = rig
        .fake
        .requests()
        .iter()
        .filter(|request| request.method == "POST" && request.path.ends_with("/messages"))
        .map(|request| request.status)
        .collect();
    assert_eq!(statuses.iter().filter(|status| **status == 429).count(), 3, "{statuses:?}");

    let file = rig
        .api
        .create_message_with_files(
            rig.channel.get(),
            json!({"content": "report"}),
            vec![("report.txt".to_owned(), b"all green".to_vec())],
        )
        .await
        .expect("upload");
    let uploaded = rig.bot_messages(rig.channel).into_iter().find(|message| message.id.get() == file).expect("there");
    assert_eq!(uploaded.attachments.len(), 1);
    assert_eq!(uploaded.attachments[0].filename, "report.txt");
    assert_eq!(uploaded.attachments[0].size, 9);
}

#[tokio::test]
async fn rest_errors_are_sorted_and_gone_messages_count_as_deleted() {
    let rig = rig(|_, _| {}).await;
    let id = rig.api.create_message(rig.channel.get(), json!({"content": "x"})).await.expect("sent");
    rig.api.edit_message(rig.channel.get(), id, json!({"content": "y"})).await.expect("edited");
    rig.api.delete_message(rig.channel.get(), id).await.expect("deleted");
    rig.api.delete_message(rig.channel.get(), id).await.expect("already gone is fine");
    rig.api.trigger_typing(rig.channel.get()).await.expect("typing");
    assert_eq!(rig.fake.typing_count(rig.channel), 1);

    rig.fake.fail_next(1, 403, 50013);
    let error = rig.api.create_message(rig.channel.get(), json!({"content": "x"})).await.expect_err("forbidden");
    assert!(matches!(error, DiscordApiError::Permanent { status: 403, code: Some(50013), .. }), "{error:?}");
    rig.fake.fail_next(1, 500, 0);
    let error = rig.api.create_message(rig.channel.get(), json!({"content": "x"})).await.expect_err("server error");
    assert!(error.is_transient(), "{error:?}");
    let error = rig.api.create_message(999, json!({"content": "x"})).await.expect_err("unknown channel");
    assert_eq!(error.status(), Some(404));
    assert!(!format!("{error:?} {error}").contains(TOKEN), "errors never carry the token");
}

#[tokio::test]
async fn a_thread_someone_else_started_is_used() {
    let rig = rig(|config, _| {
        config.channels =
            vec![ChannelOverride { channels: vec!["general".into()], auto_thread: Some(false), model: None }];
    })
    .await;
    let id = rig.say(rig.channel, rig.alice, "a message").await;
    rig.ingested(id).await;
    let first = rig.discord_rest.start_thread(rig.channel.get(), id, "first").await.expect("created");
    assert_eq!(first, ThreadStart::Created { thread_id: id });
    let second = rig.discord_rest.start_thread(rig.channel.get(), id, "second").await.expect("existing");
    assert_eq!(second, ThreadStart::Existing { thread_id: id });
    assert_eq!(rig.fake.threads().len(), 1);
}

/// Run the adapter until it fails (within [`WAIT`]).
async fn run_until_error(config: DiscordConfig, token: &str) -> DiscordError {
    let (_db, url) = kesoku_test_support::db::temp_sqlite_url();
    let handle = kesoku_store::open(&url).await.expect("store");
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    let workspace = TempDir::new().expect("workspace");
    let result = tokio::time::timeout(
        WAIT,
        kesoku_chatbots::discord::run_discord(
            gateway,
            config,
            DiscordToken::new(token),
            Staging::new(workspace.path()),
            Arc::new(RecordingControl::default()),
            CancellationToken::new(),
        ),
    )
    .await
    .expect("a fatal error ends the run");
    result.expect_err("fails")
}

#[tokio::test]
async fn a_rejected_token_names_the_variable() {
    let fake = FakeDiscord::start(options());
    // Through GET /gateway/bot (401)…
    let error = run_until_error(base_config(&fake), "wrong-token-0000").await;
    assert!(matches!(&error, DiscordError::TokenRejected { token_env } if token_env == "DISCORD_TOKEN"), "{error}");
    assert!(error.to_string().contains("`DISCORD_TOKEN`"), "{error}");
    // …and through the gateway's Identify (close 4004).
    let config =
        DiscordConfig { gateway_url: Some(fake.gateway_url()), token_env: "BOT_TOKEN".into(), ..base_config(&fake) };
    let error = run_until_error(config, "wrong-token-0000").await;
    assert!(matches!(&error, DiscordError::TokenRejected { token_env } if token_env == "BOT_TOKEN"), "{error}");
}

#[tokio::test]
async fn a_missing_privileged_intent_says_where_to_enable_it() {
    let fake = FakeDiscord::start(FakeDiscordOptions { message_content_intent_enabled: false, ..options() });
    let error = run_until_error(base_config(&fake), TOKEN).await;
    assert!(matches!(error, DiscordError::PrivilegedIntents), "{error}");
    assert!(error.to_string().contains("Message Content"), "{error}");
}

#[tokio::test]
async fn a_missing_token_names_the_variable() {
    let config = DiscordConfig { token_env: "KESOKU_DISCORD".into(), ..DiscordConfig::default() };
    let error = Discord::token_from(&config, None).expect_err("missing");
    assert!(error.to_string().contains("`KESOKU_DISCORD`"), "{error}");
    let error = Discord::token_from(&config, Some("  ".into())).expect_err("blank");
    assert!(matches!(error, DiscordError::MissingToken { .. }));
    assert_eq!(Discord::token_from(&config, Some("Bot abc".into())).expect("set").expose(), "abc");
}
