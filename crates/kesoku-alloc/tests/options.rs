//! mimalloc is set up the way `kesoku_alloc` says: C's `malloc` comes from it (so SQLite's
//! pages share its arena), and `configure` sets the purge delay it names. One test in its own
//! binary: `configure` must run while no other thread allocates.

use std::ffi::c_void;

use kesoku_alloc::{Allocator, PURGE_DELAY_MS, configure};

#[global_allocator]
static ALLOCATOR: Allocator = Allocator;

// The C library's allocator as C code (SQLite) calls it.
#[allow(unsafe_code)]
unsafe extern "C" {
    fn malloc(size: usize) -> *mut c_void;
    fn free(pointer: *mut c_void);
}

/// mimalloc's default purge delay (v3, milliseconds): no other option defaults to it.
const MIMALLOC_DEFAULT_PURGE_DELAY: std::ffi::c_long = 1000;

/// `mi_option_purge_delay` in mimalloc.h; kept in step with `kesoku_alloc`'s private constant.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

#[test]
#[allow(unsafe_code)]
fn c_malloc_is_mimalloc_and_purge_delay_is_the_option_it_names() {
    // SAFETY: a plain C allocation, checked and freed with the allocator that made it.
    let pointer = unsafe { malloc(4096) };
    assert!(!pointer.is_null(), "malloc(4096) failed");
    // SAFETY: asks whether an address lies in mimalloc's arenas; reads no memory at it.
    let in_mimalloc = unsafe { libmimalloc_sys::mi_is_in_heap_region(pointer) };
    // SAFETY: `pointer` came from `malloc` above and is freed once.
    unsafe { free(pointer) };
    assert!(in_mimalloc, "C's malloc did not come from mimalloc: its `override` feature is off");

    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        eprintln!("MIMALLOC_PURGE_DELAY is set: the environment decides the option, not checked");
        return;
    }
    // SAFETY: reads one entry of mimalloc's option table; this test's thread is the only one
    // touching it.
    let before = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
    assert_eq!(
        before, MIMALLOC_DEFAULT_PURGE_DELAY,
        "option {PURGE_DELAY} is not mimalloc's purge delay (default {MIMALLOC_DEFAULT_PURGE_DELAY} ms): \
         the mimalloc version changed its option numbers"
    );
    configure();
    // SAFETY: as above.
    let after = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
    assert_eq!(after, PURGE_DELAY_MS, "configure() did not set the purge delay");
}
