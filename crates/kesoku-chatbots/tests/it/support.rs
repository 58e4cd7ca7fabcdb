//! A gateway over a fresh SQLite store, a turn's worth of messages, and a writer tests can read.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use kesoku_broker::MemoryBroker;
use kesoku_core::{Message, Session, TurnMetrics, TurnOrigin};
use kesoku_gateway::Gateway;
use kesoku_store::Ledger;
use serde_json::json;
use tempfile::TempDir;

pub struct Fixture {
    pub gateway: Gateway,
    pub ledger: Arc<dyn Ledger>,
    pub session: Session,
    /// Holds the database; also the workspace of tests that stage or name files.
    pub dir: TempDir,
}

impl Fixture {
    pub fn workspace(&self) -> &Path {
        self.dir.path()
    }
}

/// A store with one active `cli` session.
pub async fn fixture() -> Fixture {
    let (dir, url) = kesoku_test_support::db::temp_sqlite_url();
    let handle = kesoku_store::open(&url).await.expect("open a sqlite store");
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    let session = Session::new("cli", "cli", Utc::now());
    gateway.store().create_session(&session).await.expect("create a session");
    gateway.store().set_active_session("cli", "cli", &session.id).await.expect("activate it");
    Fixture { gateway, ledger: handle.ledger, session, dir }
}

/// A finished tool turn as the agent writes it: root, thought, call, result, answer (with
/// figures). The root comes first.
pub fn tool_turn(session: &Session) -> Vec<Message> {
    let root = Message::user_text(&session.id, "cli", "cli", "User", "What is 25 + 15?");
    let origin = TurnOrigin::of(&root, "Kesoku");
    let thought = origin.thought(1, "I will use the shell.", None);
    let call = origin.tool_call(1, "call_1", "run_shell_command", json!({"command": "echo $((25 + 15))"}));
    let result = origin.tool_result(&call, "=== STDOUT ===\n40\n", None, None);
    let metrics =
        TurnMetrics { session_turns: 1, context_tokens: 1234, turn_tool_calls: 1, turn_tokens: 56, turn_time: 1.25 };
    let answer = origin.final_text(2, "The answer is **40**.", Some(metrics));
    vec![root, thought, call, result, answer]
}

/// A `Write` whose bytes the test reads back.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("capture lock")).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A `Write` that keeps each write as one block: the CLI chatbot prints every message (and
/// every part of one) in a single write, so the blocks are what a person saw, one by one.
#[derive(Clone, Default)]
pub struct Blocks(Arc<Mutex<Vec<String>>>);

impl Blocks {
    pub fn blocks(&self) -> Vec<String> {
        self.0.lock().expect("blocks lock").clone()
    }
}

impl Write for Blocks {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("blocks lock").push(String::from_utf8_lossy(bytes).into_owned());
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Wait until `check` holds, polling every 10 ms, at most 1,000 times. Counted in polls, not
/// in clock time, so it also works under a paused clock (which jumps ahead while the store
/// works on its own thread).
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..1000 {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("timed out waiting: {what}");
}
