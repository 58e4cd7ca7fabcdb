//! The Discord REST calls the adapter makes, as a trait (temporary: helper "discord" owns this
//! file and implements the trait over twilight-http; only the trait and its error live here).

use std::time::Duration;

use async_trait::async_trait;

/// The REST calls the adapter makes. Message ids and channel ids are Discord snowflakes.
#[async_trait]
pub trait DiscordApi: Send + Sync {
    async fn create_message(&self, channel_id: u64, body: serde_json::Value) -> Result<u64, DiscordApiError>;
    async fn create_message_with_files(
        &self,
        channel_id: u64,
        body: serde_json::Value,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<u64, DiscordApiError>;
    async fn edit_message(
        &self,
        channel_id: u64,
        message_id: u64,
        body: serde_json::Value,
    ) -> Result<(), DiscordApiError>;
    /// A message that is already gone (404) counts as deleted.
    async fn delete_message(&self, channel_id: u64, message_id: u64) -> Result<(), DiscordApiError>;
    async fn trigger_typing(&self, channel_id: u64) -> Result<(), DiscordApiError>;
}

/// Why a REST call failed: worth retrying later, or not.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DiscordApiError {
    #[error("discord could not be reached or asked to wait: {reason}")]
    Transient { reason: String, retry_after: Option<Duration> },
    #[error("discord refused the request (http {status}): {reason}")]
    Permanent { status: u16, code: Option<u64>, reason: String },
}
