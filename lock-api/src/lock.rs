//! Lock names, modes and fencing tokens.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::LockNameError;

/// A validated name type: a newtype over non-empty UTF-8 of at most `MAX_LEN` bytes without
/// control characters, valid by construction ("parse, don't validate"), including when it is
/// decoded from the network.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $max:expr) => {
        $(#[$doc])*
        #[doc = ""]
        #[doc = "Cloning one is cheap: the name is shared, not copied."]
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
        #[serde(try_from = "String")]
        pub struct $name(Arc<str>);

        impl $name {
            #[doc = "The longest name accepted, in bytes."]
            pub const MAX_LEN: usize = $max;

            #[doc = "Validates `name` and wraps it."]
            #[doc = ""]
            #[doc = "# Errors"]
            #[doc = concat!(
                "[`LockNameError::Empty`] for an empty name, [`LockNameError::TooLong`] above [`",
                stringify!($name),
                "::MAX_LEN`] bytes, [`LockNameError::ControlCharacter`] for a name with a \
                 control character (newline, tab, escape, ...)."
            )]
            pub fn new(name: impl Into<String>) -> Result<Self, LockNameError> {
                let name = name.into();
                if name.is_empty() {
                    return Err(LockNameError::Empty);
                }
                if name.len() > Self::MAX_LEN {
                    return Err(LockNameError::TooLong {
                        len: name.len(),
                        max: Self::MAX_LEN,
                    });
                }
                if name.chars().any(char::is_control) {
                    return Err(LockNameError::ControlCharacter);
                }
                Ok(Self(name.into()))
            }

            #[doc = "The name as a string slice."]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = LockNameError;

            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0.as_ref().to_owned()
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }
    };
}

name_type!(
    /// The name of a distributed lock: non-empty UTF-8 of at most [`LockName::MAX_LEN`] bytes,
    /// without control characters (it appears in logs and events).
    ///
    /// "Parse, don't validate": a `LockName` is valid by construction, including when it is
    /// decoded from the network (a message naming an invalid lock is dropped as malformed).
    ///
    /// ```
    /// use conclave_lock_api::{LockName, LockNameError};
    ///
    /// assert!(LockName::new("orders/42").is_ok());
    /// assert_eq!(LockName::new("x".repeat(300)), Err(LockNameError::TooLong { len: 300, max: 255 }));
    /// assert_eq!(LockName::new("a\nb"), Err(LockNameError::ControlCharacter));
    /// ```
    LockName,
    255
);

name_type!(
    /// The name of a lock service: an independent namespace of locks on the same cluster
    /// (Geode's named `DistributedLockService`), with its own grantor, reconciliation and
    /// events. Non-empty UTF-8 of at most [`ServiceName::MAX_LEN`] bytes, without control
    /// characters; valid by construction, including when decoded from the network.
    ///
    /// ```
    /// use conclave_lock_api::{LockNameError, ServiceName};
    ///
    /// assert_eq!(ServiceName::new("billing")?.as_str(), "billing");
    /// assert_eq!(ServiceName::new(""), Err(LockNameError::Empty));
    /// assert_eq!(ServiceName::new("bill\ting"), Err(LockNameError::ControlCharacter));
    /// # Ok::<(), LockNameError>(())
    /// ```
    ServiceName,
    64
);

/// How a lock is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LockMode {
    /// One holder at a time, and no shared holders meanwhile.
    Exclusive,
    /// Any number of shared holders at once, and no exclusive holder meanwhile.
    Shared,
}

impl LockMode {
    /// Whether a holder in mode `self` and a holder in mode `other` may hold the lock together.
    pub fn is_compatible_with(self, other: LockMode) -> bool {
        matches!((self, other), (LockMode::Shared, LockMode::Shared))
    }
}

/// A fencing token: a number that strictly increases, per lock, with every grant.
///
/// Pass it to the resource the lock protects; the resource rejects writes carrying a token
/// lower than the highest it has seen, which makes a paused or partitioned former holder
/// harmless. The high 32 bits come from the view epoch of the grant and the low 32 bits count
/// grants within it, so tokens keep increasing across grantor changes.
///
/// ```
/// use conclave_lock_api::FencingToken;
///
/// assert!(FencingToken::new(3, 0) > FencingToken::new(2, 999));
/// assert_eq!(FencingToken::new(3, 7).epoch(), 3);
/// // Both formats show the two parts, epoch first.
/// assert_eq!(FencingToken::new(3, 7).to_string(), "3.7");
/// assert_eq!(format!("{:?}", FencingToken::new(3, 7)), "FencingToken(3.7)");
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// A token from a view epoch (its low 32 bits) and a counter within that epoch.
    pub fn new(epoch: u64, counter: u32) -> Self {
        Self(((epoch & 0xffff_ffff) << 32) | u64::from(counter))
    }

    /// The view epoch part of the token.
    pub fn epoch(self) -> u64 {
        self.0 >> 32
    }

    /// The counter part of the token.
    pub fn counter(self) -> u32 {
        (self.0 & 0xffff_ffff) as u32
    }
}

impl fmt::Display for FencingToken {
    /// `epoch.counter`, e.g. `1.121`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch(), self.counter())
    }
}

impl fmt::Debug for FencingToken {
    /// `FencingToken(epoch.counter)`, the parts [`fmt::Display`] shows (the raw number mixes
    /// them: `FencingToken(1.121)` is `(1 << 32) + 121`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_at_the_bound() {
        assert!(LockName::new("x".repeat(255)).is_ok());
        assert_eq!(
            LockName::new("x".repeat(256)),
            Err(LockNameError::TooLong { len: 256, max: 255 })
        );
        assert!(
            LockName::new("é".repeat(127)).is_ok(),
            "bytes, not characters"
        );
        assert!(LockName::new("é".repeat(128)).is_err());
    }

    #[test]
    fn names_are_printable() {
        for name in [
            "a\nb",
            "\t",
            "tail\r",
            "\u{1b}[31mred",
            "nul\0",
            "\u{85}next-line",
        ] {
            assert_eq!(
                LockName::new(name),
                Err(LockNameError::ControlCharacter),
                "{name:?}"
            );
            assert_eq!(
                ServiceName::new(name),
                Err(LockNameError::ControlCharacter),
                "{name:?}"
            );
        }
        for name in ["orders/42", "a b", "zählung", "🔒", "x.y-z_1"] {
            assert!(LockName::new(name).is_ok(), "{name:?}");
            assert!(ServiceName::new(name).is_ok(), "{name:?}");
        }
        assert_eq!(ServiceName::new(""), Err(LockNameError::Empty));
        assert_eq!(
            ServiceName::new("s".repeat(65)),
            Err(LockNameError::TooLong { len: 65, max: 64 })
        );
    }

    #[test]
    fn names_decoded_from_the_wire_are_validated() {
        let decode = |name: &str| ciborium::from_reader::<LockName, _>(cbor_text(name).as_slice());
        assert_eq!(decode("ok").ok().map(String::from), Some("ok".to_owned()));
        assert!(decode("a\nb").is_err());
        assert!(decode("").is_err());
    }

    /// `name` as a CBOR text string.
    fn cbor_text(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(&name, &mut out).expect("encodes");
        out
    }

    #[test]
    fn shared_is_only_compatible_with_shared() {
        assert!(LockMode::Shared.is_compatible_with(LockMode::Shared));
        assert!(!LockMode::Shared.is_compatible_with(LockMode::Exclusive));
        assert!(!LockMode::Exclusive.is_compatible_with(LockMode::Shared));
        assert!(!LockMode::Exclusive.is_compatible_with(LockMode::Exclusive));
    }

    #[test]
    fn tokens_order_by_epoch_then_counter() {
        let a = FencingToken::new(1, u32::MAX);
        let b = FencingToken::new(2, 0);
        assert!(a < b);
        assert_eq!(b.counter(), 0);
        assert_eq!(a.to_string(), format!("1.{}", u32::MAX));
    }

    #[test]
    fn debug_shows_the_parts_display_shows() {
        let token = FencingToken::new(1, 121);
        assert_eq!(token.0, 4_294_967_417);
        assert_eq!(token.to_string(), "1.121");
        assert_eq!(format!("{token:?}"), "FencingToken(1.121)");
        assert_eq!(
            format!("{:?}", Some(FencingToken::default())),
            "Some(FencingToken(0.0))"
        );
    }
}
