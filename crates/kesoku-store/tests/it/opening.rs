//! Opening stores: by URL, migrating older schemas, and refusing what is not ours without
//! changing it.

use kesoku_core::{DeliveryRecord, LedgerEntry, MessageId, MessageType, Role, SessionId, Status};
use kesoku_store::{SCHEMA_VERSION, SqliteStore, StoreError};
use kesoku_test_support::db::temp_sqlite_path;

use crate::harness::{Place, message, prompt, t0};
use crate::place_tests;

place_tests!(
    a_foreign_database_is_refused_untouched,
    a_newer_schema_is_refused,
    an_older_schema_is_migrated_keeping_its_data,
    reopening_a_current_store_changes_nothing,
    open_existing_never_creates_a_store,
    open_by_url_gives_both_traits_over_one_backend,
    a_version_5_store_is_migrated_to_delivery_records,
    delivery_records_are_kept_across_opens,
);

/// Every schema version this build applies, in order.
const ALL_VERSIONS: [&str; 10] = ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10"];

async fn versions(place: &Place) -> Vec<String> {
    let mut versions = place.raw_strings("SELECT CAST(version AS TEXT) FROM kesoku_schema_version").await;
    // Numeric order (the helper's rows may come back sorted as text: "10" before "2").
    versions.sort_by_key(|v| v.parse::<i64>().unwrap_or(i64::MAX));
    versions
}

async fn a_foreign_database_is_refused_untouched(place: Place) {
    place
        .raw("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users (id, name) VALUES (1, 'ada');")
        .await;
    let journal_before = if place.is_sqlite() { place.raw_strings("PRAGMA journal_mode").await } else { vec![] };

    let error = place.open().await.err().expect("a database of another application is refused");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Foreign { .. }), "{error:?}");
    assert!(text.contains("another application") && text.contains("users"), "{text}");
    assert_eq!(place.tables().await, ["users"], "no kesoku table was created");
    assert_eq!(place.raw_strings("SELECT name FROM users").await, ["ada"]);
    if place.is_sqlite() {
        assert_eq!(place.raw_strings("PRAGMA journal_mode").await, journal_before, "journal mode untouched");
    }
    place.cleanup().await;
}

async fn a_newer_schema_is_refused(place: Place) {
    let opened = place.open().await.expect("create");
    opened.store().insert_message(&prompt("msg_kept", "s1")).await.expect("insert");
    opened.close().await;
    place
        .raw(
            "INSERT INTO kesoku_schema_version (version, description, applied_at) \
              VALUES (99, 'from the future', '2030-01-01T00:00:00.000000Z')",
        )
        .await;

    let error = place.open().await.err().expect("a newer schema is refused");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Foreign { .. }), "{error:?}");
    assert!(text.contains("99") && text.contains("newer") && text.contains("upgrade kesoku"), "{text}");
    assert_eq!(versions(&place).await, ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "99"]);
    assert_eq!(place.raw_strings("SELECT id FROM messages").await, ["msg_kept"]);
    place.cleanup().await;
}

async fn an_older_schema_is_migrated_keeping_its_data(place: Place) {
    // What a build that knew only schema version 1 left behind.
    let (v1, extra) = if place.is_sqlite() {
        (include_str!("../../migrations/sqlite/0001_messages_sessions.sql"), "")
    } else {
        (
            include_str!("../../migrations/postgres/0001_messages_sessions.sql"),
            "SELECT setval('kesoku_message_rev', 3);",
        )
    };
    place.raw(v1).await;
    place
        .raw(&format!(
            "INSERT INTO kesoku_schema_version (version, description, applied_at) \
             VALUES (1, 'messages and sessions', '2026-05-01T00:00:00.000000Z'); \
             INSERT INTO messages (id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, content, \
             status, metadata, step, created_at, updated_at, turn_id, phase, rev, created_rev) VALUES \
             ('msg_v1', 'sess_v1', NULL, 'cli', 'cli', 'User', 'user', 'text', 'written by v1', 'pending_agent', \
             '{{\"is_cronjob\": true}}', 0, '2026-05-01T00:00:00.000000Z', '2026-05-01T00:00:00.000000Z', \
             'msg_v1', 0, 1, 1), \
             ('msg_v1_next', 'sess_v1', NULL, 'cli', 'cli', 'User', 'user', 'text', 'a later turn', 'processed', \
             '{{}}', 0, '2026-05-01T00:00:01.000000Z', '2026-05-01T00:00:01.000000Z', 'msg_v1_next', 0, 2, 2), \
             ('msg_v1_answer', 'sess_v1', 'msg_v1', 'cli', 'cli', 'Kesoku', 'assistant', 'text', 'answer', \
             'processed', '{{}}', 1, '2026-05-01T00:00:02.000000Z', '2026-05-01T00:00:02.000000Z', 'msg_v1', 4, 3, 3); \
             INSERT INTO sessions (id, chatbot_id, channel_id, title, created_at, updated_at) VALUES \
             ('sess_v1', 'cli', 'cli', 'old', '2026-05-01T00:00:00.000000Z', '2026-05-01T00:00:00.000000Z'); \
             {extra}"
        ))
        .await;
    assert!(!place.tables().await.contains(&"activations".to_owned()));

    let opened = place.open().await.expect("an older schema is migrated");
    assert_eq!(versions(&place).await, ALL_VERSIONS);
    assert!(place.tables().await.contains(&"activations".to_owned()));
    let store = opened.store();
    let kept = store.get_message(&MessageId::from("msg_v1")).await.expect("get").expect("kept");
    assert_eq!(kept.content, "written by v1");
    assert_eq!(kept.metadata.is_cronjob, Some(true));
    assert_eq!(
        store.get_session(&SessionId::from("sess_v1")).await.expect("get").and_then(|s| s.title),
        Some("old".to_owned())
    );
    let event = store.insert_message(&prompt("msg_v2", "sess_v1")).await.expect("insert after migration");
    assert!(event.rev > 3);
    // The old rows keep their phased order (a late answer of the first turn before the second
    // turn), and new rows join it: an answer to the second old turn lands after it.
    let mut late =
        message("msg_v2_answer", "sess_v1", Some("msg_v1_next"), Role::Assistant, MessageType::Text, Status::Processed);
    late.step = 1;
    store.insert_message(&late).await.expect("insert an answer after migration");
    let order: Vec<String> = store
        .session_history(&SessionId::from("sess_v1"))
        .await
        .expect("history")
        .into_iter()
        .map(|m| m.id.as_str().to_owned())
        .collect();
    assert_eq!(order, ["msg_v1", "msg_v1_answer", "msg_v1_next", "msg_v2_answer", "msg_v2"]);
    let entry = ledger_entry("act_v2");
    opened.ledger().record_enqueued(&entry).await.expect("the new ledger works");
    assert_eq!(opened.ledger().get_activation(&entry.id).await.expect("get"), Some(entry));
    // So do the tables of the latest version.
    let tables = place.tables().await;
    for table in ["followups", "jobs", "chatbot_state", "grants"] {
        assert!(tables.contains(&table.to_owned()), "{table} missing from {tables:?}");
    }
    let followup = kesoku_core::FollowUp {
        id: "fu_v2".into(),
        session_id: "sess_v1".into(),
        chatbot_id: "cli".to_owned(),
        channel_id: "cli".to_owned(),
        task: "look again".to_owned(),
        due_at: t0(),
        created_at: t0(),
        created_by: Some("msg_v1".into()),
        state: kesoku_core::FollowUpState::Pending,
        settled_at: None,
    };
    store.insert_followup(&followup).await.expect("a follow-up after migration");
    assert_eq!(store.get_followup(&followup.id).await.expect("get"), Some(followup));
    opened.close().await;
    place.cleanup().await;
}

async fn reopening_a_current_store_changes_nothing(place: Place) {
    let opened = place.open().await.expect("create");
    let event = opened.store().insert_message(&prompt("msg_a", "s1")).await.expect("insert");
    opened.store().resolve_session("cli", "cli").await.expect("session");
    opened.ledger().record_enqueued(&ledger_entry("act_a")).await.expect("ledger");
    opened.close().await;
    let tables = place.tables().await;

    let reopened = place.open().await.expect("reopen");
    assert_eq!(versions(&place).await, ALL_VERSIONS);
    assert_eq!(place.tables().await, tables);
    assert_eq!(reopened.store().get_message(&event.message.id).await.expect("get"), Some(event.message));
    assert!(reopened.store().active_session("cli", "cli").await.expect("active").is_some());
    assert!(reopened.ledger().get_activation(&"act_a".into()).await.expect("get").is_some());
    assert_eq!(reopened.store().current_rev().await.expect("rev"), event.rev);
    reopened.close().await;
    place.cleanup().await;
}

async fn open_existing_never_creates_a_store(place: Place) {
    let error = kesoku_store::open_existing(&place.url()).await.expect_err("nothing there yet");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Missing { .. }), "{error:?}");
    assert!(text.contains("does not exist") && text.contains("kesoku init"), "{text}");
    match &place {
        Place::Sqlite { path, .. } => {
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(!path.exists(), "no file was created");
        }
        Place::Postgres(_) => assert!(place.tables().await.is_empty(), "no table was created"),
    }
    let created = kesoku_store::open(&place.url()).await.expect("open creates");
    created.store.insert_message(&prompt("msg_a", "s1")).await.expect("insert");
    let existing = kesoku_store::open_existing(&place.url()).await.expect("now it exists");
    assert!(existing.store.get_message(&MessageId::from("msg_a")).await.expect("get").is_some());
    drop((created, existing));
    place.cleanup().await;
}

async fn open_by_url_gives_both_traits_over_one_backend(place: Place) {
    let handle = kesoku_store::open(&place.url()).await.expect("open by url");
    handle.store.insert_message(&prompt("msg_a", "s1")).await.expect("insert");
    handle.ledger.record_enqueued(&ledger_entry("act_a")).await.expect("ledger");
    let opened = place.open().await.expect("open directly");
    assert!(opened.store().get_message(&MessageId::from("msg_a")).await.expect("get").is_some());
    assert!(opened.ledger().get_activation(&"act_a".into()).await.expect("get").is_some());
    opened.close().await;
    drop(handle);
    place.cleanup().await;
}

/// What a build that knew schema version 5 left behind: the migrations of that build, a
/// message and the finished activation of its turn.
async fn a_version_5_store_is_migrated_to_delivery_records(place: Place) {
    let (steps, extra) = if place.is_sqlite() {
        (
            [
                include_str!("../../migrations/sqlite/0001_messages_sessions.sql"),
                include_str!("../../migrations/sqlite/0002_activations.sql"),
                include_str!("../../migrations/sqlite/0003_phased_order.sql"),
                include_str!("../../migrations/sqlite/0004_open_work_index.sql"),
                include_str!("../../migrations/sqlite/0005_phased_index.sql"),
            ],
            "",
        )
    } else {
        (
            [
                include_str!("../../migrations/postgres/0001_messages_sessions.sql"),
                include_str!("../../migrations/postgres/0002_activations.sql"),
                include_str!("../../migrations/postgres/0003_phased_order.sql"),
                include_str!("../../migrations/postgres/0004_open_work_index.sql"),
                include_str!("../../migrations/postgres/0005_phased_index.sql"),
            ],
            "SELECT setval('kesoku_message_rev', 1);",
        )
    };
    for step in steps {
        place.raw(step).await;
    }
    place
        .raw(&format!(
            "INSERT INTO kesoku_schema_version (version, description, applied_at) VALUES \
             (1, 'messages and sessions', '2026-05-01T00:00:00.000000Z'), \
             (2, 'activations ledger', '2026-05-01T00:00:00.000000Z'), \
             (3, 'phased order index', '2026-05-01T00:00:00.000000Z'), \
             (4, 'open work index', '2026-05-01T00:00:00.000000Z'), \
             (5, 'phased order index (postgresql)', '2026-05-01T00:00:00.000000Z'); \
             INSERT INTO messages (id, session_id, parent_id, chatbot_id, channel_id, sender, role, type, content, \
             status, metadata, step, created_at, updated_at, turn_id, turn_seq, phase, rev, created_rev) VALUES \
             ('msg_v5', 'sess_v5', NULL, 'discord', 'c1', 'User', 'user', 'text', 'written by v5', 'processed', \
             '{{}}', 0, '2026-05-01T00:00:00.000000Z', '2026-05-01T00:00:00.000000Z', 'msg_v5', 1, 0, 1, 1); \
             INSERT INTO activations (id, kind, lane, session_id, message_id, triggered_by, depth, enqueued_at, \
             started_at, finished_at, outcome, error) VALUES \
             ('act_v5', 'message', 'interactive', 'sess_v5', 'msg_v5', 'User', 0, '2026-05-01T00:00:00.000000Z', \
             '2026-05-01T00:00:01.000000Z', '2026-05-01T00:00:02.000000Z', 'succeeded', NULL); \
             {extra}"
        ))
        .await;
    assert!(!place.tables().await.contains(&"deliveries".to_owned()));

    let opened = place.open().await.expect("a version 5 store is migrated");
    assert_eq!(versions(&place).await, ALL_VERSIONS);
    assert!(place.tables().await.contains(&"deliveries".to_owned()));
    let (store, ledger) = (opened.store(), opened.ledger());
    let kept = store.get_message(&MessageId::from("msg_v5")).await.expect("get").expect("kept");
    assert_eq!(kept.content, "written by v5");
    let root = MessageId::from("msg_v5");
    assert_eq!(store.delivery_records(&root).await.expect("records"), []);
    let sent =
        DeliveryRecord { message_id: root.clone(), part: 0, platform_message_id: "p0".to_owned(), recorded_at: t0() };
    store.record_delivery(&sent).await.expect("record after migration");
    assert_eq!(store.delivery_records(&root).await.expect("records"), [sent]);
    ledger.record_delivery_failure(&root, "part 1 refused").await.expect("note on an old row");
    let row = ledger.get_activation(&"act_v5".into()).await.expect("get").expect("the old row");
    assert_eq!(row.error.as_deref(), Some("delivery failed: part 1 refused"));
    assert_eq!(row.outcome, Some(kesoku_core::Outcome::Succeeded));
    opened.close().await;
    place.cleanup().await;
}

/// Records written by one open are there at the next; the second open applies no migration.
async fn delivery_records_are_kept_across_opens(place: Place) {
    let opened = place.open().await.expect("create");
    let records: Vec<DeliveryRecord> = (0..3)
        .map(|part| DeliveryRecord {
            message_id: MessageId::from("msg_sent"),
            part,
            platform_message_id: format!("platform_{part}"),
            recorded_at: t0(),
        })
        .collect();
    for record in records.iter().rev() {
        opened.store().record_delivery(record).await.expect("record");
    }
    opened.close().await;
    let applied_at =
        place.raw_strings("SELECT CAST(applied_at AS TEXT) FROM kesoku_schema_version ORDER BY version").await;

    let reopened = place.open().await.expect("reopen");
    assert_eq!(versions(&place).await, ALL_VERSIONS, "each version applied once");
    assert_eq!(
        place.raw_strings("SELECT CAST(applied_at AS TEXT) FROM kesoku_schema_version ORDER BY version").await,
        applied_at,
        "no version applied again"
    );
    assert_eq!(reopened.store().delivery_records(&MessageId::from("msg_sent")).await.expect("records"), records);
    let again = DeliveryRecord { platform_message_id: "late".to_owned(), ..records[0].clone() };
    reopened.store().record_delivery(&again).await.expect("a repeated part after reopening");
    assert_eq!(reopened.store().delivery_records(&MessageId::from("msg_sent")).await.expect("records"), records);
    reopened.close().await;
    place.cleanup().await;
}

fn ledger_entry(id: &str) -> LedgerEntry {
    LedgerEntry {
        id: id.into(),
        kind: kesoku_core::ActivationKind::Message,
        lane: kesoku_core::Lane::Interactive,
        session_id: "s1".into(),
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
    }
}

#[tokio::test]
async fn a_file_that_is_not_sqlite_is_refused_untouched() {
    let (dir, _) = temp_sqlite_path();
    let path = dir.path().join("notes.txt");
    let content = "these are my notes, not a database\n".repeat(200);
    std::fs::write(&path, &content).expect("write text file");

    for result in [
        SqliteStore::open(&path).await.map(|_| ()),
        SqliteStore::open_existing(&path).await.map(|_| ()),
        kesoku_store::open(&format!("sqlite://{}", path.display())).await.map(|_| ()),
    ] {
        let error = result.expect_err("a text file is not a store");
        let text = error.to_string();
        assert!(matches!(error, StoreError::Foreign { .. }), "{error:?}");
        assert!(text.contains(&path.display().to_string()) && text.contains("not a SQLite database"), "{text}");
    }
    assert_eq!(std::fs::read_to_string(&path).expect("read back"), content, "the file is unchanged");
    let names: Vec<_> =
        std::fs::read_dir(dir.path()).expect("list").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(names, ["notes.txt"], "no journal or WAL file was left beside it");
}

#[tokio::test]
async fn open_existing_refuses_an_empty_file_and_leaves_it_empty() {
    let (_dir, path) = temp_sqlite_path();
    std::fs::write(&path, b"").expect("create an empty file");
    let error = SqliteStore::open_existing(&path).await.expect_err("an empty file holds no store");
    assert!(matches!(error, StoreError::Missing { .. }), "{error:?}");
    assert!(error.to_string().contains("kesoku init"), "{error}");
    assert_eq!(std::fs::metadata(&path).expect("still there").len(), 0, "nothing was written");
}

#[tokio::test]
async fn a_directory_is_not_a_store() {
    let (dir, _) = temp_sqlite_path();
    let error = SqliteStore::open(dir.path()).await.expect_err("a directory is not a store");
    assert!(matches!(error, StoreError::Foreign { .. }), "{error:?}");
    assert!(error.to_string().contains(&dir.path().display().to_string()), "{error}");
}

#[tokio::test]
async fn urls_choose_the_backend_and_bad_ones_say_why() {
    let memory = kesoku_store::open("sqlite::memory:").await.expect("in-memory store");
    memory.store.insert_message(&prompt("msg_m", "s1")).await.expect("insert");
    memory.ledger.record_enqueued(&ledger_entry("act_m")).await.expect("ledger on the same database");
    assert!(memory.store.get_message(&MessageId::from("msg_m")).await.expect("get").is_some());
    assert_eq!(memory.ledger.list_activations(&Default::default()).await.expect("list").len(), 1);

    for url in ["mysql://root@localhost/db", "redis://localhost", "sqlite://", "postgres://u:hunter2@host:notaport/db"]
    {
        let error = kesoku_store::open(url).await.expect_err("a bad url is refused");
        let text = error.to_string();
        assert!(matches!(error, StoreError::BadUrl { .. }), "{url}: {error:?}");
        assert!(!text.contains("hunter2"), "the password is not repeated: {text}");
        assert!(text.contains("sqlite://") && text.contains("postgres://"), "the text says what is accepted: {text}");
    }
}

#[tokio::test]
async fn schema_version_is_the_last_migration() {
    let (dir, path) = temp_sqlite_path();
    let store = SqliteStore::open(&path).await.expect("create");
    store.close().await;
    let place = Place::Sqlite { _dir: dir, path };
    assert_eq!(versions(&place).await.last().cloned(), Some(SCHEMA_VERSION.to_string()));
    assert_eq!(place.raw_strings("PRAGMA journal_mode").await, ["wal"]);
}

/// Poll `done` (every 20 ms, up to 10 s) for what the background checkpoint thread does;
/// `failure` says what stayed as it was.
async fn wait_for(done: impl Fn() -> bool, failure: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{}", failure());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Checkpoints run beside the writer, not inside a commit: the log is copied back into the
/// database file while the store stays open and idle, even for fewer pages than SQLite's
/// automatic threshold (1,000), which the store turns off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_checkpointed_in_the_background() {
    use kesoku_store::Store;

    let (_dir, path) = temp_sqlite_path();
    let store = SqliteStore::open(&path).await.expect("create");
    let size = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let before = size();
    let mut batch = Vec::new();
    for index in 0..200 {
        let mut message = prompt(&format!("msg_{index:04}"), "sess_checkpoint");
        message.content = "x".repeat(2_000);
        batch.push(message);
    }
    store.insert_messages(&batch).await.expect("write about 100 pages");
    wait_for(
        || size() > before + 200 * 1_000,
        || format!("the database file stayed at {} bytes (was {before}): nothing was checkpointed", size()),
    )
    .await;
    // Still open and usable; the history reads what was written.
    let history = store.session_history(&SessionId::from("sess_checkpoint")).await.expect("history");
    assert_eq!(history.len(), 200);
    store.close().await;
}

/// A checkpoint is due once per round of writes, not once per store: writes made after a
/// checkpoint are checkpointed by the next one (the thread is woken again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_after_a_checkpoint_are_checkpointed_by_the_next_one() {
    use kesoku_store::Store;

    let (_dir, path) = temp_sqlite_path();
    let store = SqliteStore::open(&path).await.expect("create");
    let size = || std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let mut grown_past = size();
    for round in 0..3 {
        let batch: Vec<_> = (0..100)
            .map(|index| {
                let mut message = prompt(&format!("msg_{round}_{index:03}"), "sess_rounds");
                message.content = "z".repeat(2_000);
                message
            })
            .collect();
        store.insert_messages(&batch).await.expect("write about 50 pages");
        wait_for(
            || size() > grown_past + 100 * 1_000,
            || {
                format!(
                    "round {round}: the database file stayed at {} bytes (was {grown_past}): nothing was checkpointed",
                    size()
                )
            },
        )
        .await;
        grown_past = size();
    }
    let history = store.session_history(&SessionId::from("sess_rounds")).await.expect("history");
    assert_eq!(history.len(), 300);
    store.close().await;
}

/// After a quiet moment the background checkpoint has moved the whole log into the database
/// file; starting the log over (which syncs its new header) is then done by the checkpoint
/// thread, not by the next write: the write after the pause appends to a log already started
/// over (its header, with the salts SQLite changes at every restart, stays as it was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_started_over_by_the_checkpoint_thread_not_by_the_next_write() {
    use kesoku_store::Store;

    let (_dir, path) = temp_sqlite_path();
    let store = SqliteStore::open(&path).await.expect("create");
    let wal = path.with_extension("db-wal");
    // Bytes 12..24 of the log's header: the checkpoint sequence and the two salts.
    let header = || std::fs::read(&wal).ok().and_then(|bytes| bytes.get(12..24).map(<[u8]>::to_vec));
    store.insert_message(&prompt("msg_before_pause", "sess_restart")).await.expect("a first write");
    let written = header().expect("the write left a log with a header");
    wait_for(
        || header().as_ref() != Some(&written),
        || format!("the log was not started over within 10 s of the write: its header is still {written:?}"),
    )
    .await;
    let restarted = header().expect("a log header after the restart");
    store.insert_message(&prompt("msg_after_pause", "sess_restart")).await.expect("the write after the pause");
    assert_eq!(header(), Some(restarted), "the write after the pause started the log over itself");
    let history = store.session_history(&SessionId::from("sess_restart")).await.expect("history");
    let ids: Vec<&str> = history.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["msg_before_pause", "msg_after_pause"]);
    store.close().await;
}

/// A burst grows the write-ahead log; once checkpointed, the next write starts the log over and
/// cuts the file back to the limit instead of keeping the burst's size on disk for good.
#[tokio::test]
async fn a_log_grown_by_a_burst_is_cut_back_after_a_checkpoint() {
    use kesoku_store::Store;

    let (_dir, path) = temp_sqlite_path();
    let store = SqliteStore::open(&path).await.expect("create");
    let wal = path.with_extension("db-wal");
    let wal_size = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    // About 24 MB in one transaction: the log must hold it all until the commit.
    let batch: Vec<_> = (0..240)
        .map(|index| {
            let mut message = prompt(&format!("burst_{index:04}"), "sess_burst");
            message.content = "y".repeat(100_000);
            message
        })
        .collect();
    store.insert_messages(&batch).await.expect("the burst");
    let grown = wal_size();
    assert!(grown > 20_000_000, "the burst left a log of {grown} bytes at {}", wal.display());
    // Small writes until the background checkpoint has caught up and a write restarted the log.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut index = 0;
    while wal_size() > 16 * 1024 * 1024 {
        assert!(
            std::time::Instant::now() < deadline,
            "the log stayed at {} bytes after the burst (limit 16 MiB)",
            wal_size()
        );
        store.insert_message(&prompt(&format!("after_{index:04}"), "sess_burst")).await.expect("a small write");
        index += 1;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let history = store.session_history(&SessionId::from("sess_burst")).await.expect("history");
    assert_eq!(history.len(), 240 + index);
    store.close().await;
}

/// A command's store (one connection, its reads behind its writes) on the same file as the
/// service's: each sees the other's writes and claims, and a claim the one holds the other
/// cannot take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_store_shares_the_file_with_the_service() {
    use kesoku_core::{MessageFilter, Status};
    use kesoku_store::{Footprint, Store};

    let (_dir, path) = temp_sqlite_path();
    let service = SqliteStore::open(&path).await.expect("create");
    let url = format!("sqlite://{}", path.display());
    let command = kesoku_store::open_existing_with(&url, Footprint::Command).await.expect("the command's store");
    let session = SessionId::from("sess_both");

    let rev = service.current_rev().await.expect("rev");
    command.store.insert_messages(&[prompt("msg_from_command", "sess_both")]).await.expect("the command writes");
    service.insert_messages(&[prompt("msg_from_service", "sess_both")]).await.expect("the service writes");

    let seen_by_command: Vec<String> = command
        .store
        .session_history(&session)
        .await
        .expect("the command reads")
        .into_iter()
        .map(|message| message.id.to_string())
        .collect();
    assert_eq!(seen_by_command, ["msg_from_command", "msg_from_service"]);
    let changes = service.changes_since(rev, &MessageFilter::default(), 10).await.expect("changes");
    assert_eq!(changes.len(), 2, "the service's change feed holds the command's write: {changes:?}");

    let id = MessageId::from("msg_from_service");
    let won =
        command.store.claim(&id, Status::Processing, &[Status::PendingAgent], "command-worker").await.expect("claim");
    assert!(won.is_some(), "the command claims the service's message");
    let lost =
        service.claim(&id, Status::Processing, &[Status::PendingAgent], "service-worker").await.expect("claim again");
    assert!(lost.is_none(), "a claim held through the command's store is not taken twice");
    let claim = service.claim_of(&id).await.expect("claim_of").expect("claimed");
    assert_eq!(claim.claimed_by, "command-worker");

    // A command's store opens only what exists.
    let missing = format!("sqlite://{}", path.with_file_name("absent.db").display());
    let error = kesoku_store::open_existing_with(&missing, Footprint::Command).await.expect_err("no such store");
    assert!(matches!(error, StoreError::Missing { .. }), "{error:?}");
    service.close().await;
}

/// A pooled PostgreSQL connection the server ended while it sat idle (a restart, an idle
/// timeout, a proxy) is pinged, found dead and replaced before a store call gets it. (Only
/// connections idle for `PING_WHEN_IDLE` are pinged; sqlx's default pings before every call.)
#[tokio::test]
async fn a_postgres_connection_ended_while_idle_is_replaced_before_use() {
    use sqlx::Connection;
    let Some(db) = kesoku_test_support::db::pg_schema().await else { return };
    let app = format!("kesoku-idle-{}", db.schema());
    let url = format!("{}&application_name={app}", db.url());
    let handle = kesoku_store::open(&url).await.expect("open");
    handle.store.current_rev().await.expect("a first call leaves a connection in the pool");

    let admin_url = std::env::var(kesoku_test_support::db::POSTGRES_URL_VAR).expect("set when a schema was made");
    let mut admin = sqlx::PgConnection::connect(&admin_url).await.expect("admin connection");
    let ended: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&app)
            .fetch_all(&mut admin)
            .await
            .expect("end the store's connections");
    assert!(!ended.is_empty() && ended.iter().all(|ended| *ended), "the store's connections were ended: {ended:?}");
    admin.close().await.expect("close");

    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    handle.store.current_rev().await.expect("the dead connection is replaced, not handed out");
    drop(handle);
    db.cleanup().await;
}
