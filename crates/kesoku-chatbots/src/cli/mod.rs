//! The CLI chatbot: the terminal as a platform (chatbot and channel `cli`, sender `User`,
//! spec §3.1).
//!
//! [`CliChatbot`] prints each message of its chatbot the way [`render`] says and marks it
//! delivered; while a turn runs it shows a spinner with the elapsed time (terminals only).
//! [`CliChatbot::follow_turn`] follows one turn from the store and the live stream until its
//! root message ends, turning the first interrupt (Ctrl-C) into a stop request and a second
//! into "stop waiting".
//!
//! Not here: the prompt and line editing (the binary's REPL), deciding whether the output is a
//! terminal or `NO_COLOR` is set (the binary reads the environment and picks a
//! [`RenderMode`]).

pub mod render;

use std::io::Write;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use kesoku_core::{DeliveryRecord, Message, MessageFilter, MessageId, MessageType, SessionId, Status};
use kesoku_gateway::{Gateway, ListenFrom};
use tokio::sync::mpsc::UnboundedReceiver;

pub use render::{RenderMode, Renderer};

use crate::answer::{OutboundPart, Part};
use crate::control::{SessionControl, TurnStop};
use crate::{Capabilities, Chatbot, ChatbotError, Delivered, Deliverer, DeliveryError};

/// The CLI chatbot's id.
pub const CLI_CHATBOT: &str = "cli";
/// The CLI's one channel.
pub const CLI_CHANNEL: &str = "cli";
/// The sender of the CLI's user messages.
pub const CLI_SENDER: &str = "User";

/// How a followed turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnOutcome {
    /// Answered (root `processed`).
    Processed,
    /// Stopped (root `interrupted`): by Ctrl-C, `/stop`, or a newer message.
    Interrupted,
    /// Failed (root `error`); the error notification was shown.
    Failed,
    /// The worker running it shut down and handed it back (`pending_agent`): it runs again
    /// when a worker is next available.
    Requeued,
    /// The user stopped waiting (second interrupt); the turn may go on elsewhere.
    Detached,
}

/// Where output goes: the real terminal (spinner possible) or any writer (tests).
enum Sink {
    Stdout,
    Writer(Box<dyn Write + Send>),
}

impl Sink {
    fn write(&mut self, text: &str) -> std::io::Result<()> {
        match self {
            Sink::Stdout => {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()
            }
            Sink::Writer(writer) => {
                writer.write_all(text.as_bytes())?;
                writer.flush()
            }
        }
    }
}

/// The spinner line while a turn runs.
struct SpinnerLine {
    label: String,
    started: Instant,
    frame: usize,
}

/// The output and the spinner share one lock, so a message and a spinner frame never
/// interleave.
struct Screen {
    sink: Sink,
    spinner: Option<SpinnerLine>,
    /// The spinner is on screen (the cursor is at the end of its line).
    drawn: bool,
    /// A ticker thread is running.
    ticking: bool,
}

impl Screen {
    fn clear_spinner(&mut self) -> std::io::Result<()> {
        if self.drawn {
            self.drawn = false;
            self.sink.write(CLEAR_LINE)?;
        }
        Ok(())
    }

    fn draw_spinner(&mut self) -> std::io::Result<()> {
        let Some(spinner) = &mut self.spinner else { return Ok(()) };
        let frame = SPINNER_FRAMES[spinner.frame % SPINNER_FRAMES.len()];
        spinner.frame += 1;
        let elapsed = spinner.started.elapsed().as_secs_f64();
        let line = format!(
            "{CLEAR_LINE}{} {} {}",
            console::style(frame).cyan().force_styling(true),
            spinner.label,
            console::style(format!("{elapsed:.1}s")).dim().force_styling(true)
        );
        self.drawn = true;
        self.sink.write(&line)
    }
}

/// Back to the line's start and erase it.
const CLEAR_LINE: &str = "\r\x1b[2K";
const SPINNER_FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
const SPINNER_TICK: Duration = Duration::from_millis(100);

/// The terminal chatbot.
pub struct CliChatbot {
    renderer: Renderer,
    // Short sections only (one write), never held across an await; shared with the spinner's
    // ticker thread.
    screen: Arc<Mutex<Screen>>,
}

impl std::fmt::Debug for CliChatbot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CliChatbot").field("renderer", &self.renderer).finish()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl CliChatbot {
    /// Print to standard output, as wide as the terminal (80 columns when unknown).
    pub fn stdout(mode: RenderMode) -> Self {
        let columns = console::Term::stdout().size_checked().map_or(80, |(_, columns)| usize::from(columns));
        Self::new(mode, columns, Sink::Stdout)
    }

    /// Print to `writer` (no spinner).
    pub fn with_writer(mode: RenderMode, columns: usize, writer: Box<dyn Write + Send>) -> Self {
        Self::new(mode, columns, Sink::Writer(writer))
    }

    fn new(mode: RenderMode, columns: usize, sink: Sink) -> Self {
        CliChatbot {
            renderer: Renderer::new(mode, columns),
            screen: Arc::new(Mutex::new(Screen { sink, spinner: None, drawn: false, ticking: false })),
        }
    }

    pub fn renderer(&self) -> &Renderer {
        &self.renderer
    }

    /// Write text as is; the spinner, if any, moves below it.
    pub fn print(&self, text: &str) -> Result<(), ChatbotError> {
        Ok(self.print_io(text)?)
    }

    /// [`Self::print`] with the terminal's error as it is.
    fn print_io(&self, text: &str) -> std::io::Result<()> {
        let mut screen = lock(&self.screen);
        screen.clear_spinner()?;
        screen.sink.write(text)?;
        screen.draw_spinner()
    }

    /// A notice line (command replies, "interrupted").
    pub fn notice(&self, text: &str) -> Result<(), ChatbotError> {
        self.print(&self.renderer.notice(text))
    }

    /// A quiet hint line.
    pub fn hint(&self, text: &str) -> Result<(), ChatbotError> {
        self.print(&self.renderer.dim(text))
    }

    /// Show a spinner with `label` and the elapsed time (terminal output in rich mode only).
    pub fn start_spinner(&self, label: &str) {
        let mut screen = lock(&self.screen);
        if self.renderer.mode != RenderMode::Rich || !matches!(screen.sink, Sink::Stdout) {
            return;
        }
        match &mut screen.spinner {
            Some(spinner) => spinner.label = label.to_owned(),
            None => screen.spinner = Some(SpinnerLine { label: label.to_owned(), started: Instant::now(), frame: 0 }),
        }
        let _ = screen.draw_spinner();
        if !screen.ticking {
            screen.ticking = true;
            let shared = Arc::clone(&self.screen);
            std::thread::spawn(move || tick(&shared));
        }
    }

    /// Change the spinner's label, keeping its clock.
    pub fn spinner_label(&self, label: &str) {
        let mut screen = lock(&self.screen);
        if let Some(spinner) = &mut screen.spinner {
            spinner.label = label.to_owned();
            let _ = screen.draw_spinner();
        }
    }

    pub fn stop_spinner(&self) {
        let mut screen = lock(&self.screen);
        let _ = screen.clear_spinner();
        screen.spinner = None;
    }

    /// Deliver what this session still has waiting for the CLI (answers a previous run never
    /// showed, notifications posted while nobody was at the prompt).
    pub async fn deliver_outstanding(
        &self,
        deliverer: &Deliverer,
        session_id: &SessionId,
    ) -> Result<usize, ChatbotError> {
        let waiting = deliverer
            .gateway()
            .store()
            .list_messages(
                &MessageFilter::session(session_id)
                    .with_chatbot(CLI_CHATBOT)
                    .with_statuses(&[Status::Pending, Status::Responded]),
            )
            .await?;
        let mut shown = 0;
        for message in &waiting {
            if deliverer.deliver(self, message).await? == Delivered::Shown {
                shown += 1;
            }
        }
        Ok(shown)
    }

    /// Render the turn of `root_id` as it happens, until the root message ends.
    ///
    /// `after_rev` is the store revision taken before the root was posted, so nothing of the
    /// turn is missed. The first message on `interrupts` asks `control` to stop the session;
    /// a second stops waiting ([`TurnOutcome::Detached`]).
    pub async fn follow_turn(
        &self,
        deliverer: &Deliverer,
        session_id: &SessionId,
        root_id: &MessageId,
        after_rev: i64,
        control: &dyn SessionControl,
        interrupts: &mut UnboundedReceiver<()>,
    ) -> Result<TurnOutcome, ChatbotError> {
        let result = self.follow_turn_inner(deliverer, session_id, root_id, after_rev, control, interrupts).await;
        self.stop_spinner();
        result
    }

    async fn follow_turn_inner(
        &self,
        deliverer: &Deliverer,
        session_id: &SessionId,
        root_id: &MessageId,
        after_rev: i64,
        control: &dyn SessionControl,
        interrupts: &mut UnboundedReceiver<()>,
    ) -> Result<TurnOutcome, ChatbotError> {
        let gateway: &Gateway = deliverer.gateway();
        let mut events = pin!(gateway.listen(MessageFilter::session(session_id), ListenFrom::AfterRev(after_rev)));
        self.start_spinner("thinking…");
        let mut stop_requested = false;
        let mut interrupts_open = true;
        let mut root_started = false;
        loop {
            let event = tokio::select! {
                signal = interrupts.recv(), if interrupts_open => {
                    if signal.is_none() {
                        interrupts_open = false;
                        continue;
                    }
                    if stop_requested {
                        self.notice("Stopped waiting; the turn may still finish (see `kesoku history`).")?;
                        return Ok(TurnOutcome::Detached);
                    }
                    stop_requested = true;
                    self.spinner_label("stopping…");
                    let ack = control.stop_session(session_id).await?;
                    if let TurnStop::Unreachable(reason) = ack.turn {
                        self.notice(&format!("{reason} Press Ctrl-C again to stop waiting."))?;
                    }
                    continue;
                }
                event = events.next() => event,
            };
            let message = match event {
                None => return Err(ChatbotError::StreamClosed),
                Some(Err(error)) => {
                    tracing::warn!(%error, "reading the turn's messages failed; catching up");
                    continue;
                }
                Some(Ok(event)) => event.message,
            };
            if message.id == *root_id {
                match message.status {
                    Status::Processing => root_started = true,
                    // An agent of a round passed and the next one is asked: keep waiting. (A
                    // shutdown in the middle of a round is waited through too: the next start
                    // finishes it, or a second Ctrl-C stops waiting.)
                    Status::PendingAgent if root_started && in_round(&message) => root_started = false,
                    Status::Processed => return Ok(TurnOutcome::Processed),
                    Status::Interrupted => {
                        self.notice("⏹ Interrupted.")?;
                        return Ok(TurnOutcome::Interrupted);
                    }
                    Status::Error => return Ok(TurnOutcome::Failed),
                    Status::PendingAgent if root_started => {
                        self.notice("The worker running this turn shut down; it will run again when one is back.")?;
                        return Ok(TurnOutcome::Requeued);
                    }
                    Status::PendingAgent | Status::Pending | Status::Responded | Status::Delivered => {}
                }
                continue;
            }
            if deliverer.deliver(self, &message).await? == Delivered::Shown {
                match (message.message_type, message.status) {
                    (MessageType::ToolCall, _) => {
                        let name = message.metadata.tool_name.as_deref().unwrap_or("a tool");
                        self.spinner_label(&format!("running {name}…"));
                    }
                    (MessageType::ToolResult | MessageType::Thought, _) => self.spinner_label("thinking…"),
                    (MessageType::Text, _) => {}
                }
            }
        }
    }
}

#[async_trait]
impl Chatbot for CliChatbot {
    fn chatbot_id(&self) -> &str {
        CLI_CHATBOT
    }

    /// The terminal shows every step (spec §4.3) and whole answers: no length limit, no
    /// buttons (a question is a numbered list), files named rather than uploaded.
    fn capabilities(&self) -> Capabilities {
        Capabilities { shows_intermediates: true, ..Capabilities::text_only(usize::MAX) }
    }

    async fn show_step(&self, step: &Message) -> Result<(), DeliveryError> {
        self.show(step)?;
        Ok(())
    }

    /// Each part is printed as the renderer shows the message, without the turn's figures and
    /// without the blank line after: both come once, after the last part ([`Self::on_delivered`]),
    /// so an answer with several parts reads as one block.
    async fn send_part(&self, message: &Message, part: &OutboundPart) -> Result<String, DeliveryError> {
        let text = match &part.part {
            Part::Text(text) => text.clone(),
            Part::File { path, .. } => format!("📎 {}", path.display()),
            Part::Question { prompt, options } => {
                let numbered: Vec<String> =
                    options.iter().enumerate().map(|(n, o)| format!("{}. {o}", n + 1)).collect();
                format!("{prompt}\n{}", numbered.join("\n"))
            }
        };
        let mut shown = Message { content: text, ..message.clone() };
        shown.metadata.turn_metrics = None;
        if let Some(rendered) = self.renderer.render(&shown) {
            self.print_io(&rendered)?;
        }
        Ok(part.key.clone())
    }

    async fn on_delivered(&self, message: &Message, _sent: &[DeliveryRecord]) -> Result<(), DeliveryError> {
        if self.renderer.render(message).is_none() {
            return Ok(());
        }
        let figures = message.metadata.turn_metrics.as_ref().map(|metrics| self.renderer.metrics_line(metrics));
        self.print_io(&format!("{}\n", figures.unwrap_or_default()))?;
        Ok(())
    }
}

impl CliChatbot {
    /// Print one message as the renderer shows it, with a blank line after (panels and
    /// answers stay apart).
    fn show(&self, message: &Message) -> std::io::Result<()> {
        if let Some(text) = self.renderer.render(message) {
            self.print_io(&format!("{text}\n"))?;
        }
        Ok(())
    }
}

/// Redraw the spinner until it is stopped.
fn tick(screen: &Mutex<Screen>) {
    loop {
        std::thread::sleep(SPINNER_TICK);
        let mut screen = lock(screen);
        if screen.spinner.is_none() {
            screen.ticking = false;
            return;
        }
        // A terminal that went away ends the spinner, not the program.
        if screen.draw_spinner().is_err() {
            screen.spinner = None;
            screen.ticking = false;
            return;
        }
    }
}

/// Whether a root is in a round of several agents: a pass writes the round (and the next agent)
/// onto the root before it goes back to `pending_agent`.
fn in_round(root: &Message) -> bool {
    root.metadata.activation.as_ref().is_some_and(|request| request.orchestration.is_some())
}
