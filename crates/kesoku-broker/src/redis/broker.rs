//! [`RedisBroker`]: pub/sub fan-out over Redis.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::{RedisOptions, backoff, client, instance_id, manager, ping, redacted, timed_out, unavailable};
use crate::{Broker, BrokerError, BrokerEvent, Interest, MemoryBroker, Subscription};

/// Pub/sub over Redis: every process's events reach every process's subscribers.
///
/// An event published here reaches this process's subscribers at once (through an in-process
/// [`MemoryBroker`], which also filters by interest and reports slow subscribers as lagged)
/// and the other processes through the channel. When the subscription connection drops, the
/// broker reconnects (backing off) and tells every subscriber it lagged, so it catches up from
/// the store.
#[derive(Clone)]
pub struct RedisBroker {
    inner: Arc<BrokerInner>,
}

struct BrokerInner {
    url: String,
    conn: ConnectionManager,
    operation_timeout: Duration,
    channel: String,
    origin: String,
    local: MemoryBroker,
    listener: JoinHandle<()>,
}

impl Drop for BrokerInner {
    fn drop(&mut self) {
        // The listener holds a handle of the local broker: stopping it ends the subscriptions.
        self.listener.abort();
    }
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker").field("channel", &self.inner.channel).finish()
    }
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    origin: String,
    event: BrokerEvent,
}

impl RedisBroker {
    /// Connect and subscribe: events other processes publish after this returns are received.
    pub async fn connect(options: &RedisOptions) -> Result<RedisBroker, BrokerError> {
        Self::with_capacity(options, crate::memory::DEFAULT_CAPACITY).await
    }

    /// [`RedisBroker::connect`], buffering `capacity` events per subscriber (beyond that a
    /// subscriber is told it lagged).
    pub async fn with_capacity(options: &RedisOptions, capacity: usize) -> Result<RedisBroker, BrokerError> {
        let url = options.url.clone();
        let client = client(&url)?;
        let operation_timeout = options.operation_timeout;
        let conn = manager(&client, &url, operation_timeout, operation_timeout).await?;
        let channel = format!("{}:events", options.prefix);
        let origin = instance_id();
        let local = MemoryBroker::new(capacity);
        let pubsub = subscribe(&client, &url, &channel, operation_timeout).await?;
        let listening = Listening {
            client,
            url: url.clone(),
            channel: channel.clone(),
            origin: origin.clone(),
            timeout: operation_timeout,
        };
        let listener = tokio::spawn(listen(listening, local.clone(), pubsub));
        Ok(RedisBroker {
            inner: Arc::new(BrokerInner { url, conn, operation_timeout, channel, origin, local, listener }),
        })
    }
}

/// A subscription to `channel`, within `timeout` (a cut network would otherwise hang it).
async fn subscribe(
    client: &redis::Client,
    url: &str,
    channel: &str,
    timeout: Duration,
) -> Result<redis::aio::PubSub, BrokerError> {
    let subscribing = async {
        let mut pubsub = client.get_async_pubsub().await.map_err(|error| unavailable(url, &error))?;
        pubsub.subscribe(channel).await.map_err(|error| unavailable(url, &error))?;
        Ok(pubsub)
    };
    tokio::time::timeout(timeout, subscribing).await.unwrap_or_else(|_| Err(timed_out(url, timeout)))
}

/// What the listening task needs to subscribe again.
struct Listening {
    client: redis::Client,
    url: String,
    channel: String,
    origin: String,
    timeout: Duration,
}

/// Hand other processes' events to this process's subscribers, reconnecting when the
/// connection drops.
async fn listen(listening: Listening, local: MemoryBroker, first: redis::aio::PubSub) {
    let Listening { client, url, channel, origin, timeout } = listening;
    let mut pubsub = Some(first);
    let mut attempt = 0;
    loop {
        let Some(connected) = pubsub.take() else {
            tokio::time::sleep(backoff(attempt)).await;
            attempt = attempt.saturating_add(1);
            match subscribe(&client, &url, &channel, timeout).await {
                Ok(connected) => {
                    tracing::info!(channel, "broker: subscribed to Redis again");
                    // What was published meanwhile is lost here: subscribers catch up from the store.
                    local.report_gap();
                    pubsub = Some(connected);
                }
                Err(error) => tracing::warn!(%error, "broker: resubscribing failed; retrying"),
            }
            continue;
        };
        attempt = 0;
        let mut messages = connected.into_on_message();
        while let Some(message) = messages.next().await {
            let payload: Vec<u8> = message.get_payload_bytes().to_vec();
            match serde_json::from_slice::<Envelope>(&payload) {
                // This process's own events were delivered when published.
                Ok(envelope) if envelope.origin == origin => {}
                Ok(envelope) => {
                    let _ = local.publish(envelope.event).await;
                }
                Err(error) => tracing::warn!(%error, channel, "broker: ignoring an unreadable event"),
            }
        }
        tracing::warn!(channel, url = %redacted(&url), "broker: lost the Redis subscription; reconnecting");
        local.report_gap();
    }
}

#[async_trait]
impl Broker for RedisBroker {
    async fn publish(&self, event: BrokerEvent) -> Result<(), BrokerError> {
        let inner = &self.inner;
        let payload = serde_json::to_string(&Envelope { origin: inner.origin.clone(), event: event.clone() })
            .map_err(|error| BrokerError::Corrupt(format!("an event could not be encoded: {error}")))?;
        let is_control = matches!(event, BrokerEvent::Control(_));
        inner.local.publish(event).await?;
        // A brief outage is retried (the connection reconnects by itself).
        let mut conn = inner.conn.clone();
        let mut attempt = 0;
        loop {
            let sent = redis::cmd("PUBLISH").arg(&inner.channel).arg(&payload).query_async::<i64>(&mut conn).await;
            match sent {
                Ok(_) => return Ok(()),
                Err(_) if attempt < 3 => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                // A message notice is only a wake-up: the message is stored, so the write
                // that caused it stands, and other processes catch up from the store.
                Err(error) if !is_control => {
                    tracing::warn!(error = %unavailable(&inner.url, &error), "broker: a message notice did not reach other processes");
                    return Ok(());
                }
                // A stop signal exists nowhere else: the caller must know it did not leave.
                Err(error) => return Err(unavailable(&inner.url, &error)),
            }
        }
    }

    async fn subscribe(&self, interest: Interest) -> Result<Box<dyn Subscription>, BrokerError> {
        self.inner.local.subscribe(interest).await
    }

    async fn check_ready(&self) -> Result<(), BrokerError> {
        ping(&self.inner.conn, &self.inner.url, self.inner.operation_timeout).await
    }
}
