//! A spec or status as resync holds it between the LIST and the writes: compact JSON text
//! instead of a `serde_json::Value` tree. An unchanged pass keeps both sides of a whole bound
//! API in memory, and a small object's spec as a `Value` map costs several hundred bytes of
//! tree nodes against a few dozen as text (docs/performance.md "Memory").

use serde::{Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// `None` is JSON `null` (or a field the object does not have).
///
/// Two `Doc`s are equal exactly when their values are: serde_json's maps are sorted by key
/// (the crate's `preserve_order` feature is off), so the compact text of a value is canonical.
#[derive(Debug, Default)]
pub struct Doc(Option<Box<RawValue>>);

impl Doc {
    /// Keep `v` as compact text; `null` is kept as nothing.
    pub fn new(v: Option<&Value>) -> Doc {
        match v {
            None | Some(Value::Null) => Doc(None),
            // Serializing a Value cannot fail: its map keys are strings.
            Some(v) => Doc(serde_json::value::to_raw_value(v).ok()),
        }
    }

    pub fn is_null(&self) -> bool {
        self.0.is_none()
    }

    fn text(&self) -> &str {
        self.0.as_deref().map_or("null", RawValue::get)
    }
}

impl From<Value> for Doc {
    fn from(v: Value) -> Doc {
        Doc::new(Some(&v))
    }
}

impl Clone for Doc {
    fn clone(&self) -> Doc {
        Doc(self.0.as_ref().map(|r| r.to_owned()))
    }
}

impl PartialEq for Doc {
    fn eq(&self, other: &Doc) -> bool {
        self.text() == other.text()
    }
}

/// Written verbatim into a request body.
impl Serialize for Doc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Some(raw) => raw.serialize(s),
            None => s.serialize_unit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equal_exactly_when_the_values_are() {
        let cases = [
            (
                json!({"a": 1, "b": [1, 2]}),
                json!({"b": [1, 2], "a": 1}),
                true,
            ),
            (json!({"a": 1}), json!({"a": 1.0}), false),
            (json!({"a": "x"}), json!({"a": "y"}), false),
            (json!({}), Value::Null, false),
            (Value::Null, Value::Null, true),
            (json!({"s": "é\n\"q\""}), json!({"s": "é\n\"q\""}), true),
        ];
        for (a, b, want) in cases {
            assert_eq!(
                Doc::from(a.clone()) == Doc::from(b.clone()),
                want,
                "{a} vs {b}"
            );
            assert_eq!(
                a == b,
                want,
                "the table agrees with Value's equality: {a} vs {b}"
            );
        }
    }

    #[test]
    fn serializes_to_the_value_it_holds() {
        for v in [
            json!({"size": 3, "tags": ["a"], "n": null}),
            Value::Null,
            json!("x"),
        ] {
            let body = json!({"spec": Doc::from(v.clone())});
            assert_eq!(body["spec"], v);
        }
        assert!(Doc::new(None).is_null());
        assert!(Doc::from(Value::Null).is_null());
        assert!(!Doc::from(json!({})).is_null());
    }
}
