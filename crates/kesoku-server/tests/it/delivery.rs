//! The `api` chatbot's delivery: the shared deliverer running [`kesoku_server::ApiChatbot`].

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use kesoku_core::{Message, MessageFilter, MessageId, SessionId, Status, TurnOrigin};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_server::run_api_delivery;
use tokio_util::sync::CancellationToken;

use crate::harness::{TestServer, user};

/// Wait (at most 5 s) until every message of `ids` has been seen `delivered`.
async fn wait_delivered(gateway: &Gateway, session: &SessionId, ids: &[MessageId]) -> bool {
    let filter = MessageFilter::session(session).with_statuses(&[Status::Delivered]);
    let mut stream = std::pin::pin!(gateway.listen(filter, ListenFrom::Current));
    let mut missing: HashSet<MessageId> = ids.iter().cloned().collect();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !missing.is_empty() {
            match stream.next().await {
                Some(Ok(event)) => {
                    missing.remove(&event.message.id);
                }
                Some(Err(_)) => {}
                None => return,
            }
        }
    })
    .await
    .is_ok()
        && missing.is_empty()
}

#[tokio::test]
async fn pending_and_responded_api_messages_become_delivered_and_others_are_left_alone() {
    let server = TestServer::new().await;
    let api = server.session("api", "web").await;
    let discord = server.session("discord", "room").await;
    // Written before the task starts: picked up by its catch-up.
    let api_root = server.post(&user(&api, "hi")).await;
    let origin = TurnOrigin::of(&api_root, "Kesoku");
    let early = server.post(&origin.thought(1, "thinking", None)).await;
    let discord_root = server.post(&user(&discord, "hi")).await;
    let discord_reply = server.post(&TurnOrigin::of(&discord_root, "Kesoku").final_text(1, "hello", None)).await;

    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_api_delivery(server.deliverer(), shutdown.clone()));
    // Written while it runs: picked up live.
    let call = server.post(&origin.tool_call(1, "c1", "search", serde_json::json!({}))).await;
    let answer = server.post(&origin.final_text(2, "done", None)).await;

    let delivered =
        wait_delivered(&server.gateway, &api.id, &[early.id.clone(), call.id.clone(), answer.id.clone()]).await;
    assert!(delivered, "thought, tool call and answer of chatbot api should be delivered");
    let root = server.store.get_message(&api_root.id).await.expect("read").expect("stored");
    assert_eq!(root.status, Status::PendingAgent, "user messages are not the delivery task's business");
    let other = server.store.get_message(&discord_reply.id).await.expect("read").expect("stored");
    assert_eq!(other.status, Status::Pending, "another chatbot delivers its own messages");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task stops").expect("no panic");
}

#[tokio::test]
async fn nudges_and_compaction_summaries_stay_responded() {
    let server = TestServer::new().await;
    let api = server.session("api", "web").await;
    let root = server.post(&user(&api, "hi")).await;
    let origin = TurnOrigin::of(&root, "Kesoku");
    // Written before the task starts (its catch-up) and while it runs (live).
    let early_nudge = server.post(&origin.nudge(1, "Your previous response had empty content.")).await;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_api_delivery(server.deliverer(), shutdown.clone()));
    let summary = server.post(&Message::compaction_summary(&api.id, "api", "web", "summary")).await;
    let live_nudge = server.post(&origin.nudge(2, "Your previous response had empty content.")).await;
    // The answer is posted last: once it is delivered, the task has seen everything before it.
    let answer = server.post(&origin.final_text(3, "done", None)).await;
    assert!(
        wait_delivered(&server.gateway, &api.id, std::slice::from_ref(&answer.id)).await,
        "the answer is delivered"
    );
    for hidden in [&early_nudge, &summary, &live_nudge] {
        let stored = server.store.get_message(&hidden.id).await.expect("read").expect("stored");
        assert_eq!(stored.status, Status::Responded, "{:?} is shown to nobody: it stays responded", stored.content);
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task stops").expect("no panic");
}

#[tokio::test]
async fn a_message_that_changed_first_is_not_an_error() {
    let server = TestServer::new().await;
    let api = server.session("api", "web").await;
    let root = server.post(&user(&api, "hi")).await;
    let origin = TurnOrigin::of(&root, "Kesoku");
    let call = server.post(&origin.tool_call(1, "c1", "search", serde_json::json!({}))).await;
    // An interruption got there first.
    server.gateway.update_status(&call.id, Status::Interrupted).await.expect("interrupt");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(run_api_delivery(server.deliverer(), shutdown.clone()));
    let later = server.post(&origin.final_text(1, "ok", None)).await;
    assert!(
        wait_delivered(&server.gateway, &api.id, std::slice::from_ref(&later.id)).await,
        "the task keeps working after a race"
    );
    let stored = server.store.list_messages(&MessageFilter::default().with_statuses(&[Status::Interrupted])).await;
    assert_eq!(stored.expect("list").len(), 1, "the interrupted call stays interrupted");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("the task stops").expect("no panic");
}
