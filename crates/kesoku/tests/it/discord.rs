//! `kesoku start` with `[[chatbots.discord]]` against the fake Discord (gateway + REST) and a
//! mock Gemini model: whole turns as a Discord user lives them (spec §3.1, §4.2, §4.3, examples
//! 6.1 and 6.3), asserted both in the workspace's store and in what the fake saw (creates,
//! edits, deletes, uploads, interactions), with faults (dropped sockets, 429 storms, SIGKILL)
//! injected from outside the process.

use std::time::{Duration, Instant};

use kesoku_chatbots::answer::markers;
use kesoku_chatbots::chunk::chunk_text;
use kesoku_chatbots::discord::outbound::part_nonce;
use kesoku_chatbots::discord::status::{metrics_header, stop_button};
use kesoku_chatbots::ingest::platform_message_id;
use kesoku_core::{Message, MessageType, Role, Status};
use kesoku_store::StoreHandle;
use kesoku_test_support::discord::{
    ChannelId, FakeDiscord, FakeDiscordOptions, FakeMessage, MessageId as DiscordMessageId, RecordedRequest,
    SayOptions, UserId,
};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use serde_json::{Value, json};

use crate::support::{Service, Workspace, stderr};

const TOKEN: &str = "e2e-fake-discord-token";
const WAIT: Duration = Duration::from_secs(20);
const RUN_TESTS: &str = "Run tests for agent history module";

/// The service's environment: the model's key, the fake's token, debug logs of the chatbots.
const SERVICE_ENV: [(&str, &str); 3] =
    [("KESOKU_LOG", "info,kesoku_chatbots=debug"), ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY), ("DISCORD_TOKEN", TOKEN)];

/// One workspace running `kesoku start` with a Discord bot on the fake: a guild with a
/// `general` channel and the user Chii.
struct Rig {
    fake: FakeDiscord,
    model: MockServer,
    workspace: Workspace,
    store: StoreHandle,
    service: Option<Service>,
    general: ChannelId,
    chii: UserId,
}

/// The `[[chatbots.discord]]` table and the model for `fake` and `model`, plus `discord_extra`
/// lines inside the Discord table.
fn config(fake: &FakeDiscord, model: &MockServer, discord_extra: &str) -> String {
    format!(
        "[agent]\nmodel = \"gem\"\n\n\
         [models.gem]\nprovider = \"gemini\"\nmodel = \"gemini-2.5-flash\"\nbase_url = \"{model_url}\"\napi_key_env = \"KESOKU_TEST_MOCK_KEY\"\n\n\
         [models.gem.retry]\nmax_attempts = 2\nbase_delay_seconds = 0.05\nmax_delay_seconds = 0.1\n\n\
         [service]\nshutdown_grace_s = 1\n\n\
         [[chatbots.discord]]\napi_base_url = \"{api}\"\ngateway_url = \"{gateway}\"\ntimezone = \"UTC\"\n{discord_extra}\n",
        model_url = model.base_url(),
        api = fake.api_base_url(),
        gateway = fake.gateway_url(),
    )
}

/// Start the fake, the model (answering `replies` in order) and the service; returns once the
/// bot is connected and has registered its commands (so later REST faults meet the turn, not
/// the start-up). `discord_extra` gets the users' ids to write an allow-list.
async fn rig_with(replies: Vec<MockReply>, discord_extra: impl FnOnce(&FakeDiscord, UserId) -> String) -> Rig {
    let fake = FakeDiscord::start(FakeDiscordOptions { token: TOKEN.to_owned(), ..FakeDiscordOptions::default() });
    let guild = fake.add_guild("Kesoku HQ");
    let general = fake.add_text_channel(guild, "general");
    let chii = fake.add_user("chii", "Chii", false);
    let model = MockServer::start(Vendor::Gemini, replies).await;
    let extra = discord_extra(&fake, chii);
    let workspace = Workspace::with_config(&config(&fake, &model, &extra));
    let init = workspace.run(&["init"], &[]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let url = format!("sqlite://{}", workspace.path().join(".kesoku/kesoku.db").display());
    let store = kesoku_store::open_existing(&url).await.expect("open the workspace's store");
    let service = Service::spawn(&workspace, "service.log", &SERVICE_ENV);
    let mut rig = Rig { fake, model, workspace, store, service: Some(service), general, chii };
    rig.wait_started().await;
    rig
}

async fn rig(replies: Vec<MockReply>) -> Rig {
    rig_with(replies, |_, _| String::new()).await
}

fn is_command_registration(request: &RecordedRequest) -> bool {
    request.method == "PUT" && request.path.ends_with("/commands")
}

fn is_create_in(request: &RecordedRequest, channel: ChannelId) -> bool {
    request.method == "POST" && request.path == format!("/api/v10/channels/{channel}/messages")
}

impl Rig {
    fn service(&self) -> &Service {
        self.service.as_ref().expect("the service runs")
    }

    /// Wait until the bot is connected and has registered its application commands.
    async fn wait_started(&mut self) {
        let registrations = self.fake.requests().iter().filter(|r| is_command_registration(r)).count();
        let started = self
            .fake
            .wait_for(
                |state| {
                    state.live_connections() == 1
                        && state.requests().iter().filter(|r| is_command_registration(r)).count() > registrations
                },
                WAIT,
            )
            .await;
        assert!(started, "the bot connects to the fake and registers its commands; log:\n{}", self.service().log());
    }

    /// Poll `probe` until it gives a value, at most [`WAIT`]; the service log is shown on a timeout.
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
                "timed out waiting for {what}; requests: {:#?}\nlog:\n{}",
                self.fake.requests(),
                self.service.as_ref().map(Service::log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn say(&self, channel: ChannelId, user: UserId, content: &str) -> DiscordMessageId {
        self.fake.user_says(channel, user, content, SayOptions::default()).await
    }

    async fn stored(&self, discord_message: DiscordMessageId) -> Option<Message> {
        let id = platform_message_id("discord", &discord_message.to_string());
        self.store.store.get_message(&id).await.expect("read the store")
    }

    /// The stored message for `discord_message`, once ingested.
    async fn ingested(&self, discord_message: DiscordMessageId) -> Message {
        self.eventually("the discord message to be ingested", || self.stored(discord_message)).await
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

    /// The bot's messages now in `channel`.
    fn bot_messages(&self, channel: ChannelId) -> Vec<FakeMessage> {
        let bot = self.fake.bot_user_id();
        self.fake.messages(channel).into_iter().filter(|message| message.author == bot).collect()
    }

    /// The bot's messages in `channel` once `ready` holds for them.
    async fn bot_messages_when(&self, channel: ChannelId, ready: impl Fn(&[FakeMessage]) -> bool) -> Vec<FakeMessage> {
        self.eventually("the bot's messages on discord", || async {
            let messages = self.bot_messages(channel);
            ready(&messages).then_some(messages)
        })
        .await
    }

    /// Message-route requests (creates, edits, deletes) the fake saw in `channel`.
    fn message_requests(&self, channel: ChannelId) -> Vec<RecordedRequest> {
        let prefix = format!("/api/v10/channels/{channel}/messages");
        self.fake.requests().into_iter().filter(|request| request.path.starts_with(&prefix)).collect()
    }
}

/// The Discord thread (a channel) started from `message`: its id is the message's.
fn thread_of(message: DiscordMessageId) -> ChannelId {
    ChannelId(message.get())
}

/// The last assistant text of `history`.
fn answer_of(history: &[Message]) -> &Message {
    history.iter().rev().find(|m| m.role == Role::Assistant && m.message_type == MessageType::Text).expect("an answer")
}

fn assert_header(message: &Message, name: &str, user: UserId, prompt: &str) {
    let content = &message.content;
    let start = format!("`{name}` <@{user}> at `");
    let end = format!(" UTC`:\n{prompt}");
    assert!(content.starts_with(&start) && content.ends_with(&end), "header of {content:?}");
    let stamp = &content[start.len()..content.len() - end.len()];
    let shape: String = stamp.chars().map(|c| if c.is_ascii_digit() { '9' } else { c }).collect();
    assert_eq!(shape, "9999-99-99 99:99:99", "the time in {content:?}");
}

fn fences(text: &str) -> usize {
    text.lines().filter(|line| line.trim_start().starts_with("```")).count()
}

/// The lines of a text that are not fences or blank: what must survive chunking.
fn content_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty() && !line.trim_start().starts_with("```"))
        .map(str::to_owned)
        .collect()
}

/// About `chars` characters of prose and a fenced code block in the middle, in short lines.
fn long_answer(chars: usize) -> String {
    let mut text = String::from("Here is the whole module, explained.\n\n");
    let mut line = 0;
    while text.len() < chars * 3 / 10 {
        line += 1;
        text.push_str(&format!("Paragraph line {line} says what the history module keeps and why it keeps it.\n"));
    }
    text.push_str("\n```rust\n");
    while text.len() < chars * 7 / 10 {
        line += 1;
        text.push_str(&format!("    let entry_{line} = history.entry({line}).expect(\"entry {line} exists\");\n"));
    }
    text.push_str("```\n\n");
    while text.len() < chars {
        line += 1;
        text.push_str(&format!("Closing line {line}: the tests cover every branch of it.\n"));
    }
    text.trim_end().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_6_1_a_tool_turn_in_a_guild_channel_runs_in_a_thread_with_a_live_status() {
    let thought = "I need to run the unit tests for the history module. I will run them with the shell.";
    let command = "echo \"5 passed in 0.42s\"";
    let reply =
        "I have successfully executed the tests for the agent history module. All 5 tests passed in 0.42 seconds.";
    let rig = rig(vec![
        MockReply::Answer(MockAnswer::parts(vec![
            MockPart::thought(thought, None),
            MockPart::tool_call("call_1", "run_shell_command", json!({ "command": command })),
        ])),
        MockReply::text(reply),
    ])
    .await;

    let said = rig.say(rig.general, rig.chii, RUN_TESTS).await;
    let root = rig.ingested(said).await;
    let history = rig.answered(&root).await;
    let thread = thread_of(said);

    // §3.1: the thread started from the message is the channel; the sender and header are Chii's.
    assert_eq!(rig.fake.threads(), vec![(thread, rig.general, RUN_TESTS.to_owned())]);
    assert_eq!((root.chatbot_id.as_str(), root.channel_id.as_str()), ("discord", thread.to_string().as_str()));
    assert_eq!(root.sender, "Chii");
    assert_header(&root, "Chii", rig.chii, RUN_TESTS);
    assert_eq!(root.metadata.discord_message_id, Some(said.to_string()));

    // The trajectory of example 6.1.
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
    assert_eq!(history[1].content, thought);
    assert!(history[3].content.contains("5 passed in 0.42s"), "the command really ran: {}", history[3].content);
    let answer = answer_of(&history);
    assert_eq!(answer.content, reply);
    assert!(history.iter().all(|m| m.channel_id == root.channel_id), "everything happens in the thread");

    // What Discord saw: nothing in the channel, a status message created then edited in place,
    // the reply with its nonce, the status folded to the turn's figures without a Stop button.
    assert!(rig.bot_messages(rig.general).is_empty(), "the bot writes only in the thread");
    let folded = metrics_header(answer.metadata.turn_metrics.as_ref().expect("turn metrics on the answer"));
    let messages = rig.bot_messages_when(thread, |messages| messages.first().is_some_and(|m| m.edits == 3)).await;
    assert_eq!(messages.len(), 2, "{messages:#?}");
    let (status, posted) = (&messages[0], &messages[1]);
    assert_eq!((status.content.as_str(), &status.components), (folded.as_str(), &json!([])));
    assert_eq!(posted.content, reply);
    assert_eq!(posted.nonce, Some(part_nonce(&format!("{}:0", answer.id))));

    let running = format!("⏳ Working…\n💭 {thought}");
    let tool = format!("🛠️ run_shell_command: {command}");
    let stop = stop_button(&root.session_id);
    assert_eq!(stop[0]["components"][0]["custom_id"], format!("kesoku:stop:{}", root.session_id));
    let seen: Vec<(String, String, Value)> = rig
        .message_requests(thread)
        .into_iter()
        .map(|request| {
            let target = request.path.rsplit('/').next().unwrap_or_default().to_owned();
            let what = if target == "messages" { "create".to_owned() } else { format!("{} {target}", request.method) };
            (what, request.body["content"].as_str().unwrap_or_default().to_owned(), request.body["components"].clone())
        })
        .collect();
    let edit = format!("PATCH {}", status.id);
    assert_eq!(
        seen,
        vec![
            ("create".to_owned(), running.clone(), stop.clone()),
            (edit.clone(), format!("{running}\n{tool} ⏳"), stop.clone()),
            (edit.clone(), format!("{running}\n{tool} ✅"), stop),
            ("create".to_owned(), reply.to_owned(), Value::Null),
            (edit, folded, json!([])),
        ]
    );
    let creates: Vec<RecordedRequest> =
        rig.message_requests(thread).into_iter().filter(|r| r.method == "POST").collect();
    assert!(creates.iter().all(|r| r.body["enforce_nonce"] == json!(true) && r.body["nonce"].is_string()));
    assert!(rig.fake.typing_count(thread) >= 1, "typing while the turn ran");
    assert!(rig.model.violations().is_empty(), "{:?}", rig.model.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_6_3_a_new_message_interrupts_the_running_turn_and_deletes_its_status() {
    let rig = rig(vec![
        MockReply::Answer(MockAnswer::parts(vec![
            MockPart::thought("Let me sketch the component first.", None),
            MockPart::tool_call("call_a", "run_shell_command", json!({ "command": "echo sketched" })),
        ])),
        MockReply::HangAfter {
            answer: MockAnswer::parts(vec![
                MockPart::thought("Now the template of the component.", None),
                MockPart::text("Here is the web component."),
            ]),
            events: 1,
        },
        MockReply::text("A command line tool it is: here is its outline."),
    ])
    .await;

    let said_a = rig.say(rig.general, rig.chii, "Build a new web component").await;
    let thread = thread_of(said_a);
    let root_a = rig.ingested(said_a).await;
    // The turn showed its steps and now waits on a model call that hangs.
    let status = rig
        .bot_messages_when(thread, |messages| messages.len() == 1 && messages[0].content.ends_with('✅'))
        .await
        .remove(0);
    rig.eventually("the second model call", || async { (rig.model.requests().len() == 2).then_some(()) }).await;
    assert_eq!(
        rig.store.store.get_message(&root_a.id).await.expect("read").expect("exists").status,
        Status::Processing
    );

    let said_b = rig.say(thread, rig.chii, "Wait, actually build a command line tool instead").await;
    let root_b = rig.ingested(said_b).await;
    let history = rig.answered(&root_b).await;

    assert_eq!(root_b.session_id, root_a.session_id, "the thread is one session");
    assert_eq!(root_b.channel_id, thread.to_string());
    let a = history.iter().find(|m| m.id == root_a.id).expect("root A");
    assert_eq!(a.status, Status::Interrupted);
    let thought_a = history.iter().find(|m| m.message_type == MessageType::Thought).expect("A's thought");
    assert_eq!((thought_a.parent_id.as_ref(), thought_a.status), (Some(&root_a.id), Status::Delivered));
    assert_eq!(answer_of(&history).parent_id.as_ref(), Some(&root_b.id));
    assert!(rig.model.wait_for_disconnects(1, WAIT).await, "the hanging model call was dropped");

    // On Discord: A's status message is gone; B's answer is there (B showed no steps: no status).
    let messages = rig.bot_messages_when(thread, |messages| messages.len() == 1 && messages[0].id != status.id).await;
    assert_eq!(rig.fake.deleted(thread), vec![status.id], "A's status message was deleted");
    assert_eq!(
        messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
        ["A command line tool it is: here is its outline."]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stop_button_interrupts_the_running_turn_and_deletes_its_status() {
    let rig = rig(vec![
        MockReply::Answer(MockAnswer::parts(vec![
            MockPart::thought("Let me look at the logs.", None),
            MockPart::tool_call("call_a", "run_shell_command", json!({ "command": "echo looked" })),
        ])),
        MockReply::HangAfter { answer: MockAnswer::text("Still reading the logs."), events: 1 },
    ])
    .await;
    let said = rig.say(rig.general, rig.chii, "Read all the logs").await;
    let thread = thread_of(said);
    let root = rig.ingested(said).await;
    let status = rig
        .bot_messages_when(thread, |messages| messages.len() == 1 && messages[0].content.ends_with('✅'))
        .await
        .remove(0);
    rig.eventually("the second model call", || async { (rig.model.requests().len() == 2).then_some(()) }).await;

    let stop = stop_button(&root.session_id)[0]["components"][0]["custom_id"].as_str().expect("an id").to_owned();
    let interaction = rig.fake.click_button(thread, status.id, &stop, rig.chii).await;
    rig.eventually("the turn to be interrupted", || async {
        let root = rig.store.store.get_message(&root.id).await.expect("read").expect("exists");
        (root.status == Status::Interrupted).then_some(())
    })
    .await;
    assert!(rig.fake.wait_for(|state| state.deleted(thread) == vec![status.id], WAIT).await, "the status is deleted");
    assert!(rig.model.wait_for_disconnects(1, WAIT).await, "the hanging model call was dropped");
    let responses = rig.fake.interaction_responses(interaction);
    assert_eq!(responses.len(), 1, "{responses:?}");
    assert_eq!((responses[0]["route"].clone(), responses[0]["body"]["type"].clone()), (json!("callback"), json!(6)));
    assert!(rig.bot_messages(thread).is_empty(), "{:?}", rig.bot_messages(thread));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_five_thousand_character_answer_with_code_arrives_in_balanced_chunks() {
    let text = long_answer(5_000);
    assert!(text.chars().count() >= 5_000 && fences(&text) == 2);
    let rig = rig(vec![MockReply::text(text.clone())]).await;
    let said = rig.say(rig.general, rig.chii, "Show me the module").await;
    let root = rig.ingested(said).await;
    let history = rig.answered(&root).await;
    let answer = answer_of(&history);
    let thread = thread_of(said);

    let records = rig.store.store.delivery_records(&answer.id).await.expect("records");
    let chunks = rig.bot_messages_when(thread, |messages| messages.len() == records.len()).await;
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    for chunk in &chunks {
        assert!(chunk.content.chars().count() <= 2_000, "a chunk of {} characters", chunk.content.chars().count());
        assert_eq!(fences(&chunk.content) % 2, 0, "fences balanced in {:?}", chunk.content);
    }
    let joined: Vec<String> = chunks.iter().flat_map(|chunk| content_lines(&chunk.content)).collect();
    assert_eq!(joined, content_lines(&text), "nothing lost, nothing repeated, in order");
    let mut platform_ids: Vec<String> = records.iter().map(|r| r.platform_message_id.clone()).collect();
    platform_ids.sort();
    let mut posted: Vec<String> = chunks.iter().map(|m| m.id.to_string()).collect();
    posted.sort();
    assert_eq!(platform_ids, posted, "each chunk recorded with its discord id");
    let creates = rig.message_requests(thread).into_iter().filter(|r| r.method == "POST").count();
    assert_eq!(creates, chunks.len(), "each chunk sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_the_answer_names_is_uploaded_and_a_missing_one_gets_a_warning() {
    let rig = rig(vec![
        MockReply::Answer(MockAnswer::parts(vec![MockPart::tool_call(
            "call_1",
            "run_shell_command",
            json!({ "command": "printf 'quarterly numbers\\n' > report.txt" }),
        )])),
        MockReply::text("Here is the report.\n[file: report.txt]\n[file: missing.txt]"),
    ])
    .await;
    let said = rig.say(rig.general, rig.chii, "Write the report").await;
    let root = rig.ingested(said).await;
    let history = rig.answered(&root).await;
    let answer = answer_of(&history);
    assert_eq!(answer.status, Status::Delivered);
    let thread = thread_of(said);

    // Status message, the text, the upload, the warning.
    let messages = rig.bot_messages_when(thread, |messages| messages.len() == 4).await;
    let sent: Vec<&FakeMessage> = messages[1..].iter().collect();
    assert_eq!(sent[0].content, "Here is the report.");
    let upload = sent[1];
    assert_eq!(upload.attachments.len(), 1, "{upload:?}");
    assert_eq!((upload.attachments[0].filename.as_str(), upload.attachments[0].size), ("report.txt", 18));
    let bytes = reqwest::get(&upload.attachments[0].url).await.expect("download").bytes().await.expect("bytes");
    assert_eq!(&bytes[..], b"quarterly numbers\n");
    assert_eq!(sent[2].content, "⚠️ `missing.txt` was not attached: the file does not exist.");
    let multipart: Vec<RecordedRequest> =
        rig.message_requests(thread).into_iter().filter(|r| !r.files.is_empty()).collect();
    assert_eq!(multipart.len(), 1);
    assert_eq!(multipart[0].files, vec![("files[0]".to_owned(), "report.txt".to_owned(), 18)]);
    assert_eq!(multipart[0].body["enforce_nonce"], json!(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_buttons_post_the_clicked_option_as_the_next_message() {
    let rig = rig(vec![
        MockReply::text("Let us pick a colour.\n[question: Which? | Red | Blue]"),
        MockReply::text("Blue it is."),
    ])
    .await;
    let said = rig.say(rig.general, rig.chii, "Paint the button").await;
    let root = rig.ingested(said).await;
    rig.answered(&root).await;
    let thread = thread_of(said);

    let messages = rig.bot_messages_when(thread, |messages| messages.len() == 2).await;
    let question = &messages[1];
    assert_eq!(question.content, "Which?");
    let buttons = question.components[0]["components"].as_array().expect("a row of buttons").clone();
    let labels: Vec<&str> = buttons.iter().filter_map(|b| b["label"].as_str()).collect();
    assert_eq!(labels, ["Red", "Blue"]);
    let blue = buttons[1]["custom_id"].as_str().expect("a custom id").to_owned();

    let interaction = rig.fake.click_button(thread, question.id, &blue, rig.chii).await;
    let answer_root: Message = rig
        .eventually("the clicked option to be ingested", || async {
            let history = rig.store.store.session_history(&root.session_id).await.expect("history");
            history.into_iter().find(|m| m.role == Role::User && m.id != root.id)
        })
        .await;
    assert_header(&answer_root, "Chii", rig.chii, "Blue");
    assert_eq!(answer_root.channel_id, thread.to_string());
    let history = rig.answered(&answer_root).await;
    assert_eq!(answer_of(&history).content, "Blue it is.");
    let request = rig.model.requests().into_iter().nth(1).expect("the second model call");
    assert!(request.body.to_string().contains("Blue"), "the model saw the choice");

    // The click was acknowledged by updating the question: buttons disabled, the choice marked.
    let responses = rig.fake.interaction_responses(interaction);
    assert_eq!(responses.len(), 1, "{responses:?}");
    assert_eq!(responses[0]["route"], "callback");
    let updated = rig.bot_messages(thread).into_iter().find(|m| m.id == question.id).expect("the question");
    let states: Vec<(Value, Value)> = updated.components[0]["components"]
        .as_array()
        .expect("buttons")
        .iter()
        .map(|b| (b["disabled"].clone(), b["style"].clone()))
        .collect();
    assert_eq!(states, vec![(json!(true), json!(1)), (json!(true), json!(3))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allow_list_and_mentions_decide_who_is_answered_and_a_dm_is_answered_in_the_dm() {
    let rig = rig_with(vec![MockReply::text("It is tea time."), MockReply::text("Hello in private.")], |_, chii| {
        format!("allowed_users = [\"{chii}\"]")
    })
    .await;
    let bot = rig.fake.bot_user_id();
    let bob = rig.fake.add_user("bob", "Bob", false);
    let robo = rig.fake.add_user("robo", "Robo", true);
    let mention = |users: Vec<UserId>| SayOptions { mentions: users, ..SayOptions::default() };

    let not_allowed = rig.say(rig.general, bob, "hello there").await;
    let others_only =
        rig.fake.user_says(rig.general, rig.chii, &format!("<@{bob}> can you look?"), mention(vec![bob])).await;
    let from_a_bot = rig.fake.user_says(rig.general, robo, &format!("<@{bot}> status?"), mention(vec![bot])).await;
    let with_mention =
        rig.fake.user_says(rig.general, bob, &format!("<@{bot}> what time is it?"), mention(vec![bot])).await;

    let root = rig.ingested(with_mention).await;
    assert_header(&root, "Bob", bob, "what time is it?");
    let history = rig.answered(&root).await;
    assert_eq!(answer_of(&history).content, "It is tea time.");
    // Messages are handled in order: the earlier ones were decided before this one.
    for ignored in [not_allowed, others_only, from_a_bot] {
        assert!(rig.stored(ignored).await.is_none(), "message {ignored} should have been ignored");
    }
    assert_eq!(rig.fake.threads().len(), 1, "only the answered message got a thread");
    assert_eq!(rig.bot_messages(thread_of(with_mention)).len(), 1);

    let dm = rig.fake.add_dm(rig.chii);
    let said = rig.say(dm, rig.chii, "hi in private").await;
    let root = rig.ingested(said).await;
    assert_eq!(root.channel_id, dm.to_string(), "a DM is its own channel, no thread");
    assert_header(&root, "Chii", rig.chii, "hi in private");
    rig.answered(&root).await;
    let messages = rig.bot_messages_when(dm, |messages| !messages.is_empty()).await;
    assert_eq!(messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(), ["Hello in private."]);
    assert_eq!(rig.fake.threads().len(), 1);
    assert!(rig.bot_messages(rig.general).is_empty());
    assert_eq!(rig.model.requests().len(), 2, "the ignored messages never reached the model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_dropped_socket_the_bot_resumes_and_answers_once() {
    let rig = rig(vec![MockReply::text("First answer."), MockReply::text("Second answer.")]).await;
    let dm = rig.fake.add_dm(rig.chii);
    let first = rig.say(dm, rig.chii, "first question").await;
    rig.answered(&rig.ingested(first).await).await;

    rig.fake.drop_connections().await;
    // Said while the socket is down: the fake replays it when the bot resumes.
    let second = rig.say(dm, rig.chii, "second question").await;
    rig.answered(&rig.ingested(second).await).await;
    assert!(rig.fake.resumes() >= 1, "the bot resumed its session");

    let messages = rig.bot_messages_when(dm, |messages| messages.len() >= 2).await;
    assert_eq!(messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(), ["First answer.", "Second answer."]);
    let root = rig.stored(first).await.expect("first");
    let history = rig.store.store.session_history(&root.session_id).await.expect("history");
    let users: Vec<&str> = history.iter().filter(|m| m.role == Role::User).map(|m| m.content.as_str()).collect();
    assert_eq!(users.len(), 2, "no duplicate ingestion: {users:?}");
    assert_eq!(rig.model.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_storm_during_delivery_delays_but_sends_every_chunk_once() {
    let text = long_answer(4_500);
    // The answer comes a moment after the turn starts, so the storm is set up in between.
    let rig = rig(vec![MockReply::Delayed {
        delay: Duration::from_millis(800),
        reply: Box::new(MockReply::text(text.clone())),
    }])
    .await;
    let dm = rig.fake.add_dm(rig.chii);
    let said = rig.say(dm, rig.chii, "Explain the module in detail").await;
    rig.eventually("the typing indicator", || async { (rig.fake.typing_count(dm) >= 1).then_some(()) }).await;
    rig.fake.rate_limit_next(5, 0.2);

    let root = rig.ingested(said).await;
    let history = rig.answered(&root).await;
    let answer = answer_of(&history);
    let records = rig.store.store.delivery_records(&answer.id).await.expect("records");
    let chunks = rig.bot_messages_when(dm, |messages| messages.len() == records.len()).await;
    assert!(chunks.len() >= 3, "{} chunks", chunks.len());
    let limited = rig.fake.requests().iter().filter(|r| r.status == 429).count();
    let limited_creates = rig.fake.requests().iter().filter(|r| is_create_in(r, dm) && r.status == 429).count();
    assert_eq!((limited, limited_creates), (5, 5), "the storm hit the delivery");
    let joined: Vec<String> = chunks.iter().flat_map(|chunk| content_lines(&chunk.content)).collect();
    assert_eq!(joined, content_lines(&text), "every chunk exactly once, in order");
    let created = rig.fake.requests().iter().filter(|r| is_create_in(r, dm) && r.status == 200).count();
    assert_eq!(created, chunks.len(), "no chunk was created twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_delivery_then_a_restart_delivers_the_rest_exactly_once() {
    let text = long_answer(12_000);
    let mut rig = rig(vec![MockReply::text(text.clone())]).await;
    let dm = rig.fake.add_dm(rig.chii);
    let said = rig.say(dm, rig.chii, "Explain everything").await;

    // Once the first chunk is on Discord, make the next creates wait (429, 1 s each), and kill
    // the service while one is held back.
    let bot = rig.fake.bot_user_id();
    assert!(rig.fake.wait_for(|state| state.messages(dm).iter().any(|m| m.author == bot), WAIT).await);
    rig.fake.rate_limit_next(3, 1.0);
    rig.eventually("a chunk to be rate limited", || async {
        rig.fake.requests().iter().any(|r| is_create_in(r, dm) && r.status == 429).then_some(())
    })
    .await;
    rig.service.take().expect("running").kill().await;

    let root = rig.ingested(said).await;
    let history = rig.store.store.session_history(&root.session_id).await.expect("history");
    let answer = answer_of(&history).clone();
    assert_eq!(answer.status, Status::Pending, "killed mid-delivery");
    let expected = chunk_text(&markers(&answer.content).text, 2_000);
    assert!(expected.len() >= 6, "{} chunks", expected.len());
    let recorded = rig.store.store.delivery_records(&answer.id).await.expect("records").len();
    let on_discord = rig.bot_messages(dm).len();
    assert!(
        recorded >= 1 && recorded == on_discord && recorded < expected.len(),
        "{on_discord} on discord, {recorded} recorded"
    );

    // The worst moment of a crash: Discord accepted the next chunk, the process died before
    // recording it. Post it as the dead process did (the bot's token, the part's nonce).
    let next = recorded;
    let nonce = part_nonce(&format!("{}:{next}", answer.id));
    let client = reqwest::Client::new();
    let mut accepted = None;
    // Faults left over from the storm are answered first; the fake does not time them.
    for _ in 0..5 {
        let response = client
            .post(format!("{}/api/v10/channels/{dm}/messages", rig.fake.api_base_url()))
            .header("Authorization", format!("Bot {TOKEN}"))
            .json(&json!({ "content": expected[next], "nonce": nonce, "enforce_nonce": true }))
            .send()
            .await
            .expect("post to the fake");
        if response.status() == 200 {
            accepted =
                Some(response.json::<Value>().await.expect("a message")["id"].as_str().expect("an id").to_owned());
            break;
        }
        assert_eq!(response.status(), 429, "only leftover rate limits");
    }
    let lost_record = accepted.expect("the fake accepted the chunk");

    rig.service = Some(Service::spawn(&rig.workspace, "restarted.log", &SERVICE_ENV));
    rig.wait_started().await;
    let history = rig.answered(&root).await;
    assert_eq!(answer_of(&history).status, Status::Delivered);
    let mut records = rig.store.store.delivery_records(&answer.id).await.expect("records");
    records.sort_by_key(|record| record.part);
    let chunks = rig.bot_messages_when(dm, |messages| messages.len() >= expected.len()).await;
    let contents: Vec<&str> = chunks.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, expected, "every chunk exactly once, in order");
    let joined: Vec<String> = chunks.iter().flat_map(|chunk| content_lines(&chunk.content)).collect();
    assert_eq!(joined, content_lines(&text), "nothing lost");
    let parts: Vec<u32> = records.iter().map(|record| record.part).collect();
    assert_eq!(parts, (0..u32::try_from(expected.len()).expect("few parts")).collect::<Vec<_>>());
    assert_eq!(records[next].platform_message_id, lost_record, "the resent chunk was answered with the first one");
    let sent_again = rig
        .fake
        .requests()
        .iter()
        .filter(|r| is_create_in(r, dm) && r.status == 200 && r.body["nonce"] == json!(nonce))
        .count();
    assert_eq!(sent_again, 2, "the restart sent the unrecorded chunk again; enforce_nonce kept it single");
    assert_eq!(rig.model.requests().len(), 1, "the turn was not run again");
}
