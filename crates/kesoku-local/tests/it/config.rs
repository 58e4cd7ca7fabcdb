//! The config type: defaults, unknown fields rejected, ranges validated.

use kesoku_local::{LocalError, LocalModelConfig};

#[test]
fn defaults_apply_and_unknown_fields_are_rejected() -> Result<(), serde_json::Error> {
    let config: LocalModelConfig = serde_json::from_str(r#"{"path": "models/m.gguf", "seed": 3}"#)?;
    assert_eq!(config, LocalModelConfig { seed: Some(3), ..LocalModelConfig::new("models/m.gguf") });
    // The small-model profile: a short output cap, greedy sampling, no tools offered.
    assert_eq!((config.max_output_tokens, config.temperature, config.tools), (256, 0.0, false));
    let config: LocalModelConfig = serde_json::from_str(r#"{"path": "m.gguf", "tools": true}"#)?;
    assert!(config.tools);
    let error = serde_json::from_str::<LocalModelConfig>(r#"{"path": "m.gguf", "temprature": 0.2}"#)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("unknown field `temprature`"), "{error}");
    Ok(())
}

#[test]
fn out_of_range_values_are_rejected() {
    let cases: Vec<(&str, LocalModelConfig)> = vec![
        ("top_p", LocalModelConfig { top_p: 0.0, ..LocalModelConfig::new("m.gguf") }),
        ("temperature", LocalModelConfig { temperature: -1.0, ..LocalModelConfig::new("m.gguf") }),
        ("threads", LocalModelConfig { threads: Some(0), ..LocalModelConfig::new("m.gguf") }),
        ("max_output_tokens", LocalModelConfig { max_output_tokens: 0, ..LocalModelConfig::new("m.gguf") }),
        ("context_window", LocalModelConfig { context_window: Some(0), ..LocalModelConfig::new("m.gguf") }),
    ];
    for (field, config) in cases {
        match config.validate() {
            Err(LocalError::Config(message)) => assert!(message.contains(field), "{field}: {message}"),
            other => panic!("{field}: expected a config error, got {other:?}"),
        }
    }
    assert!(LocalModelConfig::new("m.gguf").validate().is_ok());
}
