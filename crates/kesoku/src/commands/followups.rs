//! `kesoku followups`: the follow-ups the agent scheduled, soonest due first, and
//! `kesoku followups cancel ID`.
//!
//! Times are shown in `[agent] timezone`, else UTC. Cancelling works while the service runs:
//! its scheduler reads a follow-up's state again right before firing it.

use std::process::ExitCode;

use kesoku_agent::followups::{FollowUpError, cancel, format_local};
use kesoku_core::{FollowUpFilter, FollowUpId, FollowUpState, SessionId};

use crate::cli::{FollowupsArgs, FollowupsCommand};
use crate::config::Config;
use crate::wiring;

pub async fn run(config: &Config, args: &FollowupsArgs) -> anyhow::Result<ExitCode> {
    let handle = wiring::open_store(config, false).await?;
    let zone = wiring::local_zone(config);
    if let Some(FollowupsCommand::Cancel { id }) = &args.command {
        let id = FollowUpId::from(id.trim());
        return match cancel(handle.store.as_ref(), &id, None, zone).await {
            Ok(followup) => {
                println!(
                    "cancelled {} (due {}): {}",
                    followup.id,
                    format_local(followup.due_at, zone),
                    one_line(&followup.task)
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(FollowUpError::NotFound { id }) => {
                anyhow::bail!("there is no follow-up `{id}`: `kesoku followups --all` lists them")
            }
            Err(error) => Err(error.into()),
        };
    }
    let filter = FollowUpFilter {
        session_id: args.session.as_deref().map(SessionId::from),
        state: (!args.all).then_some(FollowUpState::Pending),
        ..FollowUpFilter::default()
    };
    let followups = handle.store.list_followups(&filter).await?;
    if followups.is_empty() && !args.json {
        println!("{}", if args.all { "no follow-ups" } else { "no pending follow-ups" });
    }
    for followup in followups {
        if args.json {
            println!("{}", serde_json::to_string(&followup)?);
            continue;
        }
        let state = if args.all { format!("{:<9}  ", followup.state) } else { String::new() };
        println!(
            "{}  {}  {state}session {}  {}",
            followup.id,
            format_local(followup.due_at, zone),
            followup.session_id,
            one_line(&followup.task)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A task on one line of the listing.
fn one_line(task: &str) -> String {
    task.split_whitespace().collect::<Vec<_>>().join(" ")
}
