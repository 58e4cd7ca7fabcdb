//! Crash loop: the real service (`kesoku start`) is killed with SIGKILL 50 times at random
//! points of scripted three-tool turns and restarted; at the end every user message is
//! `processed` (or `error` with a notification), every tool call has a result, and no answer
//! was given twice.
//!
//! Messages are written straight into the service's SQLite store by this test (as `kesoku chat`
//! does next to a running service); the service picks them up at start (and through its store
//! watch). The model is the policy server: a turn makes three `run_shell_command` calls, one
//! per step, then answers, whatever earlier runs of the turn left behind. A second loop does
//! the same with `read_file`, a tool that takes almost no time, so that the kills land between
//! a call's write, the tool and its result's write rather than inside a tool.

use std::time::Duration;

use kesoku_bench::mock::{HttpPolicy, PolicyServer};
use kesoku_core::{Message, MessageType, Outcome, Session, Status};
use kesoku_store::{LedgerFilter, StoreHandle};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::support::{KEY_VAR, Workspace, answers_of, has_error_notification, wait_all_terminal};

const KILLS: usize = 50;
/// Kills land uniformly in this window after the process starts (start-up and recovery
/// included; a debug build's turn of three tools takes a few hundred milliseconds).
const KILL_WINDOW_MS: u64 = 700;

async fn post_in_new_session(store: &StoreHandle, round: usize) -> Message {
    let session = Session::new("cli", &format!("crash-{round}"), chrono::Utc::now());
    store.store.create_session(&session).await.expect("session");
    let message = Message::user_text(&session.id, "cli", &session.channel_id, "User", format!("task {round}"));
    store.store.insert_message(&message).await.expect("post").message
}

/// Read the child's stderr until a line contains `needle`, then keep draining it.
async fn wait_for_log(child: &mut tokio::process::Child, needle: &str) {
    use tokio::io::AsyncBufReadExt;
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let found = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains(needle) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "the service never logged `{needle}`");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_kills_at_random_points_lose_nothing() {
    let policy = HttpPolicy {
        calls: 3,
        tool: "run_shell_command".to_owned(),
        arguments: json!({"command": "sleep 0.03; echo step"}),
        latency: Duration::from_millis(10),
    };
    crash_loop(policy, KILLS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_in_quick_tool_steps_lose_nothing_and_answer_each_call_once() {
    // Slower model answers than above: a `read_file` step takes no time of its own, and the
    // kills must land inside turns.
    let policy = HttpPolicy {
        calls: 3,
        tool: "read_file".to_owned(),
        arguments: json!({"path": "notes.txt"}),
        latency: Duration::from_millis(60),
    };
    crash_loop(policy, KILLS / 2).await;
}

/// `kills` rounds of: post a message in a new session, start the service, SIGKILL it at a
/// random point (the model answering by `policy`); then one clean run answers everything, and
/// nothing may be lost or doubled.
async fn crash_loop(policy: HttpPolicy, kills: usize) {
    let tool = policy.tool.clone();
    let model = PolicyServer::start(policy);
    let workspace = Workspace::new(&model.base_url(), "");
    workspace.init().await;
    std::fs::write(workspace.path().join(".kesoku").join("notes.txt"), "a note to read\n").expect("write notes.txt");
    let store = workspace.store().await;
    let env = [(KEY_VAR, "test-key")];

    for round in 0..kills {
        post_in_new_session(&store, round).await;
        let mut child = workspace
            .command(&["start"], &env)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start the service");
        // Every other round the kill lands anywhere from the spawn on (start-up and recovery
        // included); the others wait for this round's first model request, so the kill lands
        // inside a turn however long a loaded machine takes to start the service.
        let window = if round % 2 == 1 {
            let before = model.requests();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while model.requests() == before && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            KILL_WINDOW_MS / 4
        } else {
            KILL_WINDOW_MS
        };
        let wait = rand::random_range(0..window);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        child.start_kill().expect("SIGKILL the service");
        let status = child.wait().await.expect("reap the service");
        assert!(!status.success(), "round {round}: the service was killed, not stopped");
    }

    // The last start runs without a kill until everything is answered, then stops cleanly.
    let mut child = workspace
        .command(&["-v", "start"], &env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the service");
    wait_for_log(&mut child, "recovery done").await;
    let roots = wait_all_terminal(&store, Duration::from_secs(120)).await;
    let pid = Pid::from_raw(i32::try_from(child.id().expect("running")).expect("pid fits"));
    kill(pid, Signal::SIGTERM).expect("SIGTERM the service");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.expect("stops").expect("reap");
    assert!(status.success(), "a clean stop exits 0: {status}");

    assert_eq!(roots.len(), kills, "every posted message is stored");
    let mut interrupted_by_kills = 0;
    for root in &roots {
        let history = store.store.session_history(&root.session_id).await.expect("history");
        let answers = answers_of(&history, root);
        match root.status {
            Status::Processed => assert_eq!(
                answers.len(),
                1,
                "{} is processed and has exactly one answer: {:?}",
                root.id,
                answers.iter().map(|m| &m.content).collect::<Vec<_>>()
            ),
            Status::Error => {
                assert!(has_error_notification(&history, root), "{} failed without telling the user", root.id);
                assert!(answers.len() <= 1, "{} was answered twice", root.id);
            }
            other @ (Status::PendingAgent
            | Status::Processing
            | Status::Interrupted
            | Status::Pending
            | Status::Delivered
            | Status::Responded) => panic!("{} ended {other}; expected processed or error", root.id),
        }
        interrupted_by_kills += history
            .iter()
            .filter(|m| m.message_type == MessageType::ToolResult && m.content.contains("service restarted"))
            .count();
        for call in history.iter().filter(|m| m.message_type == MessageType::ToolCall) {
            let results = history
                .iter()
                .filter(|m| m.message_type == MessageType::ToolResult && m.parent_id.as_ref() == Some(&call.id))
                .count();
            assert_eq!(results, 1, "tool call {} has {results} results", call.id);
        }
    }
    let orphans = store.store.orphaned_tool_calls(None).await.expect("orphans");
    assert!(orphans.is_empty(), "tool calls without a result: {:?}", orphans.iter().map(|m| &m.id).collect::<Vec<_>>());
    let ledger = store.ledger.list_activations(&LedgerFilter::default()).await.expect("ledger");
    assert!(store.ledger.unfinished_activations().await.expect("unfinished").is_empty(), "every ledger row is closed");
    let cancelled = ledger.iter().filter(|row| row.outcome == Some(Outcome::Cancelled)).count();
    // The kills must have hit running turns, or this test proved nothing.
    assert!(
        cancelled + interrupted_by_kills >= 5,
        "only {cancelled} cancelled activations and {interrupted_by_kills} interrupted tool calls: the kills missed"
    );
    println!(
        "crash loop ({}): {kills} kills, {} messages, {cancelled} activations cancelled by kills, \
         {interrupted_by_kills} tool calls cut by kills, {} model requests",
        tool,
        roots.len(),
        model.requests()
    );
}

/// The narrow window the loop above hits only now and then, made certain: a process died after
/// posting a turn's final answer and before marking the message `processed`. The restarted
/// agent resolves the message without asking the model again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_answered_just_before_a_crash_is_not_answered_twice() {
    use std::sync::Arc;

    use kesoku_bench::models::{ModelClock, Policy, PolicyModel, TimedModel};
    use kesoku_bench::system::{AgentSetup, Backend, StoreSetup, System};
    use kesoku_core::TurnOrigin;

    let setup = StoreSetup::open(&Backend::Sqlite).await.expect("store");
    let store = setup.handle.clone();
    let session = Session::new("cli", "cli", chrono::Utc::now());
    store.store.create_session(&session).await.expect("session");
    let root = Message::user_text(&session.id, "cli", "cli", "User", "what is 6 x 7?");
    store.store.insert_message(&root).await.expect("post");
    // Claimed by an earlier instance of this very process: dead, as after a crash and restart.
    let host = nix::unistd::gethostname().expect("hostname").into_string().expect("utf-8 hostname");
    let dead = format!("{host}/{}/an-earlier-instance", std::process::id());
    store.store.claim(&root.id, Status::Processing, &[Status::PendingAgent], &dead).await.expect("claim");
    let answer = TurnOrigin::of(&root, "Kesoku").final_text(1, "42", None);
    store.store.insert_message(&answer).await.expect("the answer the dead run posted");

    let clock = ModelClock::default();
    let model = TimedModel::new(Arc::new(PolicyModel::new("policy", Policy::plain())), clock.clone());
    let system = System::start(setup, AgentSetup::with_model(Arc::new(model))).await.expect("agent");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = store.store.get_message(&root.id).await.expect("get").expect("stored").status;
        if crate::support::is_terminal(status) || tokio::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, Status::Processed);
    let history = store.store.session_history(&session.id).await.expect("history");
    let answers = answers_of(&history, &root);
    assert_eq!(answers.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(), ["42"], "one answer, the first");
    assert_eq!(clock.calls(), 0, "the model was not asked again");
    system.stop().await;
}
