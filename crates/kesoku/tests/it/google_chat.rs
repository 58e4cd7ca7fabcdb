//! `kesoku start` with `[[chatbots.google_chat]]` against the fake Google Chat (token endpoint,
//! Pub/Sub, Chat REST) and a mock Gemini model: a whole turn as a Chat user lives it (the
//! progress card ⏳ → ✅ and the answer in the same thread), a `[[cron]]` job delivering into a
//! Chat thread, and no message lost or sent twice when the Chat API fails for a while or the
//! service is SIGKILLed mid-delivery.

use std::time::{Duration, Instant};

use kesoku_chatbots::answer::markers;
use kesoku_chatbots::chunk::chunk_text;
use kesoku_chatbots::google_chat::Credentials;
use kesoku_chatbots::google_chat::auth::assertion;
use kesoku_chatbots::google_chat::format::to_chat_text;
use kesoku_chatbots::google_chat::outbound::CHUNK_CHARS;
use kesoku_chatbots::google_chat::rest::client_message_id;
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_core::{Message, MessageFilter, MessageType, Role, Status};
use kesoku_store::StoreHandle;
use kesoku_test_support::google_chat::{FakeChatMessage, FakeGoogleChat, FakeGoogleChatOptions, FakeUser, Said};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use serde_json::{Value, json};

use crate::support::{Service, Workspace, stderr};

const WAIT: Duration = Duration::from_secs(30);
const SERVICE_ENV: [(&str, &str); 2] =
    [("KESOKU_LOG", "info,kesoku_chatbots=debug"), ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY)];

struct Rig {
    fake: FakeGoogleChat,
    model: MockServer,
    workspace: Workspace,
    store: StoreHandle,
    service: Option<Service>,
    room: String,
    chii: FakeUser,
}

fn config(fake: &FakeGoogleChat, model: &MockServer, extra: &str) -> String {
    format!(
        "[agent]\nmodel = \"gem\"\n\n\
         [models.gem]\nprovider = \"gemini\"\nmodel = \"gemini-2.5-flash\"\nbase_url = \"{model_url}\"\napi_key_env = \"KESOKU_TEST_MOCK_KEY\"\n\n\
         [models.gem.retry]\nmax_attempts = 2\nbase_delay_seconds = 0.05\nmax_delay_seconds = 0.1\n\n\
         [service]\nshutdown_grace_s = 1\n\n\
         [[chatbots.google_chat]]\nchat_base_url = \"{base}\"\npubsub_base_url = \"{base}\"\nsubscription = \"{subscription}\"\n\
         credentials_file = \"google-key.json\"\ntimezone = \"UTC\"\n\n{extra}\n",
        model_url = model.base_url(),
        base = fake.base_url(),
        subscription = fake.subscription(),
    )
}

async fn rig(replies: Vec<MockReply>, extra: &str) -> Rig {
    let fake = FakeGoogleChat::start(FakeGoogleChatOptions::default());
    let room = fake.add_space("ROOM", false);
    let model = MockServer::start(Vendor::Gemini, replies).await;
    let workspace = Workspace::with_config(&config(&fake, &model, extra));
    std::fs::write(workspace.path().join("google-key.json"), fake.service_account_json()).expect("write the key");
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the workspace's store");
    let service = Service::spawn(&workspace, "service.log", &SERVICE_ENV);
    let rig = Rig {
        fake,
        model,
        workspace,
        store,
        service: Some(service),
        room,
        chii: FakeUser::new(7, "Chii", "chii@example.com"),
    };
    rig.wait_pulling().await;
    rig
}

impl Rig {
    fn log(&self) -> String {
        self.service.as_ref().map(Service::log).unwrap_or_default()
    }

    async fn wait_pulling(&self) {
        let before = self.fake.requests().iter().filter(|r| r.path.ends_with(":pull")).count();
        let pulling = self
            .fake
            .wait_for(|fake| fake.requests().iter().filter(|r| r.path.ends_with(":pull")).count() > before, WAIT);
        assert!(pulling.await, "the service pulls the subscription; log:\n{}", self.log());
    }

    async fn eventually<T, F>(&self, what: &str, probe: impl Fn() -> F) -> T
    where
        F: Future<Output = Option<T>>,
    {
        self.eventually_within(what, WAIT, probe).await
    }

    async fn eventually_within<T, F>(&self, what: &str, wait: Duration, probe: impl Fn() -> F) -> T
    where
        F: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; log:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn ingested(&self, said: &Said) -> Message {
        let id = platform_message_id("google_chat", &said.message);
        self.eventually("the chat message to be stored", || async {
            self.store.store.get_message(&id).await.expect("read the store")
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
            done.then_some(history)
        })
        .await
    }

    fn app_messages(&self, thread: &str) -> Vec<FakeChatMessage> {
        self.fake.messages_in(thread).into_iter().filter(|m| m.from_app).collect()
    }

    fn parts_in(&self, thread: &str) -> Vec<FakeChatMessage> {
        self.app_messages(thread).into_iter().filter(|m| m.name.contains("/messages/client-p-")).collect()
    }
}

fn answer_of(history: &[Message]) -> &Message {
    history.iter().rev().find(|m| m.role == Role::Assistant && m.message_type == MessageType::Text).expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_turn_updates_one_card_and_answers_in_the_same_thread() {
    let reply = "All **5** tests passed.";
    let rig = rig(
        vec![
            MockReply::Answer(MockAnswer::parts(vec![
                MockPart::thought("I will run the tests with the shell.", None),
                MockPart::tool_call("call_1", "run_shell_command", json!({ "command": "echo 5 passed" })),
            ])),
            MockReply::text(reply),
        ],
        "",
    )
    .await;
    let said = rig.fake.user_says(&rig.room, None, &rig.chii, "Run the tests");
    let root = rig.ingested(&said).await;
    assert_eq!((root.channel_id.as_str(), root.sender.as_str()), (said.thread.as_str(), "Chii"));
    let history = rig.answered(&root).await;
    let shape: Vec<(Role, MessageType, Status)> = history.iter().map(|m| (m.role, m.message_type, m.status)).collect();
    assert_eq!(
        shape,
        vec![
            (Role::User, MessageType::Text, Status::Processed),
            (Role::Assistant, MessageType::Thought, Status::Delivered),
            (Role::Tool, MessageType::ToolCall, Status::Delivered),
            (Role::Tool, MessageType::ToolResult, Status::Delivered),
            (Role::Assistant, MessageType::Text, Status::Delivered),
        ]
    );
    let messages = rig
        .eventually("the card finished and the answer in the thread", || async {
            let messages = rig.app_messages(&said.thread);
            let done = messages.iter().any(|m| m.rendered().starts_with("✅ Done"));
            (done && messages.len() == 2).then_some(messages)
        })
        .await;
    let card = messages[0].rendered();
    assert!(card.contains("Thoughts & Tools") && card.contains("✅ run_shell_command echo 5 passed"), "{card}");
    assert!(card.contains("💭 I will run the tests with the shell."), "{card}");
    assert!(card.contains("tool call"), "the metrics: {card}");
    assert!(messages[0].edits >= 2, "the card was updated in place: {}", messages[0].edits);
    assert_eq!(messages[1].text, "All *5* tests passed.");
    // The card was ⏳ while the call ran.
    let hourglass =
        rig.fake.requests().iter().any(|r| r.body.to_string().contains("⏳ run_shell_command echo 5 passed"));
    assert!(hourglass, "the call showed ⏳ before ✅");
    assert!(rig.fake.all_acked(), "the event was acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_job_delivers_into_a_google_chat_thread() {
    let thread = "spaces/ROOM/threads/standup";
    // Once a minute, at a second a few seconds from now (six fields, seconds first): a slow
    // start misses only the first slot, and the test ends well before a second one.
    let at = chrono::Utc::now() + chrono::Duration::seconds(5);
    let schedule = at.format("%S * * * * *").to_string();
    let cron = format!(
        "[[cron]]\nname = \"standup\"\nschedule = \"{schedule}\"\nprompt = \"Say good morning\"\nchatbot = \"google_chat\"\nchannel = \"{thread}\"\n"
    );
    let rig = rig(vec![MockReply::text("Good morning, team.")], &cron).await;
    let root = rig
        .eventually_within("the cron job's message", Duration::from_secs(75), || async {
            let filter = MessageFilter::default().with_chatbot("google_chat").with_roles(&[Role::User]);
            let messages = rig.store.store.list_messages(&filter).await.expect("list");
            messages.into_iter().find(|m| m.metadata.cron_job.as_deref() == Some("standup"))
        })
        .await;
    assert_eq!(root.channel_id, thread);
    let history = rig.answered(&root).await;
    assert_eq!(answer_of(&history).content, "Good morning, team.");
    let shown = rig
        .eventually("the answer in the thread", || async {
            let parts = rig.parts_in(thread);
            (!parts.is_empty()).then_some(parts)
        })
        .await;
    assert_eq!(shown[0].text, "Good morning, team.");
    assert_eq!(shown[0].thread, thread, "delivered into the job's thread");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_of_the_chat_api_delays_but_sends_every_chunk_once() {
    let text = (1..=300).map(|i| format!("Line {i} of the long answer, kept whole.")).collect::<Vec<_>>().join("\n");
    let rig = rig(vec![MockReply::text(text.clone())], "").await;
    // The turn's card is created, then the first chunk fails three times.
    rig.fake.fail_chat_after(1, 3, 503);
    let said = rig.fake.user_says(&rig.room, None, &rig.chii, "Tell me everything");
    let root = rig.ingested(&said).await;
    let history = rig.answered(&root).await;
    let expected: Vec<String> = chunk_text(&markers(&answer_of(&history).content).text, CHUNK_CHARS)
        .iter()
        .map(|chunk| to_chat_text(chunk))
        .collect();
    assert!(expected.len() >= 3, "{} chunks", expected.len());
    let parts = rig
        .eventually("every chunk", || async {
            let parts = rig.parts_in(&said.thread);
            (parts.len() >= expected.len()).then_some(parts)
        })
        .await;
    let texts: Vec<&str> = parts.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, expected, "every chunk exactly once, in order");
    assert_eq!(rig.fake.requests().iter().filter(|r| r.status == 503).count(), 3, "the outage hit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_delivery_then_a_restart_delivers_the_rest_exactly_once() {
    let text =
        (1..=400).map(|i| format!("Paragraph {i}: what the module keeps and why.")).collect::<Vec<_>>().join("\n");
    let mut rig = rig(vec![MockReply::text(text.clone())], "").await;
    // The card and the first chunk go through, then every call fails; kill the service while
    // it retries.
    rig.fake.fail_chat_after(2, 10_000, 503);
    let said = rig.fake.user_says(&rig.room, None, &rig.chii, "Explain everything");
    let first =
        rig.fake.wait_for(|fake| fake.messages_in(&said.thread).iter().any(|m| m.name.contains("client-p-")), WAIT);
    assert!(first.await, "the first chunk arrives; log:\n{}", rig.log());
    let failing = rig.fake.wait_for(|fake| fake.requests().iter().any(|r| r.status == 503), WAIT);
    assert!(failing.await);
    rig.service.take().expect("running").kill().await;
    rig.fake.clear_faults();

    let root = rig.ingested(&said).await;
    let history = rig.store.store.session_history(&root.session_id).await.expect("history");
    let answer = answer_of(&history).clone();
    assert_eq!(answer.status, Status::Pending, "killed mid-delivery");
    let expected: Vec<String> =
        chunk_text(&markers(&answer.content).text, CHUNK_CHARS).iter().map(|chunk| to_chat_text(chunk)).collect();
    assert!(expected.len() >= 4, "{} chunks", expected.len());
    let recorded = rig.store.store.delivery_records(&answer.id).await.expect("records").len();
    assert!(recorded >= 1 && recorded == rig.parts_in(&said.thread).len() && recorded < expected.len());

    // The worst moment of a crash: Chat took the next chunk and the process died before
    // recording it. Post it as the dead process did: its token, the part's id and requestId.
    let next = recorded;
    let id = client_message_id("p", &format!("{}:{next}", answer.id));
    let Credentials::ServiceAccount(key) =
        Credentials::from_json(&rig.fake.service_account_json()).expect("the test key");
    let client = reqwest::Client::new();
    let jwt = assertion(&key, chrono::Utc::now().timestamp()).expect("sign");
    let token: Value = client
        .post(rig.fake.token_uri())
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion={jwt}"))
        .send()
        .await
        .expect("token")
        .json()
        .await
        .expect("json");
    let posted = client
        .post(format!(
            "{}/v1/spaces/ROOM/messages?messageId={id}&requestId={id}&messageReplyOption=REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD",
            rig.fake.base_url()
        ))
        .bearer_auth(token["access_token"].as_str().expect("a token"))
        .json(&json!({ "text": expected[next], "thread": { "name": said.thread } }))
        .send()
        .await
        .expect("post");
    assert_eq!(posted.status(), 200);

    rig.service = Some(Service::spawn(&rig.workspace, "restarted.log", &SERVICE_ENV));
    rig.wait_pulling().await;
    let history = rig.answered(&root).await;
    assert_eq!(answer_of(&history).status, Status::Delivered);
    let parts = rig
        .eventually("every chunk", || async {
            let parts = rig.parts_in(&said.thread);
            (parts.len() >= expected.len()).then_some(parts)
        })
        .await;
    let texts: Vec<&str> = parts.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, expected, "every chunk exactly once, in order");
    let sent_again =
        rig.fake.requests().iter().filter(|r| r.status == 200 && r.query.get("requestId") == Some(&id)).count();
    assert_eq!(sent_again, 2, "the restart sent the unrecorded chunk again; its requestId kept it single");
    assert_eq!(rig.model.requests().len(), 1, "the turn was not run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_credentials_the_start_is_refused_naming_what_to_set() {
    let fake = FakeGoogleChat::start(FakeGoogleChatOptions::default());
    let model = MockServer::start(Vendor::Gemini, Vec::new()).await;
    let text = config(&fake, &model, "").replace("credentials_file = \"google-key.json\"\n", "");
    let workspace = Workspace::with_config(&text);
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let home = workspace.path().display().to_string();
    let env = [("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY), ("GOOGLE_APPLICATION_CREDENTIALS", ""), ("HOME", home.as_str())];
    let started = tokio::time::timeout(WAIT, workspace.run(&["start"], &env)).await.expect("start gives up at once");
    assert!(!started.status.success());
    let error = stderr(&started);
    assert!(error.contains("GOOGLE_APPLICATION_CREDENTIALS") && error.contains("credentials_file"), "{error}");
    assert!(error.contains("[[chatbots.google_chat]] id = \"google_chat\""), "the entry is named: {error}");
    assert!(fake.requests().is_empty(), "nothing was called");
}
