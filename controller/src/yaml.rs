//! Minimal YAML emitter for printing rules: block mappings and sequences, scalar
//! sequences inline, strings double-quoted (JSON escaping is valid YAML).

use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// Order-keeping JSON tree (objects are key/value lists).
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

impl Value {
    fn is_array(&self) -> bool {
        matches!(self, Value::Array(_))
    }
    fn is_object(&self) -> bool {
        matches!(self, Value::Object(_))
    }
}

struct Ordered(Value);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OrderedVisitor).map(Ordered)
    }
}

struct OrderedVisitor;

impl<'de> Visitor<'de> for OrderedVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_string()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Ordered(x)) = a.next_element()? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some((k, Ordered(x))) = a.next_entry::<String, Ordered>()? {
            v.push((k, x));
        }
        Ok(Value::Object(v))
    }
}

/// Render any serializable value as YAML, keeping struct field order.
pub fn to_yaml<T: Serialize>(v: &T) -> Result<String, serde_json::Error> {
    // serde_json::Value sorts keys; going through JSON text and an order-keeping
    // tree keeps fields in declaration order, which reads better.
    let text = serde_json::to_string(v)?;
    let v: Value = serde_json::from_str::<Ordered>(&text)?.0;
    let mut out = String::new();
    emit(&v, 0, &mut out, false);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

fn scalar(v: &Value) -> Option<String> {
    Some(match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quoted_unless_plain(s),
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Object(o) if o.is_empty() => "{}".into(),
        Value::Array(a) if a.iter().all(|x| !x.is_array() && !x.is_object()) => {
            let items: Vec<String> = a.iter().filter_map(scalar).collect();
            format!("[{}]", items.join(", "))
        }
        _ => return None,
    })
}

fn quoted_unless_plain(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !matches!(s, "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n");
    if plain {
        s.to_string()
    } else {
        serde_json::Value::String(s.to_string()).to_string()
    }
}

fn emit(v: &Value, indent: usize, out: &mut String, in_seq: bool) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(o) if !o.is_empty() => {
            for (i, (k, val)) in o.iter().enumerate() {
                // The first key of a sequence item shares the `- ` line.
                if !(in_seq && i == 0) {
                    out.push_str(&pad);
                }
                out.push_str(&quoted_unless_plain(k));
                out.push(':');
                match scalar(val) {
                    Some(s) => {
                        out.push(' ');
                        out.push_str(&s);
                        out.push('\n');
                    }
                    None => {
                        out.push('\n');
                        emit(val, indent + 2, out, false);
                    }
                }
            }
        }
        Value::Array(a) if scalar(v).is_none() => {
            for item in a {
                out.push_str(&pad);
                out.push_str("- ");
                match scalar(item) {
                    Some(s) => {
                        out.push_str(&s);
                        out.push('\n');
                    }
                    None if item.is_object() => emit(item, indent + 2, out, true),
                    None => {
                        out.push('\n');
                        emit(item, indent + 2, out, false);
                    }
                }
            }
        }
        other => {
            out.push_str(&pad);
            out.push_str(&scalar(other).unwrap_or_default());
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn emits_parseable_yaml_in_field_order() {
        #[derive(serde::Serialize)]
        struct S {
            z: u8,
            b: Vec<&'static str>,
            c: serde_json::Value,
        }
        let v = S {
            z: 1,
            b: vec!["x", "10.0.0.1"],
            c: serde_json::json!([{"d": null, "e": {"f": true}}, {"g": "02:00:0a"}]),
        };
        let y = super::to_yaml(&v).unwrap();
        assert!(marked_yaml::parse_yaml(0, &y).is_ok(), "{y}");
        assert!(y.starts_with("z: 1\nb: [x, \"10.0.0.1\"]\n"), "{y}");
        assert!(y.contains("- d: null\n    e:\n      f: true\n"), "{y}");
    }
}
