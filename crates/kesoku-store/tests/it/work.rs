//! Work that outlives a turn: follow-ups and background jobs, stored as given, listed in their
//! orders, and moved out of `pending` / `running` exactly once.

use std::sync::Arc;

use chrono::{DateTime, Duration as Span, Utc};
use kesoku_core::{
    FollowUp, FollowUpFilter, FollowUpId, FollowUpState, Job, JobEnd, JobFilter, JobId, JobState, MessageId, SessionId,
};
use kesoku_store::{Store, StoreError};

use crate::backend_tests;
use crate::harness::{Backend, prompt, t0};

backend_tests!(
    followups_round_trip_every_field,
    followups_are_listed_soonest_due_first_and_filtered,
    a_followup_is_settled_once,
    concurrent_settles_of_one_followup_let_exactly_one_win,
    jobs_round_trip_every_field,
    jobs_are_listed_newest_first_and_filtered,
    a_job_is_finished_once,
    concurrent_finishes_of_one_job_let_exactly_one_win,
    work_rows_refuse_duplicate_ids,
    work_rows_take_no_message_revision,
);

fn at(seconds: i64) -> DateTime<Utc> {
    t0() + Span::seconds(seconds)
}

/// A pending follow-up of `session`, due `due` seconds after t0.
fn followup(id: &str, session: &str, due: i64) -> FollowUp {
    FollowUp {
        id: FollowUpId::from(id),
        session_id: SessionId::from(session),
        chatbot_id: "discord".to_owned(),
        channel_id: "c1".to_owned(),
        task: format!("task of {id}"),
        due_at: at(due),
        created_at: t0(),
        created_by: Some(MessageId::from(format!("msg_by_{id}"))),
        state: FollowUpState::Pending,
        settled_at: None,
    }
}

/// A running job of `session`, started `started` seconds after t0.
fn job(id: &str, session: &str, started: i64) -> Job {
    Job {
        id: JobId::from(id),
        session_id: SessionId::from(session),
        chatbot_id: "discord".to_owned(),
        channel_id: "c1".to_owned(),
        message_id: MessageId::from(format!("msg_of_{id}")),
        command: format!("sleep 60 # {id}"),
        pid: Some(4242),
        stdout_path: format!("/work/jobs/{id}.out"),
        stderr_path: format!("/work/jobs/{id}.err"),
        state: JobState::Running,
        exit_code: None,
        detail: None,
        started_at: at(started),
        finished_at: None,
    }
}

fn ids_of_followups(list: &[FollowUp]) -> Vec<&str> {
    list.iter().map(|f| f.id.as_str()).collect()
}

fn ids_of_jobs(list: &[Job]) -> Vec<&str> {
    list.iter().map(|j| j.id.as_str()).collect()
}

async fn get_followup(b: &Backend, id: &str) -> FollowUp {
    b.store.get_followup(&FollowUpId::from(id)).await.expect("get follow-up").expect("the follow-up exists")
}

async fn get_job(b: &Backend, id: &str) -> Job {
    b.store.get_job(&JobId::from(id)).await.expect("get job").expect("the job exists")
}

async fn followups_round_trip_every_field(b: &Backend) {
    // Every optional field set, times with nanoseconds (kept to the microsecond).
    let full = FollowUp {
        due_at: t0() + Span::nanoseconds(86_400_123_456_789),
        created_at: t0() + Span::nanoseconds(1_999),
        state: FollowUpState::Fired,
        settled_at: Some(t0() + Span::nanoseconds(86_400_500_000_001)),
        task: "check the build ✓ and report back\nline two".to_owned(),
        ..followup("fu_full", "sess_a", 0)
    };
    // Every optional field absent.
    let bare = FollowUp { created_by: None, ..followup("fu_bare", "sess_a", 60) };
    for f in [&full, &bare] {
        b.store.insert_followup(f).await.expect("insert follow-up");
    }
    let read = get_followup(b, "fu_full").await;
    assert_eq!(
        read,
        FollowUp {
            due_at: t0() + Span::microseconds(86_400_123_456),
            created_at: t0() + Span::microseconds(1),
            settled_at: Some(t0() + Span::microseconds(86_400_500_000)),
            ..full.clone()
        }
    );
    assert_eq!(get_followup(b, "fu_bare").await, bare);
    assert_eq!(b.store.get_followup(&FollowUpId::from("fu_never")).await.expect("get"), None);
}

async fn followups_are_listed_soonest_due_first_and_filtered(b: &Backend) {
    // Stored out of due order; fu_tie_b and fu_tie_a are due together (stored b first).
    let rows = [
        followup("fu_late", "sess_a", 300),
        followup("fu_tie_b", "sess_a", 100),
        followup("fu_early", "sess_b", 10),
        followup("fu_tie_a", "sess_b", 100),
        FollowUp { state: FollowUpState::Cancelled, settled_at: Some(at(5)), ..followup("fu_cancelled", "sess_a", 50) },
        FollowUp { state: FollowUpState::Fired, settled_at: Some(at(200)), ..followup("fu_fired", "sess_b", 200) },
    ];
    for f in &rows {
        b.store.insert_followup(f).await.expect("insert");
    }
    let list = |filter: FollowUpFilter| async move { b.store.list_followups(&filter).await.expect("list follow-ups") };

    let all = list(FollowUpFilter::default()).await;
    assert_eq!(ids_of_followups(&all), ["fu_early", "fu_cancelled", "fu_tie_b", "fu_tie_a", "fu_fired", "fu_late"]);
    assert_eq!(all[0], rows[2], "listed rows are whole");

    let pending = FollowUpFilter { state: Some(FollowUpState::Pending), ..Default::default() };
    assert_eq!(ids_of_followups(&list(pending.clone()).await), ["fu_early", "fu_tie_b", "fu_tie_a", "fu_late"]);
    // What the scheduler asks: pending and due by now (inclusive), soonest first.
    let due_now = FollowUpFilter { due_by: Some(at(100)), ..pending.clone() };
    assert_eq!(ids_of_followups(&list(due_now.clone()).await), ["fu_early", "fu_tie_b", "fu_tie_a"]);
    let due_earlier = FollowUpFilter { due_by: Some(at(100) - Span::microseconds(1)), ..pending.clone() };
    assert_eq!(ids_of_followups(&list(due_earlier).await), ["fu_early"]);
    assert_eq!(ids_of_followups(&list(FollowUpFilter { limit: Some(2), ..due_now }).await), ["fu_early", "fu_tie_b"]);

    let of_a = FollowUpFilter { session_id: Some(SessionId::from("sess_a")), ..Default::default() };
    assert_eq!(ids_of_followups(&list(of_a.clone()).await), ["fu_cancelled", "fu_tie_b", "fu_late"]);
    let pending_of_a = FollowUpFilter { state: Some(FollowUpState::Pending), ..of_a };
    assert_eq!(ids_of_followups(&list(pending_of_a).await), ["fu_tie_b", "fu_late"]);
    let fired = FollowUpFilter { state: Some(FollowUpState::Fired), ..Default::default() };
    assert_eq!(ids_of_followups(&list(fired).await), ["fu_fired"]);
    let nobody = FollowUpFilter { session_id: Some(SessionId::from("sess_none")), ..Default::default() };
    assert_eq!(list(nobody).await, []);
    assert_eq!(list(FollowUpFilter { limit: Some(0), ..Default::default() }).await, []);
}

async fn a_followup_is_settled_once(b: &Backend) {
    for f in [followup("fu_1", "sess_a", 10), followup("fu_2", "sess_a", 20)] {
        b.store.insert_followup(&f).await.expect("insert");
    }
    let id = FollowUpId::from("fu_1");
    let fired_at = at(10) + Span::nanoseconds(1_500);
    assert!(b.store.settle_followup(&id, FollowUpState::Fired, fired_at).await.expect("settle"), "pending: it settles");
    let settled = get_followup(b, "fu_1").await;
    assert_eq!(
        settled,
        FollowUp {
            state: FollowUpState::Fired,
            settled_at: Some(at(10) + Span::microseconds(1)),
            ..followup("fu_1", "sess_a", 10)
        }
    );
    // Settled already: false, and nothing changes (neither the state nor the time).
    for to in [FollowUpState::Fired, FollowUpState::Cancelled] {
        assert!(!b.store.settle_followup(&id, to, at(99)).await.expect("settle again"), "{to} after fired");
        assert_eq!(get_followup(b, "fu_1").await, settled);
    }

    // Cancelling works the same way.
    let other = FollowUpId::from("fu_2");
    assert!(b.store.settle_followup(&other, FollowUpState::Cancelled, at(15)).await.expect("cancel"));
    assert_eq!(get_followup(b, "fu_2").await.state, FollowUpState::Cancelled);
    assert!(!b.store.settle_followup(&other, FollowUpState::Fired, at(20)).await.expect("fire after cancel"));
    assert_eq!(get_followup(b, "fu_2").await.state, FollowUpState::Cancelled);

    let unknown = b.store.settle_followup(&FollowUpId::from("fu_never"), FollowUpState::Fired, at(1)).await;
    let Err(StoreError::NotFound { what: "follow-up", id }) = unknown else {
        panic!("expected not found: {unknown:?}")
    };
    assert_eq!(id, "fu_never");

    // Back to pending is refused, saying what to do, and changes nothing.
    b.store.insert_followup(&followup("fu_3", "sess_a", 30)).await.expect("insert");
    let error = b
        .store
        .settle_followup(&FollowUpId::from("fu_3"), FollowUpState::Pending, at(1))
        .await
        .expect_err("settling to pending");
    assert!(matches!(error, StoreError::IllegalChange { what: "follow-up", .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("fu_3") && text.contains("`fired` or `cancelled`"), "{text}");
    assert_eq!(get_followup(b, "fu_3").await, followup("fu_3", "sess_a", 30));
}

/// Callers that each start `RACERS` settles (or finishes) of one row at once, `ROWS` times.
const RACERS: usize = 8;
const ROWS: usize = 10;

async fn concurrent_settles_of_one_followup_let_exactly_one_win(b: &Backend) {
    for row in 0..ROWS {
        let id = FollowUpId::from(format!("fu_race_{row}"));
        b.store.insert_followup(&followup(id.as_str(), "sess_race", 0)).await.expect("insert");
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let mut racers = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let (store, barrier, id) = (Arc::clone(&b.store), Arc::clone(&barrier), id.clone());
            // Half fire it (the scheduler), half cancel it (the agent, the CLI).
            let to = if racer % 2 == 0 { FollowUpState::Fired } else { FollowUpState::Cancelled };
            let settled_at = at(i64::try_from(racer).expect("a small number"));
            racers.spawn(async move {
                barrier.wait().await;
                let won = store.settle_followup(&id, to, settled_at).await.expect("settle");
                (won, to, settled_at)
            });
        }
        let mut winners = Vec::new();
        while let Some(result) = racers.join_next().await {
            let (won, to, settled_at) = result.expect("racer task");
            if won {
                winners.push((to, settled_at));
            }
        }
        assert_eq!(winners.len(), 1, "{id}: exactly one settle wins, got {winners:?}");
        let (to, settled_at) = winners[0];
        let stored = get_followup(b, id.as_str()).await;
        assert_eq!((stored.state, stored.settled_at), (to, Some(settled_at)), "{id}: the winner's change is kept");
    }
}

async fn jobs_round_trip_every_field(b: &Backend) {
    let full = Job {
        pid: Some(i32::MAX),
        state: JobState::Exited,
        exit_code: Some(-1),
        detail: Some("killed by signal 9 (SIGKILL)".to_owned()),
        started_at: t0() + Span::nanoseconds(7_654_321),
        finished_at: Some(t0() + Span::nanoseconds(3_600_000_000_999)),
        command: "cargo test 2>&1 | tee 'out file.txt'".to_owned(),
        ..job("job_full", "sess_a", 0)
    };
    let bare = Job { pid: None, ..job("job_bare", "sess_a", 1) };
    for j in [&full, &bare] {
        b.store.insert_job(j).await.expect("insert job");
    }
    assert_eq!(
        get_job(b, "job_full").await,
        Job {
            started_at: t0() + Span::microseconds(7_654),
            finished_at: Some(t0() + Span::microseconds(3_600_000_000)),
            ..full.clone()
        }
    );
    assert_eq!(get_job(b, "job_bare").await, bare);
    assert_eq!(b.store.get_job(&JobId::from("job_never")).await.expect("get"), None);
}

async fn jobs_are_listed_newest_first_and_filtered(b: &Backend) {
    let ended = |j: Job, state: JobState| Job { state, finished_at: Some(at(500)), ..j };
    // Stored out of start order; job_tie_1 and job_tie_2 started together (stored 1 first).
    let rows = [
        job("job_mid", "sess_a", 20),
        job("job_old", "sess_b", 10),
        job("job_tie_1", "sess_a", 30),
        ended(job("job_tie_2", "sess_b", 30), JobState::Exited),
        ended(job("job_lost", "sess_a", 5), JobState::Lost),
        ended(job("job_new", "sess_a", 40), JobState::Cancelled),
    ];
    for j in &rows {
        b.store.insert_job(j).await.expect("insert");
    }
    let list = |filter: JobFilter| async move { b.store.list_jobs(&filter).await.expect("list jobs") };

    let all = list(JobFilter::default()).await;
    assert_eq!(ids_of_jobs(&all), ["job_new", "job_tie_2", "job_tie_1", "job_mid", "job_old", "job_lost"]);
    assert_eq!(all[1], rows[3], "listed rows are whole");

    // What recovery asks after a restart: the running ones.
    let running = JobFilter { state: Some(JobState::Running), ..Default::default() };
    assert_eq!(ids_of_jobs(&list(running.clone()).await), ["job_tie_1", "job_mid", "job_old"]);
    assert_eq!(ids_of_jobs(&list(JobFilter { limit: Some(1), ..running.clone() }).await), ["job_tie_1"]);
    let of_a = JobFilter { session_id: Some(SessionId::from("sess_a")), ..Default::default() };
    assert_eq!(ids_of_jobs(&list(of_a.clone()).await), ["job_new", "job_tie_1", "job_mid", "job_lost"]);
    let running_of_b = JobFilter { session_id: Some(SessionId::from("sess_b")), ..running };
    assert_eq!(ids_of_jobs(&list(running_of_b).await), ["job_old"]);
    for (state, expected) in [(JobState::Exited, "job_tie_2"), (JobState::Lost, "job_lost")] {
        assert_eq!(ids_of_jobs(&list(JobFilter { state: Some(state), ..Default::default() }).await), [expected]);
    }
    assert_eq!(ids_of_jobs(&list(JobFilter { limit: Some(2), ..of_a }).await), ["job_new", "job_tie_1"]);
    let nobody = JobFilter { session_id: Some(SessionId::from("sess_none")), ..Default::default() };
    assert_eq!(list(nobody).await, []);
}

async fn a_job_is_finished_once(b: &Backend) {
    for j in [job("job_1", "sess_a", 0), job("job_2", "sess_a", 1)] {
        b.store.insert_job(&j).await.expect("insert");
    }
    let id = JobId::from("job_1");
    let end = JobEnd {
        state: JobState::Exited,
        exit_code: Some(3),
        detail: None,
        finished_at: at(60) + Span::nanoseconds(2_500),
    };
    assert!(b.store.finish_job(&id, &end).await.expect("finish"), "running: it finishes");
    let finished = get_job(b, "job_1").await;
    assert_eq!(
        finished,
        Job {
            state: JobState::Exited,
            exit_code: Some(3),
            finished_at: Some(at(60) + Span::microseconds(2)),
            ..job("job_1", "sess_a", 0)
        }
    );
    // Its end is recorded already: false, and nothing changes.
    let later = JobEnd {
        state: JobState::Lost,
        exit_code: None,
        detail: Some("the process was gone after a restart".to_owned()),
        finished_at: at(999),
    };
    assert!(!b.store.finish_job(&id, &later).await.expect("finish again"));
    assert_eq!(get_job(b, "job_1").await, finished);

    // A cancelled job keeps its detail and no exit code.
    let cancelled = JobEnd {
        state: JobState::Cancelled,
        exit_code: None,
        detail: Some("cancelled by kesoku jobs cancel".to_owned()),
        finished_at: at(70),
    };
    assert!(b.store.finish_job(&JobId::from("job_2"), &cancelled).await.expect("cancel"));
    let stored = get_job(b, "job_2").await;
    assert_eq!(
        (stored.state, stored.exit_code, stored.detail.as_deref(), stored.finished_at),
        (JobState::Cancelled, None, Some("cancelled by kesoku jobs cancel"), Some(at(70)))
    );

    let unknown = b.store.finish_job(&JobId::from("job_never"), &end).await;
    let Err(StoreError::NotFound { what: "job", id }) = unknown else { panic!("expected not found: {unknown:?}") };
    assert_eq!(id, "job_never");

    // Finishing as running is refused, saying what to do, and changes nothing.
    b.store.insert_job(&job("job_3", "sess_a", 2)).await.expect("insert");
    let still_running = JobEnd { state: JobState::Running, ..end };
    let error = b.store.finish_job(&JobId::from("job_3"), &still_running).await.expect_err("finish as running");
    assert!(matches!(error, StoreError::IllegalChange { what: "job", .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("job_3") && text.contains("`exited`, `lost` or `cancelled`"), "{text}");
    assert_eq!(get_job(b, "job_3").await, job("job_3", "sess_a", 2));
}

async fn concurrent_finishes_of_one_job_let_exactly_one_win(b: &Backend) {
    for row in 0..ROWS {
        let id = JobId::from(format!("job_race_{row}"));
        b.store.insert_job(&job(id.as_str(), "sess_race", 0)).await.expect("insert");
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let mut racers = tokio::task::JoinSet::new();
        for racer in 0..RACERS {
            let (store, barrier, id) = (Arc::clone(&b.store), Arc::clone(&barrier), id.clone());
            // The watcher saw it exit, `cancel_job` stopped it, recovery found it gone.
            let state = [JobState::Exited, JobState::Cancelled, JobState::Lost][racer % 3];
            let end = JobEnd {
                state,
                exit_code: Some(i32::try_from(racer).expect("a small number")),
                detail: Some(format!("racer {racer}")),
                finished_at: at(i64::try_from(racer).expect("a small number")),
            };
            racers.spawn(async move {
                barrier.wait().await;
                let won = store.finish_job(&id, &end).await.expect("finish");
                (won, end)
            });
        }
        let mut winners = Vec::new();
        while let Some(result) = racers.join_next().await {
            let (won, end) = result.expect("racer task");
            if won {
                winners.push(end);
            }
        }
        assert_eq!(winners.len(), 1, "{id}: exactly one finish wins, got {winners:?}");
        let end = &winners[0];
        let stored = get_job(b, id.as_str()).await;
        assert_eq!(
            (stored.state, stored.exit_code, stored.detail.as_ref(), stored.finished_at),
            (end.state, end.exit_code, end.detail.as_ref(), Some(end.finished_at)),
            "{id}: the winner's end is kept"
        );
    }
}

async fn work_rows_refuse_duplicate_ids(b: &Backend) {
    let first = followup("fu_dup", "sess_a", 10);
    b.store.insert_followup(&first).await.expect("insert");
    let again = FollowUp { task: "another task".to_owned(), ..followup("fu_dup", "sess_b", 20) };
    let error = b.store.insert_followup(&again).await.expect_err("a repeated follow-up id");
    let StoreError::Duplicate { what: "follow-up", id } = &error else { panic!("expected a duplicate: {error:?}") };
    assert_eq!(id, "fu_dup");
    assert_eq!(get_followup(b, "fu_dup").await, first, "the first row is kept");
    let all = b.store.list_followups(&FollowUpFilter::default()).await.expect("list");
    assert_eq!(all.len(), 1);

    let first = job("job_dup", "sess_a", 0);
    b.store.insert_job(&first).await.expect("insert");
    let again = Job { command: "rm -rf /tmp/x".to_owned(), ..job("job_dup", "sess_b", 5) };
    let error = b.store.insert_job(&again).await.expect_err("a repeated job id");
    let StoreError::Duplicate { what: "job", id } = &error else { panic!("expected a duplicate: {error:?}") };
    assert_eq!(id, "job_dup");
    assert_eq!(get_job(b, "job_dup").await, first, "the first row is kept");
    assert_eq!(b.store.list_jobs(&JobFilter::default()).await.expect("list").len(), 1);
}

/// Follow-ups and jobs are not messages: readers following revisions see none of their changes.
async fn work_rows_take_no_message_revision(b: &Backend) {
    let store: &Arc<dyn Store> = &b.store;
    store.insert_message(&prompt("msg_before", "sess_a")).await.expect("insert a message");
    let rev = store.current_rev().await.expect("rev");
    assert!(rev > 0);
    store.insert_followup(&followup("fu_rev", "sess_a", 10)).await.expect("insert");
    assert!(store.settle_followup(&FollowUpId::from("fu_rev"), FollowUpState::Fired, at(10)).await.expect("settle"));
    store.insert_job(&job("job_rev", "sess_a", 0)).await.expect("insert");
    let end = JobEnd { state: JobState::Exited, exit_code: Some(0), detail: None, finished_at: at(1) };
    assert!(store.finish_job(&JobId::from("job_rev"), &end).await.expect("finish"));
    assert_eq!(store.current_rev().await.expect("rev"), rev);
    let after = store.insert_message(&prompt("msg_after", "sess_a")).await.expect("insert a message");
    assert_eq!(after.rev, rev + 1, "the next message takes the next revision");
}
