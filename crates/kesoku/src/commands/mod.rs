//! One module per subcommand.

mod chat;
mod followups;
mod grants;
mod history;
mod init;
mod jobs;
mod ledger;
mod models;
mod service;
mod start;

use std::process::ExitCode;

use crate::cli::{Cli, Command, ModelsCommand, WechatCommand};
use crate::config::Config;

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Init(args) => init::run(&cli.config, &args).await,
        // A first `kesoku chat` with no config sets up the default one (as `kesoku init` would)
        // and answers: one command from a fresh checkout to an answer.
        Command::Chat(args) if !cli.config.exists() => chat::run(&init::first_run(&cli.config).await?, &args).await,
        Command::Chat(args) => chat::run(&Config::load(&cli.config)?, &args).await,
        Command::Start(args) => start::run(&Config::load(&cli.config)?, &args).await,
        Command::Service(command) => service::run(&Config::load(&cli.config)?, command).await,
        Command::History(command) => history::run(&Config::load(&cli.config)?, command).await,
        Command::Ledger(args) => ledger::run(&Config::load(&cli.config)?, &args).await,
        Command::Jobs(args) => jobs::run(&Config::load(&cli.config)?, &args).await,
        Command::Followups(args) => followups::run(&Config::load(&cli.config)?, &args).await,
        // With --dir, pulling a model needs no config (a fresh machine, CI caches).
        Command::Models(ModelsCommand::Pull { source, dir: Some(dir) }) => {
            println!("{}", models::pull_into(&source, &dir).await?.path.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Models(command) => models::run(&Config::load(&cli.config)?, command).await,
        Command::Wechat(WechatCommand::Pair { id }) => {
            crate::platforms::wechat::pair(&Config::load(&cli.config)?, id.as_deref()).await
        }
        Command::Grants(command) => grants::run(&Config::load(&cli.config)?, command).await,
    }
}
