//! Test support: writes small synthetic GGUF chat models (llama architecture, byte-level GPT-2
//! tokenizer, ChatML template) so engine mechanics can be tested in milliseconds without real
//! weights. Public for this crate's integration tests and benches; not for production use.
//!
//! A model is random, or "repeating": its residual stream carries a constant channel that the
//! output layer maps to one chosen token, so greedy generation repeats that token forever (and
//! sampling almost always does) — handy for cancellation, stop and length tests.

use crate::error::LocalError;
use crate::sampling::SplitMix64;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::path::Path;

/// Weight storage type of the synthetic matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyWeights {
    Q4_0,
    Q4_1,
    Q8_0,
    /// Stored as f32 (re-quantized to Q8_0 on load).
    F32,
    /// Stored as Q4K blocks (re-quantized to Q8_0 on load); needs 256-wide rows.
    Q4K,
}

impl TinyWeights {
    fn dtype(self) -> GgmlDType {
        match self {
            Self::Q4_0 => GgmlDType::Q4_0,
            Self::Q4_1 => GgmlDType::Q4_1,
            Self::Q8_0 => GgmlDType::Q8_0,
            Self::F32 => GgmlDType::F32,
            Self::Q4K => GgmlDType::Q4K,
        }
    }
}

/// The architecture written into `general.architecture`, with its extra tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyArchitecture {
    Llama,
    /// Q/K/V biases, NEOX rotary embeddings.
    Qwen2,
    /// Per-head Q/K norms, NEOX rotary embeddings.
    Qwen3,
}

impl TinyArchitecture {
    fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }
}

/// The shape of a synthetic model.
#[derive(Clone, Debug)]
pub struct TinyModel {
    pub layers: usize,
    pub embedding: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub feed_forward: usize,
    pub weights: TinyWeights,
    pub seed: u64,
    /// When set, generation repeats this vocabulary entry (e.g. `"a"`).
    pub repeat: Option<String>,
    pub context_length: usize,
    /// The chat template; `None` writes ChatML.
    pub chat_template: Option<String>,
    pub architecture: TinyArchitecture,
}

impl Default for TinyModel {
    fn default() -> Self {
        Self {
            layers: 2,
            embedding: 64,
            heads: 4,
            kv_heads: 2,
            feed_forward: 128,
            weights: TinyWeights::Q8_0,
            seed: 7,
            repeat: None,
            context_length: 512,
            chat_template: None,
            architecture: TinyArchitecture::Llama,
        }
    }
}

/// The GPT-2 byte-to-character map: printable bytes stand for themselves, the rest are shifted
/// past 255 so every byte has a visible character.
pub fn byte_to_char(byte: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    if printable(byte) {
        return char::from(byte);
    }
    let offset = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(256 + offset).unwrap_or('?')
}

/// Special tokens first (ids 0, 1, 2), then the 256 bytes, then a few merged tokens.
pub fn tiny_vocabulary() -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
    tokens.extend((0..=255u8).map(|b| byte_to_char(b).to_string()));
    let space = byte_to_char(b' ');
    let merges = vec![format!("{space} t"), "h e".to_owned(), format!("{space}t he")];
    tokens.extend([format!("{space}t"), "he".to_owned(), format!("{space}the")]);
    (tokens, merges)
}

/// ChatML as SmolLM2 writes it, minus its default system prompt.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn error(path: &Path, error: impl std::fmt::Display) -> LocalError {
    LocalError::WriteModel { path: path.to_path_buf(), source: std::io::Error::other(error.to_string()) }
}

impl TinyModel {
    /// Writes the model to `path`.
    pub fn write(&self, path: &Path) -> Result<(), LocalError> {
        let (tokens, merges) = tiny_vocabulary();
        let vocab = tokens.len();
        let d = self.embedding;
        let head_dim = d / self.heads;
        let kv_dim = head_dim * self.kv_heads;
        let mut rng = SplitMix64::new(self.seed);
        let mut random =
            |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|_| (rng.next_f32() * 2.0 - 1.0) * scale).collect() };
        let repeat_id = match &self.repeat {
            Some(text) => Some(
                tokens
                    .iter()
                    .position(|t| t == text)
                    .ok_or_else(|| error(path, format!("{text:?} is not in the vocabulary")))?,
            ),
            None => None,
        };

        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        let mut add = |name: String, values: Vec<f32>, dims: &[usize], dtype: GgmlDType| -> Result<(), LocalError> {
            let tensor = Tensor::from_vec(values, dims, &Device::Cpu).map_err(|e| error(path, e))?;
            let quantized = QTensor::quantize(&tensor, dtype).map_err(|e| error(path, e))?;
            tensors.push((name, quantized));
            Ok(())
        };
        let dtype = self.weights.dtype();
        let mut embeddings = random(vocab * d, 0.5);
        if repeat_id.is_some() {
            // Channel 0 is a constant 1 in every embedding, and no layer writes to it.
            for row in embeddings.chunks_exact_mut(d) {
                row[0] = 1.0;
            }
        }
        add("token_embd.weight".into(), embeddings, &[vocab, d], GgmlDType::Q8_0)?;
        let mut output_norm = vec![1.0f32; d];
        let mut output = random(vocab * d, 0.5);
        if let Some(id) = repeat_id {
            output_norm[0] = 100.0;
            output.fill(0.0);
            output[id * d] = 1.0;
        }
        add("output_norm.weight".into(), output_norm, &[d], GgmlDType::F32)?;
        add("output.weight".into(), output, &[vocab, d], GgmlDType::Q8_0)?;
        for layer in 0..self.layers {
            let name = |suffix: &str| format!("blk.{layer}.{suffix}");
            // Uniform in ±1/√fan_in keeps activations bounded through the layers.
            let (by_d, by_ff) = (1.0 / (d as f32).sqrt(), 1.0 / (self.feed_forward as f32).sqrt());
            add(name("attn_norm.weight"), vec![1.0; d], &[d], GgmlDType::F32)?;
            add(name("ffn_norm.weight"), vec![1.0; d], &[d], GgmlDType::F32)?;
            add(name("attn_q.weight"), random(d * d, by_d), &[d, d], dtype)?;
            add(name("attn_k.weight"), random(kv_dim * d, by_d), &[kv_dim, d], dtype)?;
            add(name("attn_v.weight"), random(kv_dim * d, by_d), &[kv_dim, d], dtype)?;
            let mut attn_output = random(d * d, by_d);
            let ff = self.feed_forward;
            let mut down = random(d * ff, by_ff);
            if repeat_id.is_some() {
                attn_output[..d].fill(0.0);
                down[..ff].fill(0.0);
            }
            add(name("attn_output.weight"), attn_output, &[d, d], dtype)?;
            add(name("ffn_gate.weight"), random(ff * d, by_d), &[ff, d], dtype)?;
            add(name("ffn_up.weight"), random(ff * d, by_d), &[ff, d], dtype)?;
            add(name("ffn_down.weight"), down, &[d, ff], dtype)?;
            match self.architecture {
                TinyArchitecture::Llama => {}
                TinyArchitecture::Qwen2 => {
                    add(name("attn_q.bias"), random(d, 0.2), &[d], GgmlDType::F32)?;
                    add(name("attn_k.bias"), random(kv_dim, 0.2), &[kv_dim], GgmlDType::F32)?;
                    add(name("attn_v.bias"), random(kv_dim, 0.2), &[kv_dim], GgmlDType::F32)?;
                }
                TinyArchitecture::Qwen3 => {
                    let norm = |values: Vec<f32>| values.into_iter().map(|v| 1.0 + v).collect::<Vec<f32>>();
                    add(name("attn_q_norm.weight"), norm(random(head_dim, 0.3)), &[head_dim], GgmlDType::F32)?;
                    add(name("attn_k_norm.weight"), norm(random(head_dim, 0.3)), &[head_dim], GgmlDType::F32)?;
                }
            }
        }

        let strings = |items: &[String]| Value::Array(items.iter().map(|s| Value::String(s.clone())).collect());
        let types: Vec<Value> = (0..vocab).map(|i| Value::I32(if i < 3 { 3 } else { 1 })).collect();
        let arch = self.architecture.name();
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let metadata: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(arch.into())),
            ("general.name".into(), Value::String("tiny test model".into())),
            (key("block_count"), Value::U32(self.layers as u32)),
            (key("context_length"), Value::U32(self.context_length as u32)),
            (key("embedding_length"), Value::U32(d as u32)),
            (key("feed_forward_length"), Value::U32(self.feed_forward as u32)),
            (key("attention.head_count"), Value::U32(self.heads as u32)),
            (key("attention.head_count_kv"), Value::U32(self.kv_heads as u32)),
            (key("attention.key_length"), Value::U32(head_dim as u32)),
            (key("attention.value_length"), Value::U32(head_dim as u32)),
            (key("rope.freq_base"), Value::F32(10_000.0)),
            (key("rope.dimension_count"), Value::U32(head_dim as u32)),
            (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
            (key("vocab_size"), Value::U32(vocab as u32)),
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
            ("tokenizer.ggml.tokens".into(), strings(&tokens)),
            ("tokenizer.ggml.merges".into(), strings(&merges)),
            ("tokenizer.ggml.token_type".into(), Value::Array(types)),
            ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
            ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
            (
                "tokenizer.chat_template".into(),
                Value::String(self.chat_template.clone().unwrap_or_else(|| CHATML.into())),
            ),
        ];
        let metadata_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut file = std::fs::File::create(path).map_err(|e| error(path, e))?;
        gguf_file::write(&mut file, &metadata_refs, &tensor_refs).map_err(|e| error(path, e))?;
        Ok(())
    }
}
