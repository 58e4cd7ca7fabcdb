//! The cron chatbot: scheduled prompts posted as the spec's Cronjob Trigger Messages, each run
//! as a workflow activation.
//!
//! Each `[[cron]]` job posts, on its schedule, a user message with sender `Cronjob` and
//! `metadata.is_cronjob` into the active session of its (chatbot, channel). The message also
//! carries `metadata.activation`, a workflow [`ActivationRequest`] whose trigger context (job
//! name, `cron`, the pattern, the scheduled time) the model is shown, with the job's time zone,
//! output schema and `triggered_by = cron:<job>`; and `metadata.model` when the job names a
//! model. The agent runs it on the responsive lane. What the seed system got wrong, done right:
//! day-of-month and day-of-week combine with OR as in Vixie cron (unless the pattern asks for
//! AND with `+`); a job's state is keyed by its name, read back from the store (the newest
//! trigger message it posted), never by its position in the file; a run missed while the
//! service was down is made up once at start (`catch_up`), not forgotten and not repeated.
//!
//! Triggers enter through [`crate::ingest`] like every other message, keyed by the job and
//! the scheduled time (`cron:{job}:{RFC 3339}`): the same slot fired twice (a catch-up racing
//! the timer, two processes, a restart within the slot) is stored once.
//!
//! Time comes from the store's [`kesoku_store::Clock`] (`gateway.store().clock()`), never from
//! `Utc::now()` directly: a test that runs the store on [`kesoku_store::Clock::following_tokio`]
//! with tokio's time paused runs the schedule through days and DST changes instantly.

use std::path::PathBuf;
use std::str::FromStr;

use chrono::{DateTime, SecondsFormat, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use kesoku_core::activation::TriggerContext;
use kesoku_core::message::SENDER_CRONJOB;
use kesoku_core::{ActivationKind, ActivationRequest, Message, MessageFilter, Metadata, Role};
use kesoku_gateway::Gateway;
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ingest::{Inbound, IngestError, Ingested, ingest};
use crate::staging::Staging;

/// Metadata key set on a trigger posted to make up a missed run.
pub const CATCH_UP_KEY: &str = "cron_catch_up";

/// One `[[cron]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CronJobConfig {
    /// Unique name: the job's identity across restarts and edits of the file.
    pub name: String,
    /// Cron pattern: five fields (minute precision) or six (seconds first); `@daily` etc.
    pub schedule: String,
    /// The prompt the agent receives.
    pub prompt: String,
    /// Where the answer goes.
    #[serde(default = "default_chatbot")]
    pub chatbot: String,
    pub channel: String,
    /// IANA time zone of the schedule (`Asia/Singapore`); default UTC.
    #[serde(default)]
    pub timezone: Option<String>,
    /// Make up one run missed while the service was down.
    #[serde(default = "default_catch_up")]
    pub catch_up: bool,
    /// The `[models.NAME]` that answers this job's runs (default: the agent's model). The
    /// binary checks at config load that it exists.
    #[serde(default)]
    pub model: Option<String>,
    /// A JSON Schema object (written as a TOML table) the run's final answer must follow.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// The person the job's runs work for: tools that need a connection use that person's
    /// grants (`kesoku grants set USER NAME`). Never shown to the model.
    #[serde(default)]
    pub delegation_user: Option<String>,
}

fn default_chatbot() -> String {
    "api".to_owned()
}

fn default_catch_up() -> bool {
    true
}

#[derive(Debug, thiserror::Error)]
pub enum CronError {
    #[error("cron job `{job}`: schedule `{schedule}` is not a cron pattern: {reason}")]
    Schedule { job: String, schedule: String, reason: String },
    #[error("cron job `{job}`: `{timezone}` is not an IANA time zone (for example `Europe/Paris`)")]
    Timezone { job: String, timezone: String },
    #[error("cron job names must be unique and non-empty: `{0}`")]
    Name(String),
    #[error(
        "cron job `{job}`: output_schema {reason} (write it as a table, for example \
         `output_schema = {{ type = \"object\", properties = {{ ok = {{ type = \"boolean\" }} }} }}`)"
    )]
    OutputSchema { job: String, reason: String },
}

/// A parsed job.
#[derive(Debug, Clone)]
pub struct CronJob {
    pub config: CronJobConfig,
    cron: Cron,
    timezone: Tz,
}

impl CronJob {
    pub fn parse(config: CronJobConfig) -> Result<CronJob, CronError> {
        if config.name.trim().is_empty() {
            return Err(CronError::Name(config.name));
        }
        let parser = CronParser::builder().seconds(Seconds::Optional).build();
        let cron = parser.parse(&config.schedule).map_err(|error| CronError::Schedule {
            job: config.name.clone(),
            schedule: config.schedule.clone(),
            reason: error.to_string(),
        })?;
        let timezone = match &config.timezone {
            Some(name) => Tz::from_str(name)
                .map_err(|_| CronError::Timezone { job: config.name.clone(), timezone: name.clone() })?,
            None => Tz::UTC,
        };
        if let Some(schema) = &config.output_schema
            && let Err(reason) = crate::ingest::check_output_schema(schema)
        {
            return Err(CronError::OutputSchema { job: config.name.clone(), reason });
        }
        Ok(CronJob { config, cron, timezone })
    }

    /// Parse every job, refusing duplicate names.
    pub fn parse_all(configs: &[CronJobConfig]) -> Result<Vec<CronJob>, CronError> {
        let mut jobs: Vec<CronJob> = Vec::new();
        for config in configs {
            if jobs.iter().any(|job| job.config.name == config.name) {
                return Err(CronError::Name(config.name.clone()));
            }
            jobs.push(CronJob::parse(config.clone())?);
        }
        Ok(jobs)
    }

    /// The first scheduled time strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = after.with_timezone(&self.timezone);
        self.cron.find_next_occurrence(&local, false).ok().map(|t| t.with_timezone(&Utc))
    }

    /// The last scheduled time at or before `at`.
    pub fn previous_at_or_before(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = at.with_timezone(&self.timezone);
        self.cron.find_previous_occurrence(&local, true).ok().map(|t| t.with_timezone(&Utc))
    }

    /// The Cronjob Trigger Message for a run scheduled at `scheduled`, in `session`.
    pub fn trigger(&self, session_id: &kesoku_core::SessionId, scheduled: DateTime<Utc>, catch_up: bool) -> Message {
        let mut message =
            Message::cronjob_trigger(session_id, &self.config.chatbot, &self.config.channel, self.content(scheduled));
        message.metadata = self.metadata(scheduled, catch_up);
        message
    }

    /// The trigger of a run scheduled at `scheduled`, as [`crate::ingest`] takes it: keyed by
    /// the job and the slot, so a slot posted twice is stored once.
    pub fn inbound(&self, scheduled: DateTime<Utc>, catch_up: bool) -> Inbound {
        let mut inbound =
            Inbound::text(&self.config.chatbot, &self.config.channel, SENDER_CRONJOB, self.content(scheduled));
        inbound.platform_key = Some(self.slot_key(scheduled));
        inbound.metadata = self.metadata(scheduled, catch_up);
        inbound
    }

    /// `cron:{job}:{scheduled, RFC 3339 UTC}`: the identity of one scheduled run.
    pub fn slot_key(&self, scheduled: DateTime<Utc>) -> String {
        format!("cron:{}:{}", self.config.name, scheduled.to_rfc3339_opts(SecondsFormat::Secs, true))
    }

    fn content(&self, scheduled: DateTime<Utc>) -> String {
        format!(
            "{}{}",
            crate::ingest::sender_header(SENDER_CRONJOB, None, scheduled, self.timezone),
            self.config.prompt
        )
    }

    /// The workflow activation a run scheduled at `scheduled` asks for. The task is the bare
    /// prompt: the message's content has the `Cronjob at …` header in front of it.
    pub fn activation(&self, scheduled: DateTime<Utc>) -> ActivationRequest {
        ActivationRequest {
            task: Some(self.config.prompt.clone()),
            trigger: Some(TriggerContext {
                name: self.config.name.clone(),
                source: "cron".to_owned(),
                schedule: Some(self.config.schedule.clone()),
                fired_at: scheduled,
            }),
            output_schema: self.config.output_schema.clone(),
            timezone: Some(self.timezone.name().to_owned()),
            triggered_by: Some(format!("cron:{}", self.config.name)),
            delegation_user: self.config.delegation_user.clone(),
            ..ActivationRequest::new(ActivationKind::Workflow)
        }
    }

    fn metadata(&self, scheduled: DateTime<Utc>, catch_up: bool) -> Metadata {
        let mut metadata = Metadata {
            is_cronjob: Some(true),
            cron_job: Some(self.config.name.clone()),
            model: self.config.model.clone(),
            activation: Some(Box::new(self.activation(scheduled))),
            ..Metadata::default()
        };
        if catch_up {
            metadata.extra.insert(CATCH_UP_KEY.to_owned(), Value::Bool(true));
        }
        metadata
    }
}

/// When `job` last posted, read back from the store.
pub async fn last_fired(gateway: &Gateway, job: &CronJob) -> Result<Option<DateTime<Utc>>, kesoku_store::StoreError> {
    let filter = MessageFilter::default()
        .with_chatbot(&job.config.chatbot)
        .with_channel(&job.config.channel)
        .with_roles(&[Role::User]);
    let messages = gateway.store().list_messages(&filter).await?;
    Ok(messages
        .iter()
        .rev()
        .find(|m| m.is_cron_trigger() && m.metadata.cron_job.as_deref() == Some(job.config.name.as_str()))
        .and_then(|m| m.created_at))
}

/// Post a job's trigger for the run scheduled at `scheduled` into the active session of its
/// channel. A slot already posted answers [`Ingested::Duplicate`] and posts nothing.
pub async fn fire(
    gateway: &Gateway,
    job: &CronJob,
    scheduled: DateTime<Utc>,
    catch_up: bool,
) -> Result<Ingested, IngestError> {
    // Triggers carry no files: the staging folder is never written.
    let staging = Staging::new(PathBuf::new());
    ingest(gateway, &staging, job.inbound(scheduled, catch_up)).await
}

/// [`fire`], logging the outcome: a failed run is skipped, the schedule goes on.
async fn fire_logged(gateway: &Gateway, job: &CronJob, scheduled: DateTime<Utc>, catch_up: bool) {
    match fire(gateway, job, scheduled, catch_up).await {
        Ok(Ingested::Posted(_)) => tracing::info!(job = %job.config.name, %scheduled, catch_up, "cron job fired"),
        Ok(Ingested::Duplicate(id)) => {
            tracing::info!(job = %job.config.name, %scheduled, message = %id, "cron: this run was already posted")
        }
        Err(error) => {
            tracing::error!(%error, job = %job.config.name, "cron: posting the trigger failed; the run is skipped")
        }
    }
}

/// Run every job until `shutdown`. Each job keeps its own next time; a made-up run for a missed
/// schedule is posted once at start. Times are read from the store's clock.
pub async fn run_cron(gateway: Gateway, jobs: Vec<CronJob>, shutdown: CancellationToken) {
    if jobs.is_empty() {
        return;
    }
    let clock = gateway.store().clock();
    let now = clock.now();
    let mut next: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let last = match last_fired(&gateway, job).await {
            Ok(last) => last,
            Err(error) => {
                tracing::warn!(%error, job = %job.config.name, "cron: reading the last run failed; starting fresh");
                None
            }
        };
        if let (Some(last), true) = (last, job.config.catch_up)
            && let Some(missed) = job.previous_at_or_before(now)
            && missed > last
        {
            fire_logged(&gateway, job, missed, true).await;
        }
        next.push(job.next_after(now));
    }
    loop {
        let Some((index, when)) =
            next.iter().enumerate().filter_map(|(i, t)| t.map(|t| (i, t))).min_by_key(|(_, t)| *t)
        else {
            return;
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = clock.sleep_until(when) => {}
        }
        fire_logged(&gateway, &jobs[index], when, false).await;
        next[index] = jobs[index].next_after(when);
    }
}
