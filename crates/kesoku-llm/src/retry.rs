//! Retrying failed calls: exponential backoff with jitter, `Retry-After`, and the rule that a
//! stream is only retried before anything of it was handed to the caller.
//!
//! The policy is plain data from the model's configuration. This module does not decide *what*
//! is retryable ([`LlmError::is_retryable`] does) nor does it move to another model (the
//! fallback model does, once the retries here are spent).

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::ResponseStream;
use crate::error::{LlmError, LlmErrorKind};

/// How often and how patiently to retry. Part of a model's configuration (`[models.NAME.retry]`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in total, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Delay before the first retry; it doubles for each further one.
    pub base_delay_seconds: f64,
    /// Longest delay between attempts. A `Retry-After` longer than this ends the retries.
    pub max_delay_seconds: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 4, base_delay_seconds: 1.0, max_delay_seconds: 30.0 }
    }
}

impl RetryPolicy {
    /// One attempt, no retry.
    pub fn no_retries() -> Self {
        RetryPolicy { max_attempts: 1, ..RetryPolicy::default() }
    }

    /// Check the numbers are usable.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("retry.max_attempts must be at least 1".to_owned());
        }
        for (field, value) in
            [("retry.base_delay_seconds", self.base_delay_seconds), ("retry.max_delay_seconds", self.max_delay_seconds)]
        {
            if !value.is_finite() || value < 0.0 {
                return Err(format!("{field} must be a non-negative number of seconds, got {value}"));
            }
        }
        Ok(())
    }

    fn max_delay(&self) -> Duration {
        Duration::try_from_secs_f64(self.max_delay_seconds).unwrap_or(Duration::ZERO)
    }

    /// The backoff before retry number `retry` (1 for the first retry), with "equal jitter":
    /// half the exponential delay, plus a random share of the other half.
    pub fn backoff(&self, retry: u32) -> Duration {
        let exponent = retry.saturating_sub(1).min(30);
        let seconds = (self.base_delay_seconds * f64::from(1u32 << exponent)).min(self.max_delay_seconds);
        let seconds = if seconds.is_finite() && seconds > 0.0 { seconds } else { 0.0 };
        let jitter: f64 = rand::random_range(0.0..=1.0);
        Duration::try_from_secs_f64(seconds / 2.0 + seconds / 2.0 * jitter).unwrap_or(Duration::ZERO)
    }

    /// How long to wait before retry number `retry` after `error`, or `None` to give up: the
    /// error is not retryable, the attempts are spent, or the provider asked for a longer wait
    /// than `max_delay_seconds`.
    pub fn delay_before_retry(&self, error: &LlmError, retry: u32) -> Option<Duration> {
        if !error.is_retryable() || retry >= self.max_attempts {
            return None;
        }
        match error.retry_after() {
            Some(wait) if wait > self.max_delay() => None,
            Some(wait) => Some(wait),
            None => Some(self.backoff(retry)),
        }
    }
}

/// Parse a `Retry-After` header value: delay seconds or an HTTP-date (relative to `now`).
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let date = DateTime::parse_from_rfc2822(value).ok()?.with_timezone(&Utc);
    Some((date - now).to_std().unwrap_or(Duration::ZERO))
}

/// Run `attempt` until it succeeds, fails for good, or the policy gives up.
pub(crate) async fn call_with_retries<T, F, Fut>(policy: &RetryPolicy, mut attempt: F) -> Result<T, LlmError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, LlmError>>,
{
    let mut retry = 1;
    loop {
        let error = match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let Some(delay) = policy.delay_before_retry(&error, retry) else {
            return Err(error);
        };
        tracing::warn!(error = %error, attempt = retry, delay_ms = delay.as_millis() as u64, "model call failed, retrying");
        tokio::time::sleep(delay).await;
        retry += 1;
    }
}

/// Open a stream with retries: an attempt counts as successful once it produced its first
/// event, which is then handed out with the rest. A failure before that is retried; a failure
/// after it reaches the caller as an error item, never retried behind its back.
pub(crate) async fn open_stream_with_retries<F, Fut>(
    policy: &RetryPolicy,
    mut attempt: F,
) -> Result<ResponseStream, LlmError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<ResponseStream, LlmError>>,
{
    call_with_retries(policy, || {
        let opened = attempt();
        async move {
            let mut stream = opened.await?;
            match stream.next().await {
                Some(Ok(first)) => {
                    let first = futures::stream::once(async move { Ok(first) });
                    Ok(Box::pin(first.chain(stream)) as ResponseStream)
                }
                Some(Err(error)) => Err(error),
                None => Err(LlmError::new(LlmErrorKind::Protocol, "the provider closed the stream without any event")),
            }
        }
    })
    .await
}
