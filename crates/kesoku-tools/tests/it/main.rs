//! Integration tests of kesoku-tools: real `/bin/sh` processes and real files in temp folders.
//!
//! Waiting here is on real processes (a pid file appearing, a process disappearing), polled
//! with short sleeps and generous limits; `tokio::time::pause` cannot stand in for a child
//! process's own clock.

mod config;
mod files;
mod http;
mod registry;
mod shell;
mod shell_processes;
mod support;
