//! The sealed-packet target: arbitrary bytes opened by a keyed and by an unkeyed member, and a
//! genuine sealed packet changed by the input.

use std::net::SocketAddr;
use std::time::Instant;

use conclave_lock_api::seal::{ClusterKey, Keyring, Opened, Sealer};
use conclave_lock_api::wire::ClusterId;

/// Never panics; arbitrary bytes never open; a genuine packet opens exactly once, unchanged,
/// and not at all once any byte of it is changed.
pub fn seal_open(data: &[u8]) {
    let cluster = ClusterId(0x5ea1);
    let ring = Keyring::new(ClusterKey::from_bytes([1; 32]));
    let (a, b): (SocketAddr, SocketAddr) = (
        SocketAddr::from(([127, 0, 0, 1], 7801)),
        SocketAddr::from(([127, 0, 0, 1], 7802)),
    );
    let (Ok(sender), Ok(keyed), Ok(open)) = (
        Sealer::new(cluster, Some(ring.clone()), a),
        Sealer::new(cluster, Some(ring), b),
        Sealer::new(cluster, None, b),
    ) else {
        return;
    };
    let now = Instant::now();
    // Bytes nobody sealed with the key never open at a keyed member.
    assert!(!matches!(keyed.open(now, a, data), Opened::Datagram(_)));
    // A member without a key passes what is not sealed or a notice, and drops the rest.
    if let Opened::Datagram(d) = open.open(now, a, data) {
        assert_eq!(d, data);
    }
    // A genuine packet carrying the input.
    let Ok(packet) = sender.seal(Some(b), data) else {
        return;
    };
    if data.len() >= 2 {
        let mut bent = packet.clone();
        let at = usize::from(u16::from_be_bytes([data[0], data[1]])) % bent.len();
        bent[at] ^= data.get(2).copied().unwrap_or(1).max(1);
        assert!(
            !matches!(keyed.open(now, a, &bent), Opened::Datagram(_)),
            "a packet changed at byte {at} opened"
        );
    }
    assert_eq!(keyed.open(now, a, &packet), Opened::Datagram(data.to_vec()));
    assert!(
        !matches!(keyed.open(now, a, &packet), Opened::Datagram(_)),
        "a replay opened"
    );
}
