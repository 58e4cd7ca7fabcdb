//! The in-process broker: a tokio broadcast channel. A slow subscriber is told it lagged (and
//! catches up from the store) instead of slowing the publisher or losing data silently.

use async_trait::async_trait;
use tokio::sync::broadcast;

use crate::{Broker, BrokerError, BrokerEvent, Received, Subscription};

/// Default ring size: events a subscriber may fall behind before it must re-read the store.
pub const DEFAULT_CAPACITY: usize = 8192;

#[derive(Debug, Clone)]
pub struct MemoryBroker {
    sender: broadcast::Sender<BrokerEvent>,
}

impl MemoryBroker {
    pub fn new(capacity: usize) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(1));
        MemoryBroker { sender }
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
        // No subscriber is not an error: the store holds the data.
        let _ = self.sender.send(event);
        Ok(())
    }

    async fn subscribe(&self) -> Result<Box<dyn Subscription>, BrokerError> {
        Ok(Box::new(MemorySubscription { receiver: self.sender.subscribe() }))
    }
}

struct MemorySubscription {
    receiver: broadcast::Receiver<BrokerEvent>,
}

#[async_trait]
impl Subscription for MemorySubscription {
    async fn recv(&mut self) -> Received {
        match self.receiver.recv().await {
            Ok(event) => Received::Event(event),
            Err(broadcast::error::RecvError::Lagged(missed)) => Received::Lagged { missed },
            Err(broadcast::error::RecvError::Closed) => Received::Closed,
        }
    }
}
