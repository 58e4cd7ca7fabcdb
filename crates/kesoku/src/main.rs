//! The `kesoku` binary: reads the config and the environment, wires backends and tasks, and
//! runs commands. Library crates never read either; they get what they need from here.

mod cli;
mod commands;
mod config;
mod control;
mod memory;
mod platforms;
mod wiring;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc, counting live bytes for `/metrics` (see `kesoku_alloc`).
#[global_allocator]
static ALLOCATOR: kesoku_alloc::Allocator = kesoku_alloc::Allocator;

fn main() -> ExitCode {
    kesoku_alloc::configure();
    let cli = cli::Cli::parse();
    init_tracing(&cli);
    // The service spreads sessions over every core; a command (a one-shot turn, an interactive
    // chat, a history listing) is one conversation at a time and runs on this thread alone:
    // two fewer threads, each with its own stack and allocator pages, at every start.
    let mut builder = if matches!(cli.command, cli::Command::Start(_)) {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(cli: &cli::Cli) {
    // The service logs its life (start, recovery, shutdown) by default; commands stay quiet.
    let quiet = if matches!(cli.command, cli::Command::Start(_)) { "info" } else { "warn" };
    let default = match cli.verbose {
        0 => quiet,
        1 => "info,kesoku=debug",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("KESOKU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        cli::LogFormat::Json => builder.json().init(),
        cli::LogFormat::Text => builder.init(),
    }
}
