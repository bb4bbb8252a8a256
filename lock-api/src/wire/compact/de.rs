//! The compact form's deserializer: reads what `ser` writes, over a byte slice, borrowing
//! strings and bytes from it. Total: every length is checked against what is left of the
//! input before it is taken, nesting is limited, and sizes hinted to serde never exceed the
//! bytes left (each element takes at least one).

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use super::{Error, MAJOR_ARRAY, MAJOR_BYTES, MAJOR_MAP, MAJOR_NEG, MAJOR_TAG, MAJOR_TEXT};
use super::{MAJOR_UINT, TAG_BIGNUM};

/// One CBOR data item's head, with the content of strings.
enum Item<'de> {
    Uint(u64),
    /// The negative integer `-1 - n`.
    Neg(u64),
    Bytes(&'de [u8]),
    Text(&'de str),
    Array(u64),
    Map(u64),
    Tag(u64),
    Bool(bool),
    Null,
    Float(f64),
}

impl Item<'_> {
    fn describe(&self) -> &'static str {
        match self {
            Item::Uint(_) => "an unsigned integer",
            Item::Neg(_) => "a negative integer",
            Item::Bytes(_) => "a byte string",
            Item::Text(_) => "a text string",
            Item::Array(_) => "an array",
            Item::Map(_) => "a map",
            Item::Tag(_) => "a tag",
            Item::Bool(_) => "a boolean",
            Item::Null => "null",
            Item::Float(_) => "a float",
        }
    }
}

fn unexpected(found: &Item<'_>, expected: &str) -> Error {
    Error(format!("expected {expected}, found {}", found.describe()))
}

/// Reads values from a byte slice.
pub(super) struct Deserializer<'de> {
    input: &'de [u8],
    depth_left: usize,
}

impl<'de> Deserializer<'de> {
    pub(super) fn new(input: &'de [u8], depth: usize) -> Self {
        Self {
            input,
            depth_left: depth,
        }
    }

    /// How many bytes are left unread.
    pub(super) fn rest(&self) -> usize {
        self.input.len()
    }

    fn take(&mut self, n: u64) -> Result<&'de [u8], Error> {
        let n = usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.input.len())
            .ok_or_else(|| {
                Error(format!(
                    "{n} bytes wanted, {} left: truncated",
                    self.input.len()
                ))
            })?;
        let (taken, rest) = self.input.split_at(n);
        self.input = rest;
        Ok(taken)
    }

    fn peek_major(&self) -> Option<u8> {
        self.input.first().map(|b| b >> 5)
    }

    fn next(&mut self) -> Result<Item<'de>, Error> {
        let initial = self.take(1)?[0];
        let (major, info) = (initial >> 5, initial & 0x1f);
        let arg = match info {
            0..=23 => u64::from(info),
            24..=27 => {
                let bytes = self.take(1 << (info - 24))?;
                bytes.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b))
            }
            _ => return Err(Error(format!("unsupported CBOR head 0x{initial:02x}"))),
        };
        Ok(match major {
            MAJOR_UINT => Item::Uint(arg),
            MAJOR_NEG => Item::Neg(arg),
            MAJOR_BYTES => Item::Bytes(self.take(arg)?),
            MAJOR_TEXT => Item::Text(
                std::str::from_utf8(self.take(arg)?)
                    .map_err(|_| Error("text string of invalid UTF-8".to_owned()))?,
            ),
            MAJOR_ARRAY => Item::Array(arg),
            MAJOR_MAP => Item::Map(arg),
            MAJOR_TAG => Item::Tag(arg),
            _ => match info {
                20 => Item::Bool(false),
                21 => Item::Bool(true),
                22 => Item::Null,
                27 => Item::Float(f64::from_bits(arg)),
                _ => return Err(Error(format!("unsupported CBOR value 0x{initial:02x}"))),
            },
        })
    }

    fn enter(&mut self) -> Result<(), Error> {
        self.depth_left = self
            .depth_left
            .checked_sub(1)
            .ok_or_else(|| Error("nested too deeply".to_owned()))?;
        Ok(())
    }

    fn leave(&mut self) {
        self.depth_left += 1;
    }

    /// The content of a bignum tag: at most 16 bytes, big-endian.
    fn bignum(&mut self) -> Result<u128, Error> {
        self.enter()?;
        let bytes = match self.next()? {
            Item::Bytes(bytes) if bytes.len() <= 16 => bytes,
            Item::Bytes(_) => return Err(Error("bignum above 128 bits".to_owned())),
            other => return Err(unexpected(&other, "the bytes of a bignum")),
        };
        self.leave();
        Ok(bytes.iter().fold(0u128, |n, b| (n << 8) | u128::from(*b)))
    }

    fn visit<V: Visitor<'de>>(&mut self, item: Item<'de>, visitor: V) -> Result<V::Value, Error> {
        match item {
            Item::Uint(n) => visitor.visit_u64(n),
            Item::Neg(n) => match i64::try_from(n) {
                Ok(n) => visitor.visit_i64(-1 - n),
                Err(_) => visitor.visit_i128(-1 - i128::from(n)),
            },
            Item::Bytes(bytes) => visitor.visit_borrowed_bytes(bytes),
            Item::Text(text) => visitor.visit_borrowed_str(text),
            Item::Array(n) => self.seq(n, visitor),
            Item::Map(n) => self.map(n, visitor),
            Item::Tag(TAG_BIGNUM) => visitor.visit_u128(self.bignum()?),
            Item::Tag(tag) => Err(Error(format!("unsupported tag {tag}"))),
            Item::Bool(b) => visitor.visit_bool(b),
            Item::Null => visitor.visit_unit(),
            Item::Float(f) => visitor.visit_f64(f),
        }
    }

    fn seq<V: Visitor<'de>>(&mut self, len: u64, visitor: V) -> Result<V::Value, Error> {
        self.enter()?;
        let mut access = Elements {
            de: self,
            left: len,
        };
        let value = visitor.visit_seq(&mut access)?;
        if access.left != 0 {
            return Err(Error(format!("{} elements left unread", access.left)));
        }
        self.leave();
        Ok(value)
    }

    fn map<V: Visitor<'de>>(&mut self, len: u64, visitor: V) -> Result<V::Value, Error> {
        self.enter()?;
        let mut access = Elements {
            de: self,
            left: len,
        };
        let value = visitor.visit_map(&mut access)?;
        if access.left != 0 {
            return Err(Error(format!("{} entries left unread", access.left)));
        }
        self.leave();
        Ok(value)
    }

    /// Skips one data item (a field this build does not know).
    fn skip(&mut self) -> Result<(), Error> {
        let (count, nested) = match self.next()? {
            Item::Array(n) => (n, true),
            Item::Map(n) => (n.saturating_mul(2), true),
            Item::Tag(_) => (1, true),
            _ => (0, false),
        };
        if nested {
            self.enter()?;
            for _ in 0..count {
                self.skip()?;
            }
            self.leave();
        }
        Ok(())
    }

    fn integer<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            item @ (Item::Uint(_) | Item::Neg(_) | Item::Tag(TAG_BIGNUM)) => {
                self.visit(item, visitor)
            }
            other => Err(unexpected(&other, "an integer")),
        }
    }
}

macro_rules! integers {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                self.integer(visitor)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for &mut Deserializer<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let item = self.next()?;
        self.visit(item, visitor)
    }

    integers!(
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
    );

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Bool(b) => visitor.visit_bool(b),
            other => Err(unexpected(&other, "a boolean")),
        }
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Float(f) => visitor.visit_f64(f),
            other => Err(unexpected(&other, "a float")),
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Text(text) => visitor.visit_borrowed_str(text),
            other => Err(unexpected(&other, "a text string")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Bytes(bytes) => visitor.visit_borrowed_bytes(bytes),
            other => Err(unexpected(&other, "a byte string")),
        }
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.input.first() == Some(&super::NULL) {
            self.input = &self.input[1..];
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Null => visitor.visit_unit(),
            other => Err(unexpected(&other, "null")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Array(n) => self.seq(n, visitor),
            other => Err(unexpected(&other, "an array")),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Map(n) => self.map(n, visitor),
            other => Err(unexpected(&other, "a map")),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.peek_major() {
            Some(MAJOR_UINT) => visitor.visit_enum(Variant {
                de: self,
                content: false,
            }),
            Some(MAJOR_ARRAY) => {
                match self.next()? {
                    Item::Array(2) => {}
                    other => return Err(unexpected(&other, "an array [index, content]")),
                }
                self.enter()?;
                let value = visitor.visit_enum(Variant {
                    de: &mut *self,
                    content: true,
                })?;
                self.leave();
                Ok(value)
            }
            _ => {
                let item = self.next()?;
                Err(unexpected(&item, "an enum variant"))
            }
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.next()? {
            Item::Uint(n) => visitor.visit_u64(n),
            other => Err(unexpected(&other, "a field or variant index")),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.skip()?;
        visitor.visit_unit()
    }

    fn is_human_readable(&self) -> bool {
        false
    }
}

/// The elements of an array, or the entries of a map.
struct Elements<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    left: u64,
}

impl Elements<'_, '_> {
    fn size_hint(&self) -> Option<usize> {
        Some(usize::try_from(self.left).map_or(self.de.input.len(), |n| n.min(self.de.input.len())))
    }
}

impl<'de> de::SeqAccess<'de> for &mut Elements<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Elements::size_hint(self)
    }
}

impl<'de> de::MapAccess<'de> for &mut Elements<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(&mut *self.de)
    }

    fn size_hint(&self) -> Option<usize> {
        Elements::size_hint(self)
    }
}

/// An enum's variant: a bare index (`content: false`), or the index and content of an array.
struct Variant<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    content: bool,
}

impl<'de> de::EnumAccess<'de> for Variant<'_, 'de> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let index = match self.de.next()? {
            Item::Uint(n) => n,
            other => return Err(unexpected(&other, "a variant index")),
        };
        let value = seed.deserialize(index.into_deserializer())?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.content {
            false => Ok(()),
            true => Err(Error("a unit variant with content".to_owned())),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        self.with_content()?;
        seed.deserialize(self.de)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        self.with_content()?;
        de::Deserializer::deserialize_tuple(self.de, len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.with_content()?;
        de::Deserializer::deserialize_struct(self.de, "", fields, visitor)
    }
}

impl Variant<'_, '_> {
    fn with_content(&self) -> Result<(), Error> {
        match self.content {
            true => Ok(()),
            false => Err(Error("a variant without its content".to_owned())),
        }
    }
}
