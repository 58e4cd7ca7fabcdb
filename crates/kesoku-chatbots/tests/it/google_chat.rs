//! The Google Chat adapter against the fake (token endpoint, Pub/Sub, Chat REST): tokens and
//! their refresh, pulls that fail, duplicate events, acknowledging only after storing (and a
//! restart between the two), whole turns with the progress card, question buttons, the
//! greeting, the allow-list, and an API that fails for a while.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kesoku_broker::MemoryBroker;
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_chatbots::google_chat::inbound::GREETING;
use kesoku_chatbots::google_chat::{Credentials, GoogleChat, GoogleChatChatbot, GoogleChatConfig};
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_chatbots::staging::Staging;
use kesoku_chatbots::{Deliverer, RetryPolicy};
use kesoku_core::{Message, MessageFilter, Role, SessionId, Status, TurnMetrics, TurnOrigin};
use kesoku_gateway::Gateway;
use kesoku_test_support::google_chat::{FakeGoogleChat, FakeGoogleChatOptions, FakeUser, Said};
use serde_json::json;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::eventually;

pub const WAIT: Duration = Duration::from_secs(10);

/// The kit and these tests stop no turn through commands.
pub struct NoControl;

#[async_trait]
impl SessionControl for NoControl {
    async fn stop_session(&self, _session_id: &SessionId) -> Result<StopAck, kesoku_chatbots::ChatbotError> {
        Ok(StopAck { turn: TurnStop::Unreachable("no turns run here".to_owned()), interrupted_waiting: 0 })
    }
}

/// The adapter pulling from a fake with a room (`spaces/ROOM`), a DM, Alice and Bob.
pub struct Rig {
    pub fake: FakeGoogleChat,
    pub gateway: Gateway,
    pub chatbot: Arc<GoogleChatChatbot>,
    pub config: GoogleChatConfig,
    pub room: String,
    pub dm: String,
    pub alice: FakeUser,
    pub bob: FakeUser,
    pub workspace: TempDir,
    pub shutdown: CancellationToken,
    pub task: Option<JoinHandle<()>>,
    _db: TempDir,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Rig {
    pub async fn start(options: FakeGoogleChatOptions, allowed_users: Vec<String>) -> Rig {
        let fake = FakeGoogleChat::start(options);
        let room = fake.add_space("ROOM", false);
        let dm = fake.add_space("DM", true);
        let config = GoogleChatConfig {
            chat_base_url: fake.base_url(),
            pubsub_base_url: fake.base_url(),
            subscription: fake.subscription(),
            allowed_users,
            timezone: "Asia/Tokyo".to_owned(),
            ..GoogleChatConfig::default()
        };
        let (db, url) = kesoku_test_support::db::temp_sqlite_url();
        let handle = kesoku_store::open(&url).await.expect("open a sqlite store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let workspace = TempDir::new().expect("workspace");
        // One app, as `kesoku start` builds it: the pull loop and delivery share its clients
        // (and so its access token).
        let google = build(&fake, &gateway, &config, &workspace);
        let chatbot = Arc::new(google.chatbot());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(google.run(shutdown.clone()));
        Rig {
            chatbot,
            fake,
            gateway,
            config,
            room,
            dm,
            alice: FakeUser::new(1001, "Alice", "alice@example.com"),
            bob: FakeUser::new(1002, "Bob", "bob@example.com"),
            workspace,
            shutdown,
            task: Some(task),
            _db: db,
        }
    }

    /// Start the pull loop again (a new process's, with its own clients).
    pub fn run_adapter(&mut self) {
        let google = build(&self.fake, &self.gateway, &self.config, &self.workspace);
        self.shutdown = CancellationToken::new();
        self.task = Some(tokio::spawn(google.run(self.shutdown.clone())));
    }

    /// Kill the pull loop where it stands (no graceful stop).
    pub async fn kill_adapter(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub async fn stored(&self, said: &Said) -> Option<Message> {
        let id = platform_message_id("google_chat", &said.message);
        self.gateway.store().get_message(&id).await.expect("store reads")
    }

    pub async fn wait_stored(&self, said: &Said) -> Message {
        eventually(&format!("{} to be stored", said.message), || async { self.stored(said).await.is_some() }).await;
        self.stored(said).await.expect("stored")
    }

    pub async fn wait_acked(&self, pubsub_id: &str) {
        let acked = self.fake.wait_for(|fake| fake.delivery(pubsub_id).is_some_and(|(_, acked)| acked), WAIT).await;
        assert!(acked, "pub/sub message {pubsub_id} acknowledged");
    }

    pub async fn user_messages(&self) -> Vec<Message> {
        let filter = MessageFilter::default().with_chatbot("google_chat").with_roles(&[Role::User]);
        self.gateway.store().list_messages(&filter).await.expect("list")
    }

    pub fn workspace(&self) -> PathBuf {
        self.workspace.path().to_owned()
    }

    /// A deliverer with fast retries.
    pub fn deliverer(&self) -> Deliverer {
        Deliverer::new(self.gateway.clone(), self.workspace()).with_retry(RetryPolicy {
            attempts: 2,
            first_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(20),
            sweep_every: Duration::from_millis(50),
        })
    }

    /// What people see in `place` (a thread or a space), one rendered message each.
    pub fn visible(&self, place: &str) -> Vec<String> {
        self.fake.messages_in(place).iter().map(|message| message.rendered()).collect()
    }
}

fn build(fake: &FakeGoogleChat, gateway: &Gateway, config: &GoogleChatConfig, workspace: &TempDir) -> GoogleChat {
    let credentials = Credentials::from_json(&fake.service_account_json()).expect("the test key parses");
    GoogleChat::new(gateway.clone(), config.clone(), credentials, Staging::new(workspace.path()), Arc::new(NoControl))
        .expect("a valid configuration")
}

#[tokio::test]
async fn a_message_is_stored_with_its_thread_sender_and_metadata() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "What is 25 + 15?");
    let stored = rig.wait_stored(&said).await;
    assert_eq!(stored.channel_id, said.thread, "a room conversation is its thread");
    assert_eq!(stored.sender, "Alice");
    assert!(stored.content.starts_with("`Alice` <users/1001> at `"), "{}", stored.content);
    assert!(stored.content.ends_with("Asia/Tokyo`:\nWhat is 25 + 15?"), "the mention is stripped: {}", stored.content);
    assert_eq!(stored.metadata.extra["google_chat_message_name"], said.message.as_str());
    assert_eq!(stored.metadata.extra["google_chat_sender_email"], "alice@example.com");
    // The thread hangs off its space (an agent sitting in the space reads it).
    let thread = stored.metadata.thread.as_deref().expect("metadata.thread");
    assert_eq!((thread.parent_channel_id.as_str(), thread.root_message_id.as_ref()), (rig.room.as_str(), None));
    rig.wait_acked(&said.pubsub_id).await;
    // A direct message belongs to the space, whatever thread Chat gave it.
    let direct = rig.fake.user_says(&rig.dm, None, &rig.alice, "hello in private");
    let direct = rig.wait_stored(&direct).await;
    assert_eq!(direct.channel_id, rig.dm);
    assert!(direct.metadata.thread.is_none(), "the space itself is no thread");
    // Every call carried a token from the fake's token endpoint, fetched once.
    assert_eq!(rig.fake.tokens_issued(), 1);
    assert_eq!(rig.fake.unauthorized(), 0);
}

#[tokio::test]
async fn tokens_are_refreshed_before_they_expire() {
    let options = FakeGoogleChatOptions { token_lifetime: Duration::from_secs(2), ..FakeGoogleChatOptions::default() };
    let rig = Rig::start(options, Vec::new()).await;
    // The pull loop calls every half second; tokens living 2 s are replaced after 1 s.
    let refreshed = rig.fake.wait_for(|fake| fake.tokens_issued() >= 3, WAIT).await;
    assert!(refreshed, "tokens were fetched again before they expired");
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "still here");
    rig.wait_stored(&said).await;
    assert_eq!(rig.fake.unauthorized(), 0, "no call went out with an expired token");
}

#[tokio::test]
async fn a_token_refused_with_401_is_replaced_and_the_call_made_again() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    let first = rig.fake.user_says(&rig.room, None, &rig.alice, "first");
    rig.wait_stored(&first).await;
    rig.fake.expire_tokens();
    let second = rig.fake.user_says(&rig.room, None, &rig.alice, "after the token was revoked");
    rig.wait_stored(&second).await;
    assert!(rig.fake.unauthorized() >= 1, "the old token was refused");
    assert_eq!(rig.fake.tokens_issued(), 2, "one new token, fetched after the 401");
    // Delivery meets the same: its call is refused once, then made with the new token.
    rig.fake.expire_tokens();
    let root = rig.wait_stored(&second).await;
    let answer = TurnOrigin::of(&root, "Kesoku").final_text(1, "Answer after a 401.", None);
    rig.gateway.post(&answer).await.expect("post");
    let outcome = rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("deliver");
    assert_eq!(outcome, kesoku_chatbots::Delivered::Shown);
    assert_eq!(rig.fake.tokens_issued(), 3, "one more token, shared by delivery and the pull loop");
    assert_eq!(rig.visible(&second.thread).iter().filter(|t| t.contains("Answer after a 401.")).count(), 1);
}

#[tokio::test]
async fn failed_pulls_are_retried() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    rig.fake.fail_pulls(2, 503);
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "after an outage");
    rig.wait_stored(&said).await;
    rig.wait_acked(&said.pubsub_id).await;
    let failed = rig.fake.requests().iter().filter(|r| r.path.ends_with(":pull") && r.status == 503).count();
    assert_eq!(failed, 2, "both failures reached the adapter");
}

#[tokio::test]
async fn a_pull_whose_answer_was_lost_is_delivered_again_after_the_lease() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    rig.fake.lose_pulls(1);
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "lost on the way");
    let lost = rig.fake.wait_for(|fake| fake.delivery(&said.pubsub_id) == Some((1, false)), WAIT).await;
    assert!(lost, "the message was leased by the lost pull");
    assert!(rig.stored(&said).await.is_none(), "the adapter never saw it");
    rig.fake.expire_leases();
    rig.wait_stored(&said).await;
    rig.wait_acked(&said.pubsub_id).await;
    assert_eq!(rig.fake.delivery(&said.pubsub_id), Some((2, true)));
}

#[tokio::test]
async fn a_duplicate_event_is_stored_once_and_acknowledged() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "say it once");
    rig.wait_stored(&said).await;
    let again = rig.fake.publish_again(&said.pubsub_id);
    rig.wait_acked(&again).await;
    let count = rig.user_messages().await.iter().filter(|m| m.content.contains("say it once")).count();
    assert_eq!(count, 1);
}

#[tokio::test]
async fn a_crash_between_storing_and_acknowledging_is_redelivered_and_recognised() {
    let mut rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    // The acknowledgement is lost: as if the process died right after storing.
    rig.fake.fail_acks(1);
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "stored before the crash");
    rig.wait_stored(&said).await;
    let ack_failed = rig
        .fake
        .wait_for(|fake| fake.requests().iter().any(|r| r.path.ends_with(":acknowledge") && r.status == 503), WAIT)
        .await;
    assert!(ack_failed, "the acknowledgement failed");
    assert_eq!(rig.fake.delivery(&said.pubsub_id), Some((1, false)), "leased, not acknowledged");
    rig.kill_adapter().await;
    rig.run_adapter();
    // Pub/Sub delivers it again once the lease ends; the new process recognises it.
    rig.fake.expire_leases();
    rig.wait_acked(&said.pubsub_id).await;
    assert_eq!(rig.fake.delivery(&said.pubsub_id), Some((2, true)));
    let count = rig.user_messages().await.iter().filter(|m| m.content.contains("stored before the crash")).count();
    assert_eq!(count, 1, "stored once");
}

#[tokio::test]
async fn users_outside_the_allow_list_are_ignored() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), vec!["alice@example.com".to_owned()]).await;
    // Bob is not allowed: his message is dropped for good (acknowledged) and never stored.
    let bob = rig.fake.user_says(&rig.room, None, &rig.bob, "let me in");
    rig.wait_acked(&bob.pubsub_id).await;
    assert!(rig.stored(&bob).await.is_none(), "a user not in allowed_users is ignored");
    let alice = rig.fake.user_says(&rig.room, None, &rig.alice, "I am allowed");
    rig.wait_stored(&alice).await;
}

#[tokio::test]
async fn a_whole_turn_updates_one_card_and_answers_in_the_thread() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    let shutdown = CancellationToken::new();
    let delivery = tokio::spawn({
        let deliverer = rig.deliverer();
        let chatbot: Arc<dyn kesoku_chatbots::Chatbot> = rig.chatbot.clone();
        let shutdown = shutdown.clone();
        async move { deliverer.run(chatbot, shutdown).await }
    });
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "What is 25 + 15?");
    let root = rig.wait_stored(&said).await;
    let gateway = &rig.gateway;
    let root = gateway.claim(&root.id, Status::Processing, &[Status::PendingAgent], "test").await.expect("claim");
    let root = root.expect("claimable").message;
    let origin = TurnOrigin::of(&root, "Kesoku");
    let card_of = |fake: &FakeGoogleChat| {
        fake.messages_in(&said.thread).into_iter().find(|m| m.name.contains("/messages/client-card-"))
    };
    assert!(rig.fake.wait_for(|fake| card_of(fake).is_some(), WAIT).await, "the turn's card appears");
    let thought = origin.thought(1, "I will use the shell.", None);
    gateway.post(&thought).await.expect("post");
    let call = origin.tool_call(1, "c1", "run_shell_command", json!({"command": "echo $((25 + 15))"}));
    gateway.post(&call).await.expect("post");
    let running = |fake: &FakeGoogleChat| {
        card_of(fake).is_some_and(|card| card.rendered().contains("⏳ run_shell_command echo $((25 + 15))"))
    };
    assert!(rig.fake.wait_for(running, WAIT).await, "the call shows ⏳: {:?}", card_of(&rig.fake));
    gateway.post(&origin.tool_result(&call, "40", None, None)).await.expect("post");
    let metrics =
        TurnMetrics { session_turns: 1, context_tokens: 1234, turn_tool_calls: 1, turn_tokens: 56, turn_time: 1.25 };
    let answer = origin.final_text(2, "The answer is **40**.", Some(metrics));
    gateway.post(&answer).await.expect("post");
    let answered = |fake: &FakeGoogleChat| {
        fake.messages_in(&said.thread).iter().any(|m| m.text == "The answer is *40*.")
            && card_of(fake).is_some_and(|card| card.rendered().contains("✅ Done"))
    };
    assert!(rig.fake.wait_for(answered, WAIT).await, "answered: {:?}", rig.visible(&said.thread));
    gateway.update_status(&root.id, Status::Processed).await.expect("processed");
    let card = card_of(&rig.fake).expect("card").rendered();
    assert!(card.contains("✅ run_shell_command echo $((25 + 15))"), "{card}");
    assert!(card.contains("💭 I will use the shell."), "{card}");
    assert!(card.contains("1,234"), "the metrics: {card}");
    let visible = rig.visible(&said.thread);
    assert_eq!(visible.len(), 3, "the question, one card, one answer: {visible:?}");
    let creates: Vec<_> =
        rig.fake.requests().into_iter().filter(|r| r.method == "POST" && r.path.ends_with("/messages")).collect();
    assert!(creates.iter().all(|r| r.query.get("messageReplyOption").map(String::as_str)
        == Some("REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD")
        && r.body["thread"]["name"] == said.thread.as_str()));
    for message in [&thought, &call, &answer] {
        let stored = gateway.store().get_message(&message.id).await.expect("read").expect("stored");
        assert_eq!(stored.status, Status::Delivered, "{}", message.id);
    }
    shutdown.cancel();
    delivery.await.expect("no panic");
}

#[tokio::test]
async fn a_question_is_buttons_and_a_click_is_the_next_message() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "pick for me");
    let root = rig.wait_stored(&said).await;
    let answer =
        TurnOrigin::of(&root, "Kesoku").final_text(1, "Which colour? [question: Which one? | Red | Blue]", None);
    rig.gateway.post(&answer).await.expect("post");
    rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("deliver");
    let question = rig
        .fake
        .messages_in(&said.thread)
        .into_iter()
        .find(|m| m.rendered().contains("[Blue]"))
        .expect("the question's buttons");
    let click = rig.fake.click(&question.name, "Blue", &rig.bob);
    rig.wait_acked(&click).await;
    let users = rig.user_messages().await;
    let chosen = users.iter().find(|m| m.sender == "Bob").expect("the click was stored");
    assert!(chosen.content.ends_with(":\nBlue"), "{}", chosen.content);
    assert_eq!(chosen.channel_id, said.thread, "in the question's conversation");
    let answered = rig.fake.message(&question.name).expect("still there");
    assert!(answered.text.contains("→ *Blue*") && answered.cards_v2 == json!([]), "{answered:?}");
}

#[tokio::test]
async fn being_added_to_a_space_says_hello_once() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    rig.fake.fail_acks(1);
    let added = rig.fake.add_app_to_space(&rig.room, &rig.alice);
    let greeted = rig.fake.wait_for(|fake| fake.messages_in("spaces/ROOM").iter().any(|m| m.text == GREETING), WAIT);
    assert!(greeted.await, "the app greets the space");
    // Handled, but the acknowledgement was lost: the redelivery greets no second time.
    assert!(
        rig.fake
            .wait_for(|fake| fake.requests().iter().any(|r| r.path.ends_with(":acknowledge") && r.status == 503), WAIT)
            .await
    );
    rig.fake.expire_leases();
    rig.wait_acked(&added).await;
    let greetings = rig.fake.messages_in("spaces/ROOM").iter().filter(|m| m.text == GREETING).count();
    assert_eq!(greetings, 1);
}

#[tokio::test]
async fn an_api_failing_for_a_while_loses_and_doubles_nothing() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    let said = rig.fake.user_says(&rig.room, None, &rig.alice, "answer me through the outage");
    let root = rig.wait_stored(&said).await;
    // More failures than one delivery attempt retries: the sweep takes the answer again.
    rig.fake.fail_chat(5, 503);
    let shutdown = CancellationToken::new();
    let delivery = tokio::spawn({
        let deliverer = rig.deliverer();
        let chatbot: Arc<dyn kesoku_chatbots::Chatbot> = rig.chatbot.clone();
        let shutdown = shutdown.clone();
        async move { deliverer.run(chatbot, shutdown).await }
    });
    let answer = TurnOrigin::of(&root, "Kesoku").final_text(1, "Made it through the outage.", None);
    rig.gateway.post(&answer).await.expect("post");
    let shown =
        |fake: &FakeGoogleChat| fake.messages_in(&said.thread).iter().any(|m| m.text == "Made it through the outage.");
    assert!(rig.fake.wait_for(shown, WAIT).await, "delivered after the outage");
    eventually("the answer marked delivered", || async {
        let stored = rig.gateway.store().get_message(&answer.id).await.expect("read").expect("stored");
        stored.status == Status::Delivered
    })
    .await;
    let times = rig.visible(&said.thread).iter().filter(|t| t.contains("Made it through the outage.")).count();
    assert_eq!(times, 1);
    let failures = rig.fake.requests().iter().filter(|r| r.status == 503).count();
    assert_eq!(failures, 5);
    shutdown.cancel();
    delivery.await.expect("no panic");
}

#[tokio::test]
async fn files_become_a_note_since_apps_cannot_upload() {
    let rig = Rig::start(FakeGoogleChatOptions::default(), Vec::new()).await;
    std::fs::write(rig.workspace.path().join("report.txt"), "data").expect("write");
    let said = rig.fake.user_says(&rig.dm, None, &rig.alice, "send the report");
    let root = rig.wait_stored(&said).await;
    let answer = TurnOrigin::of(&root, "Kesoku").final_text(1, "Here it is. [file: report.txt]", None);
    rig.gateway.post(&answer).await.expect("post");
    rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("deliver");
    let visible = rig.visible(&rig.dm);
    assert!(visible.iter().any(|t| t.contains("📎 `report.txt`")), "{visible:?}");
}
