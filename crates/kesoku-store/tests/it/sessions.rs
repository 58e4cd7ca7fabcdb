//! Sessions and the (chatbot, channel) → active session map.

use std::sync::Arc;
use std::time::Duration;

use chrono::Duration as Span;
use kesoku_core::{Session, SessionId};
use kesoku_store::{SessionFilter, StoreError};

use crate::backend_tests;
use crate::harness::{Backend, t0};

backend_tests!(
    sessions_are_created_listed_and_titled,
    a_channel_points_at_its_active_session,
    resolve_session_is_atomic_under_concurrency,
);

fn session(id: &str, chatbot: &str, channel: &str, minutes: i64) -> Session {
    let at = t0() + Span::minutes(minutes);
    Session {
        id: SessionId::from(id),
        chatbot_id: chatbot.to_owned(),
        channel_id: channel.to_owned(),
        title: None,
        created_at: at,
        updated_at: at,
    }
}

async fn sessions_are_created_listed_and_titled(b: &Backend) {
    let sessions =
        [session("s1", "discord", "room_1", 0), session("s2", "discord", "room_2", 1), session("s3", "cli", "cli", 2)];
    for s in &sessions {
        b.store.create_session(s).await.expect("create");
    }
    let error = b.store.create_session(&session("s1", "cli", "cli", 9)).await.expect_err("same id");
    assert!(matches!(&error, StoreError::Duplicate { what: "session", id } if id == "s1"), "{error:?}");
    assert_eq!(b.store.get_session(&SessionId::from("s1")).await.expect("get").as_ref(), Some(&sessions[0]));
    assert_eq!(b.store.get_session(&SessionId::from("nope")).await.expect("get"), None);

    let ids = |list: Vec<Session>| list.into_iter().map(|s| s.id.into_string()).collect::<Vec<_>>();
    let cases = [
        (SessionFilter::default(), vec!["s3", "s2", "s1"]),
        (SessionFilter { chatbot_id: Some("discord".to_owned()), ..SessionFilter::default() }, vec!["s2", "s1"]),
        (SessionFilter { channel_id: Some("room_1".to_owned()), ..SessionFilter::default() }, vec!["s1"]),
        (SessionFilter { limit: Some(2), ..SessionFilter::default() }, vec!["s3", "s2"]),
        (SessionFilter { chatbot_id: Some("wechat".to_owned()), ..SessionFilter::default() }, vec![]),
    ];
    for (filter, expected) in cases {
        assert_eq!(ids(b.store.list_sessions(&filter).await.expect("list")), expected, "{filter:?}");
    }

    b.clock.advance(Duration::from_secs(30));
    b.store.set_session_title(&SessionId::from("s2"), "Tokyo weather").await.expect("title");
    let titled = b.store.get_session(&SessionId::from("s2")).await.expect("get").expect("exists");
    assert_eq!(titled.title.as_deref(), Some("Tokyo weather"));
    assert_eq!(titled.updated_at, t0() + Span::seconds(30));
    assert_eq!(titled.created_at, sessions[1].created_at);
    let error = b.store.set_session_title(&SessionId::from("nope"), "x").await.expect_err("missing");
    assert!(matches!(&error, StoreError::NotFound { what: "session", .. }), "{error:?}");
}

async fn a_channel_points_at_its_active_session(b: &Backend) {
    assert_eq!(b.store.active_session("discord", "room_1").await.expect("active"), None);
    let error =
        b.store.set_active_session("discord", "room_1", &SessionId::from("ghost")).await.expect_err("unknown session");
    assert!(matches!(&error, StoreError::NotFound { what: "session", id } if id == "ghost"), "{error:?}");
    assert_eq!(b.store.active_session("discord", "room_1").await.expect("active"), None);

    b.store.create_session(&session("s1", "discord", "room_1", 0)).await.expect("create");
    b.store.create_session(&session("s2", "discord", "room_1", 1)).await.expect("create");
    b.store.set_active_session("discord", "room_1", &SessionId::from("s1")).await.expect("activate s1");
    assert_eq!(b.store.active_session("discord", "room_1").await.expect("active"), Some(SessionId::from("s1")));
    b.store.set_active_session("discord", "room_1", &SessionId::from("s2")).await.expect("activate s2");
    assert_eq!(b.store.active_session("discord", "room_1").await.expect("active"), Some(SessionId::from("s2")));
    assert_eq!(b.store.active_session("discord", "room_2").await.expect("active"), None);
    assert_eq!(b.store.resolve_session("discord", "room_1").await.expect("resolve").id, SessionId::from("s2"));
}

async fn resolve_session_is_atomic_under_concurrency(b: &Backend) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let store = Arc::clone(&b.store);
        tasks.spawn(async move { store.resolve_session("discord", "room_7").await });
    }
    let mut ids = Vec::new();
    while let Some(result) = tasks.join_next().await {
        ids.push(result.expect("task").expect("resolve").id);
    }
    assert_eq!(ids.len(), 16);
    assert!(ids.iter().all(|id| *id == ids[0]), "every caller got the same session: {ids:?}");
    assert_eq!(b.store.active_session("discord", "room_7").await.expect("active"), Some(ids[0].clone()));
    let created = b
        .store
        .list_sessions(&SessionFilter { channel_id: Some("room_7".to_owned()), ..SessionFilter::default() })
        .await
        .expect("list");
    assert_eq!(created.len(), 1, "losers leave no session behind");
    assert_eq!(created[0].chatbot_id, "discord");
    assert_eq!(created[0].created_at, t0());

    let other = b.store.resolve_session("discord", "room_8").await.expect("resolve another");
    assert_ne!(other.id, ids[0]);
    assert_eq!(b.store.get_session(&other.id).await.expect("get"), Some(other));
}
