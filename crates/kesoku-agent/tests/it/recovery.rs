//! Crash recovery: work a dead process held is handed back and finished exactly once.

use kesoku_core::{Message, MessageType, Outcome, Role, Status, TurnOrigin};
use kesoku_llm::ScriptStep;
use serde_json::json;

use crate::harness::{BOT, CHANNEL, Harness};

#[tokio::test]
async fn a_turn_killed_mid_tool_is_finished_once_after_restart() {
    // Start with an agent that has nothing to do, then forge what a process killed mid-tool
    // leaves behind: the message claimed by a dead process, a thought and a call without result.
    let h = Harness::start(vec![]).await;
    let user = Message::user_text(&h.session.id, BOT, CHANNEL, "Chii", "run the report");
    let mut claimed = user.clone();
    claimed.status = Status::Processing;
    let origin = TurnOrigin::of(&user, "Kesoku");
    let call = origin.tool_call(1, "call_1", "run_shell_command", json!({"command": "sleep 100"}));
    h.handle
        .store
        .insert_messages(&[claimed.clone(), origin.thought(1, "running it", None), call.clone()])
        .await
        .expect("insert");
    // A dead process on this host (pid 2147483632 does not exist) holds the claim.
    let dead = format!("{}/2147483632/deadbeef", hostname());
    h.handle.store.renew_claim(&user.id, "nobody").await.expect("renew");
    sqlx_claim(&h, &user.id, &dead).await;

    let mut h = h;
    h.shut_down().await;
    h.model.push(ScriptStep::text("The report is done."));
    h.reboot(Default::default()).await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);

    let messages = h.history().await;
    let results: Vec<&Message> = messages.iter().filter(|m| m.message_type == MessageType::ToolResult).collect();
    assert_eq!(results.len(), 1, "the open call got exactly one result");
    assert_eq!(results[0].parent_id.as_ref(), Some(&call.id));
    assert!(results[0].content.contains("service restarted"), "{}", results[0].content);
    assert_eq!(h.status_of(&call.id).await, Status::Interrupted);
    let answers = messages.iter().filter(|m| m.role == Role::Assistant && m.message_type == MessageType::Text).count();
    assert_eq!(answers, 1, "no duplicate final answer");
    let reply = messages.last().expect("reply");
    assert_eq!(reply.step, 2, "the re-run continues after the stored step");
    // The model saw the interrupted call with its synthetic result.
    let seen = format!("{:?}", h.model.requests()[0].turns);
    assert!(seen.contains("call_1") && seen.contains("service restarted"), "{seen}");
    let outcomes: Vec<Option<Outcome>> = h.finished_ledger_for(&user.id).await.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, vec![Some(Outcome::Succeeded)], "one activation ran the recovered turn");
}

#[tokio::test]
async fn a_turn_killed_after_its_tool_result_was_stored_goes_on_without_running_the_tool_again() {
    // What a process killed between a tool's stored result and the next model call leaves: the
    // call and its real result, the message claimed by a dead process.
    let h = Harness::start(vec![]).await;
    let user = Message::user_text(&h.session.id, BOT, CHANNEL, "Chii", "count the files");
    let mut claimed = user.clone();
    claimed.status = Status::Processing;
    let origin = TurnOrigin::of(&user, "Kesoku");
    let call = origin.tool_call(1, "call_1", "run_shell_command", json!({"command": "touch ran-again; echo 3"}));
    let result = origin.tool_result(&call, "=== STDOUT ===\n3\n".to_owned(), Some("3".to_owned()), None);
    h.handle.store.insert_messages(&[claimed, call.clone(), result.clone()]).await.expect("insert");
    let dead = format!("{}/2147483632/deadbeef", hostname());
    h.handle.store.renew_claim(&user.id, "nobody").await.expect("renew");
    sqlx_claim(&h, &user.id, &dead).await;

    let mut h = h;
    h.shut_down().await;
    h.model.push(ScriptStep::text("There are 3 files."));
    h.reboot(Default::default()).await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);

    let messages = h.history().await;
    let results: Vec<&Message> = messages.iter().filter(|m| m.message_type == MessageType::ToolResult).collect();
    assert_eq!(results.len(), 1, "the call keeps its one, real result");
    assert_eq!(results[0].id, result.id);
    assert!(!h.dir.path().join("workspace").join("ran-again").exists(), "the tool did not run again");
    let reply = messages.last().expect("reply");
    assert_eq!((reply.step, reply.content.as_str()), (2, "There are 3 files."));
    let seen = format!("{:?}", h.model.requests()[0].turns);
    assert!(seen.contains("call_1") && !seen.contains("service restarted"), "{seen}");
}

#[tokio::test]
async fn a_live_claim_elsewhere_is_left_alone() {
    let h = Harness::start(vec![]).await;
    let mut user = Message::user_text(&h.session.id, BOT, CHANNEL, "Chii", "busy elsewhere");
    user.status = Status::Processing;
    h.handle.store.insert_message(&user).await.expect("insert");
    sqlx_claim(&h, &user.id, "another-host/1/alive").await;
    let mut h = h;
    h.shut_down().await;
    h.reboot(Default::default()).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(h.status_of(&user.id).await, Status::Processing, "another host's fresh claim is not an orphan");
}

pub(crate) fn hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
}

/// Set who holds a `processing` message, as a crashed process's claim would.
pub(crate) async fn sqlx_claim(h: &Harness, id: &kesoku_core::MessageId, claimed_by: &str) {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", h.dir.path().join("kesoku.db").display()))
        .await
        .expect("raw connection");
    sqlx::query("UPDATE messages SET claimed_by = ?, claimed_at = ? WHERE id = ?")
        .bind(claimed_by)
        .bind(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        .bind(id.as_str())
        .execute(&pool)
        .await
        .expect("set claim");
    pool.close().await;
}

/// A ledger whose enqueue writes fail while `failing` is set; everything else is the store's.
struct RefusingLedger {
    inner: std::sync::Arc<dyn kesoku_store::Ledger>,
    failing: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl kesoku_store::Ledger for RefusingLedger {
    async fn record_enqueued(&self, entry: &kesoku_core::LedgerEntry) -> kesoku_store::StoreResult<bool> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(kesoku_store::StoreError::Migration("disk full (test)".to_owned()));
        }
        self.inner.record_enqueued(entry).await
    }
    async fn record_started(
        &self,
        id: &kesoku_core::ActivationId,
        at: chrono::DateTime<chrono::Utc>,
    ) -> kesoku_store::StoreResult<()> {
        self.inner.record_started(id, at).await
    }
    async fn record_finished(
        &self,
        id: &kesoku_core::ActivationId,
        at: chrono::DateTime<chrono::Utc>,
        outcome: Outcome,
        error: Option<&str>,
        usage: &kesoku_core::Usage,
    ) -> kesoku_store::StoreResult<()> {
        self.inner.record_finished(id, at, outcome, error, usage).await
    }
    async fn get_activation(
        &self,
        id: &kesoku_core::ActivationId,
    ) -> kesoku_store::StoreResult<Option<kesoku_core::LedgerEntry>> {
        self.inner.get_activation(id).await
    }
    async fn list_activations(
        &self,
        filter: &kesoku_store::LedgerFilter,
    ) -> kesoku_store::StoreResult<Vec<kesoku_core::LedgerEntry>> {
        self.inner.list_activations(filter).await
    }
    async fn unfinished_activations(&self) -> kesoku_store::StoreResult<Vec<kesoku_core::LedgerEntry>> {
        self.inner.unfinished_activations().await
    }
    async fn record_delivery_failure(
        &self,
        root_message_id: &kesoku_core::MessageId,
        reason: &str,
    ) -> kesoku_store::StoreResult<()> {
        self.inner.record_delivery_failure(root_message_id, reason).await
    }
}

/// The ledger row is written while the activation is already queued; a turn never claims its
/// message before that row exists, so a failed write leaves the message pending and untouched,
/// and a later start runs it.
#[tokio::test]
async fn a_message_whose_ledger_row_cannot_be_written_stays_pending_for_the_next_start() {
    let mut h = Harness::start(vec![ScriptStep::text("should not be sent")]).await;
    h.shut_down().await;
    let refusing = std::sync::Arc::new(RefusingLedger {
        inner: std::sync::Arc::clone(&h.handle.ledger),
        failing: std::sync::atomic::AtomicBool::new(true),
    });
    h.reboot(crate::harness::Options { ledger: Some(refusing.clone()), ..Default::default() }).await;
    let user = h.post_user("hello").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(h.status_of(&user.id).await, Status::PendingAgent, "not claimed without a ledger row");
    assert!(h.model.requests().is_empty(), "the model was called for an unrecorded activation");
    assert!(h.ledger_for(&user.id).await.is_empty());

    // The disk has room again: the next start queues it, records it and answers once.
    h.shut_down().await;
    refusing.failing.store(false, std::sync::atomic::Ordering::SeqCst);
    h.reboot(crate::harness::Options { ledger: Some(refusing), ..Default::default() }).await;
    assert_eq!(h.wait_terminal(&user.id).await, Status::Processed);
    assert_eq!(h.model.requests().len(), 1);
    let outcomes: Vec<Option<Outcome>> = h.finished_ledger_for(&user.id).await.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, vec![Some(Outcome::Succeeded)]);
}
