//! The in-process broker: one bounded channel per subscriber, filled by `publish` with the
//! events that subscriber's [`Interest`] covers. A slow subscriber is told it lagged (and
//! catches up from the store) instead of slowing the publisher or losing data silently.
//!
//! Why not a broadcast channel: it wakes every subscriber for every event. A message written
//! by a turn then woke the intake, the stop-signal listener and each chatbot's listener, most
//! of them only to drop it, and on a machine with two cores each extra task woken also woke
//! the other runtime thread (a cross-CPU wake-up, the largest part of a turn's overhead on a
//! virtual machine). Filtering at the publisher wakes only the tasks an event concerns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::{Broker, BrokerError, BrokerEvent, Interest, Received, Subscription};

/// Default buffer per subscriber: events it may fall behind before it must re-read the store.
pub const DEFAULT_CAPACITY: usize = 8192;

#[derive(Debug, Clone)]
pub struct MemoryBroker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    subscribers: Mutex<Vec<Subscriber>>,
}

/// What a subscriber's channel carries: an event, or word that events were lost upstream.
#[derive(Debug)]
enum Delivery {
    Event(BrokerEvent),
    /// Events may have been missed, how many is unknown (a remote broker's connection dropped).
    Gap,
}

#[derive(Debug)]
struct Subscriber {
    interest: Interest,
    sender: mpsc::Sender<Delivery>,
    /// Events dropped because the subscriber's buffer was full, not yet reported to it.
    missed: Arc<AtomicU64>,
}

impl MemoryBroker {
    pub fn new(capacity: usize) -> Self {
        MemoryBroker { inner: Arc::new(Inner { capacity: capacity.max(1), subscribers: Mutex::default() }) }
    }
}

impl MemoryBroker {
    /// Tell every subscriber that events may have been lost (a remote broker lost its
    /// connection): each receives [`Received::Lagged`] and catches up from the store.
    pub(crate) fn report_gap(&self) {
        let subscribers = self.inner.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        for subscriber in subscribers.iter() {
            if subscriber.sender.try_send(Delivery::Gap).is_err() {
                // A full buffer: the lag is reported from the count instead.
                subscriber.missed.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

#[async_trait]
impl Broker for MemoryBroker {
    async fn publish(&self, event: BrokerEvent) -> Result<(), BrokerError> {
        // No subscriber is not an error: the store holds the data. A subscriber whose receiver
        // is gone is forgotten here.
        let mut subscribers = self.inner.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        subscribers.retain(|subscriber| {
            if !subscriber.interest.wants(&event) {
                return !subscriber.sender.is_closed();
            }
            match subscriber.sender.try_send(Delivery::Event(event.clone())) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    subscriber.missed.fetch_add(1, Ordering::AcqRel);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
        Ok(())
    }

    async fn subscribe(&self, interest: Interest) -> Result<Box<dyn Subscription>, BrokerError> {
        let (sender, receiver) = mpsc::channel(self.inner.capacity);
        let missed = Arc::new(AtomicU64::new(0));
        let subscriber = Subscriber { interest, sender, missed: Arc::clone(&missed) };
        self.inner.subscribers.lock().unwrap_or_else(PoisonError::into_inner).push(subscriber);
        // The subscription holds the broker weakly: it ends (`Closed`) when the last broker
        // handle is dropped, as the senders go with it.
        Ok(Box::new(MemorySubscription { receiver, missed, broker: Arc::downgrade(&self.inner) }))
    }
}

struct MemorySubscription {
    receiver: mpsc::Receiver<Delivery>,
    missed: Arc<AtomicU64>,
    broker: std::sync::Weak<Inner>,
}

#[async_trait]
impl Subscription for MemorySubscription {
    async fn recv(&mut self) -> Received {
        // A lag is reported as soon as it happened: the subscriber catches up from the store
        // (which holds the events dropped here), then goes on with what its buffer still holds.
        let missed = self.missed.swap(0, Ordering::AcqRel);
        if missed > 0 {
            return Received::Lagged { missed };
        }
        match self.receiver.recv().await {
            Some(Delivery::Event(event)) => Received::Event(event),
            Some(Delivery::Gap) => Received::Lagged { missed: 0 },
            None => Received::Closed,
        }
    }
}

impl Drop for MemorySubscription {
    fn drop(&mut self) {
        // Forget this subscriber now rather than at the next publish that concerns it.
        self.receiver.close();
        if let Some(inner) = self.broker.upgrade() {
            inner
                .subscribers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|subscriber| !subscriber.sender.is_closed());
        }
    }
}
