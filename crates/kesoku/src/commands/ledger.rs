//! `kesoku ledger`: the execution ledger, newest first, one line per activation (kind, lane,
//! depth, outcome, timings, usage, who triggered it), filtered by session, kind, lane or failure.

use std::process::ExitCode;

use kesoku_core::{LedgerEntry, SessionId};
use kesoku_store::LedgerFilter;

use crate::cli::LedgerArgs;
use crate::config::Config;
use crate::wiring;

pub async fn run(config: &Config, args: &LedgerArgs) -> anyhow::Result<ExitCode> {
    let handle = wiring::open_store(config, false).await?;
    let filter = LedgerFilter {
        session_id: args.session.as_deref().map(SessionId::from),
        only_unsuccessful: args.failed,
        kind: args.kind,
        lane: args.lane,
        limit: Some(args.limit),
    };
    let rows = handle.ledger.list_activations(&filter).await?;
    if rows.is_empty() && !args.json {
        println!("no activations recorded");
    }
    for row in rows {
        if args.json {
            println!("{}", serde_json::to_string(&row)?);
        } else {
            println!("{}", line(&row));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One ledger row as a line: the columns are wide enough for every kind, lane and outcome.
fn line(row: &LedgerEntry) -> String {
    let duration = match (row.started_at, row.finished_at) {
        (Some(start), Some(end)) => format!("{:.2}s", (end - start).num_milliseconds() as f64 / 1000.0),
        (Some(_), None) => "running".to_owned(),
        (None, _) => "queued".to_owned(),
    };
    format!(
        "{}  {}  {:<11} {:<21} depth {:<2} {:<14} {:>8}  calls {}/{} tokens {}  by {}{}  session {}{}",
        row.id,
        row.enqueued_at.format("%Y-%m-%d %H:%M:%S"),
        // `as_str`: the enums' `Display` writes the bare name and ignores the column width.
        row.lane.as_str(),
        row.kind.as_str(),
        row.depth,
        row.outcome.map_or("-", |o| o.as_str()),
        duration,
        row.usage.model_calls,
        row.usage.tool_calls,
        row.usage.total_tokens(),
        row.triggered_by,
        row.agent.as_ref().map(|a| format!("  agent {a}")).unwrap_or_default(),
        row.session_id,
        row.error.as_ref().map(|e| format!("  error: {e}")).unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use kesoku_core::{ActivationId, ActivationKind, Lane, Outcome, Usage};

    use super::*;

    #[test]
    fn a_line_shows_kind_lane_depth_and_outcome() {
        let Some(at) = Utc.with_ymd_and_hms(2026, 5, 27, 12, 45, 0).single() else {
            panic!("a valid time");
        };
        let row = LedgerEntry {
            id: ActivationId::from("act_1"),
            kind: ActivationKind::BackgroundJobResult,
            lane: Lane::Responsive,
            session_id: SessionId::from("s1"),
            message_id: None,
            triggered_by: "system".to_owned(),
            delegation_user: None,
            depth: 2,
            agent: Some("Ryan".to_owned()),
            enqueued_at: at,
            started_at: Some(at),
            finished_at: Some(at + chrono::Duration::milliseconds(1500)),
            outcome: Some(Outcome::LimitExceeded),
            error: Some("tool call limit (20) reached".to_owned()),
            usage: Usage { model_calls: 3, tool_calls: 20, input_tokens: 100, output_tokens: 20 },
        };
        assert_eq!(
            line(&row),
            "act_1  2026-05-27 12:45:00  responsive  background_job_result depth 2  limit_exceeded    1.50s  \
             calls 3/20 tokens 120  by system  agent Ryan  session s1  error: tool call limit (20) reached"
        );
        let queued = LedgerEntry {
            kind: ActivationKind::Maintenance,
            lane: Lane::Background,
            depth: 0,
            agent: None,
            started_at: None,
            finished_at: None,
            outcome: None,
            error: None,
            usage: Usage::default(),
            ..row
        };
        assert_eq!(
            line(&queued),
            "act_1  2026-05-27 12:45:00  background  maintenance           depth 0  -                queued  \
             calls 0/0 tokens 0  by system  session s1"
        );
    }
}
