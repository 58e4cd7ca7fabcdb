//! The WeChat adapter against the fake iLink API and CDN: the poll's cursor across a restart,
//! long-poll failures, duplicate deliveries, encrypted media both ways with fixed vectors,
//! the expired session, typing, the allow-list. [`WeChatRig`] is also the conformance kit's
//! harness (`wechat_conformance.rs`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kesoku_broker::MemoryBroker;
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_chatbots::delivery::{Delivered, Deliverer, RetryPolicy};
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_chatbots::staging::Staging;
use kesoku_chatbots::wechat::inbound::CURSOR_KEY;
use kesoku_chatbots::wechat::{BotToken, PollOptions, WeChat, WeChatChatbot, WeChatConfig};
use kesoku_chatbots::{Chatbot, ChatbotError};
use kesoku_core::{Message, MessageFilter, Role, SessionId, Status, TurnOrigin};
use kesoku_gateway::Gateway;
use kesoku_test_support::wechat::{FakeWeChat, FakeWeChatOptions, Fault};
use serde_json::json;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::eventually;

pub const TOKEN: &str = "test-token-for-the-wechat-adapter";
pub const ALICE: &str = "wxid_alice@im.wechat";
pub const OWNER: &str = "wxid_owner@im.wechat";

/// The kit stops no turn through commands; the adapter needs a control anyway.
struct NoControl;

#[async_trait]
impl SessionControl for NoControl {
    async fn stop_session(&self, _session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        Ok(StopAck { turn: TurnStop::Unreachable("these tests run no turns".to_owned()), interrupted_waiting: 0 })
    }
}

/// A WeChat adapter (poll + delivery) over one store, talking to the fake.
pub struct WeChatRig {
    pub fake: FakeWeChat,
    pub gateway: Gateway,
    pub chatbot: Arc<WeChatChatbot>,
    pub config: WeChatConfig,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
    pub workspace: TempDir,
    _db: TempDir,
}

impl Drop for WeChatRig {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn fast_poll() -> PollOptions {
    PollOptions {
        long_poll: Duration::from_millis(500),
        first_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        expired_backoff: Duration::from_millis(40),
        typing_interval: Duration::from_millis(20),
        typing_cap: Duration::from_secs(60),
    }
}

impl WeChatRig {
    /// The fake and the adapter; `allowed_users` as configured.
    pub async fn start(allowed_users: &[&str]) -> WeChatRig {
        let fake = FakeWeChat::start(FakeWeChatOptions {
            token: TOKEN.to_owned(),
            owner: OWNER.to_owned(),
            ..FakeWeChatOptions::default()
        })
        .await;
        let config = WeChatConfig {
            base_url: fake.base_url(),
            cdn_base_url: fake.cdn_base_url(),
            allowed_users: allowed_users.iter().map(|user| (*user).to_owned()).collect(),
            timezone: "Asia/Shanghai".to_owned(),
            ..WeChatConfig::default()
        };
        let (db, url) = kesoku_test_support::db::temp_sqlite_url();
        let handle = kesoku_store::open(&url).await.expect("open a sqlite store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let workspace = TempDir::new().expect("workspace");
        let adapter = adapter(&gateway, &config, &workspace);
        let shutdown = CancellationToken::new();
        let chatbot = Arc::new(adapter.chatbot());
        let task = Some(tokio::spawn(adapter.run(shutdown.clone())));
        WeChatRig { fake, gateway, chatbot, config, shutdown, task, workspace, _db: db }
    }

    /// Stop the poll (if running) and start a fresh adapter on the same store.
    pub async fn restart(&mut self) {
        self.stop().await;
        let adapter = adapter(&self.gateway, &self.config, &self.workspace);
        self.chatbot = Arc::new(adapter.chatbot());
        self.shutdown = CancellationToken::new();
        self.task = Some(tokio::spawn(adapter.run(self.shutdown.clone())));
    }

    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task).await.expect("stops in time").expect("no panic");
        }
    }

    pub async fn stored(&self, wechat_message_id: &str) -> Option<Message> {
        let id = platform_message_id(&self.config.id, wechat_message_id);
        self.gateway.store().get_message(&id).await.expect("store reads")
    }

    pub async fn wait_ingested(&self, wechat_message_id: &str) -> Message {
        eventually(&format!("wechat message {wechat_message_id} to be ingested"), || async {
            self.stored(wechat_message_id).await.is_some()
        })
        .await;
        self.stored(wechat_message_id).await.expect("stored")
    }

    /// User messages stored for this chatbot whose content contains `needle`.
    pub async fn user_messages_containing(&self, needle: &str) -> usize {
        let filter = MessageFilter::default().with_chatbot(&self.config.id).with_roles(&[Role::User]);
        let messages = self.gateway.store().list_messages(&filter).await.expect("list");
        messages.iter().filter(|m| m.content.contains(needle)).count()
    }

    pub fn deliverer(&self) -> Deliverer {
        Deliverer::new(self.gateway.clone(), self.workspace.path()).with_retry(RetryPolicy {
            attempts: 3,
            first_delay: Duration::from_millis(5),
            max_delay: Duration::from_millis(20),
            sweep_every: Duration::from_millis(50),
        })
    }

    /// An answer `text` to a running root of `channel` (which must have written first).
    pub async fn answer_in(&self, channel: &str, text: &str) -> (Message, Message) {
        let session = self.gateway.resolve_session(&self.config.id, channel).await.expect("session");
        let root = Message::user_text(&session.id, &self.config.id, channel, ALICE, "question");
        self.gateway.post(&root).await.expect("post root");
        let root = self
            .gateway
            .claim(&root.id, Status::Processing, &[Status::PendingAgent], "test")
            .await
            .expect("claim")
            .expect("claimable")
            .message;
        let answer = TurnOrigin::of(&root, "Kesoku").final_text(1, text, None);
        self.gateway.post(&answer).await.expect("post answer");
        (root, answer)
    }
}

fn adapter(gateway: &Gateway, config: &WeChatConfig, workspace: &TempDir) -> WeChat {
    WeChat::with_options(
        gateway.clone(),
        config.clone(),
        BotToken::new(TOKEN),
        Some(OWNER.to_owned()),
        Staging::new(workspace.path()),
        Arc::new(NoControl),
        fast_poll(),
    )
    .expect("a valid configuration")
}

#[tokio::test]
async fn the_cursor_survives_a_restart_without_replay_or_skip() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let first = rig.fake.user_says(ALICE, "before the restart");
    rig.wait_ingested(&first).await;
    eventually("the cursor to be saved", || async {
        rig.gateway.store().chatbot_state("wechat", CURSOR_KEY).await.expect("state").as_deref() == Some("cur-1")
    })
    .await;
    rig.stop().await;
    let second = rig.fake.user_says(ALICE, "while the bot was down");
    let polls_before = rig.fake.cursors().len();
    rig.restart().await;
    rig.wait_ingested(&second).await;
    let after_restart = rig.fake.cursors()[polls_before].clone();
    assert_eq!(after_restart, "cur-1", "the restarted poll goes on from the saved cursor, not from the start");
    assert_eq!(rig.user_messages_containing("before the restart").await, 1);
    assert_eq!(rig.user_messages_containing("while the bot was down").await, 1);
    let stored = rig.stored(&first).await.expect("stored");
    assert_eq!(stored.channel_id, ALICE);
    assert_eq!(stored.sender, ALICE);
    assert!(stored.content.starts_with(&format!("`{ALICE}` at `")), "{}", stored.content);
    assert!(stored.content.ends_with(" Asia/Shanghai`:\nbefore the restart"), "{}", stored.content);
    rig.stop().await;
}

#[tokio::test]
async fn a_lost_cursor_replays_the_history_but_stores_nothing_twice() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let first = rig.fake.user_says(ALICE, "replayed once");
    rig.wait_ingested(&first).await;
    rig.stop().await;
    rig.gateway.store().set_chatbot_state("wechat", CURSOR_KEY, "").await.expect("forget the cursor");
    rig.fake.redeliver(&first);
    let marker = rig.fake.user_says(ALICE, "after the replay");
    rig.restart().await;
    rig.wait_ingested(&marker).await;
    assert_eq!(rig.user_messages_containing("replayed once").await, 1, "a replayed message is stored once");
    rig.stop().await;
}

#[tokio::test]
async fn long_poll_errors_back_off_and_nothing_is_lost() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    rig.fake.fail_next("getupdates", 2, Fault::ServerError);
    rig.fake.fail_next("getupdates", 1, Fault::Drop);
    rig.fake.fail_next("getupdates", 1, Fault::Ret);
    let id = rig.fake.user_says(ALICE, "through the storm");
    rig.wait_ingested(&id).await;
    assert_eq!(rig.fake.state().pending_faults(), 0, "every fault met the poll");
    assert_eq!(rig.user_messages_containing("through the storm").await, 1);
    rig.stop().await;
}

#[tokio::test]
async fn the_allow_list_decides_who_is_answered() {
    // Empty: only the account that paired.
    let mut rig = WeChatRig::start(&[]).await;
    let stranger = rig.fake.user_says(ALICE, "from a stranger");
    let owner = rig.fake.user_says(OWNER, "from the owner");
    rig.wait_ingested(&owner).await;
    assert!(rig.stored(&stranger).await.is_none(), "a user not on the allow-list is ignored");
    rig.stop().await;
}

#[tokio::test]
async fn a_group_room_is_the_channel_and_its_sender_the_user() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let id = rig.fake.room_says("room123456@chatroom", ALICE, "hello room");
    let stored = rig.wait_ingested(&id).await;
    assert_eq!(stored.channel_id, "room123456@chatroom");
    assert_eq!(stored.sender, ALICE);
    let (_root, answer) = rig.answer_in("room123456@chatroom", "## Hi\nThe **room** gets plain text.").await;
    let outcome = rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert_eq!(rig.fake.texts_to("room123456@chatroom"), vec!["Hi\nThe room gets plain text.".to_owned()]);
    rig.stop().await;
}

/// RustCrypto's published ECB example: key 0x42 × 16, this text, this ciphertext.
const VECTOR_PLAIN: &[u8] = b"hello world! this is my plaintext.";
const VECTOR_CIPHER_HEX: &str =
    "42b153410851a931eb3e6c048867ae5f95eb20b42e176b07840db75688be9c70e4670ea0d87a71be5f9f3099b4fff3dc";

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
}

#[tokio::test]
async fn inbound_media_is_downloaded_decrypted_and_staged() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let image = rig.fake.put_cdn(unhex(VECTOR_CIPHER_HEX));
    let file = rig.fake.put_cdn(unhex(VECTOR_CIPHER_HEX));
    let raw_key = STANDARD.encode([0x42u8; 16]);
    let hex_key = STANDARD.encode("42".repeat(16));
    let id = rig.fake.user_sends(
        ALICE,
        vec![
            json!({ "type": 1, "text_item": { "text": "see attached" } }),
            json!({ "type": 2, "image_item": { "media": { "encrypt_query_param": image.encrypt_query_param, "aes_key": raw_key } } }),
            json!({ "type": 4, "file_item": { "media": { "encrypt_query_param": file.encrypt_query_param, "aes_key": hex_key }, "file_name": "notes.txt", "len": "34" } }),
            json!({ "type": 3, "voice_item": { "text": "please summarise it", "playtime": 1200 } }),
            json!({ "type": 5, "video_item": { "media": { "full_url": "http://media.example.invalid/v", "aes_key": raw_key } } }),
        ],
    );
    let stored = rig.wait_ingested(&id).await;
    assert!(stored.content.contains("see attached\n[voice message] please summarise it"), "{}", stored.content);
    assert!(stored.content.contains("[attachment `video-5.mp4` was not received"), "{}", stored.content);
    assert!(stored.content.contains("not the configured cdn_base_url"), "{}", stored.content);
    let attachments = stored.metadata.attachments.clone().expect("attachments");
    assert_eq!(attachments.len(), 2, "{attachments:?}");
    for attachment in &attachments {
        let bytes = std::fs::read(rig.workspace.path().join(&attachment.path)).expect("staged file");
        assert_eq!(bytes, VECTOR_PLAIN, "{attachment:?} decrypts to the vector's plaintext");
    }
    assert!(!rig.fake.calls().iter().any(|call| call.contains("example")), "the foreign host was never asked");
    rig.stop().await;
}

#[tokio::test]
async fn a_file_the_answer_names_is_encrypted_uploaded_and_sent_as_a_media_item() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let hello = rig.fake.user_says(ALICE, "send me the report");
    rig.wait_ingested(&hello).await;
    std::fs::write(rig.workspace.path().join("report.txt"), VECTOR_PLAIN).expect("write");
    std::fs::write(rig.workspace.path().join("chart.png"), [0x89u8, b'P', b'N', b'G', 1, 2, 3]).expect("write");
    let (_root, answer) = rig.answer_in(ALICE, "Here it is.\n[file: report.txt]\n[file: chart.png]").await;
    let outcome = rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    let sent = rig.fake.sent();
    let file = sent.iter().find(|m| m.item_type == 4).expect("a file item");
    assert_eq!(file.file_name.as_deref(), Some("report.txt"));
    assert_eq!(
        file.file.as_deref(),
        Some(VECTOR_PLAIN),
        "the CDN holds the file, encrypted with the key the item names"
    );
    let image = sent.iter().find(|m| m.item_type == 2).expect("an image item");
    assert_eq!(image.file.as_deref(), Some(&[0x89u8, b'P', b'N', b'G', 1, 2, 3][..]));
    assert_eq!(rig.fake.texts_to(ALICE), vec!["Here it is.".to_owned()]);
    rig.stop().await;
}

#[tokio::test]
async fn an_expired_session_keeps_the_answer_pending_until_paired_again() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let hello = rig.fake.user_says(ALICE, "hello");
    rig.wait_ingested(&hello).await;
    let (_root, answer) = rig.answer_in(ALICE, "An answer that waits for pairing.").await;
    rig.fake.expire_session();
    let error = rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect_err("not delivered");
    assert!(error.to_string().contains("kesoku wechat pair"), "{error}");
    let stored = rig.gateway.store().get_message(&answer.id).await.expect("read").expect("stored");
    assert_eq!(stored.status, Status::Pending, "never lost: it waits");
    assert!(rig.fake.sent().is_empty());
    rig.fake.renew_session();
    let outcome = rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("deliver");
    assert_eq!(outcome, Delivered::Shown);
    assert_eq!(rig.fake.texts_to(ALICE), vec!["An answer that waits for pairing.".to_owned()]);
    rig.stop().await;
}

#[tokio::test]
async fn a_running_turn_shows_typing_and_steps_are_never_sent() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let hello = rig.fake.user_says(ALICE, "think about it");
    rig.wait_ingested(&hello).await;
    let (root, answer) = rig.answer_in(ALICE, "Done thinking.").await;
    rig.chatbot.on_turn(&root).await.expect("typing on");
    let renewed = rig.fake.wait_for(|state| state.typing().len() >= 3, Duration::from_secs(10)).await;
    assert!(renewed, "typing is renewed while the turn runs");
    let thought = TurnOrigin::of(&root, "Kesoku").thought(1, "A private thought", None);
    rig.gateway.post(&thought).await.expect("post thought");
    assert_eq!(rig.deliverer().deliver(rig.chatbot.as_ref(), &thought).await.expect("step"), Delivered::Marked);
    assert_eq!(rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("answer"), Delivered::Shown);
    let done = rig.gateway.update_status(&root.id, Status::Processed).await.expect("processed").message;
    rig.chatbot.on_turn(&done).await.expect("typing off");
    let typing = rig.fake.typing();
    let (last, renewals) = typing.split_last().expect("typing events");
    assert_eq!(last, &(ALICE.to_owned(), 2), "typing is cleared when the turn ends");
    assert!(renewals.len() >= 3 && renewals.iter().all(|event| *event == (ALICE.to_owned(), 1)), "{typing:?}");
    assert_eq!(rig.fake.texts_to(ALICE), vec!["Done thinking.".to_owned()]);
    rig.stop().await;
}

#[tokio::test]
async fn a_channel_that_never_wrote_cannot_be_answered_and_says_why() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    let (_root, answer) = rig.answer_in("room999@chatroom", "Nobody asked.").await;
    let outcome = rig.deliverer().deliver(rig.chatbot.as_ref(), &answer).await.expect("deliver");
    let Delivered::Failed(reason) = outcome else { panic!("expected a failure, got {outcome:?}") };
    assert!(reason.contains("context_token"), "{reason}");
    rig.stop().await;
}

#[tokio::test]
async fn a_chat_command_is_answered_in_the_chat_and_never_stored() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    rig.fake.user_says(ALICE, "/help");
    let answered = rig.fake.wait_for(|state| state.sent().iter().any(|m| m.to == ALICE), Duration::from_secs(10)).await;
    assert!(answered, "the command is answered");
    let reply = rig.fake.texts_to(ALICE).join("\n");
    assert!(reply.contains("/stop") && reply.contains("/clear"), "{reply}");
    assert!(!reply.contains('`'), "plain text: {reply}");
    assert_eq!(rig.user_messages_containing("/help").await, 0, "commands never reach the agent");
    rig.stop().await;
}

#[tokio::test]
async fn the_poll_waits_out_an_expired_session_and_resumes_after_pairing() {
    let mut rig = WeChatRig::start(&[ALICE]).await;
    rig.fake.expire_session();
    let id = rig.fake.user_says(ALICE, "written while the session was expired");
    let refused = rig.fake.calls().len();
    assert!(rig.fake.wait_for(|state| state.calls().len() >= refused + 2, Duration::from_secs(10)).await);
    assert!(rig.stored(&id).await.is_none(), "nothing comes in while the session is expired");
    rig.fake.renew_session();
    rig.wait_ingested(&id).await;
    assert_eq!(rig.user_messages_containing("written while the session was expired").await, 1);
    rig.stop().await;
}

/// Numbers typed at the `need_verifycode` prompt, in order.
struct Typed(Vec<&'static str>);

impl kesoku_chatbots::wechat::pair::VerifyCodes for Typed {
    fn ask(&mut self, _prompt: &str) -> std::io::Result<String> {
        Ok(if self.0.is_empty() { String::new() } else { self.0.remove(0).to_owned() })
    }
}

#[tokio::test]
async fn pairing_refreshes_an_expired_code_and_asks_for_the_phone_number() {
    use kesoku_chatbots::wechat::pair::{PairOptions, pair};
    let fake = FakeWeChat::start(FakeWeChatOptions {
        token: TOKEN.to_owned(),
        owner: OWNER.to_owned(),
        ..FakeWeChatOptions::default()
    })
    .await;
    let phone = async {
        assert!(fake.wait_for(|state| state.qr_count() == 1, Duration::from_secs(10)).await);
        let first = fake.qr_codes()[0].clone();
        fake.expire_qr(&first);
        assert!(fake.wait_for(|state| state.qr_count() == 2, Duration::from_secs(10)).await);
        let second = fake.qr_codes()[1].clone();
        fake.ask_verify_code(&second, "4711");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while fake.qr_status(&second).as_deref() != Some("scaned") {
            assert!(std::time::Instant::now() < deadline, "the right number is sent");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        fake.confirm(&second);
    };
    let mut out = Vec::new();
    let mut typed = Typed(vec!["1234", "4711"]);
    let options = PairOptions { poll_pause: Duration::from_millis(10), timeout: Duration::from_secs(30) };
    let base_url = fake.base_url();
    let (paired, ()) = tokio::join!(pair(&base_url, &mut out, &mut typed, options), phone);
    let pairing = paired.expect("paired");
    assert_eq!(pairing.token, TOKEN);
    assert_eq!(pairing.user_id.as_deref(), Some(OWNER));
    assert_eq!(pairing.base_url.as_deref(), Some(fake.base_url().as_str()));
    let shown = String::from_utf8(out).expect("utf-8");
    assert_eq!(shown.matches("Scan this QR code").count(), 2, "{shown}");
    assert!(shown.contains("The QR code expired") && shown.contains("did not match"), "{shown}");
    assert!(!shown.contains(TOKEN), "the token is never shown");
}
