//! The compact form's serializer: serde's data model written as CBOR, structs as maps keyed by
//! field index and enum variants by index (see the parent module for the mapping).

use serde::ser::{self, Serialize};

use super::{head, Error, MAJOR_ARRAY, MAJOR_BYTES, MAJOR_MAP, MAJOR_NEG, MAJOR_TEXT, MAJOR_UINT};
use super::{FALSE, FLOAT64, NULL, TAG_BIGNUM, TRUE};

/// Writes values into `out`.
pub(super) struct Serializer<'a> {
    pub(super) out: &'a mut Vec<u8>,
}

impl Serializer<'_> {
    fn uint(&mut self, v: u64) {
        head(self.out, MAJOR_UINT, v);
    }

    fn int(&mut self, v: i64) {
        match u64::try_from(v) {
            Ok(v) => head(self.out, MAJOR_UINT, v),
            // -1 - v, without overflow for i64::MIN.
            Err(_) => head(self.out, MAJOR_NEG, !(v as u64)),
        }
    }

    fn text(&mut self, v: &str) {
        head(self.out, MAJOR_TEXT, v.len() as u64);
        self.out.extend_from_slice(v.as_bytes());
    }

    /// A variant with content: a two-element array, the index then the content.
    fn variant(&mut self, index: u32) {
        head(self.out, MAJOR_ARRAY, 2);
        self.uint(u64::from(index));
    }
}

/// Opens an array or map whose element count is `len` if known, else counted as it is
/// written and put in front at the end.
fn open(out: &mut Vec<u8>, major: u8, len: Option<usize>) -> Collection<'_> {
    let start = out.len();
    if let Some(len) = len {
        head(out, major, len as u64);
    }
    Collection {
        out,
        major,
        declared: len,
        start,
        written: 0,
    }
}

/// An array or map being written.
pub(super) struct Collection<'a> {
    out: &'a mut Vec<u8>,
    major: u8,
    declared: Option<usize>,
    start: usize,
    written: usize,
}

impl Collection<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        value.serialize(Serializer { out: self.out })
    }

    fn finish(self) -> Result<(), Error> {
        match self.declared {
            Some(declared) if declared == self.written => Ok(()),
            Some(declared) => Err(Error(format!(
                "{declared} elements declared, {} written",
                self.written
            ))),
            None => {
                let mut prefix = Vec::with_capacity(9);
                head(&mut prefix, self.major, self.written as u64);
                self.out.splice(self.start..self.start, prefix);
                Ok(())
            }
        }
    }
}

/// A struct being written: a map keyed by field index. Skipped fields keep their index.
pub(super) struct Struct<'a> {
    map: Collection<'a>,
    next_index: u64,
}

impl Struct<'_> {
    fn field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        head(self.map.out, MAJOR_UINT, self.next_index);
        self.next_index += 1;
        self.map.written += 1;
        self.map.element(value)
    }
}

impl<'a> ser::Serializer for Serializer<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Collection<'a>;
    type SerializeTuple = Collection<'a>;
    type SerializeTupleStruct = Collection<'a>;
    type SerializeTupleVariant = Collection<'a>;
    type SerializeMap = Collection<'a>;
    type SerializeStruct = Struct<'a>;
    type SerializeStructVariant = Struct<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Error> {
        self.out.push(if v { TRUE } else { FALSE });
        Ok(())
    }

    fn serialize_i8(mut self, v: i8) -> Result<(), Error> {
        self.int(i64::from(v));
        Ok(())
    }

    fn serialize_i16(mut self, v: i16) -> Result<(), Error> {
        self.int(i64::from(v));
        Ok(())
    }

    fn serialize_i32(mut self, v: i32) -> Result<(), Error> {
        self.int(i64::from(v));
        Ok(())
    }

    fn serialize_i64(mut self, v: i64) -> Result<(), Error> {
        self.int(v);
        Ok(())
    }

    fn serialize_i128(mut self, v: i128) -> Result<(), Error> {
        let v = i64::try_from(v).map_err(|_| Error("i128 beyond 64 bits".to_owned()))?;
        self.int(v);
        Ok(())
    }

    fn serialize_u8(mut self, v: u8) -> Result<(), Error> {
        self.uint(u64::from(v));
        Ok(())
    }

    fn serialize_u16(mut self, v: u16) -> Result<(), Error> {
        self.uint(u64::from(v));
        Ok(())
    }

    fn serialize_u32(mut self, v: u32) -> Result<(), Error> {
        self.uint(u64::from(v));
        Ok(())
    }

    fn serialize_u64(mut self, v: u64) -> Result<(), Error> {
        self.uint(v);
        Ok(())
    }

    /// Up to 64 bits as an integer, above as a bignum (tag 2) of the big-endian bytes without
    /// leading zeros.
    fn serialize_u128(mut self, v: u128) -> Result<(), Error> {
        match u64::try_from(v) {
            Ok(v) => self.uint(v),
            Err(_) => {
                let bytes = v.to_be_bytes();
                let skip = (v.leading_zeros() / 8) as usize;
                head(self.out, super::MAJOR_TAG, TAG_BIGNUM);
                head(self.out, MAJOR_BYTES, (16 - skip) as u64);
                self.out.extend_from_slice(&bytes[skip..]);
            }
        }
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        self.serialize_f64(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        self.out.push(FLOAT64);
        self.out.extend_from_slice(&v.to_bits().to_be_bytes());
        Ok(())
    }

    fn serialize_char(mut self, v: char) -> Result<(), Error> {
        self.text(v.encode_utf8(&mut [0; 4]));
        Ok(())
    }

    fn serialize_str(mut self, v: &str) -> Result<(), Error> {
        self.text(v);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        head(self.out, MAJOR_BYTES, v.len() as u64);
        self.out.extend_from_slice(v);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Error> {
        self.out.push(NULL);
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        mut self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
    ) -> Result<(), Error> {
        self.uint(u64::from(index));
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.variant(index);
        value.serialize(self)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Collection<'a>, Error> {
        Ok(open(self.out, MAJOR_ARRAY, len))
    }

    fn serialize_tuple(self, len: usize) -> Result<Collection<'a>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Collection<'a>, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        len: usize,
    ) -> Result<Collection<'a>, Error> {
        self.variant(index);
        self.serialize_seq(Some(len))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Collection<'a>, Error> {
        Ok(open(self.out, MAJOR_MAP, len))
    }

    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Struct<'a>, Error> {
        let map = self.serialize_map(Some(len))?;
        Ok(Struct { map, next_index: 0 })
    }

    fn serialize_struct_variant(
        mut self,
        name: &'static str,
        index: u32,
        _variant: &'static str,
        len: usize,
    ) -> Result<Struct<'a>, Error> {
        self.variant(index);
        self.serialize_struct(name, len)
    }

    fn is_human_readable(&self) -> bool {
        false
    }
}

impl ser::SerializeSeq for Collection<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.written += 1;
        self.element(value)
    }

    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeTuple for Collection<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }

    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Collection<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }

    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Collection<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        ser::SerializeSeq::serialize_element(self, value)
    }

    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeMap for Collection<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.written += 1;
        self.element(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.element(value)
    }

    fn end(self) -> Result<(), Error> {
        self.finish()
    }
}

impl ser::SerializeStruct for Struct<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        _key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(value)
    }

    fn skip_field(&mut self, _key: &'static str) -> Result<(), Error> {
        self.next_index += 1;
        Ok(())
    }

    fn end(self) -> Result<(), Error> {
        self.map.finish()
    }
}

impl ser::SerializeStructVariant for Struct<'_> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        _key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(value)
    }

    fn skip_field(&mut self, _key: &'static str) -> Result<(), Error> {
        self.next_index += 1;
        Ok(())
    }

    fn end(self) -> Result<(), Error> {
        self.map.finish()
    }
}
