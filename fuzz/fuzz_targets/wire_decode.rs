//! Arbitrary bytes into the wire decoders: `Header::read`, `decode_packet` (for the cluster the
//! header names, so the fuzzer gets past the cluster check) and `decode_message`. They must
//! never panic, and whatever decodes must survive an encode/decode round trip unchanged.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    conclave_fuzz::wire_round_trip(data);
});
