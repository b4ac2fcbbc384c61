//! The configuration's JSON, read strictly: a key given twice in one object is an error naming
//! it by its path (`machines.kube1.gpus`), where serde_json keeps the last silently (a machine
//! meant to get no GPU would get every one); and serde's complaints about a value said in JSON's
//! terms.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// `bytes` as a JSON value, refusing a duplicate key anywhere; the error says where.
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict {
        path: String::new(),
    }
    .deserialize(&mut de)
    .map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// A value at `path` (dot-separated keys, `[i]` for array items; empty at the top).
struct Strict {
    path: String,
}

impl Strict {
    fn child(&self, key: &str) -> Strict {
        Strict {
            path: if self.path.is_empty() {
                key.to_owned()
            } else {
                format!("{}.{key}", self.path)
            },
        }
    }
}

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict {
            path: format!("{}[{}]", self.path, out.len()),
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let at = self.child(&key);
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "{}: the key is given twice (JSON keeps the last silently; say it once)",
                    at.path
                )));
            }
            let v = map.next_value_seed(at)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// serde's message about a value in JSON's terms, not Rust's: `expected u64` is a whole number
/// of 0 or more, `expected struct DevicesSetting` and `map` a JSON object, `sequence` a list.
pub(super) fn in_json_terms(serde: &str) -> String {
    let mut out = serde.to_owned();
    while let Some(at) = out.find("expected struct ") {
        let name = &out[at + "expected struct ".len()..];
        let end = name
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .unwrap_or(name.len());
        out.replace_range(
            at..at + "expected struct ".len() + end,
            "expected a JSON object",
        );
    }
    for (rust, json) in [
        ("expected u64", "expected a whole number of 0 or more"),
        ("expected u32", "expected a whole number of 0 or more"),
        ("expected u16", "expected a whole number of 0 or more"),
        ("expected u8", "expected a whole number of 0 or more"),
        ("expected usize", "expected a whole number of 0 or more"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected a sequence", "expected a list"),
        ("expected a map", "expected a JSON object"),
        ("invalid type: map", "invalid type: a JSON object"),
        ("invalid type: sequence", "invalid type: a list"),
    ] {
        out = out.replace(rust, json);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_key_given_twice_is_named_by_its_path() {
        let e = parse(br#"{"machines":{"kube1":{"gpus":"none","gpus":"all"}}}"#).unwrap_err();
        assert!(
            e.starts_with("machines.kube1.gpus: the key is given twice"),
            "{e}"
        );
        let e = parse(br#"{"a":[{"b":1},{"b":2,"b":3}]}"#).unwrap_err();
        assert!(e.starts_with("a[1].b: the key is given twice"), "{e}");
        assert_eq!(
            parse(br#"{"a":{"b":[1,2.5,"x",null,true]},"c":{}}"#).unwrap(),
            serde_json::json!({"a":{"b":[1,2.5,"x",null,true]},"c":{}})
        );
        assert!(parse(br#"{"a":1} x"#).is_err(), "trailing characters");
    }
}
