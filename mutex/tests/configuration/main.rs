//! A node configured wrong fails loudly, through the public API: each test of [`misconfig`] is
//! one misconfiguration, the error it gets, and that no lock was granted because of it.

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod misconfig;
