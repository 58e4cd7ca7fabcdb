//! [`LocalModel`]: a loaded model, its generation worker, and the token stream it returns.
//!
//! A model loads once and is shared: [`LocalModel`] is a cheap handle, and
//! [`LocalModel::load_shared`] hands every caller with the same config the same instance. Each
//! model owns one dedicated worker thread and a rayon pool of `threads` compute threads;
//! generations queue on that worker and run one at a time, off the async runtime. The worker
//! keeps the key/value cache of the last generation and reuses its longest common prefix with the
//! next prompt, so an agent's next step only pays for the new tokens.
//!
//! Cancellation: a [`Generation`] stops promptly when its token is cancelled or when it is
//! dropped; the worker checks between tokens and between prompt chunks.
//!
//! Not here: HTTP, downloads (`pull`), the provider-neutral request types (`provider`).

use crate::chat::{ChatPrompt, ToolCall};
use crate::config::{DEFAULT_CONTEXT_WINDOW, LocalModelConfig};
use crate::error::LocalError;
use crate::gguf::GgufFile;
use crate::llama::{KvCache, Scratch, Weights};
use crate::sampling::Sampler;
use crate::template::ChatTemplate;
use crate::tokenizer::{IncrementalDecoder, TextTokenizer};
use crate::tool_calls::{ParsedOutput, parse_tool_calls};
use futures::Stream;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

/// Prompt tokens processed per forward call; cancellation is checked between chunks.
const PROMPT_CHUNK: usize = 128;

/// What a loaded model is.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalModelInfo {
    /// `general.name` from the file, or its file name.
    pub name: String,
    pub path: PathBuf,
    /// `general.architecture`.
    pub architecture: String,
    /// Tokens the key/value cache holds (prompt plus output).
    pub context_window: usize,
    /// The context length the model was trained with.
    pub trained_context: usize,
    pub vocab_size: usize,
    pub layers: usize,
    /// Bytes of weights in memory.
    pub weight_bytes: usize,
    pub threads: usize,
    /// The kernel family in use ("avx2+fma" or "scalar").
    pub kernels: &'static str,
    /// Whether the chat template declares tools itself (else the documented fallback is used).
    pub template_handles_tools: bool,
}

/// Sampling and length settings of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationParams {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    /// Generation ends before the first occurrence of any of these; they are not emitted.
    pub stop: Vec<String>,
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn (EOS / end-of-turn token).
    EndOfTurn,
    /// A stop sequence appeared.
    StopSequence,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The context window filled up.
    ContextFull,
    /// The caller cancelled or dropped the stream.
    Cancelled,
}

/// Counts and timings of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationStats {
    pub finish_reason: FinishReason,
    /// Tokens of the prompt, including those reused from the cache.
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys/values were reused from the previous generation.
    pub cached_prompt_tokens: usize,
    pub output_tokens: usize,
    /// Time to process the (non-cached) prompt tokens.
    pub prompt_time: Duration,
    /// Time from the first to the last generated token.
    pub generation_time: Duration,
}

impl GenerationStats {
    /// Prompt processing speed in tokens per second.
    pub fn prompt_tokens_per_second(&self) -> f64 {
        let processed = self.prompt_tokens - self.cached_prompt_tokens;
        processed as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    /// Generation speed in tokens per second (the first token comes from the prompt pass).
    pub fn generation_tokens_per_second(&self) -> f64 {
        self.output_tokens.saturating_sub(1) as f64 / self.generation_time.as_secs_f64().max(1e-9)
    }
}

/// An item of a generation stream.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerationEvent {
    /// The next piece of visible text.
    Text(String),
    /// The last event.
    Finished(GenerationStats),
}

/// A whole answer: text, the tool calls found in it, and the stats.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// Text with tool-call blocks removed.
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    /// The raw output as generated.
    pub raw: String,
    pub stats: GenerationStats,
}

/// A running generation: a stream of [`GenerationEvent`]s ending with `Finished`, or an error.
/// Dropping it cancels the generation.
pub struct Generation {
    events: tokio::sync::mpsc::Receiver<Result<GenerationEvent, LocalError>>,
    _cancel_on_drop: DropGuard,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation").finish_non_exhaustive()
    }
}

impl Stream for Generation {
    type Item = Result<GenerationEvent, LocalError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_recv(cx)
    }
}

impl Generation {
    /// Collects the stream into the full text and stats.
    pub async fn collect_text(mut self) -> Result<(String, GenerationStats), LocalError> {
        let mut text = String::new();
        while let Some(event) = self.events.recv().await {
            match event? {
                GenerationEvent::Text(piece) => text.push_str(&piece),
                GenerationEvent::Finished(stats) => return Ok((text, stats)),
            }
        }
        Err(LocalError::WorkerGone)
    }
}

enum JobInput {
    Text(String),
    Tokens(Vec<u32>),
}

struct Job {
    input: JobInput,
    params: GenerationParams,
    cancel: CancellationToken,
    events: tokio::sync::mpsc::Sender<Result<GenerationEvent, LocalError>>,
}

struct Inner {
    info: LocalModelInfo,
    config: LocalModelConfig,
    tokenizer: Arc<TextTokenizer>,
    template: ChatTemplate,
    /// The worker's queue; the worker exits when the last handle drops this sender.
    jobs: mpsc::Sender<Job>,
}

/// A loaded local model. Cloning is cheap and shares the weights and the worker.
#[derive(Clone)]
pub struct LocalModel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LocalModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalModel").field("info", &self.inner.info).finish_non_exhaustive()
    }
}

/// Models loaded in this process, so sessions share one copy of the weights.
/// A registry of weak handles: it never keeps a model alive by itself.
static SHARED: Mutex<Vec<(LocalModelConfig, Weak<Inner>)>> = Mutex::new(Vec::new());

fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
}

impl LocalModel {
    /// Loads the model (blocking: reads and converts the whole file). Prefer [`Self::load_async`]
    /// or [`Self::load_shared`] from async code.
    pub fn load(config: &LocalModelConfig) -> Result<Self, LocalError> {
        config.validate()?;
        let mut gguf = GgufFile::open(&config.path)?;
        let tokenizer = Arc::new(TextTokenizer::load(&gguf)?);
        let template = ChatTemplate::new(
            gguf.string("tokenizer.chat_template").map(str::to_owned),
            tokenizer.bos.as_ref().map(|(_, t)| t.clone()).unwrap_or_default(),
            tokenizer.eos.as_ref().map(|(_, t)| t.clone()).unwrap_or_default(),
        );
        let name = gguf.string("general.name").map(str::to_owned).unwrap_or_else(|| {
            config.path.file_stem().map_or_else(|| "local".to_owned(), |s| s.to_string_lossy().into_owned())
        });
        let weights = Weights::load(&mut gguf)?;
        let hyper = weights.hyper.clone();
        let context_window = config
            .context_window
            .unwrap_or(DEFAULT_CONTEXT_WINDOW.min(hyper.context_length))
            .min(hyper.context_length.max(1));
        let threads = config.effective_threads();
        let info = LocalModelInfo {
            name,
            path: config.path.clone(),
            architecture: hyper.architecture.name().to_owned(),
            context_window,
            trained_context: hyper.context_length,
            vocab_size: hyper.vocab_size,
            layers: hyper.n_layer,
            weight_bytes: weights.size_in_bytes(),
            threads,
            kernels: weights.simd.describe(),
            template_handles_tools: template.handles_tools(),
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("kesoku-local-compute-{i}"))
            .build()
            .map_err(|error| LocalError::Config(format!("cannot start {threads} compute threads: {error}")))?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let worker = Worker {
            weights,
            tokenizer: Arc::clone(&tokenizer),
            context_window,
            cache: KvCache::default(),
            cached: Vec::new(),
            scratch: Scratch::default(),
        };
        std::thread::Builder::new()
            .name("kesoku-local-worker".to_owned())
            .spawn(move || worker.run(&pool, &queue))
            .map_err(|error| LocalError::Config(format!("cannot start the generation thread: {error}")))?;
        tracing::info!(model = %info.name, bytes = info.weight_bytes, threads, kernels = info.kernels, "local model loaded");
        Ok(Self { inner: Arc::new(Inner { info, config: config.clone(), tokenizer, template, jobs }) })
    }

    /// [`Self::load`] on a blocking thread.
    pub async fn load_async(config: &LocalModelConfig) -> Result<Self, LocalError> {
        let config = config.clone();
        tokio::task::spawn_blocking(move || Self::load(&config)).await.map_err(|_| LocalError::WorkerGone)?
    }

    /// The process-wide instance for `config`: loads it on first use, returns the same model to
    /// every later caller while any handle is alive.
    pub async fn load_shared(config: &LocalModelConfig) -> Result<Self, LocalError> {
        if let Some(model) = Self::find_shared(config) {
            return Ok(model);
        }
        let model = Self::load_async(config).await?;
        let mut shared = SHARED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another caller may have finished loading meanwhile: keep theirs, drop ours.
        shared.retain(|(_, weak)| weak.strong_count() > 0);
        if let Some(inner) = shared.iter().find(|(c, _)| c == config).and_then(|(_, weak)| weak.upgrade()) {
            return Ok(Self { inner });
        }
        shared.push((config.clone(), Arc::downgrade(&model.inner)));
        Ok(model)
    }

    fn find_shared(config: &LocalModelConfig) -> Option<Self> {
        let shared = SHARED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        shared.iter().find(|(c, _)| c == config).and_then(|(_, weak)| weak.upgrade()).map(|inner| Self { inner })
    }

    /// Whether two handles share one loaded model.
    pub fn same_instance(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub fn info(&self) -> &LocalModelInfo {
        &self.inner.info
    }

    pub fn config(&self) -> &LocalModelConfig {
        &self.inner.config
    }

    /// Parameters from the config (fresh seed when the config has none).
    pub fn default_params(&self) -> GenerationParams {
        let config = &self.inner.config;
        GenerationParams {
            max_tokens: config.max_output_tokens,
            temperature: config.temperature,
            top_p: config.top_p,
            seed: config.seed.unwrap_or_else(fresh_seed),
            stop: Vec::new(),
        }
    }

    /// The prompt text the chat template makes of `prompt`.
    pub fn render_prompt(&self, prompt: &ChatPrompt) -> Result<String, LocalError> {
        self.inner.template.render(prompt)
    }

    /// Token ids of `text` (special tokens written in it are recognised).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, LocalError> {
        self.inner.tokenizer.encode(text)
    }

    /// Text of token ids.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String, LocalError> {
        self.inner.tokenizer.decode(ids)
    }

    fn submit(
        &self,
        input: JobInput,
        params: GenerationParams,
        cancel: &CancellationToken,
    ) -> Result<Generation, LocalError> {
        let (events, receiver) = tokio::sync::mpsc::channel(64);
        let cancel = cancel.child_token();
        let job = Job { input, params, cancel: cancel.clone(), events };
        self.inner.jobs.send(job).map_err(|_| LocalError::WorkerGone)?;
        Ok(Generation { events: receiver, _cancel_on_drop: cancel.drop_guard() })
    }

    /// Generates a continuation of raw prompt text (already templated).
    pub fn generate_text(
        &self,
        prompt: &str,
        params: GenerationParams,
        cancel: &CancellationToken,
    ) -> Result<Generation, LocalError> {
        self.submit(JobInput::Text(prompt.to_owned()), params, cancel)
    }

    /// Generates a continuation of prompt token ids.
    pub fn generate_tokens(
        &self,
        prompt: Vec<u32>,
        params: GenerationParams,
        cancel: &CancellationToken,
    ) -> Result<Generation, LocalError> {
        self.submit(JobInput::Tokens(prompt), params, cancel)
    }

    /// Renders `prompt` with the chat template and generates the assistant's reply.
    pub fn chat(
        &self,
        prompt: &ChatPrompt,
        params: GenerationParams,
        cancel: &CancellationToken,
    ) -> Result<Generation, LocalError> {
        let text = self.render_prompt(prompt)?;
        self.generate_text(&text, params, cancel)
    }

    /// [`Self::chat`] to the end, with tool calls parsed out of the reply.
    pub async fn complete(
        &self,
        prompt: &ChatPrompt,
        params: GenerationParams,
        cancel: &CancellationToken,
    ) -> Result<Completion, LocalError> {
        let (raw, stats) = self.chat(prompt, params, cancel)?.collect_text().await?;
        let offered: Vec<&str> = prompt.tools.iter().map(|t| t.name.as_str()).collect();
        let ParsedOutput { text, tool_calls } = if offered.is_empty() {
            ParsedOutput { text: raw.trim().to_owned(), tool_calls: Vec::new() }
        } else {
            parse_tool_calls(&raw, &offered)
        };
        Ok(Completion { text, tool_calls, raw, stats })
    }
}

/// Holds back text that could be the start of a stop sequence.
struct StopFilter {
    stops: Vec<String>,
    text: String,
    sent: usize,
}

enum StopOutcome {
    /// Text that is safe to show.
    Emit(String),
    /// A stop sequence was found; this is the text before it.
    Stopped(String),
}

impl StopFilter {
    fn new(stops: &[String]) -> Self {
        Self { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), text: String::new(), sent: 0 }
    }

    fn push(&mut self, piece: &str) -> StopOutcome {
        self.text.push_str(piece);
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut search_from = self.sent.saturating_sub(longest);
        while !self.text.is_char_boundary(search_from) {
            search_from -= 1;
        }
        let found = self
            .stops
            .iter()
            .filter_map(|stop| self.text[search_from..].find(stop.as_str()).map(|i| search_from + i))
            .min();
        if let Some(at) = found {
            let before = self.text[self.sent.min(at)..at].to_owned();
            self.sent = at;
            return StopOutcome::Stopped(before);
        }
        // Keep back the longest tail that is a prefix of a stop sequence.
        let mut safe = self.text.len();
        for stop in &self.stops {
            for (end, _) in stop.char_indices().skip(1) {
                if self.text.ends_with(&stop[..end]) {
                    safe = safe.min(self.text.len() - end);
                }
            }
        }
        let safe = safe.max(self.sent);
        let out = self.text[self.sent..safe].to_owned();
        self.sent = safe;
        StopOutcome::Emit(out)
    }

    fn rest(&mut self) -> String {
        let out = self.text[self.sent..].to_owned();
        self.sent = self.text.len();
        out
    }
}

struct Worker {
    weights: Weights,
    tokenizer: Arc<TextTokenizer>,
    context_window: usize,
    cache: KvCache,
    /// The tokens whose keys/values are in `cache`.
    cached: Vec<u32>,
    scratch: Scratch,
}

/// The generation ended because its consumer went away or cancelled.
struct Abandoned;

impl Worker {
    fn run(mut self, pool: &rayon::ThreadPool, queue: &mpsc::Receiver<Job>) {
        while let Ok(job) = queue.recv() {
            if job.cancel.is_cancelled() || job.events.is_closed() {
                continue;
            }
            let events = job.events.clone();
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.install(|| self.generate(&job))));
            match outcome {
                Ok(Ok(stats)) => {
                    let _ = events.blocking_send(Ok(GenerationEvent::Finished(stats)));
                }
                Ok(Err(Some(error))) => {
                    let _ = events.blocking_send(Err(error));
                }
                Ok(Err(None)) => {}
                Err(_) => {
                    tracing::error!("local model generation panicked; the cache was reset");
                    self.cache.truncate(0);
                    self.cached.clear();
                    let _ = events.blocking_send(Err(LocalError::WorkerGone));
                }
            }
        }
    }

    fn abandoned(job: &Job) -> bool {
        job.cancel.is_cancelled() || job.events.is_closed()
    }

    fn send(job: &Job, text: String) -> Result<(), Abandoned> {
        if text.is_empty() {
            return Ok(());
        }
        job.events.blocking_send(Ok(GenerationEvent::Text(text))).map_err(|_| Abandoned)
    }

    /// Runs one job. `Err(None)`: nobody is listening any more.
    fn generate(&mut self, job: &Job) -> Result<GenerationStats, Option<LocalError>> {
        let tokens = match &job.input {
            JobInput::Text(text) => self.tokenizer.encode_prompt(text).map_err(Some)?,
            JobInput::Tokens(tokens) => tokens.clone(),
        };
        if tokens.is_empty() {
            return Err(Some(LocalError::Tokenizer("the prompt is empty".into())));
        }
        if tokens.len() >= self.context_window {
            return Err(Some(LocalError::PromptTooLong {
                prompt_tokens: tokens.len(),
                context_window: self.context_window,
            }));
        }
        let mut stats = GenerationStats {
            finish_reason: FinishReason::Cancelled,
            prompt_tokens: tokens.len(),
            cached_prompt_tokens: 0,
            output_tokens: 0,
            prompt_time: Duration::ZERO,
            generation_time: Duration::ZERO,
        };

        // Reuse the longest common prefix, but always run at least one token to get logits.
        let common = self.cached.iter().zip(&tokens).take_while(|(a, b)| a == b).count().min(tokens.len() - 1);
        self.cache.truncate(common);
        self.cached.truncate(common);
        stats.cached_prompt_tokens = common;

        let started = Instant::now();
        let mut remaining = &tokens[common..];
        while remaining.len() > PROMPT_CHUNK {
            if Self::abandoned(job) {
                return Ok(stats);
            }
            let (chunk, rest) = remaining.split_at(PROMPT_CHUNK);
            self.weights.forward(chunk, &mut self.cache, &mut self.scratch);
            self.cached.extend_from_slice(chunk);
            remaining = rest;
        }
        if Self::abandoned(job) {
            return Ok(stats);
        }
        let mut logits = self.weights.forward(remaining, &mut self.cache, &mut self.scratch).to_vec();
        self.cached.extend_from_slice(remaining);
        stats.prompt_time = started.elapsed();

        let generation_started = Instant::now();
        let mut sampler = Sampler::new(job.params.temperature, job.params.top_p, job.params.seed);
        let mut decoder = IncrementalDecoder::default();
        let mut stops = StopFilter::new(&job.params.stop);
        let mut finish = loop {
            if Self::abandoned(job) {
                break FinishReason::Cancelled;
            }
            let token = sampler.sample(&logits);
            if self.tokenizer.end_tokens.contains(&token) {
                break FinishReason::EndOfTurn;
            }
            stats.output_tokens += 1;
            if let Some(piece) = decoder.push(&self.tokenizer, token).map_err(Some)? {
                match stops.push(&piece) {
                    StopOutcome::Emit(text) => Self::send(job, text).map_err(|_| None)?,
                    StopOutcome::Stopped(text) => {
                        Self::send(job, text).map_err(|_| None)?;
                        break FinishReason::StopSequence;
                    }
                }
            }
            if stats.output_tokens >= job.params.max_tokens {
                break FinishReason::MaxTokens;
            }
            if self.cache.len() + 1 > self.context_window {
                break FinishReason::ContextFull;
            }
            logits.clear();
            logits.extend_from_slice(self.weights.forward(&[token], &mut self.cache, &mut self.scratch));
            self.cached.push(token);
        };
        if finish != FinishReason::StopSequence {
            if let Some(piece) = decoder.finish(&self.tokenizer).map_err(Some)? {
                match stops.push(&piece) {
                    StopOutcome::Emit(text) => Self::send(job, text).map_err(|_| None)?,
                    StopOutcome::Stopped(text) => {
                        Self::send(job, text).map_err(|_| None)?;
                        finish = FinishReason::StopSequence;
                    }
                }
            }
            if finish != FinishReason::Cancelled && finish != FinishReason::StopSequence {
                Self::send(job, stops.rest()).map_err(|_| None)?;
            }
        }
        stats.generation_time = generation_started.elapsed();
        stats.finish_reason = finish;
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds pieces through a stop filter; returns what was shown and whether it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut filter = StopFilter::new(&stops.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        let mut shown = String::new();
        for piece in pieces {
            match filter.push(piece) {
                StopOutcome::Emit(text) => shown.push_str(&text),
                StopOutcome::Stopped(text) => {
                    shown.push_str(&text);
                    return (shown, true);
                }
            }
        }
        shown.push_str(&filter.rest());
        (shown, false)
    }

    #[test]
    fn stop_sequences_across_pieces() {
        let cases: Vec<(&[&str], &[&str], &str, bool)> = vec![
            (&[], &["a", "b"], "ab", false),
            (&["END"], &["ok E", "N", "D more"], "ok ", true),
            (&["END"], &["ok E", "N", "o"], "ok ENo", false),
            (&["é!"], &["caf", "é", "!"], "caf", true),
            (&["é!"], &["café", " ok"], "café ok", false),
            (&["\n\n", "User:"], &["line\n", "\nUser:"], "line", true),
            (&["ab", "b"], &["xab"], "x", true),
            (&[""], &["kept"], "kept", false),
        ];
        for (stops, pieces, shown, stopped) in cases {
            assert_eq!(run(stops, pieces), (shown.to_owned(), stopped), "{stops:?} {pieces:?}");
        }
    }
}
