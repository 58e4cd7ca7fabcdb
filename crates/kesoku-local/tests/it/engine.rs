//! Generation mechanics on synthetic models: streaming, length, stop sequences, seeds,
//! cancellation, prefix reuse, context limits, sharing.

use crate::support::{TestResult, assert_finish, drain, greedy, repeating, tiny};
use futures::StreamExt;
use kesoku_local::testing::TinyModel;
use kesoku_local::{FinishReason, GenerationEvent, GenerationParams, LocalModel, LocalModelConfig};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn streams_text_and_honours_max_tokens() -> TestResult {
    let (_dir, model) = tiny(repeating("a"))?;
    let generation = model.generate_text("<|im_start|>user\nhi<|im_end|>\n", greedy(5), &CancellationToken::new())?;
    let (pieces, stats) = drain(generation).await?;
    assert_eq!(pieces.concat(), "aaaaa");
    assert!(pieces.len() >= 2, "text arrives in pieces, not at the end: {pieces:?}");
    assert_finish(&stats, FinishReason::MaxTokens);
    assert_eq!(stats.output_tokens, 5);
    Ok(())
}

#[tokio::test]
async fn stop_sequences_end_generation_and_are_not_emitted() -> TestResult {
    let (_dir, model) = tiny(repeating("he"))?;
    let cases: Vec<(Vec<&str>, &str)> =
        vec![(vec!["eh"], "h"), (vec!["xyz", "heh"], ""), (vec!["hehehe"], ""), (vec!["hee"], "hehehehehe")];
    for (stops, expected) in cases {
        let params = GenerationParams { stop: stops.iter().map(|s| s.to_string()).collect(), ..greedy(5) };
        let (pieces, stats) = drain(model.generate_text("x", params, &CancellationToken::new())?).await?;
        assert_eq!(pieces.concat(), expected, "stops {stops:?}");
        let finish = if expected.len() == 10 { FinishReason::MaxTokens } else { FinishReason::StopSequence };
        assert_finish(&stats, finish);
    }
    Ok(())
}

#[tokio::test]
async fn a_seed_makes_sampling_repeatable() -> TestResult {
    let (_dir, model) = tiny(TinyModel::default())?;
    let run = |seed| {
        let model = model.clone();
        async move {
            let params = GenerationParams { max_tokens: 24, temperature: 1.0, top_p: 0.95, seed, stop: Vec::new() };
            drain(model.generate_text("The", params, &CancellationToken::new())?).await
        }
    };
    let (first, _) = run(5).await?;
    let (again, _) = run(5).await?;
    let (other, _) = run(6).await?;
    assert_eq!(first.concat(), again.concat());
    assert_ne!(first.concat(), other.concat());
    Ok(())
}

/// A repeating model big enough that a long generation takes many seconds.
fn slow_repeating() -> TinyModel {
    TinyModel {
        layers: 8,
        embedding: 256,
        heads: 8,
        kv_heads: 4,
        feed_forward: 1024,
        context_length: 16_384,
        ..repeating("a")
    }
}

#[tokio::test]
async fn cancelling_stops_the_stream_promptly() -> TestResult {
    let (_dir, model) = tiny(slow_repeating())?;
    let cancel = CancellationToken::new();
    let mut generation = model.generate_text("count", greedy(16_000), &cancel)?;
    let mut seen = 0;
    while seen < 3 {
        if let Some(GenerationEvent::Text(_)) = generation.next().await.transpose()? {
            seen += 1;
        }
    }
    cancel.cancel();
    let (_, stats) = tokio::time::timeout(Duration::from_secs(5), drain(generation)).await??;
    assert_finish(&stats, FinishReason::Cancelled);
    assert!(stats.output_tokens < 16_000, "stopped early: {stats:?}");
    Ok(())
}

#[tokio::test]
async fn dropping_the_stream_frees_the_worker() -> TestResult {
    let (_dir, model) = tiny(slow_repeating())?;
    let mut generation = model.generate_text("count", greedy(16_000), &CancellationToken::new())?;
    generation.next().await.transpose()?;
    drop(generation);
    // The worker runs one generation at a time: this one can only finish if the first stopped.
    let next = model.generate_text("again", greedy(3), &CancellationToken::new())?;
    let (pieces, stats) = tokio::time::timeout(Duration::from_secs(10), drain(next)).await??;
    assert_eq!(pieces.concat(), "aaa");
    assert_finish(&stats, FinishReason::MaxTokens);
    Ok(())
}

#[tokio::test]
async fn a_cancelled_token_before_the_start_generates_nothing() -> TestResult {
    let (_dir, model) = tiny(repeating("a"))?;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let generation = model.generate_text("hi", greedy(50), &cancel)?;
    // The job is skipped: the stream closes without any text.
    let events: Vec<_> = generation.collect().await;
    assert!(events.iter().all(|e| !matches!(e, Ok(GenerationEvent::Text(_)))), "{events:?}");
    Ok(())
}

#[tokio::test]
async fn the_next_prompt_reuses_the_cached_prefix() -> TestResult {
    let (_dir, model) = tiny(TinyModel::default())?;
    let prompt = "<|im_start|>user\nthe same long opening of a conversation<|im_end|>\n";
    let (first_text, first) = drain(model.generate_text(prompt, greedy(4), &CancellationToken::new())?).await?;
    let (second_text, second) = drain(model.generate_text(prompt, greedy(4), &CancellationToken::new())?).await?;
    assert_eq!(first.cached_prompt_tokens, 0);
    assert_eq!(second.cached_prompt_tokens, second.prompt_tokens - 1, "{second:?}");
    assert_eq!(first_text, second_text, "reuse must not change greedy output");
    let longer = format!("{prompt}<|im_start|>user\nmore<|im_end|>\n");
    let (_, third) = drain(model.generate_text(&longer, greedy(2), &CancellationToken::new())?).await?;
    assert!(third.cached_prompt_tokens >= first.prompt_tokens - 1, "{third:?}");
    Ok(())
}

#[tokio::test]
async fn prompts_beyond_the_context_window_are_refused_and_output_stops_at_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.gguf");
    repeating("a").write(&path)?;
    let config = LocalModelConfig { context_window: Some(16), ..LocalModelConfig::new(&path) };
    let model = LocalModel::load(&config)?;
    assert_eq!(model.info().context_window, 16);
    let too_long = "x".repeat(40);
    match drain(model.generate_text(&too_long, greedy(4), &CancellationToken::new())?).await {
        Err(error) => {
            let message = error.to_string();
            assert!(message.contains("context window is 16"), "{message}");
        }
        Ok(other) => panic!("expected an error, got {other:?}"),
    }
    let (pieces, stats) = drain(model.generate_text("xx", greedy(100), &CancellationToken::new())?).await?;
    assert_finish(&stats, FinishReason::ContextFull);
    assert_eq!(stats.prompt_tokens + pieces.concat().len(), 16 + 1, "{stats:?}");
    Ok(())
}

#[tokio::test]
async fn shared_loading_gives_one_instance_per_config() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.gguf");
    TinyModel::default().write(&path)?;
    let config = LocalModelConfig::new(&path);
    let (a, b) = tokio::join!(LocalModel::load_shared(&config), LocalModel::load_shared(&config));
    let (a, b) = (a?, b?);
    assert!(a.same_instance(&b));
    let other = LocalModel::load_shared(&LocalModelConfig { seed: Some(9), ..config.clone() }).await?;
    assert!(!other.same_instance(&a));
    Ok(())
}

#[tokio::test]
async fn every_weight_type_loads_and_generates() -> TestResult {
    use kesoku_local::testing::TinyWeights;
    for weights in [TinyWeights::Q4_0, TinyWeights::Q4_1, TinyWeights::Q8_0, TinyWeights::F32, TinyWeights::Q4K] {
        let spec = TinyModel { weights, embedding: 256, heads: 4, kv_heads: 2, feed_forward: 256, ..repeating("a") };
        let (_dir, model) = tiny(spec)?;
        let (pieces, _) = drain(model.generate_text("hi", greedy(3), &CancellationToken::new())?).await?;
        assert_eq!(pieces.concat(), "aaa", "{weights:?}");
    }
    Ok(())
}
