//! Rows this build cannot understand (written by hand, by another program, by a newer build
//! that added a status): typed errors naming table, id and value, never a panic, never a change.

use kesoku_core::{
    ActivationId, DeliveryRecord, FollowUp, FollowUpFilter, FollowUpId, FollowUpState, Job, JobEnd, JobFilter, JobId,
    JobState, MessageFilter, MessageId, SessionId, Status,
};
use kesoku_store::StoreError;

use crate::backend_tests;
use crate::harness::{Backend, prompt, t0};

backend_tests!(
    an_unknown_status_is_reported_and_nothing_changes,
    metadata_that_is_not_kesoku_metadata_is_reported,
    other_bad_values_are_reported,
    a_delivery_record_out_of_range_is_reported,
    unknown_follow_up_states_are_reported_and_nothing_changes,
    bad_job_rows_are_reported_and_nothing_changes,
);

fn assert_corrupt(error: &StoreError, table: &str, id: &str, value: &str) {
    let StoreError::Corrupt { table: t, id: i, reason } = error else {
        panic!("expected a corrupt-row error, got {error:?}")
    };
    assert_eq!((*t, i.as_str()), (table, id), "{error}");
    assert!(reason.contains(value), "the reason quotes the bad value `{value}`: {reason}");
    let text = error.to_string();
    assert!(text.contains(table) && text.contains(id) && text.contains(value), "{text}");
}

async fn an_unknown_status_is_reported_and_nothing_changes(b: &Backend) {
    b.store.insert_messages(&[prompt("msg_bad", "s1"), prompt("msg_good", "s1")]).await.expect("insert");
    b.place.raw("UPDATE messages SET status = 'teleported' WHERE id = 'msg_bad'").await;
    let bad = MessageId::from("msg_bad");
    let session = SessionId::from("s1");

    let error = b.store.get_message(&bad).await.expect_err("get");
    assert_corrupt(&error, "messages", "msg_bad", "teleported");
    assert_corrupt(
        &b.store.list_messages(&MessageFilter::session(&session)).await.expect_err("list"),
        "messages",
        "msg_bad",
        "teleported",
    );
    assert_corrupt(&b.store.session_history(&session).await.expect_err("history"), "messages", "msg_bad", "teleported");
    assert_corrupt(
        &b.store.changes_since(0, &MessageFilter::default(), 10).await.expect_err("changes"),
        "messages",
        "msg_bad",
        "teleported",
    );
    assert_corrupt(
        &b.store.update_status(&bad, Status::Processing).await.expect_err("update"),
        "messages",
        "msg_bad",
        "teleported",
    );
    assert_corrupt(
        &b.store.claim(&bad, Status::Processing, &[Status::PendingAgent], "w").await.expect_err("claim"),
        "messages",
        "msg_bad",
        "teleported",
    );
    assert_corrupt(&b.store.claim_of(&bad).await.expect_err("claim_of"), "messages", "msg_bad", "teleported");

    assert_eq!(b.place.raw_strings("SELECT status FROM messages WHERE id = 'msg_bad'").await, ["teleported"]);
    assert!(b.store.get_message(&MessageId::from("msg_good")).await.expect("the good row reads").is_some());
}

async fn metadata_that_is_not_kesoku_metadata_is_reported(b: &Backend) {
    b.store.insert_message(&prompt("msg_meta", "s1")).await.expect("insert");
    let id = MessageId::from("msg_meta");
    // Valid JSON, wrong shape (both backends can hold it).
    b.place.raw(r#"UPDATE messages SET metadata = '{"attachments": 5}' WHERE id = 'msg_meta'"#).await;
    let error = b.store.get_message(&id).await.expect_err("wrong shape");
    assert_corrupt(&error, "messages", "msg_meta", r#"{"attachments":5}"#);
    assert!(error.to_string().contains("metadata"), "{error}");
    // A change whose result cannot be read back is rolled back.
    let error = b.store.update_status(&id, Status::Processing).await.expect_err("update");
    assert_corrupt(&error, "messages", "msg_meta", "attachments");
    assert_eq!(b.place.raw_strings("SELECT status FROM messages WHERE id = 'msg_meta'").await, ["pending_agent"]);

    if b.is_sqlite() {
        // SQLite keeps text, so the JSON itself can be broken.
        b.place.raw(r#"UPDATE messages SET metadata = '{"tool_name": ' WHERE id = 'msg_meta'"#).await;
        let error = b.store.get_message(&id).await.expect_err("broken json");
        assert_corrupt(&error, "messages", "msg_meta", r#"{"tool_name": "#);
        assert!(error.to_string().contains("not JSON"), "{error}");
    }
}

async fn other_bad_values_are_reported(b: &Backend) {
    b.store.insert_message(&prompt("msg_step", "s1")).await.expect("insert");
    b.place.raw("UPDATE messages SET step = -3 WHERE id = 'msg_step'").await;
    let error = b.store.get_message(&MessageId::from("msg_step")).await.expect_err("negative step");
    assert_corrupt(&error, "messages", "msg_step", "-3");

    let entry = kesoku_core::LedgerEntry {
        id: ActivationId::from("act_bad"),
        kind: kesoku_core::ActivationKind::Message,
        lane: kesoku_core::Lane::Interactive,
        session_id: SessionId::from("s1"),
        message_id: None,
        triggered_by: "User".to_owned(),
        delegation_user: None,
        depth: 0,
        agent: None,
        enqueued_at: t0(),
        started_at: None,
        finished_at: None,
        outcome: None,
        error: None,
        usage: Default::default(),
    };
    b.ledger.record_enqueued(&entry).await.expect("enqueue");
    b.place.raw("UPDATE activations SET outcome = 'exploded' WHERE id = 'act_bad'").await;
    let error = b.ledger.get_activation(&entry.id).await.expect_err("unknown outcome");
    assert_corrupt(&error, "activations", "act_bad", "exploded");
    assert_corrupt(
        &b.ledger.list_activations(&Default::default()).await.expect_err("list"),
        "activations",
        "act_bad",
        "exploded",
    );

    if b.is_sqlite() {
        b.store.resolve_session("cli", "cli").await.expect("session");
        b.place.raw("UPDATE sessions SET created_at = 'last tuesday'").await;
        let error = b.store.list_sessions(&Default::default()).await.expect_err("bad time");
        let StoreError::Corrupt { table: "sessions", reason, .. } = &error else {
            panic!("expected a corrupt session row, got {error:?}")
        };
        assert!(reason.contains("last tuesday"), "{reason}");
    }
}

async fn a_delivery_record_out_of_range_is_reported(b: &Backend) {
    let record = DeliveryRecord {
        message_id: MessageId::from("msg_bad"),
        part: 0,
        platform_message_id: "p".to_owned(),
        recorded_at: t0(),
    };
    b.store.record_delivery(&record).await.expect("record");
    b.place.raw("UPDATE deliveries SET part = -7 WHERE message_id = 'msg_bad'").await;
    let error = b.store.delivery_records(&record.message_id).await.expect_err("a negative part");
    assert_corrupt(&error, "deliveries", "msg_bad", "-7");
}

async fn unknown_follow_up_states_are_reported_and_nothing_changes(b: &Backend) {
    let good = FollowUp {
        id: FollowUpId::from("fu_good"),
        session_id: SessionId::from("s1"),
        chatbot_id: "cli".to_owned(),
        channel_id: "cli".to_owned(),
        task: "t".to_owned(),
        due_at: t0(),
        created_at: t0(),
        created_by: None,
        state: FollowUpState::Pending,
        settled_at: None,
    };
    let bad = FollowUp { id: FollowUpId::from("fu_bad"), ..good.clone() };
    for f in [&good, &bad] {
        b.store.insert_followup(f).await.expect("insert");
    }
    // A state a newer build may know.
    b.place.raw("UPDATE followups SET state = 'snoozed' WHERE id = 'fu_bad'").await;
    assert_corrupt(&b.store.get_followup(&bad.id).await.expect_err("get"), "followups", "fu_bad", "snoozed");
    let error = b.store.list_followups(&FollowUpFilter::default()).await.expect_err("list");
    assert_corrupt(&error, "followups", "fu_bad", "snoozed");
    let error = b.store.settle_followup(&bad.id, FollowUpState::Fired, t0()).await.expect_err("settle");
    assert_corrupt(&error, "followups", "fu_bad", "snoozed");
    assert_eq!(b.place.raw_strings("SELECT state FROM followups WHERE id = 'fu_bad'").await, ["snoozed"]);
    assert_eq!(b.store.get_followup(&good.id).await.expect("the good row reads"), Some(good));
}

async fn bad_job_rows_are_reported_and_nothing_changes(b: &Backend) {
    let good = Job {
        id: JobId::from("job_good"),
        session_id: SessionId::from("s1"),
        chatbot_id: "cli".to_owned(),
        channel_id: "cli".to_owned(),
        message_id: MessageId::from("msg_root"),
        command: "true".to_owned(),
        pid: Some(7),
        stdout_path: "/tmp/o".to_owned(),
        stderr_path: "/tmp/e".to_owned(),
        state: JobState::Running,
        exit_code: None,
        detail: None,
        started_at: t0(),
        finished_at: None,
    };
    let bad = Job { id: JobId::from("job_bad"), ..good.clone() };
    for j in [&good, &bad] {
        b.store.insert_job(j).await.expect("insert");
    }
    b.place.raw("UPDATE jobs SET state = 'zombie' WHERE id = 'job_bad'").await;
    assert_corrupt(&b.store.get_job(&bad.id).await.expect_err("get"), "jobs", "job_bad", "zombie");
    let error = b.store.list_jobs(&JobFilter::default()).await.expect_err("list");
    assert_corrupt(&error, "jobs", "job_bad", "zombie");
    let end = JobEnd { state: JobState::Lost, exit_code: None, detail: None, finished_at: t0() };
    assert_corrupt(&b.store.finish_job(&bad.id, &end).await.expect_err("finish"), "jobs", "job_bad", "zombie");
    assert_eq!(b.place.raw_strings("SELECT state FROM jobs WHERE id = 'job_bad'").await, ["zombie"]);

    // A pid no process can have (written by hand) is reported, not cut to fit.
    b.place.raw("UPDATE jobs SET state = 'running', pid = 9999999999 WHERE id = 'job_bad'").await;
    assert_corrupt(&b.store.get_job(&bad.id).await.expect_err("get"), "jobs", "job_bad", "9999999999");
    assert_eq!(b.store.get_job(&good.id).await.expect("the good row reads"), Some(good));
}
