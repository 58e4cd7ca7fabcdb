//! Gateway behaviour against real stores (SQLite always; PostgreSQL when its URL is set).

#![allow(clippy::expect_used)]

mod listen;
