//! Sealed packets: arbitrary bytes opened by a keyed and an unkeyed member never panic and
//! never open at the keyed one; a genuine packet opens once, and not once changed.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    conclave_fuzz::seal_open(data);
});
