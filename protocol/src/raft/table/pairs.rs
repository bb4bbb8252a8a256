//! Maps in the snapshot as sequences of `(key, value)` pairs: their keys (lock keys, member
//! ids) are composite, which CBOR allows as map keys but many decoders do not; pairs are plain.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Writes `map` as a sequence of pairs, in key order.
pub(super) fn serialize<K, V, S>(map: &BTreeMap<K, V>, serializer: S) -> Result<S::Ok, S::Error>
where
    K: Serialize,
    V: Serialize,
    S: Serializer,
{
    serializer.collect_seq(map)
}

/// Reads a sequence of pairs back into a map.
pub(super) fn deserialize<'de, K, V, D>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
where
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Vec::<(K, V)>::deserialize(deserializer).map(|pairs| pairs.into_iter().collect())
}
