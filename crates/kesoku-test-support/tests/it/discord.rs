//! The fake Discord driven as a bot would: a plain websocket client on its gateway and reqwest
//! on its REST API. Every gateway frame and REST answer is also parsed with twilight's model,
//! the client the Discord adapter uses, so a shape twilight cannot read fails here first.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kesoku_test_support::discord::{
    ChannelId, FakeDiscord, FakeDiscordOptions, FakeState, GuildId, MessageId, SayOptions, UserId, intents,
};
use serde::de::DeserializeSeed;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use twilight_model::gateway::event::{GatewayEvent, GatewayEventDeserializer};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

const TOKEN: &str = "test-token-abc";
const WAIT: Duration = Duration::from_secs(5);
/// GUILDS | GUILD_MESSAGES | DIRECT_MESSAGES | MESSAGE_CONTENT.
const ALL_INTENTS: u64 =
    intents::GUILDS | intents::GUILD_MESSAGES | intents::DIRECT_MESSAGES | intents::MESSAGE_CONTENT;

fn options() -> FakeDiscordOptions {
    FakeDiscordOptions {
        token: TOKEN.to_owned(),
        heartbeat_interval: Duration::from_millis(45_000),
        ..Default::default()
    }
}

/// A fake with one guild, one text channel and one person in it.
struct World {
    fake: FakeDiscord,
    guild: GuildId,
    channel: ChannelId,
    alice: UserId,
}

fn world(options: FakeDiscordOptions) -> World {
    let fake = FakeDiscord::start(options);
    let guild = fake.add_guild("Kesoku HQ");
    let channel = fake.add_text_channel(guild, "general");
    let alice = fake.add_user("alice", "Alice", false);
    World { fake, guild, channel, alice }
}

/// What the next thing on a socket is.
#[derive(Debug)]
enum Frame {
    Json(Value),
    Close(u16, String),
    Ended,
}

async fn connect(url: &str) -> Socket {
    let (socket, _) = tokio_tungstenite::connect_async(url).await.expect("gateway accepts the websocket");
    socket
}

/// Connect the way twilight does: the configured URL, then `/?v=10&encoding=json`.
async fn connect_gateway(fake: &FakeDiscord) -> Socket {
    connect(&format!("{}/?v=10&encoding=json", fake.gateway_url())).await
}

async fn next_frame(socket: &mut Socket) -> Frame {
    loop {
        let message = tokio::time::timeout(WAIT, socket.next()).await.expect("a frame within the deadline");
        match message {
            Some(Ok(Message::Text(text))) => {
                // Everything the gateway sends must be readable by twilight.
                let deserializer = GatewayEventDeserializer::from_json(&text).expect("a gateway payload with an op");
                let mut json_deserializer = serde_json::Deserializer::from_str(&text);
                let event: Result<GatewayEvent, _> = deserializer.deserialize(&mut json_deserializer);
                event.unwrap_or_else(|error| panic!("twilight cannot parse {text}: {error}"));
                return Frame::Json(serde_json::from_str(&text).expect("json"));
            }
            Some(Ok(Message::Close(frame))) => {
                return match frame {
                    Some(frame) => Frame::Close(u16::from(frame.code), frame.reason.to_string()),
                    None => Frame::Close(1005, String::new()),
                };
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
            Some(Ok(Message::Binary(_))) => panic!("the fake sent a binary frame"),
            Some(Err(_)) | None => return Frame::Ended,
        }
    }
}

async fn next_json(socket: &mut Socket) -> Value {
    match next_frame(socket).await {
        Frame::Json(json) => json,
        other @ (Frame::Close(..) | Frame::Ended) => panic!("expected a payload, got {other:?}"),
    }
}

async fn next_close(socket: &mut Socket) -> (u16, String) {
    match next_frame(socket).await {
        Frame::Close(code, reason) => (code, reason),
        other @ (Frame::Json(_) | Frame::Ended) => panic!("expected a close frame, got {other:?}"),
    }
}

/// The next dispatch named `event`, skipping others (CHANNEL_CREATE and the like).
async fn next_dispatch(socket: &mut Socket, event: &str) -> Value {
    loop {
        let json = next_json(socket).await;
        if json["op"] == 0 && json["t"] == event {
            return json;
        }
    }
}

async fn send(socket: &mut Socket, payload: Value) {
    socket.send(Message::Text(payload.to_string().into())).await.expect("send to the gateway");
}

fn identify_payload(token: &str, intents: u64) -> Value {
    json!({"op": 2, "d": {
        "token": token,
        "intents": intents,
        "properties": {"os": "linux", "browser": "twilight.rs", "device": "twilight.rs"},
        "compress": false,
        "large_threshold": 50,
        "shard": [0, 1],
    }})
}

/// Connect, read Hello, identify, read READY; returns the socket and READY's payload.
async fn identified(fake: &FakeDiscord, intents: u64) -> (Socket, Value) {
    let mut socket = connect_gateway(fake).await;
    let hello = next_json(&mut socket).await;
    assert_eq!(hello["op"], 10);
    send(&mut socket, identify_payload(&format!("Bot {TOKEN}"), intents)).await;
    let ready = next_dispatch(&mut socket, "READY").await;
    (socket, ready)
}

fn http() -> reqwest::Client {
    reqwest::Client::new()
}

fn api(fake: &FakeDiscord, path: &str) -> String {
    format!("{}/api/v10{path}", fake.api_base_url())
}

async fn post_json(fake: &FakeDiscord, path: &str, body: Value) -> reqwest::Response {
    http()
        .post(api(fake, path))
        .header("Authorization", format!("Bot {TOKEN}"))
        .json(&body)
        .send()
        .await
        .expect("the fake answers")
}

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").and_then(|value| value.to_str().ok()).map(str::to_owned);
    assert_eq!(content_type.as_deref(), Some("application/json"), "discord.py insists on exactly this");
    (status, response.json().await.expect("a JSON body"))
}

fn parse<T: serde::de::DeserializeOwned>(value: &Value) -> T {
    serde_json::from_value(value.clone())
        .unwrap_or_else(|error| panic!("twilight cannot parse {value}: {error} ({})", std::any::type_name::<T>()))
}

#[tokio::test]
async fn identify_gets_hello_ready_and_a_guild_create_per_guild() {
    let world = world(options());
    let mut socket = connect_gateway(&world.fake).await;
    let hello = next_json(&mut socket).await;
    assert_eq!(hello, json!({"op": 10, "d": {"heartbeat_interval": 45_000}, "s": null, "t": null}));

    send(&mut socket, identify_payload(&format!("Bot {TOKEN}"), ALL_INTENTS)).await;
    let ready = next_json(&mut socket).await;
    assert_eq!((ready["op"].clone(), ready["t"].clone(), ready["s"].clone()), (json!(0), json!("READY"), json!(1)));
    let data = &ready["d"];
    assert_eq!(data["v"], 10);
    assert_eq!(data["user"]["id"], world.fake.bot_user_id().to_string());
    assert_eq!(data["user"]["bot"], true);
    assert_eq!(data["guilds"], json!([{"id": world.guild.to_string(), "unavailable": true}]));
    assert_eq!(data["resume_gateway_url"], world.fake.gateway_url());
    assert_eq!(data["application"]["id"], FakeDiscordOptions::default().application_id.to_string());
    let ready: twilight_model::gateway::payload::incoming::Ready = parse(data);
    assert!(!ready.session_id.is_empty());

    let guild_create = next_json(&mut socket).await;
    assert_eq!((guild_create["t"].clone(), guild_create["s"].clone()), (json!("GUILD_CREATE"), json!(2)));
    let guild: twilight_model::gateway::payload::incoming::GuildCreate = parse(&guild_create["d"]);
    let twilight_model::gateway::payload::incoming::GuildCreate::Available(guild) = guild else {
        panic!("the guild should be available");
    };
    assert_eq!(guild.name, "Kesoku HQ");
    assert_eq!(guild.channels.iter().map(|channel| channel.id.get()).collect::<Vec<_>>(), vec![world.channel.get()]);
    assert!(guild.members.iter().any(|member| member.user.id.get() == world.alice.get()));
    assert_eq!(world.fake.connections(), 1);
    assert_eq!(world.fake.live_connections(), 1);
}

#[tokio::test]
async fn heartbeats_are_acknowledged() {
    let world = world(options());
    let (mut socket, _) = identified(&world.fake, ALL_INTENTS).await;
    let _guild_create = next_dispatch(&mut socket, "GUILD_CREATE").await;
    send(&mut socket, json!({"op": 1, "d": 2})).await;
    assert_eq!(next_json(&mut socket).await["op"], 11);
}

#[tokio::test]
async fn a_bad_token_is_closed_with_4004() {
    let world = world(options());
    let mut socket = connect_gateway(&world.fake).await;
    let _hello = next_json(&mut socket).await;
    send(&mut socket, identify_payload("Bot not-the-token", ALL_INTENTS)).await;
    let (code, reason) = next_close(&mut socket).await;
    assert_eq!((code, reason.as_str()), (4004, "Authentication failed."));
    assert_eq!(world.fake.connections(), 0);
}

#[tokio::test]
async fn asking_for_message_content_without_it_enabled_is_closed_with_4014() {
    let world = world(FakeDiscordOptions { message_content_intent_enabled: false, ..options() });
    let mut socket = connect_gateway(&world.fake).await;
    let _hello = next_json(&mut socket).await;
    send(&mut socket, identify_payload(TOKEN, ALL_INTENTS)).await;
    let (code, reason) = next_close(&mut socket).await;
    assert_eq!((code, reason.as_str()), (4014, "Disallowed intent(s)."));

    // Without the privileged intent the same application connects.
    let (_socket, ready) = identified(&world.fake, ALL_INTENTS & !intents::MESSAGE_CONTENT).await;
    assert_eq!(ready["t"], "READY");
}

#[tokio::test]
async fn transport_compression_is_refused_with_a_reason() {
    let world = world(options());
    let mut socket = connect(&format!("{}/?v=10&encoding=json&compress=zstd-stream", world.fake.gateway_url())).await;
    let (code, reason) = next_close(&mut socket).await;
    assert_eq!(code, 4012);
    assert!(reason.contains("compress=zstd-stream"), "{reason}");
}

#[tokio::test]
async fn without_message_content_a_guild_message_arrives_empty_unless_it_mentions_the_bot() {
    let world = world(options());
    let (mut socket, _) = identified(&world.fake, intents::GUILDS | intents::GUILD_MESSAGES).await;
    world.fake.user_says(world.channel, world.alice, "secret plans", SayOptions::default()).await;
    let plain = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    assert_eq!(plain["d"]["content"], "");
    assert_eq!(plain["d"]["guild_id"], world.guild.to_string());
    assert_eq!(plain["d"]["member"]["roles"], json!([]));

    let bot = world.fake.bot_user_id();
    let content = format!("<@{bot}> hello");
    world
        .fake
        .user_says(world.channel, world.alice, &content, SayOptions { mentions: vec![bot], ..Default::default() })
        .await;
    let mention = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    assert_eq!(mention["d"]["content"], content.as_str());
    let message: twilight_model::gateway::payload::incoming::MessageCreate = parse(&mention["d"]);
    assert_eq!(message.mentions.iter().map(|user| user.id.get()).collect::<Vec<_>>(), vec![bot.get()]);
    assert_eq!(message.author.id.get(), world.alice.get());
}

#[tokio::test]
async fn a_dropped_connection_resumes_and_gets_the_missed_dispatches_replayed() {
    let world = world(options());
    let (mut socket, ready) = identified(&world.fake, ALL_INTENTS).await;
    let session_id = ready["d"]["session_id"].as_str().expect("session id").to_owned();
    let guild_create = next_dispatch(&mut socket, "GUILD_CREATE").await;
    let last_sequence = guild_create["s"].as_u64().expect("sequence");

    world.fake.drop_connections().await;
    assert!(matches!(next_frame(&mut socket).await, Frame::Ended), "the socket ends without a close frame");
    assert!(world.fake.wait_for(|state: &FakeState| state.live_connections() == 0, WAIT).await);
    let missed = world.fake.user_says(world.channel, world.alice, "while you were away", SayOptions::default()).await;

    let mut socket = connect_gateway(&world.fake).await;
    assert_eq!(next_json(&mut socket).await["op"], 10);
    send(
        &mut socket,
        json!({"op": 6, "d": {"token": format!("Bot {TOKEN}"), "session_id": session_id, "seq": last_sequence}}),
    )
    .await;
    let replayed = next_json(&mut socket).await;
    assert_eq!(replayed["t"], "MESSAGE_CREATE");
    assert_eq!(replayed["s"], last_sequence + 1);
    assert_eq!(replayed["d"]["id"], missed.to_string());
    assert_eq!(replayed["d"]["content"], "while you were away");
    let resumed = next_json(&mut socket).await;
    assert_eq!((resumed["t"].clone(), resumed["s"].clone()), (json!("RESUMED"), json!(last_sequence + 2)));
    assert_eq!((world.fake.resumes(), world.fake.connections()), (1, 1));

    // New dispatches continue the sequence on the resumed connection.
    world.fake.user_says(world.channel, world.alice, "welcome back", SayOptions::default()).await;
    let next = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    assert_eq!(next["s"], last_sequence + 3);
}

#[tokio::test]
async fn resuming_an_unknown_session_is_an_invalid_session() {
    let world = world(options());
    let mut socket = connect_gateway(&world.fake).await;
    let _hello = next_json(&mut socket).await;
    send(&mut socket, json!({"op": 6, "d": {"token": TOKEN, "session_id": "nope", "seq": 3}})).await;
    assert_eq!(next_json(&mut socket).await, json!({"op": 9, "d": false, "s": null, "t": null}));
    assert_eq!(world.fake.resumes(), 0);
}

#[tokio::test]
async fn rest_needs_the_bot_token_and_answers_in_discords_shapes() {
    let world = world(options());
    let response = http().get(api(&world.fake, "/users/@me")).send().await.expect("answer");
    assert!(response.headers().contains_key("x-ratelimit-bucket"));
    assert_eq!(json_of(response).await, (401, json!({"message": "401: Unauthorized", "code": 0})));

    let authorized = |path: &str| http().get(api(&world.fake, path)).header("Authorization", format!("Bot {TOKEN}"));
    let response = authorized("/users/@me").send().await.expect("answer");
    for header in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-ratelimit-reset-after",
        "x-ratelimit-bucket",
    ] {
        assert!(response.headers().contains_key(header), "{header} missing");
    }
    let (status, me) = json_of(response).await;
    assert_eq!(status, 200);
    let me: twilight_model::user::CurrentUser = parse(&me);
    assert_eq!(me.id.get(), world.fake.bot_user_id().get());

    let (_, application) = json_of(authorized("/applications/@me").send().await.expect("answer")).await;
    let _application: twilight_model::oauth::Application = parse(&application);
    let (_, gateway) = json_of(authorized("/gateway/bot").send().await.expect("answer")).await;
    assert_eq!(gateway["url"], world.fake.gateway_url());
    let _gateway: twilight_model::gateway::connection_info::BotConnectionInfo = parse(&gateway);
    let (_, channel) = json_of(authorized(&format!("/channels/{}", world.channel)).send().await.expect("answer")).await;
    let channel: twilight_model::channel::Channel = parse(&channel);
    assert_eq!(channel.name.as_deref(), Some("general"));
    assert_eq!(
        json_of(authorized("/channels/12345").send().await.expect("answer")).await,
        (404, json!({"message": "Unknown Channel", "code": 10003}))
    );
}

#[tokio::test]
async fn an_enforced_nonce_sent_twice_creates_one_message() {
    let world = world(options());
    let (mut socket, _) = identified(&world.fake, ALL_INTENTS).await;
    let path = format!("/channels/{}/messages", world.channel);
    let body = json!({"content": "once", "nonce": "kesoku-42", "enforce_nonce": true});
    let (status, first) = json_of(post_json(&world.fake, &path, body.clone()).await).await;
    assert_eq!(status, 200);
    let parsed: twilight_model::channel::Message = parse(&first);
    assert_eq!(parsed.content, "once");
    let (status, second) = json_of(post_json(&world.fake, &path, body).await).await;
    assert_eq!((status, second["id"].clone()), (200, first["id"].clone()));

    let messages = world.fake.messages(world.channel);
    assert_eq!(messages.len(), 1);
    assert_eq!((messages[0].nonce.as_deref(), messages[0].author), (Some("kesoku-42"), world.fake.bot_user_id()));
    // The bot hears its own message once.
    let created = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    assert_eq!(created["d"]["nonce"], "kesoku-42");

    // Without enforce_nonce the same nonce makes a second message, as on Discord.
    let (_, third) =
        json_of(post_json(&world.fake, &path, json!({"content": "again", "nonce": "kesoku-42"})).await).await;
    assert_ne!(third["id"], first["id"]);
    assert_eq!(world.fake.messages(world.channel).len(), 2);
}

#[tokio::test]
async fn too_long_or_empty_messages_are_refused_like_discord() {
    let world = world(options());
    let path = format!("/channels/{}/messages", world.channel);
    let (status, error) = json_of(post_json(&world.fake, &path, json!({"content": "x".repeat(2001)})).await).await;
    assert_eq!(status, 400);
    assert_eq!(error["code"], 50035);
    assert_eq!(error["errors"]["content"]["_errors"][0]["code"], "BASE_TYPE_MAX_LENGTH");
    let (status, error) = json_of(post_json(&world.fake, &path, json!({"content": ""})).await).await;
    assert_eq!((status, error), (400, json!({"message": "Cannot send an empty message", "code": 50006})));
    let (status, _) = json_of(post_json(&world.fake, &path, json!({"content": "é".repeat(2000)})).await).await;
    assert_eq!(status, 200, "the limit counts characters, not bytes");
}

#[tokio::test]
async fn rate_limit_next_answers_429_with_discords_body_and_headers() {
    let world = world(options());
    world.fake.rate_limit_next(1, 0.25);
    let path = format!("/channels/{}/messages", world.channel);
    let response = post_json(&world.fake, &path, json!({"content": "hi"})).await;
    let header = |name: &str| response.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_owned);
    assert_eq!(header("retry-after").as_deref(), Some("1"));
    assert_eq!(header("x-ratelimit-scope").as_deref(), Some("user"));
    assert_eq!(header("x-ratelimit-remaining").as_deref(), Some("0"));
    assert_eq!(header("x-ratelimit-reset-after").as_deref(), Some("0.250"));
    assert_eq!(header("via").as_deref(), Some("1.1 google"));
    assert!(header("x-ratelimit-bucket").is_some());
    let (status, body) = json_of(response).await;
    assert_eq!(
        (status, body),
        (429, json!({"message": "You are being rate limited.", "retry_after": 0.25, "global": false}))
    );
    assert!(world.fake.messages(world.channel).is_empty());

    let (status, _) = json_of(post_json(&world.fake, &path, json!({"content": "hi"})).await).await;
    assert_eq!(status, 200);
    let statuses: Vec<u16> = world.fake.requests().iter().map(|request| request.status).collect();
    assert_eq!(statuses, vec![429, 200]);
}

#[tokio::test]
async fn fail_next_answers_the_given_error() {
    let world = world(options());
    world.fake.fail_next(2, 403, 50001);
    let path = format!("/channels/{}/messages", world.channel);
    for _ in 0..2 {
        let (status, body) = json_of(post_json(&world.fake, &path, json!({"content": "hi"})).await).await;
        assert_eq!((status, body), (403, json!({"message": "Missing Access", "code": 50001})));
    }
    let (status, _) = json_of(post_json(&world.fake, &path, json!({"content": "hi"})).await).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn multipart_uploads_become_attachments_served_by_the_fake() {
    let world = world(options());
    let payload =
        json!({"content": "the report", "attachments": [{"id": 0, "filename": "report.txt", "description": "r"}]});
    let form = reqwest::multipart::Form::new()
        .text("payload_json", payload.to_string())
        .part("files[0]", reqwest::multipart::Part::bytes(b"hello file".to_vec()).file_name("upload.bin"));
    let response = http()
        .post(api(&world.fake, &format!("/channels/{}/messages", world.channel)))
        .header("Authorization", format!("Bot {TOKEN}"))
        .multipart(form)
        .send()
        .await
        .expect("answer");
    let (status, message) = json_of(response).await;
    assert_eq!(status, 200);
    let parsed: twilight_model::channel::Message = parse(&message);
    assert_eq!(parsed.attachments.len(), 1);
    assert_eq!((parsed.attachments[0].filename.as_str(), parsed.attachments[0].size), ("report.txt", 10));

    let stored = world.fake.messages(world.channel);
    assert_eq!(stored[0].content, "the report");
    assert_eq!((stored[0].attachments[0].filename.as_str(), stored[0].attachments[0].size), ("report.txt", 10));
    let downloaded = http().get(&stored[0].attachments[0].url).send().await.expect("download");
    assert_eq!(downloaded.bytes().await.expect("bytes").as_ref(), b"hello file");
    let recorded = world.fake.requests();
    assert_eq!(recorded[0].body, payload);
    assert_eq!(recorded[0].files, vec![("files[0]".to_owned(), "upload.bin".to_owned(), 10)]);
}

#[tokio::test]
async fn users_attachments_are_downloadable_from_the_message_create() {
    let world = world(options());
    let (mut socket, _) = identified(&world.fake, ALL_INTENTS).await;
    let options = SayOptions { attachments: vec![("notes.md".to_owned(), b"# notes".to_vec())], ..Default::default() };
    world.fake.user_says(world.channel, world.alice, "see attached", options).await;
    let created = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    let message: twilight_model::gateway::payload::incoming::MessageCreate = parse(&created["d"]);
    let attachment = &message.attachments[0];
    assert_eq!((attachment.filename.as_str(), attachment.size), ("notes.md", 7));
    let downloaded = http().get(&attachment.url).send().await.expect("download");
    assert_eq!(downloaded.bytes().await.expect("bytes").as_ref(), b"# notes");
}

#[tokio::test]
async fn a_message_starts_one_thread_whose_id_is_the_message_id() {
    let world = world(options());
    let message = world.fake.user_says(world.channel, world.alice, "let's discuss", SayOptions::default()).await;
    let path = format!("/channels/{}/messages/{message}/threads", world.channel);
    let (status, thread) =
        json_of(post_json(&world.fake, &path, json!({"name": "discussion", "auto_archive_duration": 60})).await).await;
    assert_eq!(status, 201);
    let parsed: twilight_model::channel::Channel = parse(&thread);
    assert_eq!(parsed.id.get(), message.get());
    assert_eq!(parsed.parent_id.map(|id| id.get()), Some(world.channel.get()));
    assert_eq!(world.fake.threads(), vec![(ChannelId(message.get()), world.channel, "discussion".to_owned())]);
    assert_eq!(world.fake.messages(world.channel)[0].thread, Some(ChannelId(message.get())));

    let (status, error) = json_of(post_json(&world.fake, &path, json!({"name": "again"})).await).await;
    assert_eq!(
        (status, error),
        (400, json!({"message": "A thread has already been created for this message", "code": 160004}))
    );

    // The thread is a channel the bot can post in.
    let thread_messages = format!("/channels/{message}/messages");
    let (status, _) = json_of(post_json(&world.fake, &thread_messages, json!({"content": "in thread"})).await).await;
    assert_eq!(status, 200);
    assert_eq!(world.fake.messages(ChannelId(message.get()))[0].content, "in thread");
}

#[tokio::test]
async fn edits_deletes_typing_and_threads_without_a_message() {
    let world = world(options());
    let path = format!("/channels/{}/messages", world.channel);
    let (_, message) = json_of(post_json(&world.fake, &path, json!({"content": "draft"})).await).await;
    let id = message["id"].as_str().expect("id").to_owned();
    let client = http();
    let auth = format!("Bot {TOKEN}");
    let edited = client
        .patch(api(&world.fake, &format!("{path}/{id}")))
        .header("Authorization", &auth)
        .json(&json!({"content": "final"}))
        .send()
        .await
        .expect("answer");
    let (status, edited) = json_of(edited).await;
    assert_eq!((status, edited["content"].clone()), (200, json!("final")));
    assert!(edited["edited_timestamp"].is_string());
    assert_eq!(world.fake.messages(world.channel)[0].edits, 1);

    // Someone else's message cannot be edited.
    let theirs = world.fake.user_says(world.channel, world.alice, "mine", SayOptions::default()).await;
    let response = client
        .patch(api(&world.fake, &format!("{path}/{theirs}")))
        .header("Authorization", &auth)
        .json(&json!({"content": "hijacked"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(json_of(response).await.1["code"], 50005);

    let typing = client
        .post(api(&world.fake, &format!("/channels/{}/typing", world.channel)))
        .header("Authorization", &auth)
        .send()
        .await
        .expect("answer");
    assert_eq!(typing.status().as_u16(), 204);
    assert_eq!(world.fake.typing_count(world.channel), 1);

    let deleted = client
        .delete(api(&world.fake, &format!("{path}/{id}")))
        .header("Authorization", &auth)
        .send()
        .await
        .expect("answer");
    assert_eq!(deleted.status().as_u16(), 204);
    assert_eq!(world.fake.deleted(world.channel).iter().map(|id| id.to_string()).collect::<Vec<_>>(), vec![id]);
    assert_eq!(world.fake.messages(world.channel).len(), 1);

    let (status, thread) = json_of(
        post_json(&world.fake, &format!("/channels/{}/threads", world.channel), json!({"name": "side", "type": 11}))
            .await,
    )
    .await;
    assert_eq!((status, thread["type"].clone()), (201, json!(11)));
    let _thread: twilight_model::channel::Channel = parse(&thread);
}

#[tokio::test]
async fn a_button_click_is_answered_once_by_updating_its_message() {
    let world = world(options());
    let (mut socket, _) = identified(&world.fake, ALL_INTENTS).await;
    let components =
        json!([{"type": 1, "components": [{"type": 2, "style": 1, "label": "Approve", "custom_id": "approve:1"}]}]);
    let path = format!("/channels/{}/messages", world.channel);
    let (_, message) =
        json_of(post_json(&world.fake, &path, json!({"content": "run it?", "components": components})).await).await;
    let message_id =
        kesoku_test_support::discord::MessageId(message["id"].as_str().and_then(|id| id.parse().ok()).expect("id"));
    assert_eq!(world.fake.messages(world.channel)[0].components, components);

    let interaction = world.fake.click_button(world.channel, message_id, "approve:1", world.alice).await;
    let created = next_dispatch(&mut socket, "INTERACTION_CREATE").await;
    let parsed: twilight_model::gateway::payload::incoming::InteractionCreate = parse(&created["d"]);
    assert_eq!(parsed.id.get(), interaction.get());
    assert_eq!(created["d"]["type"], 3);
    assert_eq!(created["d"]["data"], json!({"custom_id": "approve:1", "component_type": 2}));
    assert_eq!(created["d"]["member"]["user"]["id"], world.alice.to_string());
    let token = created["d"]["token"].as_str().expect("token").to_owned();

    // Interaction callbacks carry no bot token: the interaction token is the credential.
    let callback = format!("{}/api/v10/interactions/{interaction}/{token}/callback", world.fake.api_base_url());
    let body = json!({"type": 7, "data": {"content": "approved", "components": []}});
    let answer = http().post(&callback).json(&body).send().await.expect("answer");
    assert_eq!(answer.status().as_u16(), 204);
    let updated = &world.fake.messages(world.channel)[0];
    assert_eq!((updated.content.as_str(), updated.components.clone(), updated.edits), ("approved", json!([]), 1));
    assert_eq!(world.fake.interaction_responses(interaction), vec![json!({"route": "callback", "body": body})]);

    let again = http().post(&callback).json(&json!({"type": 6})).send().await.expect("answer");
    assert_eq!(
        json_of(again).await,
        (400, json!({"message": "Interaction has already been acknowledged", "code": 40060}))
    );
}

#[tokio::test]
async fn a_deferred_slash_command_is_finished_by_editing_the_original() {
    let world = world(options());
    let (mut socket, _) = identified(&world.fake, ALL_INTENTS).await;
    let application = FakeDiscordOptions::default().application_id;
    let commands = json!([{"name": "ask", "description": "ask the agent", "options": [{"type": 3, "name": "q", "description": "question", "required": true}]}]);
    let response = http()
        .put(api(&world.fake, &format!("/applications/{application}/guilds/{}/commands", world.guild)))
        .header("Authorization", format!("Bot {TOKEN}"))
        .json(&commands)
        .send()
        .await
        .expect("answer");
    let (status, registered) = json_of(response).await;
    assert_eq!(status, 200);
    let parsed: Vec<twilight_model::application::command::Command> = parse(&registered);
    assert_eq!(parsed[0].name, "ask");
    assert_eq!(world.fake.registered_commands()["guilds"][world.guild.to_string()][0]["name"], "ask");

    let options = json!([{"name": "q", "type": 3, "value": "why?"}]);
    let interaction = world.fake.slash_command(world.channel, world.alice, "ask", options.clone()).await;
    let created = next_dispatch(&mut socket, "INTERACTION_CREATE").await;
    let _parsed: twilight_model::gateway::payload::incoming::InteractionCreate = parse(&created["d"]);
    assert_eq!(created["d"]["data"]["id"], registered[0]["id"]);
    assert_eq!(created["d"]["data"]["options"], options);
    let token = created["d"]["token"].as_str().expect("token").to_owned();

    let base = world.fake.api_base_url();
    let deferred = http()
        .post(format!("{base}/api/v10/interactions/{interaction}/{token}/callback"))
        .json(&json!({"type": 5}))
        .send()
        .await
        .expect("answer");
    assert_eq!(deferred.status().as_u16(), 204);
    assert_eq!(world.fake.messages(world.channel)[0].flags & 128, 128, "a deferred answer shows as loading");

    let edit = http()
        .patch(format!("{base}/api/v10/webhooks/{application}/{token}/messages/@original"))
        .json(&json!({"content": "because"}))
        .send()
        .await
        .expect("answer");
    let (status, edited) = json_of(edit).await;
    assert_eq!(status, 200);
    let _edited: twilight_model::channel::Message = parse(&edited);
    let followup = http()
        .post(format!("{base}/api/v10/webhooks/{application}/{token}"))
        .json(&json!({"content": "and more"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(json_of(followup).await.0, 200);

    let messages = world.fake.messages(world.channel);
    let contents: Vec<(&str, u64, Option<u64>)> = messages
        .iter()
        .map(|message| (message.content.as_str(), message.flags, message.interaction.map(|id| id.get())))
        .collect();
    assert_eq!(contents, vec![("because", 0, Some(interaction.get())), ("and more", 0, Some(interaction.get()))]);
    let routes: Vec<Value> =
        world.fake.interaction_responses(interaction).iter().map(|response| response["route"].clone()).collect();
    assert_eq!(routes, vec![json!("callback"), json!("edit_original"), json!("followup")]);
}

#[tokio::test]
async fn direct_messages_carry_no_guild_and_keep_their_content() {
    let world = world(options());
    let dm = world.fake.add_dm(world.alice);
    let (mut socket, _) = identified(&world.fake, intents::DIRECT_MESSAGES).await;
    world.fake.user_says(dm, world.alice, "psst", SayOptions::default()).await;
    let created = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    assert_eq!(created["d"]["content"], "psst");
    assert!(created["d"].get("guild_id").is_none());
    assert!(created["d"].get("member").is_none());
}

#[tokio::test]
async fn a_redelivered_message_is_dispatched_again_as_it_stands() {
    let world = world(options());
    let (mut socket, _) = identified(&world.fake, ALL_INTENTS).await;
    let id = world.fake.user_says(world.channel, world.alice, "say it twice", SayOptions::default()).await;
    let first = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    world.fake.redeliver(id).await;
    let again = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    assert_eq!(again["d"], first["d"], "the same message, the same payload");
    assert_eq!(again["s"], first["s"].as_u64().expect("sequence") + 1, "a new dispatch of the session");
    assert_eq!(world.fake.messages(world.channel).len(), 1, "no second message in the channel");
}

#[tokio::test]
async fn wait_for_wakes_on_a_change_and_gives_up_at_its_deadline() {
    let world = world(options());
    let channel = world.channel;
    let waiting = world.fake.wait_for(move |state: &FakeState| state.messages(channel).len() == 1, WAIT);
    let saying = world.fake.user_says(world.channel, world.alice, "now", SayOptions::default());
    let (seen, _) = tokio::join!(waiting, saying);
    assert!(seen);
    assert!(
        !world
            .fake
            .wait_for(move |state: &FakeState| state.messages(channel).len() == 2, Duration::from_millis(50))
            .await
    );
}

#[tokio::test]
async fn message_history_pages_as_discord_documents_newest_first() {
    let world = world(options());
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(world.fake.user_says(world.channel, world.alice, &format!("m{n}"), SayOptions::default()).await.get());
    }
    let page = |query: String| {
        let url = api(&world.fake, &format!("/channels/{}/messages{query}", world.channel));
        async move {
            let response =
                http().get(url).header("Authorization", format!("Bot {TOKEN}")).send().await.expect("answer");
            let (status, body) = json_of(response).await;
            assert_eq!(status, 200, "{body}");
            let messages: Vec<twilight_model::channel::Message> = parse(&body);
            messages.iter().map(|message| message.id.get()).collect::<Vec<u64>>()
        }
    };
    let newest_first = |range: &[u64]| range.iter().rev().copied().collect::<Vec<u64>>();
    assert_eq!(page(String::new()).await, newest_first(&ids), "the latest, newest first");
    assert_eq!(page("?limit=2".into()).await, newest_first(&ids[3..]));
    // After an id: the messages right after it (not the latest), still newest first.
    assert_eq!(page(format!("?after={}&limit=2", ids[0])).await, newest_first(&ids[1..3]));
    assert_eq!(page(format!("?after={}&limit=100", ids[2])).await, newest_first(&ids[3..]));
    assert_eq!(page(format!("?after={}", ids[4])).await, Vec::<u64>::new());
    assert_eq!(page(format!("?before={}&limit=2", ids[4])).await, newest_first(&ids[2..4]));
    let response = http()
        .get(api(&world.fake, &format!("/channels/{}/messages?limit=101", world.channel)))
        .header("Authorization", format!("Bot {TOKEN}"))
        .send()
        .await
        .expect("answer");
    assert_eq!(json_of(response).await.0, 400, "limit is 1 to 100");
}

#[tokio::test]
async fn a_message_written_while_no_bot_is_connected_is_only_in_the_history() {
    let world = world(options());
    assert_eq!(world.fake.live_connections(), 0);
    let id = world.fake.user_says(world.channel, world.alice, "anyone there?", SayOptions::default()).await;

    // A bot that connects afterwards is not told (a fresh session replays nothing) …
    let (mut socket, _ready) = identified(&world.fake, ALL_INTENTS).await;
    let _guild = next_dispatch(&mut socket, "GUILD_CREATE").await;
    let later = world.fake.user_says(world.channel, world.alice, "hello?", SayOptions::default()).await;
    let dispatched = next_dispatch(&mut socket, "MESSAGE_CREATE").await;
    assert_eq!(dispatched["d"]["id"], later.to_string(), "the first MESSAGE_CREATE is the later message");
    // … but can read it back.
    let stored: Vec<MessageId> = world.fake.messages(world.channel).iter().map(|message| message.id).collect();
    assert_eq!(stored, [id, later]);
}
