//! `kesoku chat` driven through a real pseudo-terminal, as a person would use it: the screen is
//! read back through a terminal emulator (`vt100`), like `tmux capture-pane`. Every wait is
//! bounded and polls the screen; nothing sleeps for a fixed time as an assertion.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kesoku_core::{Message, MessageType, Role, Status};
use kesoku_test_support::mock_llm::{MOCK_API_KEY, MockAnswer, MockPart, MockReply, MockServer, Vendor};
use portable_pty::{Child, CommandBuilder, MasterPty, PtySize, native_pty_system};
use serde_json::json;

use crate::support::{Workspace, mock_model, stderr, stdout};

const KEY: (&str, &str) = ("KESOKU_TEST_MOCK_KEY", MOCK_API_KEY);
const ROWS: u16 = 60;
const COLS: u16 = 110;
/// Longest any single wait may take (a debug binary on a loaded CI machine).
const WAIT: Duration = Duration::from_secs(20);
const PROMPT: &str = "you ›";

/// A program running on a pseudo-terminal, its output kept on an emulated screen.
pub struct Terminal {
    screen: Arc<Mutex<vt100::Parser>>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn Child + Send + Sync>,
    _master: Box<dyn MasterPty + Send>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Terminal {
    /// Run `kesoku -c CONFIG args…` in the workspace on a fresh terminal.
    pub fn spawn(workspace: &Workspace, args: &[&str], env: &[(&str, &str)]) -> Terminal {
        let pair = native_pty_system()
            .openpty(PtySize { rows: ROWS, cols: COLS, pixel_width: 0, pixel_height: 0 })
            .expect("open a pseudo-terminal");
        let mut command = CommandBuilder::new(env!("CARGO_BIN_EXE_kesoku"));
        command.arg("-c");
        command.arg(&workspace.config);
        command.args(args);
        command.cwd(workspace.path());
        command.env("TERM", "xterm-256color");
        command.env_remove("NO_COLOR");
        command.env_remove("KESOKU_CONFIG");
        for (key, value) in env {
            command.env(key, value);
        }
        let child = pair.slave.spawn_command(command).expect("spawn kesoku on the terminal");
        // Only the child keeps the terminal's other end open, so its exit ends our reads.
        drop(pair.slave);
        let screen = Arc::new(Mutex::new(vt100::Parser::new(
            ROWS.try_into().expect("rows"),
            COLS.try_into().expect("columns"),
            0,
        )));
        let mut reader = pair.master.try_clone_reader().expect("terminal reader");
        let writer = pair.master.take_writer().expect("terminal writer");
        {
            let screen = Arc::clone(&screen);
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(read) = reader.read(&mut buffer) {
                    if read == 0 {
                        return;
                    }
                    lock(&screen).process(&buffer[..read]);
                }
            });
        }
        Terminal { screen, writer, child, _master: pair.master }
    }

    /// The visible screen as text.
    pub fn contents(&self) -> String {
        lock(&self.screen).screen().contents()
    }

    /// The text of the cursor's row.
    fn cursor_line(&self) -> String {
        let parser = lock(&self.screen);
        let screen = parser.screen();
        let (row, _) = screen.cursor_position();
        screen.rows(0, COLS).nth(usize::from(row)).unwrap_or_default()
    }

    /// Where `text` first appears on screen, as (row, column).
    pub fn find(&self, text: &str) -> Option<(u16, u16)> {
        let parser = lock(&self.screen);
        for (row, line) in parser.screen().rows(0, COLS).enumerate() {
            if let Some(byte) = line.find(text) {
                let column = line[..byte].chars().count();
                return Some((row as u16, column as u16));
            }
        }
        None
    }

    /// The foreground colour of a cell.
    pub fn color_at(&self, row: u16, column: u16) -> vt100::Color {
        lock(&self.screen).screen().cell(row, column).map_or(vt100::Color::Default, |cell| cell.fgcolor())
    }

    /// Wait until `condition` holds for the screen.
    pub async fn wait_until(&self, what: &str, condition: impl Fn(&Terminal) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !condition(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}; the screen:\n{}", self.contents());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Wait until `text` is on screen.
    pub async fn wait_for(&self, text: &str) {
        self.wait_until(&format!("{text:?}"), |terminal| terminal.contents().contains(text)).await;
    }

    /// Wait until the prompt waits for input on the cursor's line.
    pub async fn wait_for_prompt(&self) {
        self.wait_until("an empty prompt", |terminal| terminal.cursor_line().trim_end() == PROMPT).await;
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("type on the terminal");
        self.writer.flush().expect("flush the terminal");
    }

    /// Type a line and press Enter.
    pub fn type_line(&mut self, line: &str) {
        self.send(format!("{line}\r").as_bytes());
    }

    /// Wait for the program to exit; its exit code.
    pub async fn wait_exit(&mut self) -> u32 {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("child status") {
                return status.exit_code();
            }
            assert!(Instant::now() < deadline, "kesoku did not exit; the screen:\n{}", self.contents());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
    }
}

async fn init(workspace: &Workspace) {
    let output = workspace.run(&["init"], &[]).await;
    assert!(output.status.success(), "init failed: {}", stderr(&output));
}

/// The latest `cli` session's messages in phased order.
pub async fn session_messages(workspace: &Workspace, session: &str) -> Vec<Message> {
    let show = workspace.run(&["history", "show", session, "--json"], &[]).await;
    assert!(show.status.success(), "{}", stderr(&show));
    serde_json::from_slice(&show.stdout).expect("history --json is a list of messages")
}

/// Session ids of `kesoku chat -l`, newest first, the active one marked.
async fn chat_sessions(workspace: &Workspace) -> Vec<(bool, String)> {
    let list = workspace.run(&["chat", "-l"], &[]).await;
    assert!(list.status.success(), "{}", stderr(&list));
    stdout(&list)
        .lines()
        .filter_map(|line| {
            let active = line.starts_with('*');
            line[1..].split_whitespace().next().map(|id| (active, id.to_owned()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_repl_shows_coloured_panels_markdown_and_metrics_then_exits_on_ctrl_d() {
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![
            MockReply::Answer(MockAnswer::parts(vec![
                MockPart::thought("Let me compute this with the shell.", None),
                MockPart::tool_call("call_1", "run_shell_command", json!({"command": "echo $((25 + 15))"})),
            ])),
            MockReply::text("The answer is **40**."),
        ],
    )
    .await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()));
    init(&workspace).await;
    let mut terminal = Terminal::spawn(&workspace, &["chat"], &[KEY]);
    terminal.wait_for_prompt().await;
    terminal.type_line("What is 25 + 15?");
    terminal.wait_for("[turn 1 ·").await;

    let screen = terminal.contents();
    assert!(screen.contains("💭 Thought") && screen.contains("Let me compute this with the shell."), "{screen}");
    assert!(screen.contains("🔧 run_shell_command") && screen.contains("$ echo $((25 + 15))"), "{screen}");
    assert!(screen.contains("✅ run_shell_command") && screen.contains("=== STDOUT ==="), "{screen}");
    assert!(screen.contains("1 tool call"), "the metrics line: {screen}");
    // Markdown is rendered: the emphasis markers are gone, the text stays.
    assert!(screen.contains("The answer is 40.") && !screen.contains("**40**"), "{screen}");
    // Panel borders in the spec's colours: thoughts cyan, tool calls yellow, results magenta.
    for (title, color) in [("💭 Thought", 6), ("🔧 run_shell_command", 3), ("✅ run_shell_command", 5)] {
        let (row, column) = terminal.find(title).expect("panel title on screen");
        assert_eq!(terminal.color_at(row, column.saturating_sub(3)), vt100::Color::Idx(color), "{title}");
    }
    terminal.wait_for_prompt().await;
    terminal.send(b"\x04");
    assert_eq!(terminal.wait_exit().await, 0, "Ctrl-D exits cleanly:\n{}", terminal.contents());

    let sessions = chat_sessions(&workspace).await;
    let messages = session_messages(&workspace, &sessions[0].1).await;
    let shape: Vec<(MessageType, Status)> = messages.iter().map(|m| (m.message_type, m.status)).collect();
    assert_eq!(
        shape,
        vec![
            (MessageType::Text, Status::Processed),
            (MessageType::Thought, Status::Delivered),
            (MessageType::ToolCall, Status::Delivered),
            (MessageType::ToolResult, Status::Delivered),
            (MessageType::Text, Status::Delivered),
        ],
        "every step printed is marked delivered"
    );
    let history = std::fs::read_to_string(workspace.path().join(".kesoku/chat_history")).expect("a history file");
    assert!(history.contains("What is 25 + 15?"), "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_a_turn_interrupts_the_turn_not_the_program() {
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![
            MockReply::HangAfter {
                answer: MockAnswer::text("I am thinking about this for a very long time"),
                events: 1,
            },
            MockReply::text("Second answer."),
        ],
    )
    .await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()));
    init(&workspace).await;
    let mut terminal = Terminal::spawn(&workspace, &["chat"], &[KEY]);
    terminal.wait_for_prompt().await;
    terminal.type_line("Tell me a long story");
    terminal.wait_for("thinking…").await;
    // The model call is under way (the mock holds the stream open) before Ctrl-C.
    let deadline = Instant::now() + WAIT;
    while server.requests().is_empty() {
        assert!(Instant::now() < deadline, "the model was never called");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    terminal.send(b"\x03");
    terminal.wait_for("⏹ Interrupted.").await;
    terminal.wait_for_prompt().await;
    assert!(server.wait_for_disconnects(1, WAIT).await, "the model stream was dropped");

    terminal.type_line("Try again");
    terminal.wait_for("Second answer.").await;
    terminal.wait_for_prompt().await;
    terminal.send(b"\x04");
    assert_eq!(terminal.wait_exit().await, 0);

    let sessions = chat_sessions(&workspace).await;
    let messages = session_messages(&workspace, &sessions[0].1).await;
    let roots: Vec<(&str, Status)> =
        messages.iter().filter(|m| m.role == Role::User).map(|m| (m.content.as_str(), m.status)).collect();
    assert_eq!(roots, vec![("Tell me a long story", Status::Interrupted), ("Try again", Status::Processed)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_commands_answer_locally_and_compact_posts_the_trigger() {
    let server = MockServer::start(Vendor::OpenAi, vec![MockReply::text("Summary of the conversation.")]).await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()));
    init(&workspace).await;
    let mut terminal = Terminal::spawn(&workspace, &["chat"], &[KEY]);
    terminal.wait_for_prompt().await;

    terminal.type_line("/help");
    terminal.wait_for("/compact").await;
    terminal.wait_for_prompt().await;
    terminal.type_line("/frobnicate");
    terminal.wait_for("Unknown command `/frobnicate`").await;
    terminal.wait_for_prompt().await;
    terminal.type_line("/status");
    terminal.wait_for("No turn has finished in this session yet.").await;
    terminal.wait_for_prompt().await;
    assert!(server.requests().is_empty(), "commands never reach the model");

    terminal.type_line("/compact");
    terminal.wait_for("Compaction requested").await;
    terminal.wait_for_prompt().await;
    terminal.type_line("/clear");
    terminal.wait_for("Started a new session").await;
    terminal.wait_for_prompt().await;
    terminal.type_line("/sessions");
    terminal.wait_for("newest first").await;
    terminal.wait_for_prompt().await;
    terminal.send(b"\x04");
    assert_eq!(terminal.wait_exit().await, 0);

    let sessions = chat_sessions(&workspace).await;
    assert_eq!(sessions.len(), 2, "/clear made a second session: {sessions:?}");
    assert!(sessions[0].0, "the new session is the active one: {sessions:?}");
    let old = session_messages(&workspace, &sessions[1].1).await;
    let trigger = old.iter().find(|m| m.metadata.is_compaction == Some(true)).expect("the compaction trigger");
    assert_eq!((trigger.role, trigger.sender.as_str()), (Role::User, "System"));
    assert_eq!(
        trigger.content,
        "[System Notification] The user manually requested compaction of the conversation history."
    );
    assert!(old.iter().all(|m| !m.content.starts_with('/')), "no command was stored as a message");
}

#[tokio::test]
async fn one_shot_turns_resume_choose_and_list_sessions_and_stage_attachments() {
    let server = MockServer::start(
        Vendor::OpenAi,
        vec![
            MockReply::text("First."),
            MockReply::text("Second."),
            MockReply::text("Third."),
            MockReply::text("Fourth."),
        ],
    )
    .await;
    let workspace = Workspace::with_config(&mock_model(&server.base_url()));
    init(&workspace).await;
    let notes = workspace.path().join("notes.txt");
    std::fs::write(&notes, "remember the milk").expect("write an attachment");
    let notes_text = notes.display().to_string();

    let first = workspace.run(&["chat", "--attach", &notes_text, "Read my notes"], &[KEY]).await;
    assert!(first.status.success(), "{}", stderr(&first));
    assert!(stdout(&first).contains("First."), "{}", stdout(&first));
    assert!(!stdout(&first).contains('\u{1b}'), "plain output when stdout is not a terminal");
    let resumed = workspace.run(&["chat", "-z", "And now?"], &[KEY]).await;
    assert!(resumed.status.success(), "{}", stderr(&resumed));

    let sessions = chat_sessions(&workspace).await;
    assert_eq!(sessions.len(), 1, "-z continued the latest session: {sessions:?}");
    let session = sessions[0].1.clone();
    let messages = session_messages(&workspace, &session).await;
    let prompts: Vec<&str> = messages.iter().filter(|m| m.role == Role::User).map(|m| m.content.as_str()).collect();
    assert_eq!(prompts, vec!["Read my notes", "And now?"]);
    let attachment = &messages[0].attachments()[0];
    assert_eq!((attachment.filename.as_str(), attachment.mime_type.as_str()), ("notes.txt", "text/plain"));
    let staged = workspace.path().join(".kesoku").join(&attachment.path);
    assert_eq!(std::fs::read_to_string(&staged).expect("the staged copy"), "remember the milk");
    assert!(staged.starts_with(workspace.path().join(".kesoku/sessions").join(&session)), "{}", staged.display());

    // A new session, then back to the first one by id.
    let fresh = workspace.run(&["chat", "Something else"], &[KEY]).await;
    assert!(fresh.status.success(), "{}", stderr(&fresh));
    let sessions = chat_sessions(&workspace).await;
    assert_eq!(sessions.len(), 2);
    assert!(sessions[0].0 && sessions[0].1 != session, "the newest is active: {sessions:?}");
    let missing = workspace.path().join("no-such-file.txt").display().to_string();
    let unreadable = workspace.run(&["chat", "--attach", &missing, "Read this"], &[KEY]).await;
    assert!(!unreadable.status.success());
    assert!(stderr(&unreadable).contains("cannot attach") && stderr(&unreadable).contains("no-such-file.txt"));
    assert_eq!(chat_sessions(&workspace).await.len(), 3, "a new session, but nothing posted into it");
    let unknown = workspace.run(&["chat", "--session", "sess_nope", "hi"], &[KEY]).await;
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("no session `sess_nope`"), "{}", stderr(&unknown));
    let chosen = workspace.run(&["chat", "-l"], &[]).await;
    assert!(stdout(&chosen).contains("Read my notes"), "the list shows first prompts: {}", stdout(&chosen));
    let back = workspace.run(&["chat", "--session", &session, "One more"], &[KEY]).await;
    assert!(back.status.success() && stdout(&back).contains("Fourth."), "{}", stderr(&back));
    let sessions = chat_sessions(&workspace).await;
    assert!(sessions.iter().any(|(active, id)| *active && *id == session), "--session activates it: {sessions:?}");
    let prompts = session_messages(&workspace, &session).await.into_iter().filter(|m| m.role == Role::User).count();
    assert_eq!(prompts, 3);
}
