//! Broker and queue behaviour: the conformance suites on every backend (the Redis ones at
//! `KESOKU_TEST_REDIS_URL`, skipped saying so when it is unset, failing when
//! `KESOKU_REQUIRE_SERVERS=1`), the memory backends' own cases, and Redis across processes.

#![allow(clippy::expect_used)]

mod broker;
mod lease;
mod queue;
mod redis;

use std::sync::Arc;

use async_trait::async_trait;
use kesoku_broker::conformance::{BrokerFactory, QueueFactory};
use kesoku_broker::queue::{Aging, LaneCaps};
use kesoku_broker::{Broker, MemoryBroker, MemoryQueue, Queue, RedisBroker, RedisOptions, RedisQueue};

pub struct MemoryQueues;

#[async_trait]
impl QueueFactory for MemoryQueues {
    async fn queue(&self, aging: Aging, caps: LaneCaps) -> Arc<dyn Queue> {
        Arc::new(MemoryQueue::new(aging, caps))
    }
}

pub struct MemoryBrokers;

#[async_trait]
impl BrokerFactory for MemoryBrokers {
    async fn broker(&self, capacity: usize) -> Arc<dyn Broker> {
        Arc::new(MemoryBroker::new(capacity))
    }
}

/// The test Redis, or `None` (having said why) when it is not configured.
pub fn redis_url() -> Option<String> {
    kesoku_test_support::db::redis_url()
}

/// Options on the test Redis with a key prefix of their own, so tests run in parallel.
pub fn fresh_options(url: &str) -> RedisOptions {
    let mut options = RedisOptions::new(url);
    options.prefix = format!("kesoku_test_{}", ulid::Ulid::generate());
    options
}

pub struct RedisQueues(String);

pub async fn redis_queues() -> Option<RedisQueues> {
    redis_url().map(RedisQueues)
}

#[async_trait]
impl QueueFactory for RedisQueues {
    async fn queue(&self, aging: Aging, caps: LaneCaps) -> Arc<dyn Queue> {
        Arc::new(RedisQueue::connect(&fresh_options(&self.0), aging, caps).await.expect("connect to the test Redis"))
    }
}

pub struct RedisBrokers(String);

pub async fn redis_brokers() -> Option<RedisBrokers> {
    redis_url().map(RedisBrokers)
}

#[async_trait]
impl BrokerFactory for RedisBrokers {
    async fn broker(&self, capacity: usize) -> Arc<dyn Broker> {
        Arc::new(
            RedisBroker::with_capacity(&fresh_options(&self.0), capacity).await.expect("connect to the test Redis"),
        )
    }
}

mod memory_conformance {
    kesoku_broker::queue_tests!(async { Some(crate::MemoryQueues) });
    kesoku_broker::broker_tests!(async { Some(crate::MemoryBrokers) });
}

mod redis_conformance {
    kesoku_broker::queue_tests!(crate::redis_queues());
    kesoku_broker::broker_tests!(crate::redis_brokers());
}
