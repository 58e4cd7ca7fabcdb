//! Damaged or wrong model files give errors that name the file and say what is wrong.

use crate::support::TestResult;
use kesoku_local::testing::TinyModel;
use kesoku_local::{LocalError, LocalModel, LocalModelConfig};
use std::path::Path;

fn load_error(path: &Path) -> LocalError {
    match LocalModel::load(&LocalModelConfig::new(path)) {
        Ok(_) => panic!("{} loaded but should not", path.display()),
        Err(error) => error,
    }
}

#[test]
fn damaged_files_are_reported_with_their_name() -> TestResult {
    let dir = tempfile::tempdir()?;
    let good = dir.path().join("good.gguf");
    TinyModel::default().write(&good)?;
    let bytes = std::fs::read(&good)?;

    // (file name, contents, expected variant check, words the message must contain)
    type Check = fn(&LocalError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Check, &[&str])> = vec![
        (
            "wrong-magic.gguf",
            b"PK\x03\x04 this is a zip, not a model".to_vec(),
            |e| matches!(e, LocalError::NotGguf { .. }),
            &["not a GGUF model file", "PK.."],
        ),
        ("empty.gguf", Vec::new(), |e| matches!(e, LocalError::NotGguf { .. }), &["not a GGUF model file"]),
        (
            "truncated.gguf",
            bytes[..bytes.len() / 2].to_vec(),
            |e| matches!(e, LocalError::CorruptModel { .. }),
            &["corrupt", "truncated", "download it again"],
        ),
        (
            "header-cut.gguf",
            bytes[..200].to_vec(),
            |e| matches!(e, LocalError::CorruptModel { .. }),
            &["corrupt", "header"],
        ),
    ];
    for (name, contents, check, words) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, contents)?;
        let error = load_error(&path);
        let message = error.to_string();
        assert!(check(&error), "{name}: unexpected error {error:?}");
        assert!(message.contains(name), "{name}: the message must name the file: {message}");
        for word in words {
            assert!(message.contains(word), "{name}: {message:?} lacks {word:?}");
        }
        assert!(!error.is_retryable());
    }

    let missing = dir.path().join("missing.gguf");
    let error = load_error(&missing);
    assert!(matches!(error, LocalError::ReadModel { .. }), "{error:?}");
    assert!(error.to_string().contains("missing.gguf"));
    Ok(())
}
