//! A byte stream handed out in chunks of fuzzed sizes, as a socket would.

use std::io::{self, Read};

/// Hands out `data` a chunk at a time: each `read` returns at most the next size drawn from
/// `seed` (a small xorshift generator), so the same input always splits the same way.
#[derive(Debug)]
pub struct Chunks<'a> {
    data: &'a [u8],
    state: u32,
}

impl<'a> Chunks<'a> {
    /// A reader of `data`, split by sizes drawn from `seed`.
    pub fn new(data: &'a [u8], seed: u8) -> Self {
        Self {
            data,
            state: 0x9e37_79b9 ^ u32::from(seed),
        }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next chunk size: mostly tiny (a prefix split anywhere), sometimes up to 64 KiB.
    fn next_size(&mut self) -> usize {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        self.state = x;
        match x % 4 {
            0 => 1 + (x >> 8) as usize % 4,
            1 => 1 + (x >> 8) as usize % 64,
            2 => 1 + (x >> 8) as usize % 4096,
            _ => 1 + (x >> 8) as usize % 65_536,
        }
    }
}

impl Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.next_size().min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}
