//! The transformer forward pass for the llama family of GGUF files (llama, which covers SmolLM,
//! TinyLlama and Mistral-style files, plus qwen2 and qwen3), with its own key/value cache.
//!
//! Weights are read through candle's GGUF reader and kept in [`crate::quant`] matrices. The pass
//! processes a batch of tokens at a time (the prompt, or one generated token), appends their keys
//! and values to the cache, and returns the logits of the last token only. Nothing here samples,
//! tokenizes or knows about chat: see `engine`.

use crate::error::LocalError;
use crate::gguf::GgufFile;
use crate::quant::{self, BLOCK, BlockQ8, NativeType, QMatrix, Simd};
use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

/// How rotary position embeddings pair up dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RopeStyle {
    /// Pairs (2i, 2i+1): llama files, whose Q/K weights were permuted by the converter.
    Interleaved,
    /// Pairs (i, i + d/2): qwen2/qwen3.
    Neox,
}

/// The architectures this forward pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
}

impl Architecture {
    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name {
            "llama" | "mistral" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    fn rope_style(self) -> RopeStyle {
        match self {
            Self::Llama => RopeStyle::Interleaved,
            Self::Qwen2 | Self::Qwen3 => RopeStyle::Neox,
        }
    }
}

/// Hyper-parameters read from the GGUF metadata.
#[derive(Clone, Debug)]
pub(crate) struct Hyper {
    pub(crate) architecture: Architecture,
    pub(crate) n_layer: usize,
    pub(crate) n_embd: usize,
    pub(crate) n_head: usize,
    pub(crate) n_kv_head: usize,
    pub(crate) head_dim: usize,
    pub(crate) rope_dim: usize,
    pub(crate) rope_base: f32,
    pub(crate) norm_eps: f32,
    pub(crate) context_length: usize,
    pub(crate) vocab_size: usize,
}

impl Hyper {
    pub(crate) fn read(gguf: &GgufFile) -> Result<Self, LocalError> {
        let arch_name = gguf.required_string("general.architecture")?.to_owned();
        let architecture = Architecture::parse(&arch_name).ok_or_else(|| {
            LocalError::unsupported(
                &gguf.path,
                format!("architecture {arch_name:?} (supported: llama, mistral, qwen2, qwen3)"),
            )
        })?;
        let key = |suffix: &str| format!("{arch_name}.{suffix}");
        let n_embd = gguf.required_usize(&key("embedding_length"))?;
        let n_head = gguf.required_usize(&key("attention.head_count"))?;
        let n_kv_head = gguf.usize(&key("attention.head_count_kv")).unwrap_or(n_head);
        if n_head == 0 || n_kv_head == 0 || !n_head.is_multiple_of(n_kv_head) {
            return Err(LocalError::corrupt(
                &gguf.path,
                format!("{n_head} heads cannot share {n_kv_head} key/value heads"),
            ));
        }
        let head_dim = gguf.usize(&key("attention.key_length")).unwrap_or(n_embd / n_head);
        let rope_dim = gguf.usize(&key("rope.dimension_count")).unwrap_or(head_dim).min(head_dim);
        let vocab_size = match gguf.usize(&key("vocab_size")) {
            Some(size) => size,
            None => gguf.string_array("tokenizer.ggml.tokens")?.len(),
        };
        Ok(Self {
            architecture,
            n_layer: gguf.required_usize(&key("block_count"))?,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            rope_dim,
            rope_base: gguf.f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            norm_eps: gguf.f32(&key("attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
            context_length: gguf.usize(&key("context_length")).unwrap_or(2048),
            vocab_size,
        })
    }

    fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub(crate) fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// A weight matrix used as a linear layer, with the split of its output rows when several
/// layers were stacked into one matrix (Q, K and V; gate and up).
#[derive(Debug)]
struct Linear {
    matrix: QMatrix,
    bias: Option<Vec<f32>>,
}

#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V stacked: rows `[0, q_dim)`, `[q_dim, q_dim + kv_dim)`, then V.
    qkv: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    attn_output: Linear,
    ffn_norm: Vec<f32>,
    /// Gate and up stacked: rows `[0, n_ff)` then `[n_ff, 2 n_ff)`.
    gate_up: Linear,
    n_ff: usize,
    down: Linear,
}

/// The weights of a loaded model.
#[derive(Debug)]
pub(crate) struct Weights {
    pub(crate) hyper: Hyper,
    embeddings: QMatrix,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    /// `None` when the output projection is tied to the embeddings.
    output: Option<QMatrix>,
    /// Per-frequency divisors of llama-3 style rope scaling.
    rope_factors: Option<Vec<f32>>,
    pub(crate) simd: Simd,
}

fn native_type(dtype: GgmlDType) -> Option<NativeType> {
    match dtype {
        GgmlDType::Q4_0 => Some(NativeType::Q4_0),
        GgmlDType::Q4_1 => Some(NativeType::Q4_1),
        GgmlDType::Q8_0 => Some(NativeType::Q8_0),
        GgmlDType::F32
        | GgmlDType::F16
        | GgmlDType::BF16
        | GgmlDType::Q5_0
        | GgmlDType::Q5_1
        | GgmlDType::Q8_1
        | GgmlDType::Q2K
        | GgmlDType::Q3K
        | GgmlDType::Q4K
        | GgmlDType::Q5K
        | GgmlDType::Q6K
        | GgmlDType::Q8K => None,
    }
}

fn load_vector(gguf: &mut GgufFile, name: &str, len: usize) -> Result<Vec<f32>, LocalError> {
    let path = gguf.path.clone();
    let tensor = gguf.tensor(name)?;
    let values = tensor
        .dequantize(&candle_core::Device::Cpu)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(|error| LocalError::corrupt(&path, format!("cannot read tensor {name}: {error}")))?;
    if values.len() != len {
        return Err(LocalError::corrupt(&path, format!("tensor {name} has {} values, expected {len}", values.len())));
    }
    Ok(values)
}

fn load_matrix(gguf: &mut GgufFile, name: &str, rows: usize, cols: usize) -> Result<QMatrix, LocalError> {
    let path = gguf.path.clone();
    let Some(info) = gguf.info(name) else {
        return Err(LocalError::corrupt(&path, format!("tensor {name} is missing")));
    };
    let dims = info.shape.dims().to_vec();
    let dtype = info.ggml_dtype;
    if dims != [rows, cols] {
        return Err(LocalError::corrupt(&path, format!("tensor {name} has shape {dims:?}, expected [{rows}, {cols}]")));
    }
    if !cols.is_multiple_of(BLOCK) {
        return Err(LocalError::unsupported(
            &path,
            format!("tensor {name} rows of {cols} values are not a multiple of 32"),
        ));
    }
    let tensor = gguf.tensor(name)?;
    match native_type(dtype) {
        Some(native) => {
            let raw = tensor.data().map_err(|error| LocalError::corrupt(&path, format!("tensor {name}: {error}")))?;
            Ok(QMatrix::from_raw(native, rows, cols, &raw))
        }
        None => {
            // Other types (K-quants, f16, f32…) are re-quantized once to Q8_0 so that a single
            // fast kernel family serves every file.
            let values = tensor
                .dequantize(&candle_core::Device::Cpu)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|error| LocalError::corrupt(&path, format!("cannot read tensor {name}: {error}")))?;
            Ok(QMatrix::q8_0_from_f32(rows, cols, &values))
        }
    }
}

/// Stacks matrices with the same input width and storage type into one; `None` when types differ.
fn stack(parts: Vec<QMatrix>) -> Result<QMatrix, Vec<QMatrix>> {
    use quant::Blocks;
    let cols = parts.first().map(|m| m.cols).unwrap_or(0);
    let rows = parts.iter().map(|m| m.rows).sum();
    let same_type =
        parts.windows(2).all(|w| std::mem::discriminant(&w[0].blocks) == std::mem::discriminant(&w[1].blocks));
    if !same_type || parts.iter().any(|m| m.cols != cols) {
        return Err(parts);
    }
    let mut iter = parts.into_iter();
    let Some(first) = iter.next() else {
        return Err(Vec::new());
    };
    let mut blocks = first.blocks;
    for part in iter {
        match (&mut blocks, part.blocks) {
            (Blocks::Q4_0(all), Blocks::Q4_0(more)) => all.extend(more),
            (Blocks::Q4_1(all), Blocks::Q4_1(more)) => all.extend(more),
            (Blocks::Q8_0(all), Blocks::Q8_0(more)) => all.extend(more),
            (Blocks::Q4_0(_) | Blocks::Q4_1(_) | Blocks::Q8_0(_), _) => unreachable!("types were checked above"),
        }
    }
    Ok(QMatrix { rows, cols, blocks })
}

/// Re-quantizes matrices of mixed types to Q8_0 so they can be stacked.
fn stack_or_requantize(parts: Vec<QMatrix>) -> QMatrix {
    match stack(parts) {
        Ok(matrix) => matrix,
        Err(parts) => {
            let cols = parts.first().map(|m| m.cols).unwrap_or(0);
            let rows: usize = parts.iter().map(|m| m.rows).sum();
            let mut values = vec![0f32; rows * cols];
            let mut row_at = 0;
            for part in &parts {
                for r in 0..part.rows {
                    part.dequantize_row(r, &mut values[(row_at + r) * cols..(row_at + r + 1) * cols]);
                }
                row_at += part.rows;
            }
            QMatrix::q8_0_from_f32(rows, cols, &values)
        }
    }
}

impl Weights {
    pub(crate) fn load(gguf: &mut GgufFile) -> Result<Self, LocalError> {
        let hyper = Hyper::read(gguf)?;
        let (d, q_dim, kv_dim) = (hyper.n_embd, hyper.q_dim(), hyper.kv_dim());
        let embeddings = load_matrix(gguf, "token_embd.weight", hyper.vocab_size, d)?;
        let output_norm = load_vector(gguf, "output_norm.weight", d)?;
        let output = if gguf.has_tensor("output.weight") {
            Some(load_matrix(gguf, "output.weight", hyper.vocab_size, d)?)
        } else {
            None
        };
        let rope_factors = if gguf.has_tensor("rope_freqs.weight") {
            Some(load_vector(gguf, "rope_freqs.weight", hyper.rope_dim / 2)?)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(hyper.n_layer);
        for i in 0..hyper.n_layer {
            let name = |suffix: &str| format!("blk.{i}.{suffix}");
            let n_ff = match gguf.info(&name("ffn_gate.weight")) {
                Some(info) => info.shape.dims().first().copied().unwrap_or(0),
                None => {
                    return Err(LocalError::corrupt(
                        &gguf.path,
                        format!("tensor {} is missing", name("ffn_gate.weight")),
                    ));
                }
            };
            let q = load_matrix(gguf, &name("attn_q.weight"), q_dim, d)?;
            let k = load_matrix(gguf, &name("attn_k.weight"), kv_dim, d)?;
            let v = load_matrix(gguf, &name("attn_v.weight"), kv_dim, d)?;
            let qkv_bias = if gguf.has_tensor(&name("attn_q.bias")) {
                let mut bias = load_vector(gguf, &name("attn_q.bias"), q_dim)?;
                bias.extend(load_vector(gguf, &name("attn_k.bias"), kv_dim)?);
                bias.extend(load_vector(gguf, &name("attn_v.bias"), kv_dim)?);
                Some(bias)
            } else {
                None
            };
            let (q_norm, k_norm) = if gguf.has_tensor(&name("attn_q_norm.weight")) {
                (
                    Some(load_vector(gguf, &name("attn_q_norm.weight"), hyper.head_dim)?),
                    Some(load_vector(gguf, &name("attn_k_norm.weight"), hyper.head_dim)?),
                )
            } else {
                (None, None)
            };
            let gate = load_matrix(gguf, &name("ffn_gate.weight"), n_ff, d)?;
            let up = load_matrix(gguf, &name("ffn_up.weight"), n_ff, d)?;
            layers.push(Layer {
                attn_norm: load_vector(gguf, &name("attn_norm.weight"), d)?,
                qkv: Linear { matrix: stack_or_requantize(vec![q, k, v]), bias: qkv_bias },
                q_norm,
                k_norm,
                attn_output: Linear { matrix: load_matrix(gguf, &name("attn_output.weight"), d, q_dim)?, bias: None },
                ffn_norm: load_vector(gguf, &name("ffn_norm.weight"), d)?,
                gate_up: Linear { matrix: stack_or_requantize(vec![gate, up]), bias: None },
                n_ff,
                down: Linear { matrix: load_matrix(gguf, &name("ffn_down.weight"), d, n_ff)?, bias: None },
            });
        }
        Ok(Self { hyper, embeddings, layers, output_norm, output, rope_factors, simd: Simd::detect() })
    }

    /// Bytes of weights held in memory.
    pub(crate) fn size_in_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv.matrix.size_in_bytes()
                    + l.attn_output.matrix.size_in_bytes()
                    + l.gate_up.matrix.size_in_bytes()
                    + l.down.matrix.size_in_bytes()
            })
            .sum();
        layers + self.embeddings.size_in_bytes() + self.output.as_ref().map_or(0, QMatrix::size_in_bytes)
    }
}

/// Keys and values of the tokens processed so far, per layer, `[position][kv_dim]`.
#[derive(Debug, Default)]
pub(crate) struct KvCache {
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
}

impl KvCache {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Forgets every position from `len` on.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Buffers reused from one forward call to the next.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    x: Vec<f32>,
    normed: Vec<f32>,
    quantized: Vec<BlockQ8>,
    qkv: Vec<f32>,
    attention: Vec<f32>,
    projected: Vec<f32>,
    gate_up: Vec<f32>,
    hidden: Vec<f32>,
    matmul: Vec<f32>,
    rope: Vec<(f32, f32)>,
    logits: Vec<f32>,
}

fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean_square + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean_square + eps).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v *= scale * w;
    }
}

fn apply_rope(head: &mut [f32], table: &[(f32, f32)], style: RopeStyle) {
    let half = table.len();
    match style {
        RopeStyle::Interleaved => {
            for (i, (cos, sin)) in table.iter().enumerate() {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos - b * sin;
                head[2 * i + 1] = a * sin + b * cos;
            }
        }
        RopeStyle::Neox => {
            for (i, (cos, sin)) in table.iter().enumerate() {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos - b * sin;
                head[i + half] = a * sin + b * cos;
            }
        }
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + quant::exp_f32(-x))
}

/// Below this many score computations, attention runs on the calling thread.
const PARALLEL_ATTENTION_WORK: usize = 16 * 1024;

impl Weights {
    /// Runs `tokens` at positions `cache.len()..` and returns the logits of the last one.
    ///
    /// The caller keeps `cache.len() + tokens.len()` within the context window.
    pub(crate) fn forward<'s>(&self, tokens: &[u32], cache: &mut KvCache, scratch: &'s mut Scratch) -> &'s [f32] {
        let hp = &self.hyper;
        let simd = self.simd;
        let (d, q_dim, kv_dim, hd) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.head_dim);
        let n = tokens.len();
        let start = cache.len;
        if cache.keys.len() != hp.n_layer {
            cache.keys = vec![Vec::new(); hp.n_layer];
            cache.values = vec![Vec::new(); hp.n_layer];
        }
        let Scratch { x, normed, quantized, qkv, attention, projected, gate_up, hidden, matmul, rope, logits } =
            scratch;

        x.resize(n * d, 0.0);
        for (token, row) in tokens.iter().zip(x.chunks_exact_mut(d)) {
            let id = (*token as usize).min(hp.vocab_size.saturating_sub(1));
            self.embeddings.dequantize_row(id, row);
        }

        // cos/sin for every position of the batch.
        let half = hp.rope_dim / 2;
        rope.clear();
        for t in 0..n {
            let position = (start + t) as f32;
            for i in 0..half {
                let mut frequency = hp.rope_base.powf(-((2 * i) as f32) / hp.rope_dim as f32);
                if let Some(factors) = &self.rope_factors {
                    frequency /= factors[i];
                }
                let angle = position * frequency;
                rope.push((angle.cos(), angle.sin()));
            }
        }

        let style = hp.architecture.rope_style();
        let group = hp.n_head / hp.n_kv_head;
        let scale = 1.0 / (hd as f32).sqrt();
        let qkv_width = q_dim + 2 * kv_dim;

        for (layer, (keys, values)) in self.layers.iter().zip(cache.keys.iter_mut().zip(cache.values.iter_mut())) {
            // Attention block.
            normed.resize(n * d, 0.0);
            for (row, out) in x.chunks_exact(d).zip(normed.chunks_exact_mut(d)) {
                rms_norm(row, &layer.attn_norm, hp.norm_eps, out);
            }
            quant::quantize_activations(normed, quantized);
            qkv.resize(n * qkv_width, 0.0);
            layer.qkv.matrix.matmul(simd, quantized, n, qkv, matmul);
            keys.truncate(start * kv_dim);
            values.truncate(start * kv_dim);
            for (t, row) in qkv.chunks_exact_mut(qkv_width).enumerate() {
                if let Some(bias) = &layer.qkv.bias {
                    for (v, b) in row.iter_mut().zip(bias) {
                        *v += b;
                    }
                }
                let table = &rope[t * half..(t + 1) * half];
                let (q, kv) = row.split_at_mut(q_dim);
                let (k, v) = kv.split_at_mut(kv_dim);
                for head in q.chunks_exact_mut(hd) {
                    if let Some(norm) = &layer.q_norm {
                        rms_norm_in_place(head, norm, hp.norm_eps);
                    }
                    apply_rope(&mut head[..hp.rope_dim], table, style);
                }
                for head in k.chunks_exact_mut(hd) {
                    if let Some(norm) = &layer.k_norm {
                        rms_norm_in_place(head, norm, hp.norm_eps);
                    }
                    apply_rope(&mut head[..hp.rope_dim], table, style);
                }
                keys.extend_from_slice(k);
                values.extend_from_slice(v);
            }

            attention.resize(n * q_dim, 0.0);
            let keys: &[f32] = keys;
            let values: &[f32] = values;
            let qkv_ref: &[f32] = qkv;
            let attend = |index: usize, out: &mut [f32], scores: &mut Vec<f32>| {
                let (t, h) = (index / hp.n_head, index % hp.n_head);
                let visible = start + t + 1;
                let q = &qkv_ref[t * qkv_width + h * hd..t * qkv_width + (h + 1) * hd];
                let kv_offset = (h / group) * hd;
                let key = |s: usize| &keys[s * kv_dim + kv_offset..s * kv_dim + kv_offset + hd];
                scores.clear();
                scores.resize(visible, 0.0);
                let mut s = 0;
                while s + 4 <= visible {
                    let dots = quant::dot4_f32(simd, q, [key(s), key(s + 1), key(s + 2), key(s + 3)]);
                    scores[s..s + 4].copy_from_slice(&dots);
                    s += 4;
                }
                for (s, score) in scores.iter_mut().enumerate().skip(s) {
                    *score = quant::dot_f32(simd, q, key(s));
                }
                let max = quant::max_f32(scores) * scale;
                for score in scores.iter_mut() {
                    *score = quant::exp_f32(*score * scale - max);
                }
                let total = quant::sum_f32(scores);
                out.fill(0.0);
                for (s, weight) in scores.iter().enumerate() {
                    let v = &values[s * kv_dim + kv_offset..s * kv_dim + kv_offset + hd];
                    quant::axpy_f32(simd, weight / total, v, out);
                }
            };
            let work = n * hp.n_head * (start + n);
            if work >= PARALLEL_ATTENTION_WORK {
                attention
                    .par_chunks_mut(hd)
                    .enumerate()
                    .for_each_init(Vec::new, |scores, (index, out)| attend(index, out, scores));
            } else {
                let mut scores = Vec::new();
                for (index, out) in attention.chunks_exact_mut(hd).enumerate() {
                    attend(index, out, &mut scores);
                }
            }

            quant::quantize_activations(attention, quantized);
            projected.resize(n * d, 0.0);
            layer.attn_output.matrix.matmul(simd, quantized, n, projected, matmul);
            for (v, p) in x.iter_mut().zip(projected.iter()) {
                *v += p;
            }

            // Feed-forward block.
            for (row, out) in x.chunks_exact(d).zip(normed.chunks_exact_mut(d)) {
                rms_norm(row, &layer.ffn_norm, hp.norm_eps, out);
            }
            quant::quantize_activations(normed, quantized);
            let n_ff = layer.n_ff;
            gate_up.resize(n * 2 * n_ff, 0.0);
            layer.gate_up.matrix.matmul(simd, quantized, n, gate_up, matmul);
            hidden.resize(n * n_ff, 0.0);
            for (row, out) in gate_up.chunks_exact(2 * n_ff).zip(hidden.chunks_exact_mut(n_ff)) {
                let (gate, up) = row.split_at(n_ff);
                for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                    *o = silu(*g) * u;
                }
            }
            quant::quantize_activations(hidden, quantized);
            layer.down.matrix.matmul(simd, quantized, n, projected, matmul);
            for (v, p) in x.iter_mut().zip(projected.iter()) {
                *v += p;
            }
        }
        cache.len = start + n;

        let last = &x[(n - 1) * d..n * d];
        normed.resize(d, 0.0);
        rms_norm(last, &self.output_norm, hp.norm_eps, &mut normed[..d]);
        quant::quantize_activations(&normed[..d], quantized);
        logits.resize(hp.vocab_size, 0.0);
        let output = self.output.as_ref().unwrap_or(&self.embeddings);
        output.matmul(simd, quantized, 1, logits, matmul);
        logits
    }
}

#[cfg(test)]
mod tests {
    //! The forward pass against candle-transformers' quantized llama, the reference
    //! implementation, on synthetic models of every weight type and on the real model when
    //! `KESOKU_TEST_LOCAL_MODEL` names one.

    use super::*;
    use crate::testing::{TinyModel, TinyWeights};
    use candle_core::quantized::gguf_file::Content;
    use candle_core::{Device, Tensor};
    use candle_transformers::models::quantized_llama::ModelWeights;
    use std::path::Path;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn reference_logits(
        reference: &mut Reference,
        tokens: &[u32],
        position: usize,
    ) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
        let input = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
        Ok(reference.forward(&input, position)?.squeeze(0)?.to_vec1::<f32>()?)
    }

    /// candle-transformers' model for each architecture, behind one `forward`.
    enum Reference {
        Llama(ModelWeights),
        Qwen2(candle_transformers::models::quantized_qwen2::ModelWeights),
        Qwen3(candle_transformers::models::quantized_qwen3::ModelWeights),
    }

    impl Reference {
        fn load(path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
            let mut file = std::fs::File::open(path)?;
            let content = Content::read(&mut file)?;
            let arch = content.metadata.get("general.architecture").map(|v| v.to_string().cloned()).transpose()?;
            Ok(match arch.as_deref() {
                Some("qwen2") => Self::Qwen2(candle_transformers::models::quantized_qwen2::ModelWeights::from_gguf(
                    content,
                    &mut file,
                    &Device::Cpu,
                )?),
                Some("qwen3") => Self::Qwen3(candle_transformers::models::quantized_qwen3::ModelWeights::from_gguf(
                    content,
                    &mut file,
                    &Device::Cpu,
                )?),
                _ => Self::Llama(ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?),
            })
        }

        fn forward(&mut self, input: &Tensor, position: usize) -> candle_core::Result<Tensor> {
            match self {
                Self::Llama(model) => model.forward(input, position),
                Self::Qwen2(model) => model.forward(input, position),
                Self::Qwen3(model) => model.forward(input, position),
            }
        }
    }

    /// Runs a prompt and `steps` greedy tokens through both implementations and compares logits.
    fn compare(path: &Path, prompt: &[u32], steps: usize, tolerance: f32) -> TestResult {
        let mut reference = Reference::load(path)?;
        let mut gguf = GgufFile::open(path)?;
        let weights = Weights::load(&mut gguf)?;
        let (mut cache, mut scratch) = (KvCache::default(), Scratch::default());

        let mut ours = weights.forward(prompt, &mut cache, &mut scratch).to_vec();
        let mut theirs = reference_logits(&mut reference, prompt, 0)?;
        let mut agree = 0;
        for step in 0..=steps {
            let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
            let worst = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= tolerance * scale, "step {step}: logits differ by {worst} (scale {scale})");
            let next = crate::sampling::argmax(&theirs);
            if crate::sampling::argmax(&ours) == next {
                agree += 1;
            }
            if step == steps {
                break;
            }
            let position = prompt.len() + step;
            ours = weights.forward(&[next], &mut cache, &mut scratch).to_vec();
            theirs = reference_logits(&mut reference, &[next], position)?;
        }
        assert!(agree * 10 >= (steps + 1) * 8, "greedy choices agree on only {agree} of {} steps", steps + 1);
        Ok(())
    }

    #[test]
    fn forward_matches_candle_reference_on_synthetic_models() -> TestResult {
        let dir = tempfile::tempdir()?;
        for weights in [TinyWeights::Q8_0, TinyWeights::Q4_1, TinyWeights::Q4_0, TinyWeights::F32] {
            let path = dir.path().join(format!("{weights:?}.gguf"));
            TinyModel { weights, ..TinyModel::default() }.write(&path)?;
            let prompt: Vec<u32> = (0..11).map(|i| 3 + (i * 37) % 250).collect();
            compare(&path, &prompt, 6, 0.05)?;
        }
        Ok(())
    }

    #[test]
    fn forward_matches_candle_reference_on_qwen_style_models() -> TestResult {
        use crate::testing::TinyArchitecture;
        let dir = tempfile::tempdir()?;
        for architecture in [TinyArchitecture::Qwen2, TinyArchitecture::Qwen3] {
            let path = dir.path().join(format!("{architecture:?}.gguf"));
            TinyModel { architecture, weights: TinyWeights::Q8_0, ..TinyModel::default() }.write(&path)?;
            let prompt: Vec<u32> = (0..9).map(|i| 3 + (i * 53) % 250).collect();
            compare(&path, &prompt, 5, 0.05)?;
        }
        Ok(())
    }

    #[test]
    fn forward_matches_candle_reference_on_the_real_model() -> TestResult {
        let Ok(path) = std::env::var("KESOKU_TEST_LOCAL_MODEL") else {
            assert!(
                std::env::var("KESOKU_REQUIRE_LOCAL_MODEL").as_deref() != Ok("1"),
                "KESOKU_REQUIRE_LOCAL_MODEL=1 but KESOKU_TEST_LOCAL_MODEL is not set"
            );
            println!("skipped: set KESOKU_TEST_LOCAL_MODEL=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf");
            return Ok(());
        };
        let prompt: Vec<u32> = vec![
            1, 9690, 198, 2683, 359, 253, 5356, 5646, 2, 198, 1, 4093, 198, 1780, 314, 3635, 1232, 3134, 47, 2, 198, 1,
            520, 9531, 198,
        ];
        compare(Path::new(&path), &prompt, 8, 0.08)
    }
}
