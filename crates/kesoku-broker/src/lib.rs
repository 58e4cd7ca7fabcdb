//! Broadcast (pub/sub) and the lane queue.
//!
//! The broker only wakes people up: every message it carries is already durable in the store,
//! so a subscriber that lags or restarts catches up from the store, never from the broker.
//! [`Broker`] and [`Queue`] are small async traits with two backends each: in-process
//! ([`MemoryBroker`], [`MemoryQueue`], the embedded default) and Redis ([`RedisBroker`],
//! [`RedisQueue`], for many processes). Every backend passes the same conformance suites
//! (`broker_tests!`, `queue_tests!`, feature `conformance`).
//!
//! This crate knows no SQL and no platform; it moves events and activations, nothing else.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod lease;
pub(crate) mod memory;
pub mod queue;
mod redis;

use async_trait::async_trait;
use kesoku_core::{Message, MessageFilter, SessionId};
use serde::{Deserialize, Serialize};

pub use memory::MemoryBroker;
pub use queue::{Acknowledge, LaneCaps, MemoryQueue, Queue, QueueDepths, QueueLease};
pub use redis::{RedisBroker, RedisOptions, RedisQueue};

/// A message was written: its state as of revision `rev`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageNotice {
    pub rev: i64,
    /// Created by this change (else updated).
    pub created: bool,
    pub message: Message,
}

/// Why a running turn is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A newer message arrived on the same channel.
    NewerMessage,
    /// A person asked (`/stop`, the API, Ctrl-C).
    UserRequest,
    /// The service is shutting down.
    Shutdown,
}

/// Control signals that must reach whichever process runs a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "control", rename_all = "snake_case")]
pub enum Control {
    /// Stop the session's running turn, unless that turn's root is `unless_root` (the newer
    /// message that caused the stop may already be running when a late signal arrives).
    Stop {
        session_id: SessionId,
        reason: StopReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unless_root: Option<kesoku_core::MessageId>,
    },
}

/// What travels on the broadcast.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum BrokerEvent {
    Message(Box<MessageNotice>),
    Control(Control),
}

/// What a subscription hands out next.
#[derive(Debug, Clone, PartialEq)]
pub enum Received {
    Event(BrokerEvent),
    /// This subscriber fell behind and `missed` events are gone (0: an unknown number, when a
    /// remote broker's connection dropped): catch up from the store.
    Lagged {
        missed: u64,
    },
    /// The broker shut down.
    Closed,
}

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// Something the broker holds could not be read (a corrupt queue entry).
    #[error("broker data unreadable: {0}")]
    Corrupt(String),
}

/// Which events a subscription is for. A broker delivers at least these (the in-process one
/// exactly these, so that an event wakes only the tasks it concerns; a remote one may filter
/// less finely): subscribers still check what they receive.
#[derive(Debug, Clone, Default)]
pub enum Interest {
    /// Every event.
    #[default]
    Everything,
    /// Messages that match the filter; no control signals.
    Messages(MessageFilter),
    /// Control signals only.
    Controls,
}

impl Interest {
    /// Whether `event` is one this subscription is for.
    pub fn wants(&self, event: &BrokerEvent) -> bool {
        match (self, event) {
            (Interest::Everything, _) => true,
            (Interest::Messages(filter), BrokerEvent::Message(notice)) => filter.matches(&notice.message),
            (Interest::Controls, BrokerEvent::Control(_)) => true,
            (Interest::Messages(_), BrokerEvent::Control(_)) | (Interest::Controls, BrokerEvent::Message(_)) => false,
        }
    }
}

/// Publish/subscribe of [`BrokerEvent`]s to the subscribers they concern.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Send to every current subscriber that wants the event. Never blocks on slow
    /// subscribers.
    async fn publish(&self, event: BrokerEvent) -> Result<(), BrokerError>;
    /// A new subscription receiving what `interest` covers, published from now on.
    async fn subscribe(&self, interest: Interest) -> Result<Box<dyn Subscription>, BrokerError>;
    /// Whether the server behind this broker answers now (`/readyz`), within the backend's
    /// operation timeout. An in-process broker always does.
    async fn check_ready(&self) -> Result<(), BrokerError> {
        Ok(())
    }
}

/// One subscriber's view of the broadcast.
#[async_trait]
pub trait Subscription: Send {
    async fn recv(&mut self) -> Received;
}
