//! The Discord chatbot runs the conformance kit against the fake Discord: a real [`Discord`]
//! (gateway + inbound) and a [`DiscordChatbot`] (delivery) over one store, talking to
//! [`FakeDiscord`] through `api_base_url`. The kit's channel is a thread the adapter started
//! from a person's message; what the platform shows is the fake's messages in that thread.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kesoku_broker::MemoryBroker;
use kesoku_chatbots::Chatbot;
use kesoku_chatbots::conformance::{Harness, run_all};
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_chatbots::discord::outbound::DiscordChatbot;
use kesoku_chatbots::discord::progress::ProgressOptions;
use kesoku_chatbots::discord::{Discord, DiscordConfig, DiscordError, DiscordToken};
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_chatbots::staging::Staging;
use kesoku_core::SessionId;
use kesoku_gateway::Gateway;
use kesoku_test_support::discord::{ChannelId, FakeDiscord, FakeDiscordOptions, MessageId, SayOptions, UserId};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::eventually;

const TOKEN: &str = "test-token-for-the-discord-kit";
const WAIT: Duration = Duration::from_secs(10);

/// The kit stops no turn through commands or buttons; the adapter needs a control anyway.
struct NoControl;

#[async_trait]
impl SessionControl for NoControl {
    async fn stop_session(&self, _session_id: &SessionId) -> Result<StopAck, kesoku_chatbots::ChatbotError> {
        Ok(StopAck {
            turn: TurnStop::Unreachable("the conformance kit runs no turns".to_owned()),
            interrupted_waiting: 0,
        })
    }
}

struct DiscordHarness {
    fake: FakeDiscord,
    gateway: Gateway,
    chatbot: Arc<DiscordChatbot>,
    /// The kit's channel: a thread started from Alice's first message.
    thread: ChannelId,
    alice: UserId,
    /// Alice's DM with the bot, where [`DiscordHarness::settled`] sends its markers.
    dm: ChannelId,
    /// The kit's event ids and the Discord messages they became.
    events: Mutex<HashMap<String, MessageId>>,
    markers: Mutex<usize>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), DiscordError>>>,
    workspace: TempDir,
    _db: TempDir,
}

impl Drop for DiscordHarness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl DiscordHarness {
    async fn start() -> DiscordHarness {
        let fake = FakeDiscord::start(FakeDiscordOptions { token: TOKEN.to_owned(), ..FakeDiscordOptions::default() });
        let guild = fake.add_guild("Kesoku HQ");
        let general = fake.add_text_channel(guild, "general");
        let alice = fake.add_user("alice", "Alice", false);
        let dm = fake.add_dm(alice);
        let config = DiscordConfig {
            api_base_url: fake.api_base_url(),
            timezone: "Asia/Singapore".to_owned(),
            ..DiscordConfig::default()
        };

        let (db, url) = kesoku_test_support::db::temp_sqlite_url();
        let handle = kesoku_store::open(&url).await.expect("open a sqlite store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let workspace = TempDir::new().expect("workspace");
        let discord = Discord::new(
            gateway.clone(),
            config,
            DiscordToken::new(TOKEN),
            Staging::new(workspace.path()),
            Arc::new(NoControl),
        )
        .expect("a valid configuration");
        let chatbot = Arc::new(DiscordChatbot::new(
            discord.chatbot_id(),
            discord.api(),
            Arc::clone(gateway.store()),
            ProgressOptions::default(),
        ));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(discord.run(shutdown.clone()));
        // Connected, and done with its own start-up calls: the fault checks must not have the
        // command registration eat the failures they queue.
        let registered = fake
            .wait_for(
                |state| {
                    state.live_connections() == 1
                        && state.registered_commands()["global"].as_array().is_some_and(|list| !list.is_empty())
                },
                WAIT,
            )
            .await;
        assert!(registered, "the adapter connects and registers its commands");

        let mut harness = DiscordHarness {
            fake,
            gateway,
            chatbot,
            thread: general,
            alice,
            dm,
            events: Mutex::new(HashMap::new()),
            markers: Mutex::new(0),
            shutdown,
            task: Some(task),
            workspace,
            _db: db,
        };
        let opening = harness.fake.user_says(general, alice, "kit conversation", SayOptions::default()).await;
        harness.wait_ingested(opening).await;
        harness.thread = ChannelId(opening.get());
        assert!(harness.fake.threads().iter().any(|(thread, _, _)| *thread == harness.thread), "a thread was started");
        harness
    }

    async fn is_ingested(&self, message: MessageId) -> bool {
        let id = platform_message_id("discord", &message.to_string());
        self.gateway.store().get_message(&id).await.expect("store reads").is_some()
    }

    async fn wait_ingested(&self, message: MessageId) {
        eventually(&format!("message {message} to be ingested"), || self.is_ingested(message)).await;
    }

    /// Wait until the adapter has handled everything dispatched so far: it handles messages
    /// one at a time in arrival order, so once a fresh marker message is ingested, every
    /// earlier one was handled (a redelivered duplicate leaves no trace of its own to wait on).
    async fn settled(&self) {
        let marker = {
            let mut markers = self.markers.lock().expect("markers");
            *markers += 1;
            format!("kit marker {markers}")
        };
        let id = self.fake.user_says(self.dm, self.alice, &marker, SayOptions::default()).await;
        self.wait_ingested(id).await;
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        let task = self.task.take().expect("running");
        let result = tokio::time::timeout(WAIT, task).await.expect("stops in time").expect("no panic");
        result.expect("a clean stop");
    }
}

#[async_trait]
impl Harness for DiscordHarness {
    fn chatbot(&self) -> Arc<dyn Chatbot> {
        self.chatbot.clone()
    }

    fn gateway(&self) -> Gateway {
        self.gateway.clone()
    }

    fn workspace(&self) -> PathBuf {
        self.workspace.path().to_owned()
    }

    fn channel_id(&self) -> String {
        self.thread.to_string()
    }

    /// The thread's messages as they stand (after edits, without deleted ones): their text,
    /// then the names of their attachments. The status message counts: its text is what
    /// people see of the turn's steps.
    async fn visible(&self) -> Vec<String> {
        self.fake
            .messages(self.thread)
            .into_iter()
            .map(|message| {
                let mut text = message.content;
                for attachment in message.attachments {
                    text.push_str(&format!("\n[attachment {}]", attachment.filename));
                }
                text
            })
            .collect()
    }

    /// A 429 (twilight waits it out) then `n` server errors, each of which reaches the seam.
    async fn fail_transiently(&self, n: usize) {
        self.fake.rate_limit_next(1, 0.01);
        self.fake.fail_next(n, 500, 0);
    }

    /// Discord's answer when the channel is gone: 404 Unknown Channel.
    async fn fail_permanently(&self) {
        self.fake.fail_next(1, 404, 10003);
    }

    /// Alice writes in the thread; an event id seen before makes the gateway dispatch that
    /// same message again (Discord delivers events at least once).
    async fn user_says(&self, text: &str, event_id: &str) {
        let known = self.events.lock().expect("events").get(event_id).copied();
        match known {
            Some(message) => {
                self.fake.redeliver(message).await;
                self.settled().await;
            }
            None => {
                let message = self.fake.user_says(self.thread, self.alice, text, SayOptions::default()).await;
                self.events.lock().expect("events").insert(event_id.to_owned(), message);
                self.wait_ingested(message).await;
            }
        }
    }

    /// Cut the gateway socket and wait until the adapter resumed its session.
    async fn drop_connection(&self) {
        let resumes = self.fake.resumes();
        self.fake.drop_connections().await;
        let resumed =
            self.fake.wait_for(|state| state.resumes() > resumes && state.live_connections() == 1, WAIT).await;
        assert!(resumed, "the adapter resumes after a dropped connection");
    }

    /// Every create carries a nonce with `enforce_nonce`: Discord answers a resend with the
    /// first message.
    fn dedups_part_keys(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn the_discord_chatbot_passes_the_conformance_kit() {
    let harness = DiscordHarness::start().await;
    run_all(&harness).await;
    let requests = harness.fake.requests();
    // The faults reached the adapter: twilight waited out the 429, the seam retried the 500s,
    // the 404 failed the answer.
    let statuses: Vec<u16> = requests.iter().map(|request| request.status).collect();
    assert!(statuses.contains(&429) && statuses.contains(&500) && statuses.contains(&404), "{statuses:?}");
    // The crash check's in-flight part really went to Discord twice, and Discord's nonce
    // check (not the seam) kept it from showing twice.
    let mut accepted_nonces: Vec<&str> = requests
        .iter()
        .filter(|request| request.method == "POST" && request.status == 200)
        .filter_map(|request| request.body["nonce"].as_str())
        .collect();
    let sent = accepted_nonces.len();
    accepted_nonces.sort_unstable();
    accepted_nonces.dedup();
    assert_eq!(sent - accepted_nonces.len(), 1, "exactly one part was sent again with its nonce");
    assert_eq!(harness.fake.deleted(harness.thread).len(), 1, "the interrupted turn's status message was deleted");
    assert_eq!(harness.fake.connections(), 1, "a dropped connection is resumed, not identified again");
    harness.stop().await;
}
