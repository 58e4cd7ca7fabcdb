//! Shared helpers: synthetic models, the real model switch, stream collection.

use futures::StreamExt;
use kesoku_local::testing::TinyModel;
use kesoku_local::{
    FinishReason, Generation, GenerationEvent, GenerationParams, GenerationStats, LocalModel, LocalModelConfig,
};
use std::path::PathBuf;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Writes `spec` into a fresh temporary directory and loads it.
pub fn tiny(spec: TinyModel) -> Result<(tempfile::TempDir, LocalModel), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.gguf");
    spec.write(&path)?;
    let model = LocalModel::load(&LocalModelConfig::new(&path))?;
    Ok((dir, model))
}

/// A model whose greedy output repeats `token` forever.
pub fn repeating(token: &str) -> TinyModel {
    TinyModel { repeat: Some(token.to_owned()), ..TinyModel::default() }
}

pub fn greedy(max_tokens: usize) -> GenerationParams {
    GenerationParams { max_tokens, temperature: 0.0, top_p: 1.0, seed: 1, stop: Vec::new() }
}

/// Drains a generation into its text pieces and final stats.
pub async fn drain(mut generation: Generation) -> Result<(Vec<String>, GenerationStats), Box<dyn std::error::Error>> {
    let mut pieces = Vec::new();
    while let Some(event) = generation.next().await {
        match event? {
            GenerationEvent::Text(piece) => pieces.push(piece),
            GenerationEvent::Finished(stats) => return Ok((pieces, stats)),
        }
    }
    Err("the stream ended without Finished".into())
}

pub fn assert_finish(stats: &GenerationStats, expected: FinishReason) {
    assert_eq!(stats.finish_reason, expected, "stats: {stats:?}");
}

/// The real model file, or `None` after printing why the test is skipped.
pub fn real_model_path() -> Option<PathBuf> {
    match std::env::var("KESOKU_TEST_LOCAL_MODEL") {
        Ok(path) => Some(PathBuf::from(path)),
        Err(_) => {
            assert!(
                std::env::var("KESOKU_REQUIRE_LOCAL_MODEL").as_deref() != Ok("1"),
                "KESOKU_REQUIRE_LOCAL_MODEL=1 but KESOKU_TEST_LOCAL_MODEL is not set"
            );
            println!("skipped: set KESOKU_TEST_LOCAL_MODEL=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf to run");
            None
        }
    }
}

/// The real model, loaded once for all tests of this binary.
pub async fn real_model() -> Option<LocalModel> {
    let path = real_model_path()?;
    let mut config = LocalModelConfig::new(path);
    config.temperature = 0.0;
    config.seed = Some(1);
    match LocalModel::load_shared(&config).await {
        Ok(model) => Some(model),
        Err(error) => panic!("cannot load the real model: {error}"),
    }
}
