//! `kesoku ledger`: the execution ledger, newest first.

use std::process::ExitCode;

use kesoku_core::SessionId;
use kesoku_store::LedgerFilter;

use crate::cli::LedgerArgs;
use crate::config::Config;
use crate::wiring;

pub async fn run(config: &Config, args: &LedgerArgs) -> anyhow::Result<ExitCode> {
    let handle = wiring::open_store(config, false).await?;
    let filter = LedgerFilter {
        session_id: args.session.as_deref().map(SessionId::from),
        only_unsuccessful: args.failed,
        limit: Some(args.limit),
    };
    let rows = handle.ledger.list_activations(&filter).await?;
    if rows.is_empty() && !args.json {
        println!("no activations recorded");
    }
    for row in rows {
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
            continue;
        }
        let duration = match (row.started_at, row.finished_at) {
            (Some(start), Some(end)) => format!("{:.2}s", (end - start).num_milliseconds() as f64 / 1000.0),
            (Some(_), None) => "running".to_owned(),
            (None, _) => "queued".to_owned(),
        };
        println!(
            "{}  {}  {:<11} {:<7} {:<14} {:>8}  calls {}/{} tokens {}  by {}  session {}{}",
            row.id,
            row.enqueued_at.format("%Y-%m-%d %H:%M:%S"),
            row.lane,
            row.kind,
            row.outcome.map_or("-".to_owned(), |o| o.to_string()),
            duration,
            row.usage.model_calls,
            row.usage.tool_calls,
            row.usage.total_tokens(),
            row.triggered_by,
            row.session_id,
            row.error.map(|e| format!("  error: {e}")).unwrap_or_default(),
        );
    }
    Ok(ExitCode::SUCCESS)
}
