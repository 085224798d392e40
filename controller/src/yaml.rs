//! Minimal YAML emitter for printing rules: block mappings and sequences, scalar
//! sequences inline, strings double-quoted (JSON escaping is valid YAML).

use serde::Serialize;
use serde_json::Value;

/// Render any serializable value as YAML.
pub fn to_yaml<T: Serialize>(v: &T) -> Result<String, serde_json::Error> {
    let v = serde_json::to_value(v)?;
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
        Value::String(s) => plain_or_quoted(s),
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Object(o) if o.is_empty() => "{}".into(),
        Value::Array(a) if a.iter().all(|x| !x.is_array() && !x.is_object()) => {
            let items: Vec<String> = a.iter().filter_map(scalar).collect();
            format!("[{}]", items.join(", "))
        }
        _ => return None,
    })
}

fn plain_or_quoted(s: &str) -> String {
    let plain = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !matches!(s, "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n");
    if plain {
        s.to_string()
    } else {
        Value::String(s.to_string()).to_string()
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
                out.push_str(&plain_or_quoted(k));
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
    fn emits_parseable_yaml() {
        let v = serde_json::json!({"a": 1, "b": ["x", "10.0.0.1"], "c": [{"d": null, "e": {"f": true}}, {"g": "02:00:0a"}]});
        let y = super::to_yaml(&v).unwrap();
        let node = marked_yaml::parse_yaml(0, &y).unwrap();
        let back: serde_json::Value = marked_yaml::from_node(&node).unwrap_or_default();
        let _ = back;
        assert!(y.contains("- d: null\n    e:\n      f: true\n"), "{y}");
        assert!(y.contains("b: [x, \"10.0.0.1\"]"), "{y}");
    }
}
