//! Helpers shared by the unit tests of several modules.

use std::net::SocketAddr;

use conclave_lock_api::MemberId;

/// Member `n`, named `m<n>` at 127.0.0.1:7000+n; incarnations ordered by `n`.
pub(crate) fn member(n: u8) -> MemberId {
    MemberId::new(
        u128::from(n) << 100,
        &format!("m{n}"),
        SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(n))),
    )
    .unwrap()
}
