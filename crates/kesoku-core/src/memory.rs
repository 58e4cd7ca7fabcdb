//! What the service reports about its memory: [`MemoryReport`], a plain value that the
//! binary's wiring fills from the parts that own memory (the allocator, the SQLite library,
//! the store, the gateway) and that the HTTP server renders as `/metrics` gauges, and the
//! names of those gauges ([`MemoryGauge`]), which the soak benchmark reads back.
//!
//! Nothing here measures anything, and no component keeps a process-wide count for it: each
//! part reports its own figures to whoever asks. It lives in `core` because both its renderer
//! (`kesoku-server`) and its reader (`kesoku-bench`) depend on `core`, and neither should
//! depend on the other for a list of names.

/// The process's memory and its parts at one moment (see [`MemoryGauge`] for what each is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// The resident set, where the system tells it (Linux).
    pub resident_bytes: Option<u64>,
    /// The anonymous part of the resident set, where the system tells it.
    pub resident_anon_bytes: Option<u64>,
    /// Bytes in live Rust heap allocations, when the binary's allocator counts them.
    pub heap_live_bytes: Option<u64>,
    pub sqlite_bytes: u64,
    pub sqlite_highwater_bytes: u64,
    pub history_cache_bytes: u64,
    pub history_cache_sessions: u64,
    pub listener_dedup_ids: u64,
    pub listener_dedup_table_bytes: u64,
}

/// One figure of a [`MemoryReport`], as a `/metrics` gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryGauge {
    Resident,
    ResidentAnon,
    HeapLive,
    Sqlite,
    SqliteHighwater,
    HistoryCache,
    HistoryCacheSessions,
    ListenerDedupIds,
    ListenerDedupTableBytes,
}

impl MemoryGauge {
    /// Every gauge, in the order `/metrics` shows them.
    pub const ALL: [MemoryGauge; 9] = [
        MemoryGauge::Resident,
        MemoryGauge::ResidentAnon,
        MemoryGauge::HeapLive,
        MemoryGauge::Sqlite,
        MemoryGauge::SqliteHighwater,
        MemoryGauge::HistoryCache,
        MemoryGauge::HistoryCacheSessions,
        MemoryGauge::ListenerDedupIds,
        MemoryGauge::ListenerDedupTableBytes,
    ];

    /// The gauge's Prometheus name (dashboards and the soak benchmark rely on these).
    pub fn name(self) -> &'static str {
        match self {
            MemoryGauge::Resident => "process_resident_memory_bytes",
            MemoryGauge::ResidentAnon => "kesoku_resident_anon_bytes",
            MemoryGauge::HeapLive => "kesoku_heap_live_bytes",
            MemoryGauge::Sqlite => "kesoku_sqlite_memory_bytes",
            MemoryGauge::SqliteHighwater => "kesoku_sqlite_memory_highwater_bytes",
            MemoryGauge::HistoryCache => "kesoku_history_cache_bytes",
            MemoryGauge::HistoryCacheSessions => "kesoku_history_cache_sessions",
            MemoryGauge::ListenerDedupIds => "kesoku_listener_dedup_ids",
            MemoryGauge::ListenerDedupTableBytes => "kesoku_listener_dedup_table_bytes",
        }
    }

    /// The gauge's `# HELP` text.
    pub fn help(self) -> &'static str {
        match self {
            MemoryGauge::Resident => "Resident memory size in bytes.",
            MemoryGauge::ResidentAnon => {
                "The anonymous part of the resident set (heaps, stacks); the rest are files' pages."
            }
            MemoryGauge::HeapLive => "Bytes in live Rust heap allocations (requested sizes, within 64 KiB per thread).",
            MemoryGauge::Sqlite => "Bytes SQLite has allocated (page caches, schemas, statements), all connections.",
            MemoryGauge::SqliteHighwater => "The most bytes SQLite has had allocated at once.",
            MemoryGauge::HistoryCache => {
                "Bytes (estimated) of decoded long histories kept between reads (at most 32 MiB)."
            }
            MemoryGauge::HistoryCacheSessions => "Long sessions whose history is kept.",
            MemoryGauge::ListenerDedupIds => {
                "Message ids held by the listeners' duplicate filters (each, those of its last 20,000 to 30,000 revisions)."
            }
            MemoryGauge::ListenerDedupTableBytes => {
                "Bytes of the listeners' duplicate-filter hash tables (a table grows and never shrinks)."
            }
        }
    }
}

impl MemoryReport {
    /// The value of `gauge`; `None` when it was not measured (the gauge is then left out).
    pub fn get(&self, gauge: MemoryGauge) -> Option<u64> {
        match gauge {
            MemoryGauge::Resident => self.resident_bytes,
            MemoryGauge::ResidentAnon => self.resident_anon_bytes,
            MemoryGauge::HeapLive => self.heap_live_bytes,
            MemoryGauge::Sqlite => Some(self.sqlite_bytes),
            MemoryGauge::SqliteHighwater => Some(self.sqlite_highwater_bytes),
            MemoryGauge::HistoryCache => Some(self.history_cache_bytes),
            MemoryGauge::HistoryCacheSessions => Some(self.history_cache_sessions),
            MemoryGauge::ListenerDedupIds => Some(self.listener_dedup_ids),
            MemoryGauge::ListenerDedupTableBytes => Some(self.listener_dedup_table_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gauge_reads_its_own_figure() {
        let report = MemoryReport {
            resident_bytes: Some(1),
            resident_anon_bytes: Some(2),
            heap_live_bytes: Some(3),
            sqlite_bytes: 4,
            sqlite_highwater_bytes: 5,
            history_cache_bytes: 6,
            history_cache_sessions: 7,
            listener_dedup_ids: 8,
            listener_dedup_table_bytes: 9,
        };
        let values: Vec<Option<u64>> = MemoryGauge::ALL.iter().map(|gauge| report.get(*gauge)).collect();
        assert_eq!(values, (1..=9).map(Some).collect::<Vec<_>>());
        let unmeasured = MemoryReport::default();
        let left_out: Vec<&str> = MemoryGauge::ALL
            .iter()
            .filter(|gauge| unmeasured.get(**gauge).is_none())
            .map(|gauge| gauge.name())
            .collect();
        assert_eq!(left_out, ["process_resident_memory_bytes", "kesoku_resident_anon_bytes", "kesoku_heap_live_bytes"]);
    }

    #[test]
    fn gauge_names_are_distinct_prometheus_names() {
        let mut names: Vec<&str> = MemoryGauge::ALL.iter().map(|gauge| gauge.name()).collect();
        for name in &names {
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{name}");
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MemoryGauge::ALL.len());
        assert!(MemoryGauge::ALL.iter().all(|gauge| gauge.help().ends_with('.')));
    }
}
