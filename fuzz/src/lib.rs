//! Helpers shared by the fuzz targets in `fuzz_targets/` and the corpus generator in
//! `examples/gen_corpus.rs`.
//!
//! - [`script`]: the byte format of the `endpoint_input` target, a script of inputs to one
//!   `Endpoint` (time steps, raw datagrams, datagrams built from fuzzed fields, local lock
//!   calls), with a writer so the generator can produce seeds.
//! - [`chunks`]: a reader handing out a byte stream in chunks of fuzzed sizes (`tcp_frames`).
//! - [`wire_round_trip`]: the round-trip property of `wire_decode`.

pub mod chunks;
pub mod script;
mod seal;

pub use seal::seal_open;

use conclave_lock_api::wire::{self, ClusterId, Header};

/// The cluster the seeds and the endpoint target use.
pub const CLUSTER: &str = "fuzz";

/// Decodes `bytes` as a datagram (for the cluster its header names) and as a bare message;
/// whatever decodes must encode again and decode to the same value, and the second encoding
/// must equal the first (the encoder's output is a fixed point).
///
/// # Panics
/// When the property does not hold: that is a bug the fuzzer reports.
pub fn wire_round_trip(bytes: &[u8]) {
    let header = Header::read(bytes);
    if header.is_ok() {
        assert!(bytes.len() >= wire::HEADER_LEN);
        assert_eq!(bytes[..4], wire::MAGIC);
    }
    let cluster = header.map_or(ClusterId::from_name(CLUSTER), |h| h.cluster);
    if let Ok(packet) = wire::decode_packet(cluster, bytes) {
        // A decoder accepts non-canonical forms (a struct as an array, long integer heads),
        // so the canonical encoding may be longer than the input, and above the limit.
        if let Some(encoded) = encodable(wire::encode_packet(cluster, &packet)) {
            let again =
                wire::decode_packet(cluster, &encoded).expect("a re-encoded packet decodes");
            assert_eq!(again, packet, "packet round trip");
            let twice = wire::encode_packet(cluster, &again).expect("encodes twice");
            assert_eq!(twice, encoded, "packet encoding is a fixed point");
        }
    }
    if let Ok(message) = wire::decode_message(bytes) {
        if let Some(encoded) = encodable(wire::encode_message(&message)) {
            let again = wire::decode_message(&encoded).expect("a re-encoded message decodes");
            assert_eq!(again, message, "message round trip");
            let twice = wire::encode_message(&again).expect("encodes twice");
            assert_eq!(twice, encoded, "message encoding is a fixed point");
        }
    }
}

/// The encoding, or `None` if it is only too large; any other error is a bug.
fn encodable(result: Result<Vec<u8>, wire::EncodeError>) -> Option<Vec<u8>> {
    match result {
        Ok(bytes) => Some(bytes),
        Err(wire::EncodeError::TooLarge { .. }) => None,
        Err(error) => panic!("a decoded value fails to encode: {error}"),
    }
}
