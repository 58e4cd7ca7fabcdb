//! `kesoku start` with `[[chatbots.wechat]]` against the fake iLink API and a mock Gemini
//! model: whole turns as a WeChat user lives them (spec §3.1, §4.3, example 6.2), asserted in
//! the workspace's store and in what the fake saw; API failures and SIGKILL injected from
//! outside; and `kesoku wechat pair` storing the token privately.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use chrono::{Timelike, Utc};
use kesoku_chatbots::answer::markers;
use kesoku_chatbots::chunk::chunk_text;
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_chatbots::wechat::inbound::context_token_key;
use kesoku_chatbots::wechat::outbound::{WECHAT_MAX_CHARS, part_client_id};
use kesoku_chatbots::wechat::text::plain_text;
use kesoku_core::{Message, MessageType, Role, Status};
use kesoku_store::StoreHandle;
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use kesoku_test_support::wechat::{FakeWeChat, FakeWeChatOptions, Fault};
use serde_json::json;

use crate::support::{Service, Workspace, stderr, stdout};

const TOKEN: &str = "e2e-fake-wechat-token";
const CHII: &str = "wxid_chii@im.wechat";
const ROOM: &str = "room123456@chatroom";
const WAIT: Duration = Duration::from_secs(30);

const SERVICE_ENV: [(&str, &str); 3] =
    [("KESOKU_LOG", "info,kesoku_chatbots=debug"), ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY), ("WECHAT_TOKEN", TOKEN)];

fn config(fake: &FakeWeChat, model: &MockServer, extra: &str, wechat_extra: &str) -> String {
    format!(
        "[agent]\nmodel = \"gem\"\n\n\
         [models.gem]\nprovider = \"gemini\"\nmodel = \"gemini-2.5-flash\"\nbase_url = \"{model_url}\"\napi_key_env = \"KESOKU_TEST_MOCK_KEY\"\n\n\
         [models.gem.retry]\nmax_attempts = 2\nbase_delay_seconds = 0.05\nmax_delay_seconds = 0.1\n\n\
         [service]\nshutdown_grace_s = 1\n\n{extra}\n\
         [[chatbots.wechat]]\nbase_url = \"{api}\"\ncdn_base_url = \"{cdn}\"\ntimezone = \"Asia/Shanghai\"\n{wechat_extra}\n",
        model_url = model.base_url(),
        api = fake.base_url(),
        cdn = fake.cdn_base_url(),
    )
}

struct Rig {
    fake: FakeWeChat,
    model: MockServer,
    workspace: Workspace,
    store: StoreHandle,
    service: Option<Service>,
}

async fn fake() -> FakeWeChat {
    FakeWeChat::start(FakeWeChatOptions { token: TOKEN.to_owned(), ..FakeWeChatOptions::default() }).await
}

/// The fake, the model (answering `replies` in order) and an initialised workspace whose
/// config has `extra` TOML and a WeChat bot (token from `WECHAT_TOKEN`) answering Chii; the
/// service is started by [`Rig::start`].
async fn rig_with(replies: Vec<MockReply>, extra: &str) -> Rig {
    let fake = fake().await;
    let model = MockServer::start(Vendor::Gemini, replies).await;
    let wechat_extra = format!("token_env = \"WECHAT_TOKEN\"\nallowed_users = [\"{CHII}\"]\n");
    let workspace = Workspace::with_config(&config(&fake, &model, extra, &wechat_extra));
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the workspace's store");
    Rig { fake, model, workspace, store, service: None }
}

impl Rig {
    async fn start(&mut self, log: &str) {
        let polls = self.fake.cursors().len();
        self.service = Some(Service::spawn(&self.workspace, log, &SERVICE_ENV));
        self.eventually("the bot to poll", || async { (self.fake.cursors().len() > polls).then_some(()) }).await;
    }

    async fn eventually<T, F>(&self, what: &str, probe: impl Fn() -> F) -> T
    where
        F: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; calls: {:?}\nlog:\n{}",
                self.fake.calls(),
                self.service.as_ref().map(Service::log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn ingested(&self, wechat_message_id: &str) -> Message {
        let id = platform_message_id("wechat", wechat_message_id);
        self.eventually("the message to be ingested", || async {
            self.store.store.get_message(&id).await.expect("read")
        })
        .await
    }

    /// The session of `root` once its turn is `processed` and every message of it `delivered`.
    async fn answered(&self, root: &Message) -> Vec<Message> {
        self.eventually("the turn to be answered and delivered", || async {
            let history = self.store.store.session_history(&root.session_id).await.expect("history");
            let root_now = history.iter().find(|m| m.id == root.id)?;
            let turn: Vec<&Message> = history.iter().filter(|m| m.created_at >= root.created_at).collect();
            let done = root_now.status == Status::Processed
                && turn.iter().any(|m| m.role == Role::Assistant && m.message_type == MessageType::Text)
                && turn.iter().filter(|m| m.id != root.id).all(|m| m.status == Status::Delivered);
            done.then_some(turn.into_iter().cloned().collect())
        })
        .await
    }
}

fn shape(turn: &[Message]) -> Vec<(Role, MessageType, Status)> {
    turn.iter().map(|m| (m.role, m.message_type, m.status)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_turn_shows_only_the_answer_and_every_step_ends_delivered() {
    let thought = "I need to run the unit tests for the history module.";
    let reply = "## Result\nAll **5 tests** passed in 0.42 seconds.";
    let mut rig = rig_with(
        vec![
            MockReply::Answer(MockAnswer::parts(vec![
                MockPart::thought(thought, None),
                MockPart::tool_call("call_1", "run_shell_command", json!({ "command": "echo \"5 passed in 0.42s\"" })),
            ])),
            MockReply::text(reply),
        ],
        "",
    )
    .await;
    rig.start("service.log").await;
    let said = rig.fake.user_says(CHII, "Run tests for agent history module");
    let root = rig.ingested(&said).await;
    assert_eq!((root.channel_id.as_str(), root.sender.as_str()), (CHII, CHII));
    assert!(root.content.ends_with(" Asia/Shanghai`:\nRun tests for agent history module"), "{}", root.content);
    let turn = rig.answered(&root).await;
    assert_eq!(
        shape(&turn),
        vec![
            (Role::User, MessageType::Text, Status::Processed),
            (Role::Assistant, MessageType::Thought, Status::Delivered),
            (Role::Tool, MessageType::ToolCall, Status::Delivered),
            (Role::Tool, MessageType::ToolResult, Status::Delivered),
            (Role::Assistant, MessageType::Text, Status::Delivered),
        ]
    );
    assert!(turn[3].content.contains("5 passed in 0.42s"), "the command ran: {}", turn[3].content);
    // WeChat saw the answer as plain text, and nothing of the steps.
    let texts = rig.fake.texts_to(CHII);
    assert_eq!(texts, vec!["Result\nAll 5 tests passed in 0.42 seconds.".to_owned()]);
    assert_eq!(rig.fake.sent().len(), 1, "thoughts and tool steps are never sent");
    rig.eventually("typing on, then off", || async {
        let typing = rig.fake.typing();
        (typing.first() == Some(&(CHII.to_owned(), 1)) && typing.last() == Some(&(CHII.to_owned(), 2))).then_some(())
    })
    .await;
    // A duplicate delivery of the same message starts nothing.
    rig.fake.redeliver(&said);
    rig.eventually("the redelivery to be polled past", || async {
        rig.fake.cursors().contains(&"cur-2".to_owned()).then_some(())
    })
    .await;
    let history = rig.store.store.session_history(&root.session_id).await.expect("history");
    assert_eq!(history.iter().filter(|m| m.role == Role::User).count(), 1, "stored once");
    assert_eq!(rig.model.requests().len(), 2, "no second turn");
    rig.service.take().expect("running").terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_6_2_a_cron_job_delivers_into_a_wechat_room() {
    let thought = "WeChat is active. I will run direct system stats and write a concise diagnostic report.";
    let reply = "Diagnostics completed successfully. System status is stable. Uptime: 3d 12h, Memory: 45% occupied, 0 active errors reported.";
    // Fires once, a few seconds from now (six fields: seconds first; Shanghai time, UTC+8).
    let shanghai = chrono::FixedOffset::east_opt(8 * 3600).expect("an offset");
    let at = (Utc::now() + chrono::Duration::seconds(8)).with_timezone(&shanghai);
    let cron = format!(
        "[[cron]]\nname = \"status\"\nschedule = \"{} {} {} * * *\"\nprompt = \"Run active diagnostics and output status summary.\"\nchatbot = \"wechat\"\nchannel = \"{ROOM}\"\ntimezone = \"Asia/Shanghai\"\ncatch_up = false\n",
        at.second(),
        at.minute(),
        at.hour()
    );
    let mut rig = rig_with(
        vec![MockReply::Answer(MockAnswer::parts(vec![MockPart::thought(thought, None), MockPart::text(reply)]))],
        &cron,
    )
    .await;
    // The room spoke to the bot before: its context token is known (a bot can only write to
    // peers that wrote to it).
    let token = rig.fake.grant_context_token(ROOM);
    rig.store.store.set_chatbot_state("wechat", &context_token_key(ROOM), &token).await.expect("state");
    rig.start("service.log").await;

    let root = rig
        .eventually("the cron trigger", || async {
            let filter = kesoku_core::MessageFilter::default().with_chatbot("wechat").with_roles(&[Role::User]);
            let found = rig.store.store.list_messages(&filter).await.expect("list");
            found.into_iter().find(|m| m.channel_id == ROOM)
        })
        .await;
    assert_eq!(root.sender, "Cronjob");
    assert_eq!(root.metadata.is_cronjob, Some(true));
    assert!(root.content.starts_with("`Cronjob` at `"), "{}", root.content);
    assert!(
        root.content.ends_with(" Asia/Shanghai`:\nRun active diagnostics and output status summary."),
        "{}",
        root.content
    );
    let turn = rig.answered(&root).await;
    assert_eq!(
        shape(&turn),
        vec![
            (Role::User, MessageType::Text, Status::Processed),
            (Role::Assistant, MessageType::Thought, Status::Delivered),
            (Role::Assistant, MessageType::Text, Status::Delivered),
        ]
    );
    assert_eq!(turn[1].content, thought);
    assert!(turn.iter().all(|m| m.chatbot_id == "wechat" && m.channel_id == ROOM));
    // The room saw the report only, never the thought.
    assert_eq!(rig.fake.texts_to(ROOM), vec![reply.to_owned()]);
    assert_eq!(rig.fake.sent().len(), 1);
    rig.service.take().expect("running").terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_failures_and_sigkill_mid_delivery_lose_nothing_and_send_nothing_twice() {
    let text: String = (0..700).map(|i| format!("Line {i:03} of the long report.\n")).collect();
    let mut rig = rig_with(
        vec![MockReply::Delayed { delay: Duration::from_millis(800), reply: Box::new(MockReply::text(text.clone())) }],
        "",
    )
    .await;
    rig.start("service.log").await;
    let said = rig.fake.user_says(CHII, "Write the long report");
    // The first chunk goes through; then the API fails (server errors) until the service is
    // killed in the middle of retrying.
    rig.fake.fail_after("sendmessage", 1, 100_000, Fault::ServerError);
    rig.eventually("a few failed sends after the first chunk", || async {
        let calls = rig.fake.calls().iter().filter(|c| *c == "sendmessage").count();
        (rig.fake.sent().len() == 1 && calls >= 3).then_some(())
    })
    .await;
    rig.service.take().expect("running").kill().await;

    let root = rig.ingested(&said).await;
    let history = rig.store.store.session_history(&root.session_id).await.expect("history");
    let answer = history.iter().rev().find(|m| m.role == Role::Assistant).expect("answer").clone();
    assert_eq!(answer.status, Status::Pending, "killed mid-delivery");
    let expected: Vec<String> =
        chunk_text(&markers(&answer.content).text, WECHAT_MAX_CHARS).iter().map(|c| plain_text(c)).collect();
    assert!(expected.len() >= 3, "{} chunks", expected.len());
    let recorded = rig.store.store.delivery_records(&answer.id).await.expect("records").len();
    assert_eq!(recorded, 1);

    // The worst moment of a crash: WeChat accepted the next chunk, the process died before
    // recording it. Send it as the dead process did (its client id, the peer's token).
    rig.fake.clear_faults();
    let token = rig.store.store.chatbot_state("wechat", &context_token_key(CHII)).await.expect("state").expect("token");
    let resent = reqwest::Client::new()
        .post(format!("{}/ilink/bot/sendmessage", rig.fake.base_url()))
        .header("AuthorizationType", "ilink_bot_token")
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("X-WECHAT-UIN", "MTIzNDU2")
        .json(&json!({
            "base_info": {},
            "msg": {
                "to_user_id": CHII, "client_id": part_client_id(&format!("{}:1", answer.id)),
                "message_type": 2, "message_state": 2, "context_token": token,
                "item_list": [{ "type": 1, "text_item": { "text": expected[1] } }],
            },
        }))
        .send()
        .await
        .expect("send to the fake");
    assert_eq!(resent.status(), 200);

    rig.start("restarted.log").await;
    let turn = rig.answered(&root).await;
    assert_eq!(turn.last().map(|m| m.status), Some(Status::Delivered));
    let texts = rig.fake.texts_to(CHII);
    assert_eq!(texts, expected, "every chunk exactly once, in order");
    let joined = texts.join("\n");
    for i in [0, 350, 699] {
        assert_eq!(joined.matches(&format!("Line {i:03} ")).count(), 1);
    }
    assert_eq!(rig.store.store.delivery_records(&answer.id).await.expect("records").len(), expected.len());
    assert_eq!(rig.model.requests().len(), 1, "the turn was not run again");
    rig.service.take().expect("running").terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_pair_stores_the_token_privately_and_start_uses_it() {
    let fake = fake().await;
    let model = MockServer::start(Vendor::Gemini, vec![MockReply::text("Hello, owner.")]).await;
    let workspace = Workspace::with_config(&config(&fake, &model, "", ""));
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));

    // Before pairing, `kesoku start` refuses with the fix.
    let refused = workspace.run(&["start"], &[("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY)]).await;
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("kesoku wechat pair"), "{}", stderr(&refused));

    // The phone: let the first code expire, scan and confirm the second.
    let phone = async {
        assert!(fake.wait_for(|state| state.qr_count() == 1, WAIT).await, "a first qr code");
        let first = fake.qr_codes()[0].clone();
        fake.expire_qr(&first);
        assert!(fake.wait_for(|state| state.qr_count() == 2, WAIT).await, "a fresh qr code");
        let second = fake.qr_codes()[1].clone();
        fake.scan(&second);
        fake.confirm(&second);
    };
    let (paired, ()) = tokio::join!(workspace.run(&["wechat", "pair"], &[]), phone);
    let (out, err) = (stdout(&paired), stderr(&paired));
    assert!(paired.status.success(), "pairing failed:\n{out}\n{err}");
    assert!(out.contains('▀') || out.contains('▄'), "the qr code is drawn:\n{out}");
    assert!(out.contains("https://liteapp.weixin.qq.com/q/"), "the url is printed:\n{out}");
    assert!(!out.contains(TOKEN) && !err.contains(TOKEN), "the token is never printed");

    let secrets = workspace.path().join("kesoku-secrets");
    let file = secrets.join("wechat-wechat.json");
    let mode = |path: &std::path::Path| std::fs::metadata(path).expect("exists").permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&secrets), 0o700);
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("json");
    assert_eq!(stored["token"], TOKEN);
    assert_eq!(stored["bot_id"], FakeWeChatOptions::default().bot_id);
    assert_eq!(stored["user_id"], FakeWeChatOptions::default().owner);
    let config_text = std::fs::read_to_string(workspace.path().join("kesoku.toml")).expect("config");
    assert!(!config_text.contains(TOKEN), "never in the config file");

    // `kesoku start` uses the stored token, and answers the account that paired.
    let service = Service::spawn(&workspace, "service.log", &[("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY)]);
    let owner = FakeWeChatOptions::default().owner;
    fake.user_says(&owner, "hi");
    let answered = fake.wait_for(|state| state.sent().iter().any(|m| m.to == owner), WAIT).await;
    assert!(answered, "the paired owner is answered; log:\n{}", service.log());
    assert!(!service.log().contains(TOKEN), "the token is never logged");
    service.terminate().await;
}
