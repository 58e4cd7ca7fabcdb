//! Structured output: an activation may carry a JSON Schema its final answer must follow
//! (`[[cron]] output_schema`, a direct trigger's `output_schema`). The schema goes to the
//! provider with the request (providers that support it constrain the answer); the answer is
//! checked here whatever the provider did. An answer that does not match is not posted: the
//! model is told what was wrong once and answers again; a second miss is posted as it is and
//! the activation ends `failed`, saying why.

use serde_json::Value;

/// Why `answer` does not follow `schema`, or `None` when it does. The answer may be the bare
/// JSON or one fenced code block holding it.
pub fn problem(schema: &Value, answer: &str) -> Option<String> {
    let validator = match jsonschema::validator_for(schema) {
        Ok(validator) => validator,
        // Producers check schemas; one that still fails to compile constrains nothing.
        Err(error) => {
            tracing::warn!(%error, "an activation's output schema does not compile; the answer is not checked");
            return None;
        }
    };
    let value: Value = match serde_json::from_str(unfenced(answer)) {
        Ok(value) => value,
        Err(error) => return Some(format!("the answer is not JSON ({error})")),
    };
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .take(5)
        .map(|error| {
            let at = error.instance_path().to_string();
            if at.is_empty() { error.to_string() } else { format!("at `{at}`: {error}") }
        })
        .collect();
    (!errors.is_empty()).then(|| format!("the answer does not match the schema: {}", errors.join("; ")))
}

/// The text inside one fenced code block (```json … ```), or the trimmed text.
fn unfenced(answer: &str) -> &str {
    let trimmed = answer.trim();
    let Some(rest) = trimmed.strip_prefix("```") else { return trimmed };
    let Some(body_start) = rest.find('\n') else { return trimmed };
    let body = &rest[body_start + 1..];
    body.trim_end().strip_suffix("```").map_or(trimmed, str::trim)
}

/// What the model is told after an answer that missed the schema.
pub fn retry_text(problem: &str, schema: &Value) -> String {
    format!(
        "Your previous answer was rejected: {problem}. Answer again with only a JSON value that matches \
         this JSON Schema, no other text:\n{schema}"
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"status": {"type": "string", "enum": ["ok", "down"]}, "count": {"type": "integer"}}, "required": ["status"]})
    }

    #[test]
    fn answers_are_checked_against_the_schema() {
        assert_eq!(problem(&schema(), r#"{"status": "ok", "count": 3}"#), None);
        assert_eq!(problem(&schema(), "```json\n{\"status\": \"down\"}\n```"), None);
        let missing = problem(&schema(), r#"{"count": 3}"#).unwrap_or_default();
        assert!(missing.contains("status"), "{missing}");
        let wrong = problem(&schema(), r#"{"status": "maybe"}"#).unwrap_or_default();
        assert!(wrong.contains("/status"), "{wrong}");
        let prose = problem(&schema(), "All good!").unwrap_or_default();
        assert!(prose.starts_with("the answer is not JSON"), "{prose}");
    }
}
