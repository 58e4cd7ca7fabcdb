//! Tokens per second of the local model, and of llama.cpp on the same file when a
//! `llama-cpp-python` server is given: prompt processing and generation, greedy, same prompts.
//!
//! ```text
//! KESOKU_BENCH_MODEL=/path/model.gguf \
//! KESOKU_BENCH_LLAMA_CPP_URL=http://127.0.0.1:8765 \   # optional
//! cargo bench -p kesoku-local --bench local_model
//! ```
//! `crates/kesoku-local/bench/run.sh` starts the llama.cpp server and runs this. Other knobs:
//! `KESOKU_BENCH_THREADS` (default: all cores), `KESOKU_BENCH_TOKENS` (generated tokens, 128),
//! `KESOKU_BENCH_RUNS` (3; the best run is reported).
//!
//! Both engines are measured the same way: prompt speed = prompt tokens / time to the first
//! token; generation speed = (tokens − 1) / time from the first to the last token. Each run
//! starts its prompt with a different line so neither engine reuses a cached prefix.

use futures::StreamExt;
use kesoku_local::{GenerationEvent, GenerationParams, LocalModel, LocalModelConfig};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, Default)]
struct Measure {
    prompt_tokens: usize,
    output_tokens: usize,
    first_token: Duration,
    generation: Duration,
}

impl Measure {
    fn prompt_rate(&self) -> f64 {
        self.prompt_tokens as f64 / self.first_token.as_secs_f64().max(1e-9)
    }

    fn generation_rate(&self) -> f64 {
        self.output_tokens.saturating_sub(1) as f64 / self.generation.as_secs_f64().max(1e-9)
    }
}

fn chat_prompt(run: usize, user: &str) -> String {
    format!(
        "<|im_start|>system\nRun {run}. You are a helpful assistant.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
}

fn long_question() -> String {
    let mut text = String::from("Read these notes and summarise them in one sentence.\n");
    for i in 0..24 {
        text.push_str(&format!(
            "Note {i}: the warehouse in district {} received {} crates of apples, {} of pears and a late delivery of tools.\n",
            i % 7,
            10 + i * 3,
            5 + i
        ));
    }
    text
}

async fn run_local(model: &LocalModel, prompt: &str, max_tokens: usize) -> Result<Measure, Box<dyn std::error::Error>> {
    let tokens = model.tokenize(prompt)?;
    let params = GenerationParams { max_tokens, temperature: 0.0, top_p: 1.0, seed: 1, stop: Vec::new() };
    let mut generation = model.generate_tokens(tokens, params, &CancellationToken::new())?;
    while let Some(event) = generation.next().await {
        match event? {
            GenerationEvent::Text(_) => {}
            GenerationEvent::Finished(stats) => {
                return Ok(Measure {
                    prompt_tokens: stats.prompt_tokens - stats.cached_prompt_tokens,
                    output_tokens: stats.output_tokens,
                    // The worker's own clock: prompt pass plus the first sample.
                    first_token: stats.prompt_time,
                    generation: stats.generation_time,
                });
            }
        }
    }
    Err("the stream ended without a Finished event".into())
}

async fn run_llama_cpp(
    client: &reqwest::Client,
    base: &str,
    prompt: &str,
    prompt_tokens: usize,
    max_tokens: usize,
) -> Result<Measure, Box<dyn std::error::Error>> {
    let body = serde_json::json!({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": true,
    });
    let started = Instant::now();
    let response = client.post(format!("{base}/v1/completions")).json(&body).send().await?.error_for_status()?;
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut first: Option<Duration> = None;
    let mut last = Duration::ZERO;
    let (mut chunks, mut length_reached) = (0usize, false);
    while let Some(chunk) = stream.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find('\n') {
            let line = buffer[..end].trim().to_owned();
            buffer.drain(..=end);
            let Some(data) = line.strip_prefix("data:") else { continue };
            let data = data.trim();
            if data == "[DONE]" {
                continue;
            }
            let value: serde_json::Value = serde_json::from_str(data)?;
            let choice = &value["choices"][0];
            if choice["finish_reason"] == "length" {
                // Stopped at max_tokens: exactly that many tokens, however they were chunked.
                length_reached = true;
            }
            if choice["text"] == "" {
                continue;
            }
            chunks += 1;
            let now = started.elapsed();
            first.get_or_insert(now);
            last = now;
        }
    }
    let first = first.ok_or("llama.cpp produced no tokens")?;
    let tokens = if length_reached { max_tokens } else { chunks };
    Ok(Measure { prompt_tokens, output_tokens: tokens, first_token: first, generation: last - first })
}

/// The CPU's model name (`/proc/cpuinfo`, as `lscpu` prints it): the two engines trade places
/// between machines, so a table without it says little.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|cpuinfo| {
            cpuinfo.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.split_whitespace().collect::<Vec<_>>().join(" "))
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

fn best(measures: &[Measure], key: fn(&Measure) -> f64) -> f64 {
    measures.iter().map(key).fold(0.0, f64::max)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(model_path) = std::env::var("KESOKU_BENCH_MODEL") else {
        println!("skipped: set KESOKU_BENCH_MODEL=/path/to/model.gguf (see crates/kesoku-local/bench/run.sh)");
        return Ok(());
    };
    let env_usize = |key: &str, default: usize| std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let threads = env_usize("KESOKU_BENCH_THREADS", std::thread::available_parallelism().map_or(1, |n| n.get()));
    let max_tokens = env_usize("KESOKU_BENCH_TOKENS", 128);
    let runs = env_usize("KESOKU_BENCH_RUNS", 3).max(1);
    let llama_cpp = std::env::var("KESOKU_BENCH_LLAMA_CPP_URL").ok();

    let mut config = LocalModelConfig::new(&model_path);
    config.threads = Some(threads);
    let load_started = Instant::now();
    let model = LocalModel::load_async(&config).await?;
    let info = model.info();
    println!("machine: {}, {} CPUs", cpu_model(), std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!(
        "model: {} ({}, {} layers, {:.1} MB of weights), {} threads, kernels {}, loaded in {:.2?}",
        info.name,
        info.architecture,
        info.layers,
        info.weight_bytes as f64 / 1e6,
        threads,
        info.kernels,
        load_started.elapsed()
    );

    // Warm-up: page in the weights and start the pools.
    run_local(&model, &chat_prompt(usize::MAX, "Hello"), 8).await?;

    let generation_question = "Count from 1 to 200, separated by commas.";
    let long = long_question();
    let prompt_tokens_long = model.tokenize(&chat_prompt(0, &long))?.len();
    let prompt_tokens_short = model.tokenize(&chat_prompt(0, generation_question))?.len();
    let client = reqwest::Client::new();
    if let Some(base) = &llama_cpp {
        run_llama_cpp(&client, base, &chat_prompt(usize::MAX, "Hello"), 0, 8).await?;
    }

    // Runs alternate between the engines so both see the same machine load.
    let (mut local_gen, mut local_prompt, mut cpp_gen, mut cpp_prompt) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        local_gen.push(run_local(&model, &chat_prompt(run, generation_question), max_tokens).await?);
        if let Some(base) = &llama_cpp {
            cpp_gen.push(
                run_llama_cpp(&client, base, &chat_prompt(run, generation_question), prompt_tokens_short, max_tokens)
                    .await?,
            );
        }
        local_prompt.push(run_local(&model, &chat_prompt(run + 1000, &long), 8).await?);
        if let Some(base) = &llama_cpp {
            cpp_prompt
                .push(run_llama_cpp(&client, base, &chat_prompt(run + 1000, &long), prompt_tokens_long, 8).await?);
        }
    }

    let mut rows = vec![(
        "kesoku-local (candle GGUF reader, own kernels)".to_owned(),
        best(&local_prompt, Measure::prompt_rate),
        best(&local_gen, Measure::generation_rate),
        local_gen.iter().map(|m| m.output_tokens).max().unwrap_or(0),
    )];
    if llama_cpp.is_some() {
        rows.push((
            "llama.cpp (llama-cpp-python server)".to_owned(),
            best(&cpp_prompt, Measure::prompt_rate),
            best(&cpp_gen, Measure::generation_rate),
            cpp_gen.iter().map(|m| m.output_tokens).max().unwrap_or(0),
        ));
    } else {
        println!("llama.cpp: not measured (set KESOKU_BENCH_LLAMA_CPP_URL, or use bench/run.sh)");
    }

    println!();
    println!("prompt of {prompt_tokens_long} tokens; generation of up to {max_tokens} tokens; best of {runs} runs");
    println!();
    println!("| engine | prompt tokens/s | generation tokens/s | tokens generated |");
    println!("|---|---:|---:|---:|");
    for (name, prompt_rate, generation_rate, generated) in &rows {
        println!("| {name} | {prompt_rate:.1} | {generation_rate:.1} | {generated} |");
    }
    if rows.len() == 2 {
        let ratio = rows[1].2 / rows[0].2.max(1e-9);
        println!();
        println!("llama.cpp generates {ratio:.2}× as fast as kesoku-local (target: at most 1.5×)");
    }
    Ok(())
}
