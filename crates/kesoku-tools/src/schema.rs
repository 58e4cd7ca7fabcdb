//! A small checker for tool arguments against the JSON Schema subset tools declare.
//!
//! It understands `type` (one name or a list), `required`, `properties`, `additionalProperties:
//! false`, `enum`, `items`, `minimum` and `maximum`, which is what providers accept in function
//! declarations. It is not a JSON Schema implementation: other keywords are ignored.
//!
//! It also smooths over two habits of models, so that tools receive clean values: an optional
//! field sent as `null` is treated as absent (removed), and an integral float (`30.0`) where an
//! integer is expected becomes an integer.

use std::fmt;

use serde_json::{Map, Number, Value};

/// Why arguments do not fit the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaMismatch {
    /// JSON pointer to the offending value (`/timeout_s`), empty for the whole object.
    pub pointer: String,
    pub problem: String,
}

impl fmt::Display for SchemaMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pointer.is_empty() {
            f.write_str(&self.problem)
        } else {
            write!(f, "`{}`: {}", self.pointer.trim_start_matches('/'), self.problem)
        }
    }
}

/// Check that `schema` can describe a tool's arguments: an object schema.
pub(crate) fn check_parameters_schema(schema: &Value) -> Result<(), String> {
    let Some(object) = schema.as_object() else {
        return Err("the parameters schema must be a JSON object".to_owned());
    };
    match object.get("type") {
        Some(Value::String(kind)) if kind == "object" => {}
        Some(_) | None => return Err("the parameters schema must have `\"type\": \"object\"`".to_owned()),
    }
    if let Some(properties) = object.get("properties")
        && !properties.is_object()
    {
        return Err("`properties` must be an object".to_owned());
    }
    if let Some(required) = object.get("required") {
        let names_ok = required.as_array().is_some_and(|names| names.iter().all(Value::is_string));
        if !names_ok {
            return Err("`required` must be a list of field names".to_owned());
        }
    }
    Ok(())
}

/// Check `value` against `schema`, normalising it on the way (see the module docs).
pub(crate) fn validate(schema: &Value, value: &mut Value) -> Result<(), SchemaMismatch> {
    let mut pointer = String::new();
    check(schema, value, &mut pointer)
}

fn check(schema: &Value, value: &mut Value, pointer: &mut String) -> Result<(), SchemaMismatch> {
    let Some(schema) = schema.as_object() else {
        // `true` or anything that is not a schema object accepts every value.
        return Ok(());
    };
    let mismatch = |pointer: &str, problem: String| SchemaMismatch { pointer: pointer.to_owned(), problem };

    let types = declared_types(schema);
    if !types.is_empty() {
        if types.contains(&"integer") {
            make_integral(value);
        }
        if !types.iter().any(|kind| has_type(value, kind)) {
            return Err(mismatch(pointer, format!("expected {}, got {}", types.join(" or "), kind_of(value))));
        }
    }

    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let listed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        return Err(mismatch(pointer, format!("must be one of {}", listed.join(", "))));
    }

    if let Some(number) = value.as_f64() {
        if let Some(minimum) = schema.get("minimum").and_then(Value::as_f64)
            && number < minimum
        {
            return Err(mismatch(pointer, format!("must be at least {minimum}, got {number}")));
        }
        if let Some(maximum) = schema.get("maximum").and_then(Value::as_f64)
            && number > maximum
        {
            return Err(mismatch(pointer, format!("must be at most {maximum}, got {number}")));
        }
    }

    match value {
        Value::Object(fields) => check_object(schema, fields, pointer),
        Value::Array(items) => {
            let Some(item_schema) = schema.get("items") else { return Ok(()) };
            for (index, item) in items.iter_mut().enumerate() {
                let length = pointer.len();
                pointer.push_str(&format!("/{index}"));
                check(item_schema, item, pointer)?;
                pointer.truncate(length);
            }
            Ok(())
        }
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => Ok(()),
    }
}

fn check_object(
    schema: &Map<String, Value>,
    fields: &mut Map<String, Value>,
    pointer: &mut String,
) -> Result<(), SchemaMismatch> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let properties = schema.get("properties").and_then(Value::as_object);

    // An optional field sent as `null` means "not given".
    fields.retain(|name, value| !value.is_null() || required.contains(&name.as_str()));

    for name in &required {
        if !fields.contains_key(*name) {
            return Err(SchemaMismatch {
                pointer: pointer.clone(),
                problem: format!("missing required field `{name}`"),
            });
        }
    }

    if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
        let known = |name: &str| properties.is_some_and(|properties| properties.contains_key(name));
        if let Some(unknown) = fields.keys().find(|name| !known(name)) {
            let expected: Vec<&str> = properties.map(|p| p.keys().map(String::as_str).collect()).unwrap_or_default();
            return Err(SchemaMismatch {
                pointer: pointer.clone(),
                problem: format!("unexpected field `{unknown}`; the fields are: {}", expected.join(", ")),
            });
        }
    }

    if let Some(properties) = properties {
        for (name, property_schema) in properties {
            if let Some(field) = fields.get_mut(name) {
                let length = pointer.len();
                pointer.push('/');
                pointer.push_str(name);
                check(property_schema, field, pointer)?;
                pointer.truncate(length);
            }
        }
    }
    Ok(())
}

fn declared_types(schema: &Map<String, Value>) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(kind)) => vec![kind.as_str()],
        Some(Value::Array(kinds)) => kinds.iter().filter_map(Value::as_str).collect(),
        Some(_) | None => Vec::new(),
    }
}

fn has_type(value: &Value, kind: &str) -> bool {
    match kind {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        // An unknown type name in a schema is the schema's problem, not the arguments'.
        _ => true,
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(number) if number.is_f64() => "a number with a fraction",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `30.0` → `30`, so that a tool deserializing a `u64` accepts what JSON Schema calls an integer.
fn make_integral(value: &mut Value) {
    let Some(float) = value.as_f64().filter(|_| value.is_f64()) else { return };
    if float.fract() != 0.0 || !float.is_finite() {
        return;
    }
    // Beyond 2^53 a float no longer names one integer; leave such values to fail the check.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if float.abs() > EXACT {
        return;
    }
    #[allow(clippy::cast_possible_truncation)] // integral and within ±2^53, checked above
    let integer = float as i64;
    *value = Value::Number(Number::from(integer));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout_s": {"type": "integer", "minimum": 1},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["command"]
        })
    }

    fn problem(mut value: Value) -> String {
        match validate(&schema(), &mut value) {
            Ok(()) => "ok".to_owned(),
            Err(mismatch) => mismatch.to_string(),
        }
    }

    #[test]
    fn reports_the_first_problem_with_its_field() {
        assert_eq!(problem(json!({"command": "ls"})), "ok");
        assert_eq!(problem(json!({})), "missing required field `command`");
        assert_eq!(problem(json!({"command": 3})), "`command`: expected string, got an integer");
        assert_eq!(problem(json!({"command": "ls", "timeout_s": "5"})), "`timeout_s`: expected integer, got a string");
        assert_eq!(problem(json!({"command": "ls", "timeout_s": 0})), "`timeout_s`: must be at least 1, got 0");
        assert_eq!(
            problem(json!({"command": "ls", "timeout_s": 1.5})),
            "`timeout_s`: expected integer, got a number with a fraction"
        );
        assert_eq!(problem(json!({"command": "ls", "mode": "c"})), "`mode`: must be one of \"a\", \"b\"");
        assert_eq!(problem(json!({"command": "ls", "tags": ["x", 1]})), "`tags/1`: expected string, got an integer");
        assert_eq!(problem(json!(["ls"])), "expected object, got an array");
    }

    #[test]
    fn normalises_nulls_and_integral_floats() {
        let mut value = json!({"command": "ls", "timeout_s": 30.0, "mode": null});
        assert_eq!(validate(&schema(), &mut value), Ok(()));
        assert_eq!(value, json!({"command": "ls", "timeout_s": 30}));
    }

    #[test]
    fn a_required_null_is_a_type_error() {
        assert_eq!(problem(json!({"command": null})), "`command`: expected string, got null");
    }

    #[test]
    fn additional_properties_false_rejects_unknown_fields() {
        let schema = json!({"type": "object", "properties": {"a": {}}, "additionalProperties": false});
        let mut value = json!({"a": 1, "b": 2});
        let outcome = validate(&schema, &mut value).map_err(|mismatch| mismatch.to_string());
        assert_eq!(outcome, Err("unexpected field `b`; the fields are: a".to_owned()));
    }

    #[test]
    fn parameters_schema_must_be_an_object_schema() {
        assert!(check_parameters_schema(&json!({"type": "object"})).is_ok());
        assert!(check_parameters_schema(&json!({"type": "string"})).is_err());
        assert!(check_parameters_schema(&json!({"type": "object", "required": [1]})).is_err());
        assert!(check_parameters_schema(&json!("object")).is_err());
    }
}
