//! Several `kesoku start` processes on one PostgreSQL store and one Redis broker (issue #31's
//! Done-when): one `--role ingest` process with the HTTP API and two `--role worker` processes,
//! messages sent through the API, one worker SIGKILLed mid-run; then the store must show every
//! user message `processed` exactly once, no reply duplicated, no session running two turns at
//! once, and an interruption sent to the ingest process stopping a turn on a worker. Then a
//! worker is stopped by SIGTERM with a turn running: it exits cleanly, the turn is handed back
//! and a newly started worker takes it.
//!
//! Real servers only (`KESOKU_TEST_POSTGRES_URL`, `KESOKU_TEST_REDIS_URL`; skipped saying so
//! when unset, failing when `KESOKU_REQUIRE_SERVERS=1`), each run on its own schema and Redis
//! prefix. The size is `KESOKU_CLUSTER_MESSAGES` over `KESOKU_CLUSTER_SESSIONS` (default: the
//! issue's 1,000 over 200).

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use kesoku_core::{LedgerEntry, Message, MessageFilter, MessageId, MessageType, Outcome, Role, SessionId, Status};
use kesoku_store::{LedgerFilter, StoreHandle};
use kesoku_test_support::mock_llm::{Behaviour, MOCK_API_KEY, MockOptions, MockReply, MockRule, MockServer, Vendor};

use crate::support::{Service, Workspace, stderr};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);
/// How long the whole workload may take to settle before the test gives up.
const SETTLE: Duration = Duration::from_secs(90);
const SLOW: &str = "A slow question that gets interrupted";
const NEWER: &str = "Never mind, a newer question";

fn size(variable: &str, default: usize) -> usize {
    std::env::var(variable).ok().and_then(|value| value.trim().parse().ok()).unwrap_or(default)
}

/// The cluster's config: the mock model, the test schema, the test Redis prefix, the HTTP API
/// (served by the ingest process only), queue mode (every message is answered) except on the
/// `urgent` channel (interrupt mode), and short recovery times so a killed worker's work comes
/// back within the test.
fn cluster_config(model_url: &str, database: &str, redis: &str, prefix: &str) -> String {
    format!(
        r#"[workspace]
database = "{database}"

[agent]
model = "mock"
queue_mode = "queue"
max_concurrent_turns = 16
channel_queue_modes = {{ "api:urgent" = "interrupt" }}
orphan_after_s = 4
requeue_after_s = 10

[models.mock]
provider = "openai"
model = "mock-model"
base_url = "{model_url}"
api_key_env = "KESOKU_TEST_MOCK_KEY"

[broker]
url = "{redis}"
prefix = "{prefix}"
reclaim_after_s = 3

[service]
shutdown_grace_s = 2

[http]
listen = "127.0.0.1:0"
"#
    )
}

async fn wait_for<F, Fut>(what: &str, timeout: Duration, condition: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !condition().await {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Post one user message through the HTTP API; its id.
async fn send(client: &reqwest::Client, base: &str, channel: &str, content: &str) -> MessageId {
    let posted: serde_json::Value = client
        .post(format!("{base}/v1/messages"))
        .json(&serde_json::json!({"channel_id": channel, "sender": "tester", "content": content}))
        .send()
        .await
        .expect("post a message")
        .error_for_status()
        .expect("the API accepts it")
        .json()
        .await
        .expect("json");
    MessageId::from(posted["id"].as_str().expect("a message id"))
}

/// Send `range` of the workload, message `i` to session `i % sessions`, in order within each
/// session (one message per session at a time), sessions in parallel.
async fn send_range(
    client: &reqwest::Client,
    base: &str,
    range: std::ops::Range<usize>,
    sessions: usize,
) -> Vec<MessageId> {
    let mut ids = Vec::new();
    let indices: Vec<usize> = range.collect();
    for round in indices.chunks(sessions) {
        let sent: Vec<MessageId> = futures::stream::iter(round.iter().copied())
            .map(
                |i| async move { send(client, base, &format!("load-{}", i % sessions), &format!("message {i}")).await },
            )
            .buffered(32)
            .collect()
            .await;
        ids.extend(sent);
    }
    ids
}

/// Wait until a process (`/pid/` in its worker id) holds the claim of a message being
/// processed: true; false when `ids` were all processed first.
async fn holds_a_claim(store: &StoreHandle, ids: &[MessageId], pid_part: &str) -> bool {
    let deadline = std::time::Instant::now() + SETTLE;
    while std::time::Instant::now() < deadline {
        let processing = store
            .store
            .list_messages(&MessageFilter::status(Status::Processing).with_chatbot("api"))
            .await
            .expect("list processing messages");
        for message in processing {
            if let Ok(Some(claim)) = store.store.claim_of(&message.id).await
                && claim.claimed_by.contains(pid_part)
            {
                return true;
            }
        }
        if processed_count(store, ids).await == ids.len() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

async fn status_of(store: &StoreHandle, id: &MessageId) -> Status {
    store.store.get_message(id).await.expect("read a message").expect("the message exists").status
}

async fn processed_count(store: &StoreHandle, ids: &[MessageId]) -> usize {
    let processed = store
        .store
        .list_messages(&MessageFilter::status(Status::Processed).with_chatbot("api").with_roles(&[Role::User]))
        .await
        .expect("list processed messages");
    let processed: std::collections::HashSet<&MessageId> = processed.iter().map(|m| &m.id).collect();
    ids.iter().filter(|id| processed.contains(id)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_postgres_and_redis_run_every_message_once() {
    let Some(redis) = kesoku_test_support::db::redis_url() else { return };
    let Some(db) = kesoku_test_support::db::pg_schema().await else { return };
    let (messages, sessions) = (size("KESOKU_CLUSTER_MESSAGES", 1000), size("KESOKU_CLUSTER_SESSIONS", 200).max(1));
    let model = MockServer::start_with(
        Vendor::OpenAi,
        MockOptions {
            api_key: Some(MOCK_API_KEY.to_owned()),
            chunk_delay: Duration::ZERO,
            behaviour: Behaviour::Rules(vec![
                MockRule::new(
                    SLOW,
                    vec![MockReply::Delayed {
                        delay: Duration::from_secs(600),
                        reply: Box::new(MockReply::text("This answer comes too late.")),
                    }],
                ),
                // The newer message's turn may see both questions as one user turn: its own rule
                // matches later in that text than the slow one's.
                MockRule::new(NEWER, vec![MockReply::text("Here is the newer answer.")]),
                // Any number of model turns after the latest user text: a message whose turn is
                // re-run after a newer one of its session was answered sees that answer last.
                MockRule::new("", std::iter::repeat_n(MockReply::text("Noted."), 64).collect()),
            ]),
        },
    )
    .await;
    let prefix = format!("kesoku_test_{}", ulid::Ulid::generate());
    let workspace = Workspace::with_config(&cluster_config(&model.base_url(), db.url(), &redis, &prefix));
    let init = workspace.run(&["init"], &[KEY]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let store = kesoku_store::open(db.url()).await.expect("open the cluster's store");

    let ingest = Service::spawn_with(&workspace, "ingest.log", &[KEY], &["start", "--role", "ingest"]);
    let worker_a = Service::spawn_with(&workspace, "worker-a.log", &[KEY], &["start", "--role", "worker"]);
    let worker_b = Service::spawn_with(&workspace, "worker-b.log", &[KEY], &["start", "--role", "worker"]);
    let base = ingest.api_base().await;
    worker_a.wait_logged("kesoku service started").await;
    worker_b.wait_logged("kesoku service started").await;
    assert!(ingest.logged("kesoku service started").is_some_and(|line| line["fields"]["role"] == "ingest"));
    let client = reqwest::Client::new();

    // The first half, then worker B dies mid-turn (no shutdown path runs), then the second half.
    let mut ids = send_range(&client, &base, 0..messages / 2, sessions).await;
    let caught = holds_a_claim(&store, &ids, &format!("/{}/", worker_b.pid())).await;
    if !caught {
        eprintln!("note: worker B held no claim before the first half was done; it is killed between turns");
    }
    worker_b.kill().await;
    ids.extend(send_range(&client, &base, messages / 2..messages, sessions).await);
    let settled = tokio::time::timeout(SETTLE, async {
        while processed_count(&store, &ids).await < ids.len() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    if settled.is_err() {
        let mut statuses: HashMap<Status, usize> = HashMap::new();
        for id in &ids {
            *statuses.entry(status_of(&store, id).await).or_default() += 1;
        }
        let tail = |service: &Service| service.log().lines().rev().take(15).collect::<Vec<_>>().join("\n");
        panic!(
            "not every message was processed in time: {statuses:?}\ningest log tail:\n{}\nworker A log tail:\n{}",
            tail(&ingest),
            tail(&worker_a)
        );
    }

    // An interruption sent to the ingest process stops a turn running on the worker.
    let slow = send(&client, &base, "urgent", SLOW).await;
    wait_for("the slow turn to reach the model", Duration::from_secs(60), || async {
        status_of(&store, &slow).await == Status::Processing
            && model.requests().iter().any(|request| request.body.to_string().contains(SLOW))
    })
    .await;
    let newer = send(&client, &base, "urgent", NEWER).await;
    wait_for("the slow turn to be interrupted", Duration::from_secs(60), || async {
        status_of(&store, &slow).await == Status::Interrupted
    })
    .await;
    let processed = tokio::time::timeout(Duration::from_secs(60), async {
        while status_of(&store, &newer).await != Status::Processed {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    if processed.is_err() {
        let rows = store.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
        let mine: Vec<_> = rows
            .iter()
            .filter(|r| r.message_id.as_ref() == Some(&newer) || r.message_id.as_ref() == Some(&slow))
            .collect();
        let tail = |service: &Service| service.log().lines().rev().take(15).collect::<Vec<_>>().join("\n");
        panic!(
            "the newer message is {:?}; rows: {mine:?}\nworker A log tail:\n{}\ningest:\n{}",
            status_of(&store, &newer).await,
            tail(&worker_a),
            tail(&ingest)
        );
    }

    // SIGTERM drains a worker: a turn still running after the grace is handed back (its
    // message waits again), and another worker takes it.
    let drained = send(&client, &base, "drain", &format!("{SLOW} (drain)")).await;
    wait_for("the drained turn to reach the model", Duration::from_secs(60), || async {
        status_of(&store, &drained).await == Status::Processing
            && model.requests().iter().any(|request| request.body.to_string().contains("(drain)"))
    })
    .await;
    let (worker_status, worker_a) = worker_a.terminate().await;
    assert!(worker_status.success(), "the worker stops cleanly: {}", worker_a.log());
    assert_eq!(status_of(&store, &drained).await, Status::PendingAgent, "the unfinished turn was handed back");
    let worker_c = Service::spawn_with(&workspace, "worker-c.log", &[KEY], &["start", "--role", "worker"]);
    let worker_c_pid = format!("/{}/", worker_c.pid());
    wait_for("another worker to take the handed-back message", Duration::from_secs(60), || async {
        status_of(&store, &drained).await == Status::Processing
            && store.store.claim_of(&drained).await.ok().flatten().is_some_and(|c| c.claimed_by.contains(&worker_c_pid))
    })
    .await;

    // The rest drain on SIGTERM.
    let (ingest_status, ingest) = ingest.terminate().await;
    assert!(ingest_status.success(), "the ingest process stops cleanly: {}", ingest.log());
    let (worker_status, worker_c) = worker_c.terminate().await;
    assert!(worker_status.success(), "the worker stops cleanly: {}", worker_c.log());

    // Read everything back from the store.
    let rows = store.ledger.list_activations(&LedgerFilter::default()).await.expect("the ledger");
    let all = store.store.list_messages(&MessageFilter::default().with_chatbot("api")).await.expect("messages");
    let mut rows_of: HashMap<&MessageId, Vec<&LedgerEntry>> = HashMap::new();
    for row in &rows {
        if let Some(id) = &row.message_id {
            rows_of.entry(id).or_default().push(row);
        }
    }
    let mut answers_of: HashMap<&MessageId, usize> = HashMap::new();
    for message in &all {
        if message.role == Role::Assistant
            && message.message_type == MessageType::Text
            && let Some(parent) = &message.parent_id
        {
            *answers_of.entry(parent).or_default() += 1;
        }
    }
    let by_id: HashMap<&MessageId, &Message> = all.iter().map(|m| (&m.id, m)).collect();
    for id in &ids {
        assert_eq!(by_id.get(id).map(|m| m.status), Some(Status::Processed), "{id} ends processed");
        let succeeded =
            rows_of.get(id).map_or(0, |rows| rows.iter().filter(|r| r.outcome == Some(Outcome::Succeeded)).count());
        assert_eq!(answers_of.get(id).copied().unwrap_or(0), 1, "{id} got exactly one answer");
        // Also when worker B died after its turn resolved the message but before the ledger
        // heard the outcome: the redelivery of that activation writes `succeeded` on its row.
        assert_eq!(succeeded, 1, "{id} ran to success exactly once: {:?}", rows_of.get(id));
    }
    let slow_outcomes: Vec<Option<Outcome>> =
        rows_of.get(&slow).map_or_else(Vec::new, |rows| rows.iter().map(|r| r.outcome).collect());
    assert!(slow_outcomes.contains(&Some(Outcome::Interrupted)), "the slow turn ended interrupted: {slow_outcomes:?}");
    assert_eq!(answers_of.get(&slow).copied().unwrap_or(0), 0, "the interrupted turn never answered");
    assert_eq!(answers_of.get(&newer).copied().unwrap_or(0), 1, "the newer message was answered");

    // No session ever ran two turns at once: the turns that ran (an activation that found its
    // message already taken ran none) do not overlap, per session, by their ledger times.
    let mut turns: HashMap<&SessionId, Vec<&LedgerEntry>> = HashMap::new();
    for row in &rows {
        if matches!(row.outcome, Some(Outcome::Succeeded | Outcome::Interrupted | Outcome::Failed))
            && row.started_at.is_some()
        {
            turns.entry(&row.session_id).or_default().push(row);
        }
    }
    for (session, mut ran) in turns {
        ran.sort_by_key(|row| row.started_at);
        for pair in ran.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            assert!(
                earlier.finished_at <= later.started_at,
                "session {session} ran two turns at once: {} ({:?} → {:?}) and {} (from {:?})",
                earlier.id,
                earlier.started_at,
                earlier.finished_at,
                later.id,
                later.started_at
            );
        }
    }
    drop(store);
    db.cleanup().await;
}

#[tokio::test]
async fn a_split_role_without_a_shared_broker_is_refused_saying_why() {
    let workspace = Workspace::with_config(&crate::support::mock_model("http://127.0.0.1:9/v1"));
    let init = workspace.run(&["init"], &[KEY]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    for role in ["ingest", "worker"] {
        let output = workspace.run(&["start", "--role", role], &[KEY]).await;
        assert!(!output.status.success(), "--role {role} without [broker] url must not start");
        let err = stderr(&output);
        assert!(err.contains(&format!("`kesoku start --role {role}` needs a shared queue")), "{err}");
        assert!(err.contains("[broker] url"), "{err}");
    }
}

/// One message's place in a trajectory, without ids or times: what must match between runs.
type Step = (Role, MessageType, Status, String, String);

/// Every channel's trajectory (the channel's session in phased order), by channel.
async fn trajectories(store: &StoreHandle, channels: usize) -> HashMap<String, Vec<Step>> {
    let mut all = HashMap::new();
    for k in 0..channels {
        let channel = format!("load-{k}");
        let session = store.store.active_session("api", &channel).await.expect("read").expect("a session");
        let steps = store
            .store
            .session_history(&session)
            .await
            .expect("history")
            .into_iter()
            .map(|m| (m.role, m.message_type, m.status, m.sender, m.content))
            .collect();
        all.insert(channel, steps);
    }
    all
}

/// Run the workload (`messages` over `channels`, one message per session at a time) against
/// a started deployment whose API is at `base`; its trajectories once every message is done.
async fn run_workload(store: &StoreHandle, base: &str, messages: usize, channels: usize) -> HashMap<String, Vec<Step>> {
    let client = reqwest::Client::new();
    let ids = send_range(&client, base, 0..messages, channels).await;
    let settled = tokio::time::timeout(SETTLE, async {
        while processed_count(store, &ids).await < ids.len() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(settled.is_ok(), "not every message was processed in time");
    // Answers are delivered by the API chatbot after they are stored: wait for that too, so
    // both runs are compared at rest.
    wait_for("every answer to be delivered", SETTLE, || async {
        store
            .store
            .list_messages(&MessageFilter::status(Status::Pending).with_chatbot("api"))
            .await
            .is_ok_and(|pending| pending.is_empty())
    })
    .await;
    trajectories(store, channels).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_workload_in_one_process_on_sqlite_gives_the_same_trajectories() {
    let Some(redis) = kesoku_test_support::db::redis_url() else { return };
    let Some(db) = kesoku_test_support::db::pg_schema().await else { return };
    let (messages, channels) = (60, 12);
    let model = MockServer::start_with(
        Vendor::OpenAi,
        MockOptions {
            api_key: Some(MOCK_API_KEY.to_owned()),
            chunk_delay: Duration::ZERO,
            behaviour: Behaviour::Rules(vec![MockRule::new(
                "",
                // Both runs' turns (every reply is the same, whatever the order of the turns).
                std::iter::repeat_n(MockReply::text("Noted."), 4 * 60).collect(),
            )]),
        },
    )
    .await;

    // Three processes on PostgreSQL + Redis.
    let prefix = format!("kesoku_test_{}", ulid::Ulid::generate());
    let cluster = Workspace::with_config(&cluster_config(&model.base_url(), db.url(), &redis, &prefix));
    let init = cluster.run(&["init"], &[KEY]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let cluster_store = kesoku_store::open(db.url()).await.expect("open the cluster's store");
    let ingest = Service::spawn_with(&cluster, "ingest.log", &[KEY], &["start", "--role", "ingest"]);
    let worker_a = Service::spawn_with(&cluster, "worker-a.log", &[KEY], &["start", "--role", "worker"]);
    let worker_b = Service::spawn_with(&cluster, "worker-b.log", &[KEY], &["start", "--role", "worker"]);
    let base = ingest.api_base().await;
    worker_a.wait_logged("kesoku service started").await;
    worker_b.wait_logged("kesoku service started").await;
    let scaled_out = run_workload(&cluster_store, &base, messages, channels).await;
    for service in [ingest, worker_a, worker_b] {
        let (status, service) = service.terminate().await;
        assert!(status.success(), "a process stops cleanly: {}", service.log());
    }

    // The embedded default: one process, SQLite, the in-process broker and queue.
    let embedded_config = cluster_config(&model.base_url(), "sqlite://kesoku.db", &redis, &prefix)
        .split("[broker]")
        .next()
        .map(|head| format!("{head}[http]\nlisten = \"127.0.0.1:0\"\n"))
        .expect("the config has a head");
    let single = Workspace::with_config(&embedded_config);
    let init = single.run(&["init"], &[KEY]).await;
    assert!(init.status.success(), "init failed: {}", stderr(&init));
    let service = Service::spawn_with(&single, "service.log", &[KEY], &["start"]);
    let base = service.api_base().await;
    let url = format!("sqlite://{}", single.path().join("kesoku.db").display());
    let single_store = kesoku_store::open(&url).await.expect("open the embedded store");
    let embedded = run_workload(&single_store, &base, messages, channels).await;
    let (status, service) = service.terminate().await;
    assert!(status.success(), "the service stops cleanly: {}", service.log());

    assert_eq!(scaled_out.len(), channels);
    for (channel, steps) in &embedded {
        assert_eq!(steps.len(), 2 * messages / channels, "{channel}: a question and an answer per message");
        assert_eq!(scaled_out.get(channel), Some(steps), "{channel}: the trajectories differ");
    }
}
