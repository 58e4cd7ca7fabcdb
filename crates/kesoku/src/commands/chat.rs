//! `kesoku chat`: talk to the agent from the terminal.
//!
//! With a prompt it runs one turn; without one it opens an interactive session (line editing,
//! history in `<workspace>/chat_history`, the shared chat commands). Either way this process is
//! the `cli` chatbot: it posts the user's messages through `kesoku_chatbots::ingest`, renders each step of
//! the turn as it is stored and marks it `delivered` (`kesoku_chatbots::cli`), and waits for
//! the turn to end before prompting again. Ctrl-C during a turn stops the turn (a second one
//! stops waiting); Ctrl-C at the prompt clears the line; Ctrl-D exits.
//!
//! Who runs the turns: when a `kesoku start` service runs for the workspace (it holds the
//! service lock), this process is only its client — it posts, and hears the service's
//! answers through the store watch; a running turn can then not be stopped from here (the
//! stop signal is in-process), only messages still waiting can. Otherwise the agent runs in
//! this process for as long as the command does (it also takes other sessions' waiting work,
//! as any agent would; what it has not finished when the command exits goes back to
//! `pending_agent`). That in-process agent offers no background jobs (`run_shell_command`
//! without `background`): nothing would watch a job once the command exits. As a client of a
//! service, the service's agent offers them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use async_trait::async_trait;
use chrono::Utc;
use kesoku_agent::Agent;
use kesoku_chatbots::cli::{CLI_CHANNEL, CLI_CHATBOT, CLI_SENDER, CliChatbot, RenderMode, TurnOutcome};
use kesoku_chatbots::commands::{self, CommandContext, CommandEffect, SessionControl, StopAck, TurnStop};
use kesoku_chatbots::staging::{IncomingFile, Staging};
use kesoku_chatbots::{ChatbotError, Deliverer, Inbound, Ingested, ingest};
use kesoku_core::{Message, MessageFilter, Session, SessionId, Status};
use kesoku_gateway::Gateway;
use kesoku_store::SessionFilter;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio_util::sync::CancellationToken;

use crate::cli::ChatArgs;
use crate::config::Config;
use crate::wiring;

/// How long an in-process agent gets to finish other work when the command exits.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// The prompt of the interactive session.
const PROMPT: &str = "you › ";

pub async fn run(config: &Config, args: &ChatArgs) -> anyhow::Result<ExitCode> {
    // One conversation at a time: the store's single connection serves it (reads wait behind
    // writes, both in microseconds), and the process starts three threads fewer.
    let (handle, gateway) = wiring::open_gateway(config, kesoku_store::Footprint::Command).await?;
    if args.list {
        return list_sessions(&gateway).await;
    }
    let prompt = args.prompt.join(" ");
    let repl = prompt.trim().is_empty();
    let backend = Backend::start(config, &handle, &gateway, repl).await?;
    let chatbot = CliChatbot::stdout(render_mode());
    let deliverer = Deliverer::new(gateway.clone(), config.workspace_dir.clone()).with_ledger(handle.ledger.clone());
    let mut session = choose_session(&gateway, args).await?;
    let (interrupt_sender, mut interrupts) = tokio::sync::mpsc::unbounded_channel();
    // The SIGINT handler is installed here, before the first prompt: a Ctrl-C that comes before
    // the forwarding task first runs (a loaded machine) must stop the turn, not kill the program.
    let sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("installing the Ctrl-C handler")?;
    let forwarder = tokio::spawn(forward_ctrl_c(sigint, interrupt_sender));

    let result = if repl {
        let mut repl = Repl {
            config,
            gateway: &gateway,
            deliverer: &deliverer,
            chatbot: &chatbot,
            control: backend.control(&gateway),
            interrupts: &mut interrupts,
            attachments: args.attach.clone(),
        };
        repl.run(&mut session, &backend).await
    } else {
        one_shot(config, &deliverer, &chatbot, &backend, &session, &prompt, &args.attach, &mut interrupts).await
    };
    forwarder.abort();
    backend.stop().await;
    result
}

/// Rich output on a terminal, plain text otherwise or when `NO_COLOR` is set (no-color.org).
fn render_mode() -> RenderMode {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let dumb = std::env::var("TERM").is_ok_and(|term| term == "dumb");
    if std::io::stdout().is_terminal() && !no_color && !dumb { RenderMode::Rich } else { RenderMode::Plain }
}

/// Every Ctrl-C (SIGINT) becomes one message on the channel. At the prompt the line editor
/// reads Ctrl-C as a key (raw mode), so only Ctrl-C during a turn arrives here.
async fn forward_ctrl_c(mut sigint: tokio::signal::unix::Signal, sender: UnboundedSender<()>) {
    while sigint.recv().await.is_some() {
        if sender.send(()).is_err() {
            return;
        }
    }
}

/// Who runs the turns.
enum Backend {
    /// The agent runs in this process.
    InProcess { agent: Agent, shutdown: CancellationToken, runner: tokio::task::JoinHandle<()> },
    /// A `kesoku start` service runs them; this process hears its changes through the store.
    Client { pid: u32, shutdown: CancellationToken, watch: tokio::task::JoinHandle<()> },
}

impl Backend {
    /// `repl`: an interactive session, which also fires due follow-ups while it is open (a
    /// one-shot ends with its answer, so it leaves them to the next service or session).
    async fn start(
        config: &Config,
        handle: &kesoku_store::StoreHandle,
        gateway: &Gateway,
        repl: bool,
    ) -> anyhow::Result<Backend> {
        if let Some(pid) = super::start::running_service(config) {
            let shutdown = CancellationToken::new();
            let watch = wiring::spawn_store_watch(config, gateway.clone(), shutdown.clone());
            return Ok(Backend::Client { pid, shutdown, watch });
        }
        let models = wiring::build_models(config).await?;
        let followups = wiring::build_followups(config, gateway);
        let agent = wiring::build_agent(config, handle, gateway.clone(), models, &followups).await?;
        agent.recover().await.context("recovering unfinished work")?;
        let shutdown = CancellationToken::new();
        let runner = {
            let agent = agent.clone();
            let shutdown = shutdown.clone();
            // Follow-ups fire while an interactive chat runs (and, when it is closed, at the
            // next start).
            tokio::spawn(async move {
                if repl {
                    tokio::join!(agent.run(shutdown.clone(), EXIT_GRACE), followups.run(shutdown));
                } else {
                    agent.run(shutdown, EXIT_GRACE).await;
                }
            })
        };
        Ok(Backend::InProcess { agent, shutdown, runner })
    }

    fn control(&self, gateway: &Gateway) -> Box<dyn SessionControl> {
        match self {
            Backend::InProcess { agent, .. } => Box::new(crate::control::AgentHandle(agent.clone())),
            Backend::Client { pid, .. } => Box::new(ClientControl { gateway: gateway.clone(), pid: *pid }),
        }
    }

    fn banner(&self) -> Option<String> {
        match self {
            Backend::InProcess { .. } => None,
            Backend::Client { pid, .. } => Some(format!("Connected to the running kesoku service (pid {pid}).")),
        }
    }

    async fn stop(self) {
        match self {
            Backend::InProcess { shutdown, runner, .. } => {
                shutdown.cancel();
                let _ = runner.await;
            }
            Backend::Client { shutdown, watch, .. } => {
                shutdown.cancel();
                let _ = watch.await;
            }
        }
    }
}

/// Stopping as a client of a running service: waiting messages can be interrupted through the
/// store, the running turn cannot (the service hears stop signals only from its own process).
struct ClientControl {
    gateway: Gateway,
    pid: u32,
}

#[async_trait]
impl SessionControl for ClientControl {
    async fn stop_session(&self, session_id: &SessionId) -> Result<StopAck, ChatbotError> {
        let waiting = self
            .gateway
            .store()
            .list_messages(&MessageFilter::session(session_id).with_statuses(&[Status::PendingAgent]))
            .await?;
        let mut interrupted_waiting = 0;
        for message in waiting {
            if self.gateway.claim(&message.id, Status::Interrupted, &[Status::PendingAgent], "cli").await?.is_some() {
                interrupted_waiting += 1;
            }
        }
        Ok(StopAck {
            turn: TurnStop::Unreachable(format!(
                "The turn runs in the kesoku service (pid {}), which this terminal cannot stop.",
                self.pid
            )),
            interrupted_waiting,
        })
    }
}

#[allow(clippy::too_many_arguments)]
async fn one_shot(
    config: &Config,
    deliverer: &Deliverer,
    chatbot: &CliChatbot,
    backend: &Backend,
    session: &Session,
    prompt: &str,
    attach: &[PathBuf],
    interrupts: &mut UnboundedReceiver<()>,
) -> anyhow::Result<ExitCode> {
    if let Some(banner) = backend.banner() {
        chatbot.hint(&banner)?;
    }
    let gateway = deliverer.gateway();
    chatbot.deliver_outstanding(deliverer, &session.id).await?;
    let after = gateway.store().current_rev().await?;
    let message =
        post_prompt(gateway, &Staging::new(&config.workspace_dir), session, prompt.to_owned(), attach).await?;
    let control = backend.control(gateway);
    let outcome = chatbot.follow_turn(deliverer, &session.id, &message.id, after, control.as_ref(), interrupts).await?;
    Ok(match outcome {
        TurnOutcome::Processed => ExitCode::SUCCESS,
        TurnOutcome::Interrupted | TurnOutcome::Detached => ExitCode::from(130),
        TurnOutcome::Failed | TurnOutcome::Requeued => ExitCode::FAILURE,
    })
}

/// The interactive session.
struct Repl<'a> {
    config: &'a Config,
    gateway: &'a Gateway,
    deliverer: &'a Deliverer,
    chatbot: &'a CliChatbot,
    control: Box<dyn SessionControl>,
    interrupts: &'a mut UnboundedReceiver<()>,
    /// Files for the first message.
    attachments: Vec<PathBuf>,
}

impl Repl<'_> {
    async fn run(&mut self, session: &mut Session, backend: &Backend) -> anyhow::Result<ExitCode> {
        let history_path = self.config.workspace_dir.join("chat_history");
        let mut reader = LineReader::spawn(history_path);
        let resumed = self.gateway.store().list_messages(&MessageFilter::session(&session.id).with_limit(1)).await?;
        self.chatbot.notice(&format!(
            "Kesoku chat · session {} ({}) · /help for commands · Ctrl-C stops a turn · Ctrl-D exits",
            session.id,
            if resumed.is_empty() { "new" } else { "resumed" }
        ))?;
        if let Some(banner) = backend.banner() {
            self.chatbot.hint(&banner)?;
        }
        if !self.attachments.is_empty() {
            let names: Vec<String> = self.attachments.iter().map(|p| p.display().to_string()).collect();
            self.chatbot.hint(&format!("Attached to your first message: {}", names.join(", ")))?;
        }
        loop {
            self.chatbot.deliver_outstanding(self.deliverer, &session.id).await?;
            let line = match reader.read(PROMPT).await {
                ReadLine::Line(line) => line,
                ReadLine::Interrupted => continue,
                ReadLine::Eof => break,
                ReadLine::Failed(error) => bail!("reading the terminal failed: {error}"),
            };
            if line.trim().is_empty() {
                continue;
            }
            let result = match commands::parse(&line) {
                Some(command) => self.command(&command, session).await,
                None => {
                    let text = commands::message_text(&line).into_owned();
                    self.turn(session, text).await
                }
            };
            if let Err(error) = result {
                self.chatbot.notice(&format!("error: {error:#}"))?;
            }
        }
        self.chatbot.hint("Bye.")?;
        Ok(ExitCode::SUCCESS)
    }

    /// Post one message and follow its turn.
    async fn turn(&mut self, session: &Session, text: String) -> anyhow::Result<()> {
        self.forget_interrupts();
        let after = self.gateway.store().current_rev().await?;
        let staging = Staging::new(&self.config.workspace_dir);
        // The files go with the first message only, posted or refused: an unreadable file
        // must not block every later message.
        let attachments = std::mem::take(&mut self.attachments);
        let message = post_prompt(self.gateway, &staging, session, text, &attachments).await?;
        self.follow(session, &message, after).await
    }

    /// A Ctrl-C from before a turn (pressed while nothing ran) must not stop it: dropped
    /// before the turn's message is posted, so none meant for the turn is lost.
    fn forget_interrupts(&mut self) {
        while self.interrupts.try_recv().is_ok() {}
    }

    async fn follow(&mut self, session: &Session, root: &Message, after: i64) -> anyhow::Result<()> {
        self.chatbot
            .follow_turn(self.deliverer, &session.id, &root.id, after, self.control.as_ref(), self.interrupts)
            .await?;
        Ok(())
    }

    async fn command(&mut self, command: &commands::ChatCommand, session: &mut Session) -> anyhow::Result<()> {
        self.forget_interrupts();
        let after = self.gateway.store().current_rev().await?;
        let context = CommandContext {
            gateway: self.gateway,
            control: self.control.as_ref(),
            chatbot_id: CLI_CHATBOT,
            channel_id: CLI_CHANNEL,
            session_id: &session.id,
        };
        let reply = commands::execute(command, &context).await?;
        self.chatbot.notice(&reply.text)?;
        match reply.effect {
            CommandEffect::SessionSwitched(new_session) => *session = new_session,
            CommandEffect::CompactionRequested(trigger) => self.follow(session, &trigger, after).await?,
            CommandEffect::None | CommandEffect::Stopped(_) => {}
        }
        Ok(())
    }
}

/// What the line editor read.
enum ReadLine {
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D on an empty line, or the end of input.
    Eof,
    Failed(String),
}

/// The line editor on a thread of its own (it blocks on the terminal), one line per request.
struct LineReader {
    requests: std::sync::mpsc::Sender<String>,
    lines: UnboundedReceiver<ReadLine>,
}

impl LineReader {
    fn spawn(history: PathBuf) -> LineReader {
        let (requests, prompts) = std::sync::mpsc::channel::<String>();
        let (sender, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || edit_lines(&history, &prompts, &sender));
        LineReader { requests, lines }
    }

    async fn read(&mut self, prompt: &str) -> ReadLine {
        if self.requests.send(prompt.to_owned()).is_err() {
            return ReadLine::Eof;
        }
        self.lines.recv().await.unwrap_or(ReadLine::Eof)
    }
}

fn edit_lines(history: &Path, prompts: &std::sync::mpsc::Receiver<String>, lines: &UnboundedSender<ReadLine>) {
    use rustyline::error::ReadlineError;
    let config = rustyline::Config::builder()
        .max_history_size(1000)
        .map_or_else(|_| rustyline::Config::default(), |builder| builder.auto_add_history(false).build());
    let mut editor = match rustyline::DefaultEditor::with_config(config) {
        Ok(editor) => editor,
        Err(error) => {
            let _ = lines.send(ReadLine::Failed(error.to_string()));
            return;
        }
    };
    // A missing history file is the normal first run.
    let _ = editor.load_history(history);
    while let Ok(prompt) = prompts.recv() {
        let read = match editor.readline(&prompt) {
            Ok(line) => {
                if !line.trim().is_empty() {
                    let _ = editor.add_history_entry(line.as_str());
                    if let Err(error) = editor.save_history(history) {
                        tracing::debug!(%error, "saving the chat history failed");
                    }
                }
                ReadLine::Line(line)
            }
            Err(ReadlineError::Interrupted) => ReadLine::Interrupted,
            Err(ReadlineError::Eof) => ReadLine::Eof,
            Err(error) => ReadLine::Failed(error.to_string()),
        };
        if lines.send(read).is_err() {
            return;
        }
    }
}

async fn list_sessions(gateway: &Gateway) -> anyhow::Result<ExitCode> {
    let store = gateway.store();
    let active = store.active_session(CLI_CHATBOT, CLI_CHANNEL).await?;
    let filter =
        SessionFilter { chatbot_id: Some(CLI_CHATBOT.into()), channel_id: Some(CLI_CHANNEL.into()), limit: Some(50) };
    let sessions = store.list_sessions(&filter).await?;
    if sessions.is_empty() {
        println!("no sessions yet: start one with `kesoku chat`");
    }
    for session in sessions {
        let first = store
            .list_messages(&MessageFilter::session(&session.id).with_roles(&[kesoku_core::Role::User]).with_limit(1))
            .await?
            .into_iter()
            .next()
            .map(|m| m.content.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(60).collect::<String>());
        println!(
            "{} {}  {}  {}",
            if active.as_ref() == Some(&session.id) { "*" } else { " " },
            session.id,
            session.updated_at.format("%Y-%m-%d %H:%M"),
            session.title.or(first).unwrap_or_default()
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn choose_session(gateway: &Gateway, args: &ChatArgs) -> anyhow::Result<Session> {
    let store = gateway.store();
    if let Some(id) = &args.session {
        let id = SessionId::from(id.as_str());
        let Some(session) = store.get_session(&id).await? else {
            bail!("no session `{id}`: list them with `kesoku chat -l`");
        };
        store.set_active_session(CLI_CHATBOT, CLI_CHANNEL, &id).await?;
        return Ok(session);
    }
    // `-z` without an earlier session starts a new one, as a first run would.
    if args.resume
        && let Some(id) = store.active_session(CLI_CHATBOT, CLI_CHANNEL).await?
        && let Some(session) = store.get_session(&id).await?
    {
        return Ok(session);
    }
    let session = Session::new(CLI_CHATBOT, CLI_CHANNEL, Utc::now());
    store.create_session(&session).await?;
    store.set_active_session(CLI_CHATBOT, CLI_CHANNEL, &session.id).await?;
    Ok(session)
}

/// The files named by `--attach`, read for [`kesoku_chatbots::ingest`] (which checks, names and
/// stages them; the media type is guessed from the name).
fn read_attachments(paths: &[PathBuf]) -> anyhow::Result<Vec<IncomingFile>> {
    paths
        .iter()
        .map(|path| {
            let filename = path
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| !n.is_empty())
                .with_context(|| format!("cannot attach {}: it has no usable file name", path.display()))?
                .to_owned();
            let bytes = std::fs::read(path).with_context(|| {
                format!("cannot attach {}: reading it failed (check the path and its permissions)", path.display())
            })?;
            Ok(IncomingFile { filename, mime_type: None, bytes })
        })
        .collect()
}

/// Post what the user typed (and the files of `attach`) into `session` through the one ingest
/// path every chatbot uses.
async fn post_prompt(
    gateway: &Gateway,
    staging: &Staging,
    session: &Session,
    text: String,
    attach: &[PathBuf],
) -> anyhow::Result<Message> {
    let mut inbound = Inbound::text(CLI_CHATBOT, CLI_CHANNEL, CLI_SENDER, text);
    inbound.session_id = Some(session.id.clone());
    inbound.files = read_attachments(attach)?;
    match ingest(gateway, staging, inbound).await? {
        Ingested::Posted(message) => Ok(*message),
        // Only keyed platform events can be duplicates; the CLI's messages carry no key.
        Ingested::Duplicate(id) => bail!("message {id} was already posted"),
    }
}
