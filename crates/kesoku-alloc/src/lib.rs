//! The global allocator of Kesoku's binaries: mimalloc (faster than glibc malloc on the many
//! small strings a turn and a history allocate, and it gives freed memory back to the OS
//! instead of keeping one arena per thread), counting the bytes of live allocations.
//!
//! The count answers what the resident set cannot: whether the heap's *contents* grow, or only
//! the pages the allocator holds (a leak grows the first; fragmentation and retained pages the
//! second). The service reports it on `/metrics` as `kesoku_heap_live_bytes`, and the soak
//! benchmark samples it beside the resident set.
//!
//! Cost: each thread adds its allocations and frees into a thread-local sum (a plain add, no
//! atomic, no destructor, so no allocation on first use), and folds it into the shared count
//! only when it reaches [`FLUSH_AT`] either way: one shared atomic add per 64 KiB of churn
//! instead of one per allocation (which would bounce one cache line between the cores on every
//! allocation). The price is precision: up to [`FLUSH_AT`] per thread is not counted yet, and
//! a thread that ends takes its unreported remainder with it (the tokio runtime's threads live
//! as long as the service; blocking-pool threads come and go).
//!
//! Both binaries (`kesoku`, `kesoku-bench`) install it, so in-process benchmarks measure the
//! allocator the service runs on.
//!
//! mimalloc also replaces C's `malloc` (its `override` feature): SQLite and the other C code
//! allocate from the same arena instead of glibc's, which kept one heap per thread that
//! touched it and gave little back (10 minutes into a soak: 9.6 MiB of glibc heaps for ~5 MB
//! of SQLite data). [`configure`] sets the one option a long-running service wants changed.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};

use mimalloc::MiMalloc;

/// Largest change a thread keeps to itself before adding it to the shared count, in bytes.
pub const FLUSH_AT: isize = 64 * 1024;

/// Bytes in live allocations, as reported by the threads so far.
static LIVE: AtomicIsize = AtomicIsize::new(0);

thread_local! {
    /// This thread's change not yet added to [`LIVE`]. `const`-initialised and without a
    /// destructor: reading it never allocates, so the allocator may use it.
    static PENDING: Cell<isize> = const { Cell::new(0) };
}

#[inline]
fn count(delta: isize) {
    let unreported = PENDING.try_with(|pending| {
        let now = pending.get() + delta;
        if now.abs() >= FLUSH_AT {
            pending.set(0);
            now
        } else {
            pending.set(now);
            0
        }
    });
    // A thread past its thread-locals' end counts straight into the shared sum.
    let unreported = unreported.unwrap_or(delta);
    if unreported != 0 {
        LIVE.fetch_add(unreported, Ordering::Relaxed);
    }
}

/// mimalloc's `mi_option_purge_delay` (its `mimalloc.h`, the v3 `mi_option_t` enum), which
/// libmimalloc-sys does not name; the test `purge_delay_is_the_option_it_names` checks it.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc waits before it gives freed pages back to the OS, in milliseconds.
///
/// mimalloc's default (1,000 ms, restarted by every free nearby) means a busy service almost
/// never returns pages: under a steady 50 turns/s its retained pages grew for an hour. At 0 a
/// page goes back as soon as it is empty; the cost is a `madvise` per emptied page, which
/// alternating throughput runs did not show.
pub const PURGE_DELAY_MS: std::ffi::c_long = 0;

/// Tunes mimalloc for a long-running service: [`PURGE_DELAY_MS`]. Call first thing in `main`,
/// before other threads start (mimalloc's option table is not synchronised). An operator's
/// `MIMALLOC_PURGE_DELAY` in the environment still wins, so the setting can be compared
/// without a rebuild.
pub fn configure() {
    // SAFETY: `mi_option_set_default` writes one entry of mimalloc's static option table
    // (bounds-checked on its side) unless the environment already set it; the caller runs it
    // before any other thread exists, so nothing reads the entry meanwhile.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set_default(PURGE_DELAY, PURGE_DELAY_MS)
    };
}

/// Bytes in live allocations (requested sizes), give or take [`FLUSH_AT`] per thread.
pub fn live_bytes() -> u64 {
    u64::try_from(LIVE.load(Ordering::Relaxed)).unwrap_or(0)
}

/// mimalloc, counting. Install with `#[global_allocator] static ALLOCATOR: Allocator = Allocator;`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Allocator;

/// `pointer`, counting `change` when the allocation succeeded (null: nothing changed).
#[inline]
fn counted(pointer: *mut u8, change: isize) -> *mut u8 {
    if !pointer.is_null() {
        count(change);
    }
    pointer
}

fn signed(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

// A global allocator is unsafe to implement by definition; this one only forwards to mimalloc.
#[allow(unsafe_code)]
// SAFETY: every method forwards its arguments unchanged to mimalloc's `GlobalAlloc`, whose
// contract is the same, and returns its result; the counting around it touches no memory of the
// allocation and never allocates.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, which is mimalloc's.
        counted(unsafe { MiMalloc.alloc(layout) }, signed(layout.size()))
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        counted(unsafe { MiMalloc.alloc_zeroed(layout) }, signed(layout.size()))
    }

    #[inline]
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        count(-signed(layout.size()));
        // SAFETY: the caller passes a block this allocator (so mimalloc) gave with `layout`.
        unsafe { MiMalloc.dealloc(pointer, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `realloc`'s contract, which is mimalloc's.
        counted(unsafe { MiMalloc.realloc(pointer, layout, new_size) }, signed(new_size) - signed(layout.size()))
    }
}
