//! Delivery records (which platform message holds which part of a message) and the ledger's
//! note of a delivery that failed for good.

use chrono::Duration as Span;
use kesoku_core::{ActivationId, ActivationKind, DeliveryRecord, LedgerEntry, MessageId, Outcome, Usage};

use crate::backend_tests;
use crate::harness::{Backend, t0};

backend_tests!(
    records_are_kept_per_part_in_part_order,
    the_first_record_of_a_part_wins,
    a_failed_delivery_is_noted_on_the_activation_rows_of_its_turn,
);

fn record(message: &str, part: u32, platform_id: &str, seconds: i64) -> DeliveryRecord {
    DeliveryRecord {
        message_id: MessageId::from(message),
        part,
        platform_message_id: platform_id.to_owned(),
        recorded_at: t0() + Span::seconds(seconds),
    }
}

async fn records_are_kept_per_part_in_part_order(b: &Backend) {
    // Written out of order; part 10 sorts after part 2 (by number, not as text).
    let parts = [
        record("msg_a", 10, "1300000000000000010", 4),
        record("msg_a", 2, "1300000000000000002", 3),
        record("msg_a", 0, "1300000000000000000", 1),
        record("msg_b", 0, "spaces/AAA/messages/b0", 2),
        record("msg_a", 1, "1300000000000000001", 2),
    ];
    for part in &parts {
        b.store.record_delivery(part).await.expect("record a part");
    }
    let of_a = b.store.delivery_records(&MessageId::from("msg_a")).await.expect("records of msg_a");
    assert_eq!(of_a, [parts[2].clone(), parts[4].clone(), parts[1].clone(), parts[0].clone()]);
    let of_b = b.store.delivery_records(&MessageId::from("msg_b")).await.expect("records of msg_b");
    assert_eq!(of_b, [parts[3].clone()], "only msg_b's own record");
    let none = b.store.delivery_records(&MessageId::from("msg_never_sent")).await.expect("records of nothing");
    assert_eq!(none, []);

    // Times are kept to the microsecond, like every time the store holds.
    let precise =
        DeliveryRecord { recorded_at: t0() + Span::nanoseconds(1_234_567_891), ..record("msg_c", u32::MAX, "last", 0) };
    b.store.record_delivery(&precise).await.expect("record the largest part");
    let read = b.store.delivery_records(&MessageId::from("msg_c")).await.expect("records of msg_c");
    assert_eq!(read, [DeliveryRecord { recorded_at: t0() + Span::microseconds(1_234_567), ..precise }]);
}

async fn the_first_record_of_a_part_wins(b: &Backend) {
    let first = record("msg_a", 0, "first", 1);
    b.store.record_delivery(&first).await.expect("record");
    let second = record("msg_a", 1, "second", 2);
    b.store.record_delivery(&second).await.expect("record");
    // A retried delivery records part 0 again (another platform id, a later time).
    b.store.record_delivery(&record("msg_a", 0, "again", 5)).await.expect("a repeated part is not an error");
    b.store.record_delivery(&first).await.expect("the same record again is not an error");
    let kept = b.store.delivery_records(&MessageId::from("msg_a")).await.expect("records");
    assert_eq!(kept, [first, second]);
}

/// A ledger row of session `s1` for `message` (the ledger tests' row with another message).
fn entry(id: &str, message: Option<&str>, minutes: i64) -> LedgerEntry {
    LedgerEntry { message_id: message.map(MessageId::from), ..crate::ledger::entry(id, "s1", minutes) }
}

async fn a_failed_delivery_is_noted_on_the_activation_rows_of_its_turn(b: &Backend) {
    // The turn of msg_root ran twice (a retry after a limit), plus rows of other messages.
    let first_try = entry("act_first_try", Some("msg_root"), 0);
    let retry = entry("act_retry", Some("msg_root"), 1);
    let other = entry("act_other", Some("msg_other"), 2);
    let workflow = LedgerEntry { kind: ActivationKind::Workflow, ..entry("act_workflow", None, 3) };
    for e in [&first_try, &retry, &other, &workflow] {
        b.ledger.record_enqueued(e).await.expect("enqueue");
    }
    let at = |seconds: i64| t0() + Span::seconds(seconds);
    let limit = "tool call limit (20) reached";
    b.ledger.record_started(&first_try.id, at(10)).await.expect("start");
    b.ledger
        .record_finished(&first_try.id, at(20), Outcome::LimitExceeded, Some(limit), &Usage::default())
        .await
        .expect("finish");
    let usage = Usage { model_calls: 1, tool_calls: 0, input_tokens: 120, output_tokens: 40 };
    b.ledger.record_started(&retry.id, at(30)).await.expect("start");
    b.ledger.record_finished(&retry.id, at(40), Outcome::Succeeded, None, &usage).await.expect("finish");
    let (first_before, retry_before) = (row(b, &first_try.id).await, row(b, &retry.id).await);
    let (other_before, workflow_before) = (row(b, &other.id).await, row(b, &workflow.id).await);

    let root = MessageId::from("msg_root");
    b.ledger.record_delivery_failure(&root, "discord answered 403: missing access").await.expect("note the failure");
    let note = "delivery failed: discord answered 403: missing access";
    assert_eq!(
        row(b, &first_try.id).await,
        LedgerEntry { error: Some(format!("{limit}; {note}")), ..first_before.clone() },
        "joined to the error the row had, nothing else changed"
    );
    assert_eq!(row(b, &retry.id).await, LedgerEntry { error: Some(note.to_owned()), ..retry_before.clone() });
    assert_eq!(row(b, &other.id).await, other_before, "another message's row is untouched");
    assert_eq!(row(b, &workflow.id).await, workflow_before, "a row of no message is untouched");

    // A second failure is added after the first.
    b.ledger.record_delivery_failure(&root, "file too large").await.expect("note again");
    let retried = row(b, &retry.id).await;
    assert_eq!(
        retried.error.as_deref(),
        Some("delivery failed: discord answered 403: missing access; delivery failed: file too large")
    );
    // The note says what happened after the turn; the turn's own outcome stays.
    assert_eq!(retried.outcome, Some(Outcome::Succeeded));

    // A message without activation rows (a chat command's answer) is not an error.
    b.ledger.record_delivery_failure(&MessageId::from("msg_no_turn"), "gone").await.expect("no row is fine");
    assert_eq!(row(b, &other.id).await, other_before);
}

async fn row(b: &Backend, id: &ActivationId) -> LedgerEntry {
    b.ledger.get_activation(id).await.expect("get").expect("the row exists")
}
