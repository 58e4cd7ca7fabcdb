//! `kesoku grants set|list|remove`: people's connections (tokens) that tools use when the agent
//! works on their behalf (an activation's delegation user).
//!
//! A secret comes in through standard input (no echo on a terminal) or `--from-env VAR`, never
//! through argv, and goes out only to the store: nothing here prints it, and listings show
//! names and times only.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{Context, bail};
use kesoku_core::check_grant_key;

use crate::cli::GrantsCommand;
use crate::config::Config;
use crate::wiring;

pub async fn run(config: &Config, command: GrantsCommand) -> anyhow::Result<ExitCode> {
    match command {
        GrantsCommand::Set { user, name, from_env } => {
            // The key is checked before a secret is asked for.
            check_grant_key(&user, &name)?;
            let secret = match from_env {
                Some(var) => std::env::var(&var).with_context(|| {
                    format!("environment variable `{var}` is not set (or not UTF-8): export it, or pipe the secret in")
                })?,
                None => read_secret(&user, &name)?,
            };
            let secret = secret.trim_end_matches(['\r', '\n']).to_owned();
            if secret.trim().is_empty() {
                bail!("the secret for `{user}`/`{name}` is empty: nothing was stored");
            }
            let handle = wiring::open_store(config, false).await?;
            let replaced = handle.store.grant_secret(&user, &name).await?.is_some();
            handle.store.set_grant(&user, &name, &secret).await?;
            println!("{} connection `{name}` for `{user}`", if replaced { "replaced" } else { "stored" });
            Ok(ExitCode::SUCCESS)
        }
        GrantsCommand::List { user, json } => {
            let handle = wiring::open_store(config, false).await?;
            let grants = handle.store.list_grants(user.as_deref()).await?;
            if grants.is_empty() && !json {
                match &user {
                    Some(user) => {
                        println!("`{user}` has no connections (add one with `kesoku grants set {user} NAME`)")
                    }
                    None => println!("no connections (add one with `kesoku grants set USER NAME`)"),
                }
            }
            for grant in grants {
                if json {
                    println!("{}", serde_json::to_string(&grant)?);
                } else {
                    println!(
                        "{}  {}  set {}  updated {}",
                        grant.user_id,
                        grant.name,
                        grant.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
                        grant.updated_at.format("%Y-%m-%d %H:%M:%S UTC")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        GrantsCommand::Remove { user, name } => {
            let handle = wiring::open_store(config, false).await?;
            if !handle.store.remove_grant(&user, &name).await? {
                bail!("`{user}` has no connection `{name}`: `kesoku grants list {user}` shows theirs");
            }
            println!("removed connection `{name}` of `{user}`");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// One line of standard input; on a terminal, prompted for and read without echo.
fn read_secret(user: &str, name: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    let mut line = String::new();
    if stdin.is_terminal() {
        eprint!("secret for `{user}`/`{name}` (not shown): ");
        std::io::stderr().flush().ok();
        let _echo = EchoOff::new(&stdin);
        stdin.lock().read_line(&mut line).context("reading the secret from the terminal")?;
        eprintln!();
    } else {
        stdin.lock().read_line(&mut line).context("reading the secret from standard input")?;
    }
    Ok(line)
}

/// Terminal echo switched off while it lives (restored on drop, also on error).
struct EchoOff {
    saved: Option<nix::sys::termios::Termios>,
}

impl EchoOff {
    fn new(stdin: &std::io::Stdin) -> Self {
        use nix::sys::termios::{LocalFlags, SetArg, tcgetattr, tcsetattr};
        let Ok(saved) = tcgetattr(stdin) else { return EchoOff { saved: None } };
        let mut quiet = saved.clone();
        quiet.local_flags.remove(LocalFlags::ECHO);
        quiet.local_flags.insert(LocalFlags::ECHONL);
        match tcsetattr(stdin, SetArg::TCSANOW, &quiet) {
            Ok(()) => EchoOff { saved: Some(saved) },
            Err(_) => EchoOff { saved: None },
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSANOW, saved);
        }
    }
}
