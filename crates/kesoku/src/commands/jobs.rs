//! `kesoku jobs`: background jobs, newest first; `kesoku jobs cancel ID` stops one.
//!
//! It reads the store, so it works whether or not the service runs. Cancelling marks the job
//! `cancelled` first and then signals its process group (which this process may do: jobs run as
//! the same user), so the service watching it posts no wakeup alert for it.

use std::process::ExitCode;

use anyhow::bail;
use kesoku_agent::JobsError;
use kesoku_core::{JobFilter, JobId, SessionId};

use crate::cli::{JobsArgs, JobsCommand};
use crate::config::Config;
use crate::wiring;

pub async fn run(config: &Config, args: &JobsArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        Some(JobsCommand::Cancel { id }) => cancel(config, id).await,
        None => list(config, args).await,
    }
}

async fn list(config: &Config, args: &JobsArgs) -> anyhow::Result<ExitCode> {
    let handle = wiring::open_store(config, false).await?;
    let filter =
        JobFilter { session_id: args.session.as_deref().map(SessionId::from), state: None, limit: Some(args.limit) };
    let jobs = handle.store.list_jobs(&filter).await?;
    if jobs.is_empty() && !args.json {
        println!("no background jobs");
    }
    for job in jobs {
        if args.json {
            println!("{}", serde_json::to_string(&job)?);
            continue;
        }
        println!(
            "{}  {:<9}  {:>4}  {}  {}  {}",
            job.id,
            job.state.as_str(),
            job.exit_code.map_or_else(|| "-".to_owned(), |code| code.to_string()),
            job.started_at.format("%Y-%m-%d %H:%M:%S"),
            job.session_id,
            job.command.trim().replace('\n', " ⏎ "),
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn cancel(config: &Config, id: &str) -> anyhow::Result<ExitCode> {
    let (_handle, gateway) = wiring::open_gateway(config, kesoku_store::Footprint::Command).await?;
    let jobs = wiring::build_jobs(config, &gateway);
    match jobs.cancel(&JobId::from(id), "kesoku jobs cancel").await {
        Ok(job) => {
            println!("cancelled {} (`{}`)", job.id, job.command.trim().replace('\n', " ⏎ "));
            Ok(ExitCode::SUCCESS)
        }
        Err(JobsError::NotRunning(job)) => {
            bail!("job {} is not running: it is {} ({})", job.id, job.state, kesoku_agent::jobs::describe_end(&job))
        }
        Err(error) => Err(error.into()),
    }
}
