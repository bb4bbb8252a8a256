//! Conclave's cross-crate test suites (not published).
//!
//! The suites live in `tests/`: `transport.rs` runs one set of scenarios of the
//! [`Transport`](https://docs.rs/conclave-lock-api) contract against every transport (the
//! in-memory one, UDP multicast, the TCP mesh). Run them with
//! `cargo test -p conclave-tests`; the output names each test `<transport>::<scenario>`.
