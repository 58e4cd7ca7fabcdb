//! Link options of the release binary that keep its resident set small (ARCHITECTURE.md,
//! "Performance choices"; measured in docs/BENCHMARKS.md, fifth run). Release builds on x86_64 Linux with glibc only, where rustc
//! links with its bundled lld by default; `KESOKU_LINK_PLAIN=1` turns both off (another linker,
//! or a binary for an older glibc).
//!
//! - `--symbol-ordering-file=link/symbol-order.txt`: the functions of start-up and of a turn
//!   first and together (`scripts/symbol-order` writes the list), so the kernel's 64 KiB
//!   fault-around maps them and not 10 MB of code spread over the whole text. Names the build no
//!   longer has are skipped, silently.
//! - `-z pack-relative-relocs` (glibc ≥ 2.36 runs it): the 1.9 MB of relative relocations read
//!   at every start shrink to a bitmap of a few KB.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=link/symbol-order.txt");
    println!("cargo::rerun-if-env-changed=KESOKU_LINK_PLAIN");
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
    let order = Path::new(&env("CARGO_MANIFEST_DIR")).join("link").join("symbol-order.txt");
    if order.is_file() {
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
