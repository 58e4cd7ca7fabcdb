//! Claims (the compare-and-set that hands out work), orphan recovery, orphaned tool calls.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kesoku_core::{MessageFilter, MessageId, MessageType, Role, SessionId, Status};
use kesoku_store::{Claim, StoreError};

use crate::backend_tests;
use crate::harness::{Backend, message, prompt, t0};

backend_tests!(
    claim_is_a_compare_and_set,
    sixteen_claimants_race_for_ten_thousand_messages,
    recover_orphans_measures_from_the_claim,
    a_renewed_claim_is_not_an_orphan,
    orphaned_tool_calls_are_calls_without_a_result,
);

async fn claim_is_a_compare_and_set(b: &Backend) {
    let inserted = b.store.insert_message(&prompt("msg_a", "s1")).await.expect("insert");
    let id = MessageId::from("msg_a");
    assert_eq!(b.store.claim_of(&id).await.expect("claim_of"), None);

    let won = b
        .store
        .claim(&id, Status::Processing, &[Status::PendingAgent], "worker-1")
        .await
        .expect("claim")
        .expect("the first claimant wins");
    assert!(won.rev > inserted.rev);
    assert_eq!(won.message.status, Status::Processing);
    assert_eq!(
        b.store.claim_of(&id).await.expect("claim_of"),
        Some(Claim { claimed_by: "worker-1".to_owned(), claimed_at: t0() })
    );

    let lost = b.store.claim(&id, Status::Processing, &[Status::PendingAgent], "worker-2").await.expect("claim");
    assert_eq!(lost, None, "the second claimant loses");
    assert_eq!(b.store.claim_of(&id).await.expect("claim_of").map(|c| c.claimed_by), Some("worker-1".to_owned()));

    // The target must be legal from every expected status; a refused claim changes nothing.
    let error = b
        .store
        .claim(&id, Status::Delivered, &[Status::Processing, Status::Pending], "x")
        .await
        .expect_err("processing -> delivered is illegal");
    let StoreError::IllegalTransition { id: refused, source } = &error else {
        panic!("expected an illegal transition, got {error:?}")
    };
    assert_eq!(refused, "msg_a");
    assert_eq!((source.from, source.to), (Status::Processing, Status::Delivered));
    assert_eq!(b.store.get_message(&id).await.expect("get").map(|m| m.status), Some(Status::Processing));
    assert_eq!(b.store.current_rev().await.expect("rev"), won.rev);

    // Claims serve other hand-overs too: a chatbot taking a pending reply for delivery.
    b.store
        .insert_message(&message("msg_r", "s1", Some("msg_a"), Role::Assistant, MessageType::Text, Status::Pending))
        .await
        .expect("insert reply");
    let reply = MessageId::from("msg_r");
    let delivered = b.store.claim(&reply, Status::Delivered, &[Status::Pending], "discord").await.expect("claim");
    assert_eq!(delivered.map(|e| e.message.status), Some(Status::Delivered));
    assert_eq!(b.store.claim_of(&reply).await.expect("claim_of"), None, "only processing messages are held");

    assert_eq!(b.store.claim(&id, Status::Processed, &[], "x").await.expect("nothing expected"), None);
    let error = b
        .store
        .claim(&MessageId::from("msg_missing"), Status::Processing, &[Status::PendingAgent], "x")
        .await
        .expect_err("missing");
    assert!(matches!(error, StoreError::NotFound { .. }), "{error:?}");
    let error = b.store.claim_of(&MessageId::from("msg_missing")).await.expect_err("missing");
    assert!(matches!(error, StoreError::NotFound { .. }), "{error:?}");
}

async fn sixteen_claimants_race_for_ten_thousand_messages(b: &Backend) {
    const MESSAGES: usize = 10_000;
    const CLAIMANTS: usize = 16;
    const CONTENDERS: usize = 4;
    let messages: Vec<_> = (0..MESSAGES).map(|i| prompt(&format!("msg_{i:05}"), "s_race")).collect();
    b.store.insert_messages(&messages).await.expect("insert 10k");
    let ids: Arc<Vec<MessageId>> = Arc::new(messages.into_iter().map(|m| m.id).collect());

    // Every claimant walks the list in the same order, trying the messages it shares with the
    // next three claimants: each message is fought over by four of the sixteen at once. (All
    // sixteen on every message is 160,000 attempts, too slow for a test on a small machine.)
    let mut tasks = tokio::task::JoinSet::new();
    for claimant in 0..CLAIMANTS {
        let store = Arc::clone(&b.store);
        let ids = Arc::clone(&ids);
        tasks.spawn(async move {
            let name = format!("worker-{claimant}");
            let mut won = Vec::new();
            for (index, id) in ids.iter().enumerate() {
                if (index + CLAIMANTS - claimant) % CLAIMANTS >= CONTENDERS {
                    continue;
                }
                if store.claim(id, Status::Processing, &[Status::PendingAgent], &name).await.expect("claim").is_some() {
                    won.push(id.clone());
                }
            }
            (name, won)
        });
    }
    let mut winners = std::collections::HashMap::new();
    while let Some(result) = tasks.join_next().await {
        let (name, won) = result.expect("claimant task");
        for id in won {
            let previous = winners.insert(id.clone(), name.clone());
            assert_eq!(previous, None, "{id} was claimed twice");
        }
    }
    assert_eq!(winners.len(), MESSAGES, "every message is claimed exactly once");

    let processing = b.store.list_messages(&MessageFilter::status(Status::Processing)).await.expect("list");
    assert_eq!(processing.len(), MESSAGES);
    for id in ids.iter().step_by(997) {
        let claim = b.store.claim_of(id).await.expect("claim_of").expect("held");
        assert_eq!(Some(&claim.claimed_by), winners.get(id), "the store names the winner of {id}");
    }
    // Each win was one change with its own revision.
    let changes = b.store.changes_since(0, &MessageFilter::default(), u32::MAX).await.expect("changes");
    let revs: HashSet<i64> = changes.iter().map(|e| e.rev).collect();
    assert_eq!(revs.len(), MESSAGES);
}

async fn recover_orphans_measures_from_the_claim(b: &Backend) {
    b.store
        .insert_messages(&[
            prompt("claimed_long_ago", "s1"),
            prompt("old_but_claimed_now", "s1"),
            prompt("waiting", "s1"),
        ])
        .await
        .expect("insert");
    let long_ago = MessageId::from("claimed_long_ago");
    let now_claimed = MessageId::from("old_but_claimed_now");
    b.store
        .claim(&long_ago, Status::Processing, &[Status::PendingAgent], "dead-worker")
        .await
        .expect("claim")
        .expect("won");

    // An hour later the other message (written an hour ago) is claimed by a live worker.
    b.clock.advance(Duration::from_secs(3600));
    b.store
        .claim(&now_claimed, Status::Processing, &[Status::PendingAgent], "live-worker")
        .await
        .expect("claim")
        .expect("won");
    let rev_before = b.store.current_rev().await.expect("rev");

    let recovered = b.store.recover_orphans(Duration::from_secs(600)).await.expect("recover");
    assert_eq!(recovered, std::slice::from_ref(&long_ago), "only the claim older than ten minutes is an orphan");
    let back = b.store.get_message(&long_ago).await.expect("get").expect("exists");
    assert_eq!(back.status, Status::PendingAgent);
    assert_eq!(back.updated_at, Some(t0() + chrono::Duration::seconds(3600)));
    assert_eq!(b.store.claim_of(&long_ago).await.expect("claim_of"), None);
    assert!(b.store.current_rev().await.expect("rev") > rev_before, "recovery is a change readers catch up on");
    assert_eq!(b.store.get_message(&now_claimed).await.expect("get").map(|m| m.status), Some(Status::Processing));
    assert_eq!(
        b.store.claim_of(&now_claimed).await.expect("claim_of").map(|c| c.claimed_by),
        Some("live-worker".to_owned())
    );

    b.clock.advance(Duration::from_secs(601));
    let recovered = b.store.recover_orphans(Duration::from_secs(600)).await.expect("recover");
    assert_eq!(recovered, std::slice::from_ref(&now_claimed));
    assert_eq!(
        b.store.get_message(&MessageId::from("waiting")).await.expect("get").map(|m| m.status),
        Some(Status::PendingAgent)
    );
    // A recovered message can be claimed again, and the new claim is fresh.
    b.store
        .claim(&long_ago, Status::Processing, &[Status::PendingAgent], "new-worker")
        .await
        .expect("claim")
        .expect("won");
    assert!(b.store.recover_orphans(Duration::from_secs(600)).await.expect("recover").is_empty());
}

async fn a_renewed_claim_is_not_an_orphan(b: &Backend) {
    b.store.insert_messages(&[prompt("long_turn", "s1")]).await.expect("insert");
    let id = MessageId::from("long_turn");
    b.store.claim(&id, Status::Processing, &[Status::PendingAgent], "worker-a").await.expect("claim").expect("won");
    let rev = b.store.current_rev().await.expect("rev");
    // A heartbeat every five minutes keeps a two-hour turn alive.
    for _ in 0..24 {
        b.clock.advance(Duration::from_secs(300));
        assert!(b.store.renew_claim(&id, "worker-a").await.expect("renew"), "the holder renews its claim");
        assert!(b.store.recover_orphans(Duration::from_secs(600)).await.expect("recover").is_empty());
    }
    assert_eq!(b.store.current_rev().await.expect("rev"), rev, "a heartbeat is not a change readers see");
    assert!(!b.store.renew_claim(&id, "worker-b").await.expect("renew"), "only the holder can renew");
    b.clock.advance(Duration::from_secs(601));
    assert_eq!(b.store.recover_orphans(Duration::from_secs(600)).await.expect("recover"), vec![id.clone()]);
    assert!(!b.store.renew_claim(&id, "worker-a").await.expect("renew"), "a recovered claim is gone");
}

async fn orphaned_tool_calls_are_calls_without_a_result(b: &Backend) {
    let call = |id: &str, session: &str, root: &str| {
        message(id, session, Some(root), Role::Tool, MessageType::ToolCall, Status::Responded)
    };
    let result = |id: &str, session: &str, call: &str| {
        message(id, session, Some(call), Role::Tool, MessageType::ToolResult, Status::Responded)
    };
    b.store
        .insert_messages(&[
            prompt("root_1", "s1"),
            call("call_answered", "s1", "root_1"),
            call("call_open", "s1", "root_1"),
            result("result_answered", "s1", "call_answered"),
            // Text under a call is not its result.
            message("note", "s1", Some("call_open"), Role::Assistant, MessageType::Text, Status::Pending),
            prompt("root_2", "s2"),
            call("call_open_2", "s2", "root_2"),
        ])
        .await
        .expect("insert");
    let ids = |list: Vec<kesoku_core::Message>| list.into_iter().map(|m| m.id.into_string()).collect::<Vec<_>>();
    let in_s1 = b.store.orphaned_tool_calls(Some(&SessionId::from("s1"))).await.expect("orphans in s1");
    assert_eq!(ids(in_s1), ["call_open"]);
    let everywhere = b.store.orphaned_tool_calls(None).await.expect("orphans");
    assert_eq!(ids(everywhere), ["call_open", "call_open_2"]);

    b.store.insert_message(&result("result_late", "s1", "call_open")).await.expect("late result");
    assert!(b.store.orphaned_tool_calls(Some(&SessionId::from("s1"))).await.expect("orphans").is_empty());
}
