//! The service's memory report for `/metrics`: asked of each part that owns memory (the
//! allocator, the SQLite library, the store, the gateway) and of the system (the resident set),
//! at every scrape. The parts keep their own figures; nothing here counts anything.

use std::sync::Arc;

use kesoku_core::MemoryReport;
use kesoku_gateway::Gateway;
use kesoku_store::Store;

/// A probe for [`kesoku_server::ServerState::with_memory`] over this process's store and gateway.
pub fn probe(store: Arc<dyn Store>, gateway: Gateway) -> impl Fn() -> MemoryReport + Send + Sync + 'static {
    move || report(store.as_ref(), &gateway)
}

/// The process's memory now, with `store`'s and `gateway`'s parts.
fn report(store: &dyn Store, gateway: &Gateway) -> MemoryReport {
    let resident = resident_memory();
    let sqlite = kesoku_store::sqlite_library_memory();
    let kept = store.memory();
    let listeners = gateway.listener_memory();
    MemoryReport {
        resident_bytes: resident.map(|(bytes, _)| bytes),
        resident_anon_bytes: resident.map(|(_, anon)| anon),
        heap_live_bytes: Some(kesoku_alloc::live_bytes()),
        sqlite_bytes: sqlite.bytes,
        sqlite_highwater_bytes: sqlite.highwater_bytes,
        history_cache_bytes: kept.history_cache_bytes,
        history_cache_sessions: kept.history_cache_sessions,
        listener_dedup_ids: listeners.dedup_ids,
        listener_dedup_table_bytes: listeners.dedup_table_bytes,
    }
}

/// `(VmRSS, RssAnon)` of this process in bytes, from `/proc/self/status` (Linux only).
fn resident_memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|line| line.starts_with(key))?;
        line[key.len()..].split_whitespace().next()?.parse::<u64>().ok().map(|kib| kib * 1024)
    };
    Some((kib("VmRSS:")?, kib("RssAnon:")?))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use kesoku_broker::MemoryBroker;
    use kesoku_core::{Message, MessageFilter, SessionId};
    use kesoku_gateway::ListenFrom;

    use super::*;

    /// The report holds the real figures of the store and gateway it was made for, and the
    /// process's resident set.
    #[tokio::test]
    async fn the_report_asks_the_store_and_the_gateway_it_was_made_for() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("kesoku.db").display());
        let handle = kesoku_store::open(&url).await.expect("open the store");
        let gateway = Gateway::new(Arc::clone(&handle.store), Arc::new(MemoryBroker::default()));
        let session = SessionId::from("sess_memory");
        for index in 0..3 {
            gateway
                .post(&Message::user_text(&session, "cli", "local", "Chii", format!("m{index}")))
                .await
                .expect("post");
        }
        let mut listener = Box::pin(gateway.listen(MessageFilter::session(&session), ListenFrom::Current));
        for _ in 0..3 {
            listener.next().await.expect("an event").expect("not an error");
        }
        let report = probe(Arc::clone(&handle.store), gateway.clone())();
        assert_eq!(report.listener_dedup_ids, 3, "{report:?}");
        assert!(report.listener_dedup_table_bytes > 0, "{report:?}");
        assert_eq!(report.history_cache_sessions, handle.store.memory().history_cache_sessions);
        assert!(report.sqlite_bytes > 0 && report.sqlite_highwater_bytes >= report.sqlite_bytes, "{report:?}");
        assert!(report.heap_live_bytes.is_some());
        if cfg!(target_os = "linux") {
            let (resident, anon) = (report.resident_bytes.unwrap_or(0), report.resident_anon_bytes.unwrap_or(u64::MAX));
            assert!(resident > 1_000_000 && anon < resident, "{report:?}");
        }
    }
}
