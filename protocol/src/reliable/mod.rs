//! Reliable delivery (in progress).
