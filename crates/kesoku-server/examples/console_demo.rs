//! A real server over a temporary SQLite store with a *fake* agent runtime, for trying the web
//! console, the browser end-to-end test and the schema fuzz run.
//!
//! The fake runtime answers every `pending_agent` message with a scripted turn posted through
//! the gateway with short delays: a thought, a `web_search` tool call, its result (an error when
//! the message contains "fail"), and a final answer with turn metrics. It records each turn in
//! the ledger and counts turns in the Prometheus recorder, and it can be stopped through the API.
//! Compaction triggers get a notification.
//!
//! ```text
//! cargo run -p kesoku-server --example console_demo -- [--addr 127.0.0.1:8787] [--delay-ms 400]
//!     [--workspace DIR] [--print-openapi]
//! ```
//! With `KESOKU_HTTP_TOKEN` set, the server requires that token. It prints
//! `listening on http://ADDR` once it accepts connections.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use futures::StreamExt;
use kesoku_broker::MemoryBroker;
use kesoku_chatbots::control::{SessionControl, StopAck, TurnStop};
use kesoku_chatbots::{ChatbotError, Deliverer};
use kesoku_core::{
    Activation, ActivationId, ActivationPayload, ExpectedResponse, Lane, LedgerEntry, Message, MessageFilter, Outcome,
    SessionId, Status, TurnMetrics, TurnOrigin, Usage,
};
use kesoku_gateway::{Gateway, ListenFrom};
use kesoku_server::{AgentControl, LaneDepths, LaneLimits, RunningTurn, RuntimeState, ServerState, Token, TurnLimits};
use kesoku_store::Ledger;
use tokio_util::sync::CancellationToken;

const WORKER: &str = "demo-worker";

struct Args {
    addr: String,
    delay: Duration,
    workspace: Option<PathBuf>,
    print_openapi: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: "127.0.0.1:8787".into(),
        delay: Duration::from_millis(400),
        workspace: None,
        print_openapi: false,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--addr" => args.addr = iter.next().ok_or("--addr needs a value")?,
            "--delay-ms" => {
                let ms: u64 =
                    iter.next().ok_or("--delay-ms needs a value")?.parse().map_err(|_| "--delay-ms: not a number")?;
                args.delay = Duration::from_millis(ms);
            }
            "--workspace" => args.workspace = Some(PathBuf::from(iter.next().ok_or("--workspace needs a value")?)),
            "--print-openapi" => args.print_openapi = true,
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

/// The fake runtime: scripted turns, one at a time per session.
struct FakeAgent {
    gateway: Gateway,
    ledger: Arc<dyn Ledger>,
    delay: Duration,
    /// Running turns by session; short critical sections only, never held across an await.
    running: Mutex<HashMap<SessionId, (RunningTurn, CancellationToken)>>,
}

impl FakeAgent {
    fn limits() -> LaneLimits {
        LaneLimits {
            interactive: TurnLimits { runtime_s: 900, model_calls: 40, tool_calls: 100 },
            responsive: TurnLimits { runtime_s: 1800, model_calls: 60, tool_calls: 200 },
            background: TurnLimits { runtime_s: 600, model_calls: 8, tool_calls: 0 },
        }
    }

    async fn pending_count(&self) -> u64 {
        let filter = MessageFilter::status(Status::PendingAgent);
        self.gateway.store().list_messages(&filter).await.map(|m| m.len() as u64).unwrap_or(0)
    }

    /// Take pending messages as they come and run their turns.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut pending =
            std::pin::pin!(self.gateway.listen(MessageFilter::status(Status::PendingAgent), ListenFrom::Current));
        loop {
            let next = tokio::select! {
                () = shutdown.cancelled() => return,
                next = pending.next() => next,
            };
            match next {
                Some(Ok(event)) => {
                    let agent = Arc::clone(&self);
                    tokio::spawn(async move { agent.turn(event.message).await });
                }
                Some(Err(error)) => tracing::warn!(%error, "fake agent: reading pending messages failed"),
                None => return,
            }
        }
    }

    async fn turn(self: Arc<Self>, root: Message) {
        let activation = Activation {
            id: ActivationId::generate(),
            session_id: root.session_id.clone(),
            chatbot_id: root.chatbot_id.clone(),
            channel_id: root.channel_id.clone(),
            triggered_by: root.sender.clone(),
            delegation_user: None,
            depth: 0,
            agent: None,
            orchestration: None,
            lane: Lane::Interactive,
            expected_response: ExpectedResponse::default(),
            locale: None,
            timezone: None,
            model: None,
            output_schema: None,
            created_at: Utc::now(),
            payload: ActivationPayload::Message { message_id: root.id.clone() },
        };
        // One turn per session at a time: wait while another runs.
        loop {
            if !self.running.lock().map(|r| r.contains_key(&root.session_id)).unwrap_or(false) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let claimed = self.gateway.claim(&root.id, Status::Processing, &[Status::PendingAgent], WORKER).await;
        if !matches!(claimed, Ok(Some(_))) {
            return;
        }
        if let Err(error) = self.ledger.record_enqueued(&LedgerEntry::enqueued(&activation)).await {
            tracing::warn!(%error, "fake agent: ledger");
        }
        let _ = self.ledger.record_started(&activation.id, Utc::now()).await;
        let cancel = CancellationToken::new();
        let turn = RunningTurn {
            session_id: root.session_id.clone(),
            root_message_id: root.id.clone(),
            activation_id: activation.id.clone(),
            lane: activation.lane,
            worker: WORKER.to_owned(),
            since: Utc::now(),
        };
        if let Ok(mut running) = self.running.lock() {
            running.insert(root.session_id.clone(), (turn, cancel.clone()));
        }
        let started = std::time::Instant::now();
        let outcome = tokio::select! {
            outcome = self.script(&root) => outcome,
            () = cancel.cancelled() => Ok(Outcome::Interrupted),
        };
        let outcome = outcome.unwrap_or_else(|error| {
            tracing::warn!(%error, "fake agent: turn failed");
            Outcome::Failed
        });
        let final_status = match outcome {
            Outcome::Succeeded | Outcome::Failed => Status::Processed,
            Outcome::Interrupted | Outcome::Cancelled | Outcome::LimitExceeded | Outcome::Refused => {
                Status::Interrupted
            }
        };
        if final_status == Status::Interrupted {
            // Unfinished tool calls of the turn are interrupted with it.
            if let Ok(calls) = self.gateway.store().orphaned_tool_calls(Some(&root.session_id)).await {
                for call in calls.iter().filter(|c| c.parent_id.as_ref() == Some(&root.id)) {
                    let _ = self.gateway.update_status(&call.id, Status::Interrupted).await;
                }
            }
        }
        let _ = self.gateway.update_status(&root.id, final_status).await;
        let usage = Usage { model_calls: 2, tool_calls: 1, input_tokens: 812, output_tokens: 230 };
        let error = (outcome == Outcome::Failed).then_some("the web_search tool failed (demo)");
        let _ = self.ledger.record_finished(&activation.id, Utc::now(), outcome, error, &usage).await;
        metrics::counter!("kesoku_turns_total", "outcome" => outcome.as_str()).increment(1);
        metrics::histogram!("kesoku_model_latency_seconds").record(started.elapsed().as_secs_f64() / 2.0);
        metrics::counter!("kesoku_model_tokens_total", "kind" => "input").increment(usage.input_tokens);
        metrics::counter!("kesoku_model_tokens_total", "kind" => "output").increment(usage.output_tokens);
        if let Ok(mut running) = self.running.lock() {
            running.remove(&root.session_id);
        }
    }

    async fn script(&self, root: &Message) -> Result<Outcome, kesoku_gateway::GatewayError> {
        let origin = TurnOrigin::of(root, "Kesoku");
        let pause = || tokio::time::sleep(self.delay);
        if root.metadata.is_compaction == Some(true) {
            pause().await;
            self.gateway
                .post(&origin.notification("🔄 Conversation history has been compacted (demo runtime)."))
                .await?;
            return Ok(Outcome::Succeeded);
        }
        let question: String = root.content.chars().take(120).collect();
        pause().await;
        self.gateway
            .post(&origin.thought(1, format!("The user asks: “{question}”. I will search the web first."), None))
            .await?;
        pause().await;
        let call = origin.tool_call(1, "call_1", "web_search", serde_json::json!({ "query": question }));
        self.gateway.post(&call).await?;
        pause().await;
        pause().await;
        let failed = root.content.to_lowercase().contains("fail");
        let result = if failed {
            origin.tool_result(
                &call,
                "Error: the search service answered 503.",
                None,
                Some("HTTP 503 from search".into()),
            )
        } else {
            origin.tool_result(
                &call,
                format!("1. {question} — example.org\n2. More about {question} — example.net"),
                Some("2 results".into()),
                None,
            )
        };
        self.gateway.post(&result).await?;
        pause().await;
        let answer = if failed {
            "The search tool failed, so I could not look this up. Please try again later.".to_owned()
        } else {
            format!("Here is what I found about “{question}”: two pages cover it (example.org, example.net).")
        };
        let metrics = TurnMetrics {
            session_turns: 1,
            context_tokens: 812,
            turn_tool_calls: 1,
            turn_tokens: 1042,
            turn_time: 2.1,
        };
        self.gateway.post(&origin.final_text(2, answer, Some(metrics))).await?;
        Ok(if failed { Outcome::Failed } else { Outcome::Succeeded })
    }
}

/// The server's view of the fake runtime.
struct DemoControl(Arc<FakeAgent>, Mutex<u64>);

#[async_trait]
impl SessionControl for DemoControl {
    async fn stop_session(&self, session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        let cancel = self
            .0
            .running
            .lock()
            .map_err(|_| ChatbotError::Stop("the demo's lock is poisoned".into()))?
            .get(session_id)
            .map(|(_, c)| c.clone());
        if let Some(cancel) = cancel {
            cancel.cancel();
        }
        let filter = MessageFilter::session(session_id).with_statuses(&[Status::PendingAgent]);
        let waiting = self.0.gateway.store().list_messages(&filter).await?;
        let mut interrupted_waiting = 0;
        for message in waiting {
            if self.0.gateway.update_status(&message.id, Status::Interrupted).await.is_ok() {
                interrupted_waiting += 1;
            }
        }
        Ok(StopAck { turn: TurnStop::Requested, interrupted_waiting })
    }
}

#[async_trait::async_trait]
impl AgentControl for DemoControl {
    async fn runtime_state(&self) -> RuntimeState {
        let running: Vec<RunningTurn> =
            self.0.running.lock().map(|r| r.values().map(|(turn, _)| turn.clone()).collect()).unwrap_or_default();
        let waiting = self.1.lock().map(|w| *w).unwrap_or(0);
        RuntimeState {
            queue: LaneDepths { interactive: waiting, responsive: 0, background: 0, running: running.len() as u64 },
            running,
            limits: FakeAgent::limits(),
            queue_unreadable: false,
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    if args.print_openapi {
        println!("{}", kesoku_server::openapi_document().to_pretty_json()?);
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kesoku_server=debug".into()),
        )
        .with_writer(std::io::stderr)
        .init();

    let temp = tempfile::Builder::new().prefix("kesoku-demo-").tempdir()?;
    let workspace = args.workspace.clone().unwrap_or_else(|| temp.path().to_path_buf());
    std::fs::create_dir_all(workspace.join("sessions"))?;
    let url = format!("sqlite://{}", workspace.join("kesoku.db").display());
    let handle = kesoku_store::open(&url).await?;
    let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;

    let agent = Arc::new(FakeAgent {
        gateway: gateway.clone(),
        ledger: Arc::clone(&handle.ledger),
        delay: args.delay,
        running: Mutex::new(HashMap::new()),
    });
    let control = Arc::new(DemoControl(Arc::clone(&agent), Mutex::new(0)));
    let shutdown = CancellationToken::new();

    let mut state = ServerState::new(gateway.clone(), Arc::clone(&handle.ledger), control.clone(), workspace.clone())
        .with_metrics(recorder.clone());
    if let Ok(value) = std::env::var("KESOKU_HTTP_TOKEN") {
        state = state.with_token(Token::new(value)?);
    }
    let listener = tokio::net::TcpListener::bind(&args.addr).await?;
    kesoku_server::check_bind(listener.local_addr()?, state.token.as_ref())?;

    let deliverer = Deliverer::new(gateway.clone(), workspace.clone()).with_ledger(Arc::clone(&handle.ledger));
    tokio::spawn(kesoku_server::run_api_delivery(deliverer, shutdown.clone()));
    tokio::spawn(Arc::clone(&agent).run(shutdown.clone()));
    {
        // Keep the fake queue depth and the recorder's upkeep fresh.
        let (agent, control, shutdown) = (Arc::clone(&agent), Arc::clone(&control), shutdown.clone());
        tokio::spawn(async move {
            while !shutdown.is_cancelled() {
                let count = agent.pending_count().await;
                if let Ok(mut waiting) = control.1.lock() {
                    *waiting = count;
                }
                recorder.run_upkeep();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        });
    }
    println!("listening on http://{}", listener.local_addr()?);
    println!("workspace {}", workspace.display());
    kesoku_server::serve(listener, state, shutdown).await?;
    drop(temp);
    Ok(())
}
