//! Arbitrary bytes through the TCP mesh's frame reader, in chunks of fuzzed sizes, as a
//! connection drives it: the first frame under the hello limit, every later frame under a
//! fuzzed `max_frame`; every frame also goes to the hello decoder. Never panics; every frame
//! returned is the next length-prefixed frame of the stream; a decoded hello encodes back to
//! its frame; the reader's buffer stays within the largest frame the limit allows and its prefix.
//!
//! Input: `max_frame` (2 bytes, big-endian, mapped into 512..=65535), a seed for the chunk
//! sizes (1 byte), then the byte stream.

#![no_main]

use conclave_fuzz::chunks::Chunks;
use conclave_tcp::fuzzing::{self, FrameReader, Parsed, HEADER_LEN, MAX_HELLO};
use conclave_tcp::MIN_FRAME;
use libfuzzer_sys::fuzz_target;

/// The largest `max_frame` a configuration accepts (`TcpConfig::validate`).
const MAX_FRAME: usize = 65_535;

fuzz_target!(|data: &[u8]| {
    let Some((head, stream)) = data.split_first_chunk::<3>() else {
        return;
    };
    let max_frame = MIN_FRAME
        + usize::from(u16::from_be_bytes([head[0], head[1]])) % (MAX_FRAME - MIN_FRAME + 1);
    let mut source = Chunks::new(stream, head[2]);
    let mut reader = FrameReader::default();
    // Where the next frame starts in `stream`, to check each frame against it.
    let mut offset = 0usize;
    let mut hello_done = false;
    // Each read moves at least one byte, so this bounds the loop.
    for _ in 0..=2 * stream.len() + 2 {
        let limit = if hello_done { max_frame } else { MAX_HELLO };
        match reader.parse(limit) {
            Parsed::Frame(payload) => {
                let prefix: [u8; HEADER_LEN] = stream[offset..offset + HEADER_LEN]
                    .try_into()
                    .expect("a whole prefix");
                let len = u32::from_be_bytes(prefix) as usize;
                assert!(
                    len <= limit,
                    "a frame of {len} bytes above the limit {limit}"
                );
                let start = offset + HEADER_LEN;
                assert_eq!(payload, stream[start..start + len], "the frame at {offset}");
                offset = start + len;
                // A connection decodes only its first frame as a hello; every frame is tried
                // here, for more hello-sized inputs.
                if let Ok(hello) = fuzzing::decode_hello(&payload) {
                    assert_eq!(
                        hello.encode(),
                        fuzzing::encode_frame(&payload),
                        "a hello round trip"
                    );
                }
                hello_done = true;
            }
            // A connection closes here.
            Parsed::TooLong(len) => {
                assert!(len > limit as u64);
                return;
            }
            Parsed::Incomplete => {
                if reader
                    .read_from(&mut source, limit)
                    .expect("reads never fail")
                    == 0
                {
                    assert!(source.is_empty());
                    return;
                }
            }
        }
        // The buffer holds one frame and its prefix at most, as documented.
        let bound = HEADER_LEN + max_frame.max(MAX_HELLO);
        assert!(
            reader.allocated() <= bound,
            "the reader holds {} bytes, above {bound}",
            reader.allocated()
        );
    }
    panic!("the reader made no progress");
});
