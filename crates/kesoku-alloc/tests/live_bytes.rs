//! The count follows what is allocated and freed, on this thread and across threads.

use kesoku_alloc::{Allocator, FLUSH_AT, live_bytes};

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

const BLOCK: usize = 8 * 1024 * 1024;

/// How far the count may be from the truth: what each thread has not reported yet (the test
/// harness runs a few threads), and the harness's own small allocations meanwhile.
const SLACK: i64 = 16 * FLUSH_AT as i64 + 1024 * 1024;

fn near(measured: i64, expected: i64, what: &str) {
    assert!((measured - expected).abs() <= SLACK, "{what}: the count moved by {measured} bytes, expected {expected}");
}

#[test]
fn allocations_frees_and_growth_are_counted_wherever_they_happen() {
    let before = live_bytes() as i64;
    let block = vec![7u8; BLOCK];
    near(live_bytes() as i64 - before, BLOCK as i64, "an 8 MiB vector");

    // Grown in place or moved: the count follows the new size.
    let mut grown = block;
    grown.reserve_exact(BLOCK);
    near(live_bytes() as i64 - before, 2 * BLOCK as i64, "grown to 16 MiB");

    // Freed on another thread than the one that allocated it.
    std::thread::spawn(move || drop(grown)).join().expect("the freeing thread");
    near(live_bytes() as i64 - before, 0, "freed on another thread");

    // Many small allocations kept: counted, not lost in the per-thread batching.
    let kept: Vec<Box<[u8; 100]>> = (0..50_000).map(|_| Box::new([1u8; 100])).collect();
    near(live_bytes() as i64 - before, 50_000 * 100 + 50_000 * 8, "50,000 small boxes");
    drop(kept);
    near(live_bytes() as i64 - before, 0, "all freed");
}
