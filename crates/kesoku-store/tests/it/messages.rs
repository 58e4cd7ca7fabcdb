//! Writing, reading, filtering and changing messages; revisions and catch-up reads.

use std::time::Duration;

use chrono::TimeZone;
use kesoku_core::{MessageFilter, MessageId, MessageType, Metadata, Role, SessionId, Status};
use kesoku_store::StoreError;
use serde_json::json;

use crate::backend_tests;
use crate::harness::{Backend, message, prompt, t0};

backend_tests!(
    insert_stamps_times_and_round_trips,
    duplicate_id_is_rejected,
    insert_messages_is_all_or_nothing,
    list_messages_filters_in_write_order,
    newest_per_channel_takes_the_last_of_each_channel_since_a_time,
    recent_messages_are_the_newest_matches_oldest_first,
    update_status_follows_the_transition_table,
    update_metadata_replaces_and_bumps_the_revision,
    changes_since_returns_the_latest_state_in_revision_order,
    a_reader_following_changes_never_skips_one,
);

async fn insert_stamps_times_and_round_trips(b: &Backend) {
    assert_eq!(b.store.current_rev().await.expect("current_rev"), 0, "an empty store is at revision 0");

    let event = b.store.insert_message(&prompt("msg_a", "sess_1")).await.expect("insert");
    assert!(event.created);
    assert!(event.rev > 0);
    assert_eq!(event.message.created_at, Some(t0()));
    assert_eq!(event.message.updated_at, Some(t0()));
    let read = b.store.get_message(&MessageId::from("msg_a")).await.expect("get");
    assert_eq!(read.as_ref(), Some(&event.message));

    // Given times are kept (to the microsecond); every metadata key survives, known or not.
    let mut call = message("msg_call", "sess_1", Some("msg_a"), Role::Tool, MessageType::ToolCall, Status::Responded);
    call.step = 3;
    call.created_at = chrono::Utc.timestamp_opt(1_780_000_000, 123_456_789).single();
    call.metadata = Metadata::from_value(json!({
        "tool_name": "run_shell_command",
        "tool_arguments": {"command": "ls -la", "env": {"A": "1"}, "list": [1, 2.5, null, true]},
        "tool_call_id": "call_7",
        "discord_message_id": "998877",
        "wechat_cronjob": true,
        "nested": {"deep": ["x", {"y": "ünïcödé ✅"}]}
    }))
    .expect("metadata");
    let event = b.store.insert_message(&call).await.expect("insert call");
    assert_eq!(event.message.created_at, chrono::Utc.timestamp_opt(1_780_000_000, 123_456_000).single());
    assert_eq!(event.message.updated_at, Some(t0()));
    let read = b.store.get_message(&call.id).await.expect("get call").expect("call exists");
    assert_eq!(read, event.message);
    assert_eq!(read.metadata, call.metadata);
    assert_eq!(read.step, 3);

    assert_eq!(b.store.get_message(&MessageId::from("msg_nope")).await.expect("get missing"), None);
}

async fn duplicate_id_is_rejected(b: &Backend) {
    b.store.insert_message(&prompt("msg_a", "sess_1")).await.expect("first insert");
    let mut again = prompt("msg_a", "sess_2");
    again.content = "a different text".to_owned();
    let error = b.store.insert_message(&again).await.expect_err("a second message with the same id");
    assert!(
        matches!(&error, StoreError::Duplicate { what: "message", id } if id == "msg_a"),
        "unexpected error: {error:?}"
    );
    assert!(error.to_string().contains("msg_a"), "{error}");
    let kept = b.store.get_message(&MessageId::from("msg_a")).await.expect("get").expect("exists");
    assert_eq!(kept.content, "content of msg_a");
    assert_eq!(kept.session_id, SessionId::from("sess_1"));
}

async fn insert_messages_is_all_or_nothing(b: &Backend) {
    b.store.insert_message(&prompt("msg_x", "sess_1")).await.expect("insert x");
    let rev_before = b.store.current_rev().await.expect("rev");

    // The third one exists already: nothing of the batch is written.
    let batch = [prompt("msg_y", "sess_1"), prompt("msg_z", "sess_1"), prompt("msg_x", "sess_1")];
    let error = b.store.insert_messages(&batch).await.expect_err("batch with an existing id");
    assert!(matches!(&error, StoreError::Duplicate { id, .. } if id == "msg_x"), "{error:?}");
    // A duplicate inside the batch itself, likewise.
    let batch = [prompt("msg_p", "sess_1"), prompt("msg_p", "sess_1")];
    let error = b.store.insert_messages(&batch).await.expect_err("batch repeating an id");
    assert!(matches!(&error, StoreError::Duplicate { id, .. } if id == "msg_p"), "{error:?}");

    for id in ["msg_y", "msg_z", "msg_p"] {
        assert_eq!(b.store.get_message(&MessageId::from(id)).await.expect("get"), None, "{id} must not exist");
    }
    assert_eq!(b.store.current_rev().await.expect("rev"), rev_before);

    let events =
        b.store.insert_messages(&[prompt("msg_y", "sess_1"), prompt("msg_z", "sess_1")]).await.expect("good batch");
    assert_eq!(events.len(), 2);
    assert!(events[0].rev > rev_before && events[1].rev > events[0].rev, "revisions increase in batch order");
    let ids: Vec<String> = b
        .store
        .list_messages(&MessageFilter::session(&SessionId::from("sess_1")))
        .await
        .expect("list")
        .into_iter()
        .map(|m| m.id.into_string())
        .collect();
    assert_eq!(ids, ["msg_x", "msg_y", "msg_z"]);
    assert!(b.store.insert_messages(&[]).await.expect("empty batch").is_empty());
}

async fn list_messages_filters_in_write_order(b: &Backend) {
    let mut messages = [
        prompt("m1", "s1"),
        message("m2", "s1", Some("m1"), Role::Assistant, MessageType::Thought, Status::Responded),
        message("m3", "s1", Some("m1"), Role::Tool, MessageType::ToolCall, Status::Responded),
        message("m4", "s1", Some("m3"), Role::Tool, MessageType::ToolResult, Status::Responded),
        message("m5", "s1", Some("m1"), Role::Assistant, MessageType::Text, Status::Pending),
        prompt("m6", "s2"),
        message("m7", "s2", Some("m6"), Role::Assistant, MessageType::Text, Status::Pending),
    ];
    messages[5].chatbot_id = "discord".to_owned();
    messages[5].channel_id = "room_9".to_owned();
    messages[6].chatbot_id = "discord".to_owned();
    messages[6].channel_id = "room_9".to_owned();
    // Written out of id order, one by one and in a batch: order is the write order.
    b.store.insert_message(&messages[5]).await.expect("insert m6");
    b.store.insert_messages(&messages[0..5]).await.expect("insert s1");
    b.store.insert_message(&messages[6]).await.expect("insert m7");

    let ids = |list: Vec<kesoku_core::Message>| list.into_iter().map(|m| m.id.into_string()).collect::<Vec<_>>();
    let all = b.store.list_messages(&MessageFilter::default()).await.expect("all");
    assert_eq!(ids(all), ["m6", "m1", "m2", "m3", "m4", "m5", "m7"]);

    let cases: Vec<(MessageFilter, Vec<&str>)> = vec![
        (MessageFilter::session(&SessionId::from("s1")), vec!["m1", "m2", "m3", "m4", "m5"]),
        (MessageFilter::default().with_chatbot("discord"), vec!["m6", "m7"]),
        (MessageFilter::default().with_chatbot("cli").with_channel("cli"), vec!["m1", "m2", "m3", "m4", "m5"]),
        (MessageFilter::default().with_channel("room_9"), vec!["m6", "m7"]),
        (MessageFilter::status(Status::Pending), vec!["m5", "m7"]),
        (
            MessageFilter::default().with_statuses(&[Status::PendingAgent, Status::Pending]),
            vec!["m6", "m1", "m5", "m7"],
        ),
        (MessageFilter::default().with_roles(&[Role::Tool]), vec!["m3", "m4"]),
        (MessageFilter::default().with_types(&[MessageType::Thought, MessageType::ToolResult]), vec!["m2", "m4"]),
        (
            MessageFilter::session(&SessionId::from("s1"))
                .with_roles(&[Role::Assistant])
                .with_types(&[MessageType::Text]),
            vec!["m5"],
        ),
        (MessageFilter::default().with_limit(3), vec!["m6", "m1", "m2"]),
        (MessageFilter::session(&SessionId::from("s1")).with_limit(2), vec!["m1", "m2"]),
        (MessageFilter::session(&SessionId::from("nobody")), vec![]),
    ];
    for (filter, expected) in cases {
        let got = b.store.list_messages(&filter).await.expect("list");
        assert_eq!(ids(got), expected, "filter {filter:?}");
    }
}

async fn update_status_follows_the_transition_table(b: &Backend) {
    let inserted = b.store.insert_message(&prompt("msg_a", "s1")).await.expect("insert");
    let id = MessageId::from("msg_a");

    let error = b.store.update_status(&id, Status::Processed).await.expect_err("pending_agent -> processed");
    let StoreError::IllegalTransition { id: refused, source } = &error else {
        panic!("expected an illegal transition, got {error:?}")
    };
    assert_eq!(refused, "msg_a");
    assert_eq!((source.from, source.to), (Status::PendingAgent, Status::Processed));
    let unchanged = b.store.get_message(&id).await.expect("get").expect("exists");
    assert_eq!(unchanged, inserted.message, "a refused change changes nothing");
    assert_eq!(b.store.current_rev().await.expect("rev"), inserted.rev);

    b.clock.advance(Duration::from_secs(5));
    let processing = b.store.update_status(&id, Status::Processing).await.expect("pending_agent -> processing");
    assert!(!processing.created);
    assert!(processing.rev > inserted.rev);
    assert_eq!(processing.message.status, Status::Processing);
    assert_eq!(processing.message.updated_at, Some(t0() + chrono::Duration::seconds(5)));
    assert_eq!(processing.message.created_at, Some(t0()));
    assert_eq!(b.store.get_message(&id).await.expect("get").as_ref(), Some(&processing.message));

    let processed = b.store.update_status(&id, Status::Processed).await.expect("processing -> processed");
    assert!(processed.rev > processing.rev);
    for to in Status::ALL {
        let error = b.store.update_status(&id, *to).await.expect_err("processed is terminal");
        assert!(matches!(error, StoreError::IllegalTransition { .. }), "{error:?}");
    }
    assert_eq!(b.store.get_message(&id).await.expect("get").map(|m| m.status), Some(Status::Processed));

    let error = b.store.update_status(&MessageId::from("msg_missing"), Status::Processing).await.expect_err("missing");
    assert!(matches!(&error, StoreError::NotFound { what: "message", id } if id == "msg_missing"), "{error:?}");
}

async fn update_metadata_replaces_and_bumps_the_revision(b: &Backend) {
    let mut reply = message("msg_r", "s1", None, Role::Assistant, MessageType::Text, Status::Pending);
    reply.metadata.tool_name = Some("old".to_owned());
    let inserted = b.store.insert_message(&reply).await.expect("insert");

    let mut metadata = Metadata { discord_message_id: Some("123".to_owned()), ..Metadata::default() };
    metadata.extra.insert("chunks".to_owned(), json!([1, 2]));
    b.clock.advance(Duration::from_secs(1));
    let event = b.store.update_metadata(&reply.id, &metadata).await.expect("update metadata");
    assert!(event.rev > inserted.rev);
    assert_eq!(event.message.metadata, metadata, "metadata is replaced, not merged");
    assert_eq!(event.message.updated_at, Some(t0() + chrono::Duration::seconds(1)));
    assert_eq!(b.store.get_message(&reply.id).await.expect("get").map(|m| m.metadata), Some(metadata.clone()));

    let error = b.store.update_metadata(&MessageId::from("msg_missing"), &metadata).await.expect_err("missing");
    assert!(matches!(error, StoreError::NotFound { .. }), "{error:?}");
}

async fn changes_since_returns_the_latest_state_in_revision_order(b: &Backend) {
    let events =
        b.store.insert_messages(&[prompt("a", "s1"), prompt("b", "s1"), prompt("c", "s2")]).await.expect("insert");
    let after_inserts = events[2].rev;
    assert_eq!(b.store.current_rev().await.expect("rev"), after_inserts);

    let claimed = b.store.update_status(&MessageId::from("a"), Status::Processing).await.expect("a processing");
    assert_eq!(b.store.current_rev().await.expect("rev"), claimed.rev);

    let all = b.store.changes_since(0, &MessageFilter::default(), 100).await.expect("changes");
    let seen: Vec<(&str, Status, bool)> =
        all.iter().map(|e| (e.message.id.as_str(), e.message.status, e.created)).collect();
    assert_eq!(
        seen,
        [("b", Status::PendingAgent, true), ("c", Status::PendingAgent, true), ("a", Status::Processing, true)],
        "one entry per message, latest state, by revision"
    );
    assert!(all.windows(2).all(|w| w[0].rev < w[1].rev));
    assert_eq!(all[2], claimed.clone_with_created(true));

    let later = b.store.changes_since(after_inserts, &MessageFilter::default(), 100).await.expect("changes");
    assert_eq!(later.len(), 1);
    assert_eq!(later[0], claimed, "a change to a message the reader already knew is not a creation");

    let pending = b.store.changes_since(0, &MessageFilter::status(Status::PendingAgent), 100).await.expect("filtered");
    assert_eq!(pending.iter().map(|e| e.message.id.as_str()).collect::<Vec<_>>(), ["b", "c"]);
    let limited = b.store.changes_since(0, &MessageFilter::default(), 2).await.expect("limited");
    assert_eq!(limited.iter().map(|e| e.message.id.as_str()).collect::<Vec<_>>(), ["b", "c"]);
    let rest = b.store.changes_since(limited[1].rev, &MessageFilter::default(), 2).await.expect("rest");
    assert_eq!(rest.iter().map(|e| e.message.id.as_str()).collect::<Vec<_>>(), ["a"]);
    let none = b.store.changes_since(claimed.rev, &MessageFilter::default(), 100).await.expect("nothing new");
    assert!(none.is_empty());
}

/// Writers commit concurrently while a reader follows `changes_since` from its cursor: every
/// message must reach the reader, which is what a revision handed out before an earlier one
/// commits would break.
async fn a_reader_following_changes_never_skips_one(b: &Backend) {
    const WRITERS: usize = 8;
    const EACH: usize = 60;
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let store = std::sync::Arc::clone(&b.store);
        writers.spawn(async move {
            for i in 0..EACH {
                let id = format!("msg_w{writer}_{i:03}");
                if i % 3 == 2 {
                    // Changes of existing messages count too.
                    let previous = MessageId::from(format!("msg_w{writer}_{:03}", i - 1).as_str());
                    store.insert_message(&prompt(&id, "s1")).await.expect("insert");
                    store.update_status(&previous, Status::Processing).await.expect("update");
                } else {
                    store.insert_messages(&[prompt(&id, "s1")]).await.expect("insert");
                }
            }
        });
    }
    let mut cursor = 0;
    let mut seen: std::collections::HashMap<String, (i64, Status)> = std::collections::HashMap::new();
    let mut follow = |batch: Vec<kesoku_store::MessageEvent>, cursor: &mut i64| {
        for event in batch {
            assert!(event.rev > *cursor, "revisions only grow for a reader");
            *cursor = event.rev;
            seen.insert(event.message.id.into_string(), (event.rev, event.message.status));
        }
    };
    while !writers.is_empty() {
        let batch = b.store.changes_since(cursor, &MessageFilter::default(), 25).await.expect("changes");
        follow(batch, &mut cursor);
        if let Some(done) = writers.try_join_next() {
            done.expect("writer");
        }
        tokio::task::yield_now().await;
    }
    loop {
        let batch = b.store.changes_since(cursor, &MessageFilter::default(), 25).await.expect("changes");
        if batch.is_empty() {
            break;
        }
        follow(batch, &mut cursor);
    }
    assert_eq!(seen.len(), WRITERS * EACH, "every message reached the reader");
    let truth = b.store.changes_since(0, &MessageFilter::default(), u32::MAX).await.expect("all");
    for event in truth {
        let (rev, status) = seen.get(event.message.id.as_str()).copied().expect("seen");
        assert_eq!(
            (rev, status),
            (event.rev, event.message.status),
            "{}: the reader has the latest state",
            event.message.id
        );
    }
}

trait WithCreated {
    fn clone_with_created(&self, created: bool) -> Self;
}

impl WithCreated for kesoku_store::MessageEvent {
    fn clone_with_created(&self, created: bool) -> Self {
        kesoku_store::MessageEvent { created, ..self.clone() }
    }
}

async fn newest_per_channel_takes_the_last_of_each_channel_since_a_time(b: &Backend) {
    let hours = |n: i64| t0() + chrono::Duration::hours(n);
    // (id, chatbot, channel, role, written at)
    let rows = [
        ("a1", "discord", "A", Role::User, hours(-1)),
        ("b1", "discord", "B", Role::User, hours(-2)),
        ("a2", "discord", "A", Role::User, hours(-3)),
        ("a3", "discord", "A", Role::Assistant, hours(0)),
        ("c1", "discord", "C", Role::User, hours(-200)),
        ("x1", "other", "A", Role::User, hours(0)),
        ("b2", "discord", "B", Role::User, hours(-1)),
    ];
    for (id, chatbot, channel, role, at) in rows {
        let mut row = message(id, &format!("s_{chatbot}_{channel}"), None, role, MessageType::Text, Status::Responded);
        row.chatbot_id = chatbot.to_owned();
        row.channel_id = channel.to_owned();
        row.created_at = Some(at);
        b.store.insert_message(&row).await.expect("insert");
    }
    let ids = |list: Vec<kesoku_core::Message>| list.into_iter().map(|m| m.id.into_string()).collect::<Vec<_>>();

    // The last written per channel (a2 was written after a1 though older), users only, the
    // chatbot's only, and none of C, whose only message is older than `since`.
    let newest = b.store.newest_per_channel("discord", Role::User, hours(-100)).await.expect("newest");
    assert_eq!(ids(newest), ["a2", "b2"]);
    let all = b.store.newest_per_channel("discord", Role::User, hours(-1000)).await.expect("newest");
    assert_eq!(ids(all), ["a2", "c1", "b2"]);
    let assistants = b.store.newest_per_channel("discord", Role::Assistant, hours(-1000)).await.expect("newest");
    assert_eq!(ids(assistants), ["a3"]);
    assert!(b.store.newest_per_channel("nobody", Role::User, hours(-1000)).await.expect("newest").is_empty());
}

async fn recent_messages_are_the_newest_matches_oldest_first(b: &Backend) {
    // One channel over two sessions, with another channel's and a tool call in between.
    let rows = [
        ("m1", "s_old", "room", MessageType::Text),
        ("m2", "s_old", "room", MessageType::Text),
        ("x1", "s_other", "elsewhere", MessageType::Text),
        ("m3", "s_new", "room", MessageType::Text),
        ("c1", "s_new", "room", MessageType::ToolCall),
        ("m4", "s_new", "room", MessageType::Text),
    ];
    for (id, session, channel, kind) in rows {
        let mut row = message(id, session, None, Role::User, kind, Status::Responded);
        row.channel_id = channel.to_owned();
        b.store.insert_message(&row).await.expect("insert");
    }
    let ids = |list: Vec<kesoku_core::Message>| list.into_iter().map(|m| m.id.into_string()).collect::<Vec<_>>();
    let texts = MessageFilter::default().with_channel("room").with_types(&[MessageType::Text]);
    assert_eq!(ids(b.store.recent_messages(&texts, 3).await.expect("recent")), ["m2", "m3", "m4"]);
    assert_eq!(ids(b.store.recent_messages(&texts, 10).await.expect("recent")), ["m1", "m2", "m3", "m4"]);
    // The filter's own limit (the oldest ones) does not apply.
    let limited = texts.clone().with_limit(1);
    assert_eq!(ids(b.store.recent_messages(&limited, 2).await.expect("recent")), ["m3", "m4"]);
    assert!(b.store.recent_messages(&texts, 0).await.expect("recent").is_empty());
}
