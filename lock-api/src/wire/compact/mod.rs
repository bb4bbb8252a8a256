//! The compact form of protocol version 4: serde's data model as CBOR without names.
//!
//! Version 3 writes each struct as a map keyed by field name and each enum variant by name
//! (cbor4ii's serde mapping). The compact form writes the same values with numbers instead:
//!
//! | serde | compact CBOR |
//! |---|---|
//! | struct, struct variant's content | map keyed by field index (declaration order, from 0); a field skipped by `skip_serializing_if` keeps its index and is left out |
//! | unit variant | its index, an unsigned integer |
//! | newtype, tuple and struct variant | array `[index, content]` (content: the value, an array, a map as for a struct) |
//! | newtype struct | its content; unit and `None`: `null`; `Some(x)`: `x` |
//! | integers | CBOR integers; a `u128` above 64 bits as a bignum (tag 2, big-endian bytes without leading zeros) |
//! | strings, bytes, sequences, maps | text, byte string, array, map (definite lengths) |
//!
//! So new fields and new variants need no code here, and a decoder skips fields it does not
//! know (higher indices) as serde's derive does for names. What this relies on of the derive:
//! field indices of serialization and deserialization agree, which holds for structs without
//! `skip`, `skip_serializing`, `skip_deserializing` or `flatten` (none of the wire types uses
//! them; the round-trip tests of every message would fail if one did).
//!
//! Decoding is total: no panics, nesting limited, lengths checked against the input before
//! anything is taken, nothing allocated ahead of the input.

mod de;
mod ser;

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

const MAJOR_UINT: u8 = 0;
const MAJOR_NEG: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;
const MAJOR_MAP: u8 = 5;
const MAJOR_TAG: u8 = 6;
const FALSE: u8 = 0xf4;
const TRUE: u8 = 0xf5;
const NULL: u8 = 0xf6;
const FLOAT64: u8 = 0xfb;
const TAG_BIGNUM: u64 = 2;

/// Why a value could not be written or read in the compact form.
#[derive(Debug)]
pub(super) struct Error(pub(super) String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl serde::ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

impl serde::de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

/// Appends the compact form of `value` to `out`.
pub(super) fn encode<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), Error> {
    value.serialize(ser::Serializer { out })
}

/// Reads a `T` from the whole of `bytes`, nesting at most `depth` levels.
pub(super) fn decode<T: DeserializeOwned>(bytes: &[u8], depth: usize) -> Result<T, Error> {
    let mut deserializer = de::Deserializer::new(bytes, depth);
    let value = T::deserialize(&mut deserializer)?;
    match deserializer.rest() {
        0 => Ok(value),
        n => Err(Error(format!("{n} trailing bytes"))),
    }
}

/// Writes a CBOR head: the major type and the argument in its shortest form.
fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let major = major << 5;
    match n {
        0..=23 => out.push(major | n as u8),
        24..=0xff => out.extend_from_slice(&[major | 24, n as u8]),
        0x100..=0xffff => {
            out.push(major | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(major | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(major | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    /// A message as a newer build writes it: a flag added last, on the wire only when set.
    #[derive(Serialize)]
    enum Newer {
        Lock {
            request: u64,
            quiet: bool,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            passes: bool,
        },
    }

    /// The same message as an older build knows it.
    #[derive(Deserialize, Debug, PartialEq)]
    enum Older {
        Lock { request: u64, quiet: bool },
    }

    /// A field an older build does not know (a higher index) is skipped, whether present or
    /// not, so a flag added last with a default stays compatible with older builds.
    #[test]
    fn an_older_build_skips_a_field_added_last() {
        for passes in [false, true] {
            let mut bytes = Vec::new();
            super::encode(
                &Newer::Lock {
                    request: 42,
                    quiet: true,
                    passes,
                },
                &mut bytes,
            )
            .expect("encodes");
            let older: Older = super::decode(&bytes, 32).expect("an older build decodes it");
            assert_eq!(
                older,
                Older::Lock {
                    request: 42,
                    quiet: true
                }
            );
        }
    }
}
