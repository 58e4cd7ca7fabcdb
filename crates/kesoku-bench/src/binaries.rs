//! Finding the real binaries to measure or drive: `kesoku` (the product) and
//! `kesoku-bench-service` (this crate's service process), next to the running executable in the
//! same target directory and profile.
//!
//! [`kesoku_binary`] asks the cargo that runs the tests to bring `kesoku` up to date first (a
//! no-op when `cargo test --workspace` just built it; a build when this crate's tests run alone
//! after a change elsewhere). It never builds anything else and never looks outside the target
//! directory.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The folder holding the running executable's sibling binaries (`target/<profile>`): the
/// executable's own folder, or its parent when it runs from `deps/` (test binaries).
pub fn profile_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().map(Path::to_path_buf)
    } else {
        Some(dir.to_path_buf())
    }
}

/// A binary of this target directory and profile, if it is built.
pub fn sibling(name: &str) -> Option<PathBuf> {
    let path = profile_dir()?.join(name);
    path.is_file().then_some(path)
}

/// The `kesoku` binary of this profile, brought up to date by cargo first (once per process:
/// a test run of this crate alone would otherwise drive a stale build).
pub fn kesoku_binary() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            build_kesoku()?;
            sibling("kesoku").ok_or_else(|| "cargo built `kesoku` but it is not next to the tests".to_owned())
        })
        .clone()
}

fn build_kesoku() -> Result<(), String> {
    let dir = profile_dir().ok_or("cannot tell where the running executable lives")?;
    let release = dir.file_name().is_some_and(|name| name == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = std::process::Command::new(cargo);
    command.args(["build", "-p", "kesoku", "--bin", "kesoku"]);
    if release {
        command.arg("--release");
    }
    if let Some(target) = dir.parent() {
        command.env("CARGO_TARGET_DIR", target);
    }
    let status = command.status().map_err(|error| format!("cannot run cargo to build `kesoku`: {error}"))?;
    if status.success() { Ok(()) } else { Err(format!("`cargo build -p kesoku` failed ({status}): build it first")) }
}
