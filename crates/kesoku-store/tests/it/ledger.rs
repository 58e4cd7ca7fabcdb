//! The execution ledger: one row per activation, from enqueued to finished.

use chrono::Duration as Span;
use kesoku_core::{ActivationId, ActivationKind, Lane, LedgerEntry, MessageId, Outcome, SessionId, Usage};
use kesoku_store::{LedgerFilter, StoreError};

use crate::backend_tests;
use crate::harness::{Backend, t0};

backend_tests!(ledger_records_an_activation_from_enqueued_to_finished);
backend_tests!(a_cancelled_row_is_rewritten_by_a_run_that_went_further);

pub(crate) fn entry(id: &str, session: &str, minutes: i64) -> LedgerEntry {
    LedgerEntry {
        id: ActivationId::from(id),
        kind: ActivationKind::Message,
        lane: Lane::Interactive,
        session_id: SessionId::from(session),
        message_id: Some(MessageId::from(format!("msg_of_{id}").as_str())),
        triggered_by: "Chii".to_owned(),
        delegation_user: None,
        depth: 0,
        agent: None,
        enqueued_at: t0() + Span::minutes(minutes),
        started_at: None,
        finished_at: None,
        outcome: None,
        error: None,
        usage: Usage::default(),
    }
}

async fn ledger_records_an_activation_from_enqueued_to_finished(b: &Backend) {
    let mut e1 = entry("act_1", "s1", 0);
    let mut e2 = LedgerEntry {
        kind: ActivationKind::Workflow,
        lane: Lane::Responsive,
        message_id: None,
        triggered_by: "cron:nightly".to_owned(),
        delegation_user: Some("Chii".to_owned()),
        depth: 2,
        agent: Some("Ryan".to_owned()),
        ..entry("act_2", "s1", 1)
    };
    let mut e3 = entry("act_3", "s2", 2);
    for e in [&e1, &e2, &e3] {
        assert!(b.ledger.record_enqueued(e).await.expect("enqueue"), "{} is new", e.id);
    }
    // Idempotent: a second record of the same id changes nothing, and says it stored nothing
    // (how several intakes agree on which one queues an activation).
    let again = b
        .ledger
        .record_enqueued(&LedgerEntry { triggered_by: "someone else".to_owned(), ..e1.clone() })
        .await
        .expect("again");
    assert!(!again, "a second record of the same id reports that the row existed");
    assert_eq!(b.ledger.get_activation(&e1.id).await.expect("get").as_ref(), Some(&e1));
    assert_eq!(b.ledger.get_activation(&e2.id).await.expect("get").as_ref(), Some(&e2));
    assert_eq!(b.ledger.get_activation(&ActivationId::from("act_none")).await.expect("get"), None);

    let at = |seconds: i64| t0() + Span::seconds(seconds);
    b.ledger.record_started(&e1.id, at(200)).await.expect("start 1");
    let usage = Usage { model_calls: 2, tool_calls: 1, input_tokens: 8421, output_tokens: 1042 };
    b.ledger.record_finished(&e1.id, at(210), Outcome::Succeeded, None, &usage).await.expect("finish 1");
    b.ledger.record_started(&e2.id, at(220)).await.expect("start 2");
    b.ledger
        .record_finished(
            &e2.id,
            at(230),
            Outcome::LimitExceeded,
            Some("tool call limit (20) reached"),
            &Usage::default(),
        )
        .await
        .expect("finish 2");
    b.ledger.record_started(&e3.id, at(240)).await.expect("start 3");
    e1 = LedgerEntry {
        started_at: Some(at(200)),
        finished_at: Some(at(210)),
        outcome: Some(Outcome::Succeeded),
        usage,
        ..e1
    };
    e2 = LedgerEntry {
        started_at: Some(at(220)),
        finished_at: Some(at(230)),
        outcome: Some(Outcome::LimitExceeded),
        error: Some("tool call limit (20) reached".to_owned()),
        ..e2
    };
    e3 = LedgerEntry { started_at: Some(at(240)), ..e3 };
    assert_eq!(b.ledger.get_activation(&e1.id).await.expect("get"), Some(e1.clone()));
    // A second delivery of a finished activation finds its message taken: its start and its
    // `cancelled` end leave the row's own outcome as it was.
    b.ledger.record_started(&e1.id, at(300)).await.expect("a second start is not an error");
    let taken = "the message was no longer pending";
    b.ledger.record_finished(&e1.id, at(301), Outcome::Cancelled, Some(taken), &Usage::default()).await.expect("again");
    assert_eq!(b.ledger.get_activation(&e1.id).await.expect("get"), Some(e1.clone()), "a final outcome stays");

    let ids = |list: Vec<LedgerEntry>| list.into_iter().map(|e| e.id.into_string()).collect::<Vec<_>>();
    let all = b.ledger.list_activations(&LedgerFilter::default()).await.expect("list");
    assert_eq!(all, [e3.clone(), e2.clone(), e1.clone()], "newest first, full rows");
    let s1 = LedgerFilter { session_id: Some(SessionId::from("s1")), ..LedgerFilter::default() };
    assert_eq!(ids(b.ledger.list_activations(&s1).await.expect("list")), ["act_2", "act_1"]);
    let failures = LedgerFilter { only_unsuccessful: true, ..LedgerFilter::default() };
    assert_eq!(ids(b.ledger.list_activations(&failures).await.expect("list")), ["act_2"]);
    let workflows = LedgerFilter { kind: Some(ActivationKind::Workflow), ..LedgerFilter::default() };
    assert_eq!(ids(b.ledger.list_activations(&workflows).await.expect("list")), ["act_2"]);
    let interactive = LedgerFilter { lane: Some(Lane::Interactive), ..LedgerFilter::default() };
    assert_eq!(ids(b.ledger.list_activations(&interactive).await.expect("list")), ["act_3", "act_1"]);
    let both = LedgerFilter {
        kind: Some(ActivationKind::Message),
        lane: Some(Lane::Interactive),
        session_id: Some(SessionId::from("s2")),
        ..LedgerFilter::default()
    };
    assert_eq!(ids(b.ledger.list_activations(&both).await.expect("list")), ["act_3"]);
    let none = LedgerFilter { lane: Some(Lane::Background), ..LedgerFilter::default() };
    assert!(b.ledger.list_activations(&none).await.expect("list").is_empty());
    let newest = LedgerFilter { limit: Some(1), ..LedgerFilter::default() };
    assert_eq!(ids(b.ledger.list_activations(&newest).await.expect("list")), ["act_3"]);
    assert_eq!(b.ledger.unfinished_activations().await.expect("unfinished"), [e3]);

    let missing = ActivationId::from("act_missing");
    let error = b.ledger.record_started(&missing, at(1)).await.expect_err("missing");
    assert!(matches!(&error, StoreError::NotFound { what: "activation", .. }), "{error:?}");
    let error =
        b.ledger.record_finished(&missing, at(1), Outcome::Failed, None, &Usage::default()).await.expect_err("missing");
    assert!(matches!(&error, StoreError::NotFound { what: "activation", .. }), "{error:?}");
}

async fn a_cancelled_row_is_rewritten_by_a_run_that_went_further(b: &Backend) {
    let at = |seconds: i64| t0() + Span::seconds(seconds);
    // A `cancelled` row (recovery closed it) is rewritten by a run that went further.
    let e4 = entry("act_4", "s3", 3);
    b.ledger.record_enqueued(&e4).await.expect("enqueue 4");
    b.ledger
        .record_finished(&e4.id, at(250), Outcome::Cancelled, Some("closed"), &Usage::default())
        .await
        .expect("close");
    b.ledger.record_started(&e4.id, at(260)).await.expect("start 4");
    b.ledger.record_finished(&e4.id, at(270), Outcome::Succeeded, None, &Usage::default()).await.expect("finish 4");
    let e4 = b.ledger.get_activation(&e4.id).await.expect("get").expect("row 4");
    assert_eq!((e4.started_at, e4.finished_at, e4.outcome), (Some(at(260)), Some(at(270)), Some(Outcome::Succeeded)));
    assert!(
        b.ledger.record_started(&ActivationId::from("act_none"), at(300)).await.is_err(),
        "starting a row that does not exist is still an error"
    );
}
