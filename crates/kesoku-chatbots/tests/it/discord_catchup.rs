//! The Discord adapter catching up, after a restart, on what people wrote while it was stopped
//! (Discord does not dispatch those to a fresh session): against the fake Discord and a real
//! SQLite store that outlives the adapter.

use std::sync::Arc;
use std::time::Duration;

use kesoku_broker::MemoryBroker;
use kesoku_chatbots::ChatbotError;
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_chatbots::discord::{Discord, DiscordConfig, DiscordError, DiscordToken};
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_chatbots::staging::Staging;
use kesoku_core::{Message, MessageFilter, Role, SessionId};
use kesoku_gateway::Gateway;
use kesoku_test_support::discord::{ChannelId, FakeDiscord, FakeDiscordOptions, MessageId, SayOptions, UserId};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "test-token-for-the-catch-up";
const WAIT: Duration = Duration::from_secs(10);

struct NoControl;

#[async_trait::async_trait]
impl SessionControl for NoControl {
    async fn stop_session(&self, _session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        Ok(StopAck { turn: TurnStop::Requested, interrupted_waiting: 0 })
    }
}

/// A fake Discord with a guild, its `general` channel and Alice, and a store that outlives
/// the adapters started on it.
struct Rig {
    fake: FakeDiscord,
    gateway: Gateway,
    general: ChannelId,
    alice: UserId,
    workspace: TempDir,
    _db: TempDir,
}

/// A running adapter.
struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), DiscordError>>,
}

async fn rig() -> Rig {
    let fake = FakeDiscord::start(FakeDiscordOptions { token: TOKEN.to_owned(), ..FakeDiscordOptions::default() });
    let guild = fake.add_guild("Kesoku HQ");
    let general = fake.add_text_channel(guild, "general");
    let alice = fake.add_user("alice", "Alice", false);
    let (db, url) = kesoku_test_support::db::temp_sqlite_url();
    let handle = kesoku_store::open(&url).await.expect("open a sqlite store");
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    Rig { fake, gateway, general, alice, workspace: TempDir::new().expect("workspace"), _db: db }
}

impl Rig {
    /// Start an adapter and wait until its fresh session is live.
    async fn start(&self) -> Running {
        let identified = self.fake.connections();
        let config = DiscordConfig {
            api_base_url: self.fake.api_base_url(),
            timezone: "Asia/Singapore".to_owned(),
            ..DiscordConfig::default()
        };
        let discord = Discord::new(
            self.gateway.clone(),
            config,
            DiscordToken::new(TOKEN),
            Staging::new(self.workspace.path()),
            Arc::new(NoControl),
        )
        .expect("a valid configuration");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(discord.run(shutdown.clone()));
        let connected = self
            .fake
            .wait_for(|state| state.identifies() == identified + 1 && state.live_connections() == 1, WAIT)
            .await;
        assert!(connected, "the adapter connects with a fresh session");
        Running { shutdown, task }
    }

    async fn stop(&self, running: Running) {
        running.shutdown.cancel();
        let result = tokio::time::timeout(WAIT, running.task).await.expect("stops in time").expect("no panic");
        assert!(result.is_ok(), "{result:?}");
        assert!(self.fake.wait_for(|state| state.live_connections() == 0, WAIT).await, "the adapter disconnects");
    }

    async fn say(&self, channel: ChannelId, content: &str) -> MessageId {
        self.fake.user_says(channel, self.alice, content, SayOptions::default()).await
    }

    /// The stored message of Discord message `id`, once ingested.
    async fn ingested(&self, id: MessageId) -> Message {
        let message_id = platform_message_id("discord", &id.to_string());
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(message) = self.gateway.store().get_message(&message_id).await.expect("store reads") {
                return message;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for message {id} to be ingested");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn is_ingested(&self, id: MessageId) -> bool {
        let message_id = platform_message_id("discord", &id.to_string());
        self.gateway.store().get_message(&message_id).await.expect("store reads").is_some()
    }

    /// The prompts stored for `channel`, in the order they were stored (header cut off).
    async fn prompts(&self, channel: ChannelId) -> Vec<String> {
        let filter = MessageFilter::default().with_chatbot("discord").with_channel(&channel.to_string());
        let messages = self.gateway.store().list_messages(&filter).await.expect("store reads");
        messages
            .into_iter()
            .filter(|message| message.role == Role::User)
            .map(|message| {
                message.content.split_once(":\n").map_or(message.content.clone(), |(_, text)| text.to_owned())
            })
            .collect()
    }

    /// How many times the history of `channel` was read.
    fn history_reads(&self, channel: ChannelId) -> usize {
        let path = format!("/api/v10/channels/{channel}/messages");
        self.fake.requests().into_iter().filter(|request| request.method == "GET" && request.path == path).count()
    }
}

/// A thread Alice started in `general` while the adapter ran (its first message ingested).
async fn thread_with_alice(rig: &Rig, channel: ChannelId, first: &str) -> ChannelId {
    let id = rig.say(channel, first).await;
    let message = rig.ingested(id).await;
    assert_eq!(message.channel_id, id.to_string(), "a thread was started from the message");
    ChannelId(id.get())
}

#[tokio::test]
async fn a_message_written_in_a_thread_while_stopped_is_ingested_once_after_a_restart() {
    let rig = rig().await;
    let running = rig.start().await;
    let thread = thread_with_alice(&rig, rig.general, "first").await;
    let second = rig.say(thread, "second").await;
    rig.ingested(second).await;
    rig.stop(running).await;

    let third = rig.say(thread, "third, while the bot is away").await;
    let running = rig.start().await;
    let stored = rig.ingested(third).await;
    assert_eq!(stored.channel_id, thread.to_string());
    assert_eq!(stored.metadata.discord_message_id, Some(third.to_string()));

    // The same message arriving live as well (Discord's at-least-once gateway) is not stored
    // again; a message written now follows it.
    rig.fake.redeliver(third).await;
    let fourth = rig.say(thread, "fourth").await;
    rig.ingested(fourth).await;
    assert_eq!(rig.prompts(thread).await, ["first", "second", "third, while the bot is away", "fourth"]);

    // The thread's history was read, and nothing from before the newest stored message was
    // handled again (the prompts above are each stored once).
    assert!(rig.history_reads(thread) >= 1, "the thread's history was read");
    rig.stop(running).await;
}

#[tokio::test]
async fn a_flood_of_ignored_messages_while_stopped_cannot_hide_a_later_one() {
    let rig = rig().await;
    let running = rig.start().await;
    let thread = thread_with_alice(&rig, rig.general, "first").await;
    rig.stop(running).await;

    // More messages than one catch-up reads, all from another bot (ignored), then Alice.
    let other_bot = rig.fake.add_user("chatty", "Chatty Bot", true);
    for index in 0..250 {
        rig.fake.user_says(thread, other_bot, &format!("noise {index}"), SayOptions::default()).await;
    }
    let wanted = rig.say(thread, "the question after the noise").await;
    let running = rig.start().await;
    rig.ingested(wanted).await;
    assert_eq!(rig.prompts(thread).await, ["first", "the question after the noise"]);
    rig.stop(running).await;
}

#[tokio::test]
async fn a_message_written_in_the_channel_while_stopped_gets_its_thread() {
    let rig = rig().await;
    let running = rig.start().await;
    thread_with_alice(&rig, rig.general, "an earlier question").await;
    rig.stop(running).await;

    let missed = rig.say(rig.general, "a question asked while the bot is away").await;
    let running = rig.start().await;
    let stored = rig.ingested(missed).await;
    assert_eq!(stored.channel_id, missed.to_string(), "a thread was started from the missed message");
    assert!(
        rig.fake.threads().iter().any(|(thread, parent, _)| thread.get() == missed.get() && *parent == rig.general),
        "{:?}",
        rig.fake.threads()
    );
    assert!(stored.content.ends_with(":\na question asked while the bot is away"), "{}", stored.content);
    rig.stop(running).await;
}

#[tokio::test]
async fn a_channel_the_bot_cannot_read_is_skipped_and_the_others_caught_up() {
    let rig = rig().await;
    let guild_channel = rig.general;
    let running = rig.start().await;
    let lost = thread_with_alice(&rig, guild_channel, "a thread the bot will lose").await;
    let kept = thread_with_alice(&rig, guild_channel, "a thread the bot keeps").await;
    rig.stop(running).await;

    let unreadable = rig.say(lost, "written where the bot cannot read").await;
    let readable = rig.say(kept, "written where the bot can read").await;
    rig.fake.deny_access(lost);
    let running = rig.start().await;
    // Channels are read in id order (`lost` before `kept`): once `kept` is caught up, `lost`
    // was tried.
    rig.ingested(readable).await;
    assert!(!rig.is_ingested(unreadable).await, "nothing could be read from the unreadable thread");
    let refused = rig
        .fake
        .requests()
        .into_iter()
        .any(|request| request.path == format!("/api/v10/channels/{lost}") && request.status == 403);
    assert!(refused, "the unreadable thread was tried");
    assert_eq!(rig.fake.live_connections(), 1, "the adapter keeps running");
    rig.stop(running).await;
}
