//! Link options of the release binary that keep its start-up cheap (ARCHITECTURE.md,
//! "Performance choices"). Release builds on x86_64 Linux with glibc only, where rustc links with
//! its bundled lld by default; `KESOKU_LINK_PLAIN=1` turns both off (another linker, or a binary
//! for an older glibc).
//!
//! - `-z pack-relative-relocs` (glibc ≥ 2.36 runs it): the relative relocations read at every
//!   start shrink to a bitmap of a few KB.
//! - `KESOKU_SYMBOL_ORDER=FILE` (optional, never a file of the repository): lld's
//!   `--symbol-ordering-file`, placing the listed functions first and together so the kernel's
//!   64 KiB fault-around maps them and not code spread over the whole text. `scripts/symbol-order`
//!   records the list from a workload of this very build and links with it; names the build
//!   does not define are skipped, which is why the list is made at release time and not kept.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=KESOKU_LINK_PLAIN");
    println!("cargo::rerun-if-env-changed=KESOKU_SYMBOL_ORDER");
    let env = |key: &str| std::env::var(key).unwrap_or_default();
    let wanted = env("PROFILE") == "release"
        && env("CARGO_CFG_TARGET_ARCH") == "x86_64"
        && env("CARGO_CFG_TARGET_OS") == "linux"
        && env("CARGO_CFG_TARGET_ENV") == "gnu"
        && env("HOST") == env("TARGET")
        && env("KESOKU_LINK_PLAIN").is_empty();
    if !wanted {
        return;
    }
    let order = env("KESOKU_SYMBOL_ORDER");
    if !order.is_empty() {
        let order = Path::new(&order);
        if !order.is_file() {
            println!("cargo::error=KESOKU_SYMBOL_ORDER names {}, which is not a file", order.display());
            return;
        }
        println!("cargo::rerun-if-changed={}", order.display());
        println!("cargo::rustc-link-arg-bin=kesoku=-Wl,--symbol-ordering-file={}", order.display());
        println!("cargo::rustc-link-arg-bin=kesoku=-Wl,--no-warn-symbol-ordering");
    }
    if glibc_at_least(2, 36) {
        println!("cargo::rustc-link-arg-bin=kesoku=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether this machine's glibc (`getconf GNU_LIBC_VERSION`: "glibc 2.36") is at least `major.minor`.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    let Ok(output) = Command::new("getconf").arg("GNU_LIBC_VERSION").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(version) = text.split_whitespace().nth(1) else {
        return false;
    };
    let mut parts = version.split('.').map(|part| part.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}
