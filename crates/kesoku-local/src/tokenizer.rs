//! The model's tokenizer: a `tokenizer.json` beside the GGUF file when there is one, otherwise
//! rebuilt from the file's `tokenizer.ggml.*` metadata with the `tokenizers` crate.
//!
//! Two GGUF tokenizer models are rebuilt: `gpt2` (byte-level BPE, with the pre-tokenizer named
//! by `tokenizer.ggml.pre`: smollm, qwen2, llama3-style, or plain GPT-2) and `llama`
//! (SentencePiece BPE with byte fallback, merges derived from the scores). This module also
//! decodes generated tokens incrementally, so a stream never splits a UTF-8 character. It does
//! not know chat templates.

use crate::error::LocalError;
use crate::gguf::GgufFile;
use std::collections::HashSet;
use std::path::Path;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence, unicode::NFC};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// GGUF token types (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: u32 = 3;
const TOKEN_TYPE_USER_DEFINED: u32 = 4;

const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A tokenizer plus the special tokens generation needs.
#[derive(Debug)]
pub(crate) struct TextTokenizer {
    inner: Tokenizer,
    /// Tokens that end a turn: EOS, EOT, and every control token.
    pub(crate) end_tokens: HashSet<u32>,
    pub(crate) bos: Option<(u32, String)>,
    pub(crate) eos: Option<(u32, String)>,
    /// Whether the model expects a BOS token at the start of every prompt.
    pub(crate) add_bos: bool,
}

fn tokenizer_error(error: impl std::fmt::Display) -> LocalError {
    LocalError::Tokenizer(error.to_string())
}

fn split(regex: &str) -> Result<PreTokenizerWrapper, LocalError> {
    let split = Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
        .map_err(tokenizer_error)?;
    Ok(split.into())
}

/// The pre-tokenizer of a `gpt2`-model GGUF tokenizer, by its `tokenizer.ggml.pre` name.
fn gpt2_pre_tokenizer(pre: &str) -> Result<(Option<NormalizerWrapper>, PreTokenizerWrapper), LocalError> {
    let byte_level = |use_regex| PreTokenizerWrapper::from(ByteLevel::new(false, false, use_regex));
    Ok(match pre {
        // SmolLM: every digit on its own, then GPT-2 splitting.
        "smollm" => (None, PreSequence::new(vec![Digits::new(true).into(), byte_level(true)]).into()),
        "qwen2" | "deepseek-r1-qwen" => {
            (Some(NFC.into()), PreSequence::new(vec![split(REGEX_QWEN2)?, byte_level(false)]).into())
        }
        "llama3" | "llama-bpe" | "llama-v3" | "smaug-bpe" | "falcon3" | "lfm2" => {
            (None, PreSequence::new(vec![split(REGEX_LLAMA3)?, byte_level(false)]).into())
        }
        _ => (None, byte_level(true)),
    })
}

/// SentencePiece BPE merges recovered from the vocabulary: every split of a piece into two
/// pieces of the vocabulary is a merge, ranked by the merged piece's score.
fn spm_merges(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    let mut merges: Vec<(f32, u32, String, String)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        let boundaries: Vec<usize> = piece.char_indices().map(|(i, _)| i).skip(1).collect();
        for at in boundaries {
            let (left, right) = piece.split_at(at);
            if vocab.contains_key(left) && vocab.contains_key(right) {
                let score = scores.get(id).copied().unwrap_or(0.0);
                merges.push((score, id as u32, left.to_owned(), right.to_owned()));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    merges.into_iter().map(|(_, _, left, right)| (left, right)).collect()
}

fn token_id(gguf: &GgufFile, key: &str, tokens: &[String]) -> Option<(u32, String)> {
    let id = u32::try_from(gguf.u64(key)?).ok()?;
    let text = tokens.get(id as usize)?.clone();
    Some((id, text))
}

impl TextTokenizer {
    /// Loads `tokenizer.json` from beside the model when present, else rebuilds from metadata.
    pub(crate) fn load(gguf: &GgufFile) -> Result<Self, LocalError> {
        let tokens = gguf.string_array("tokenizer.ggml.tokens")?;
        let types = gguf.u32_array("tokenizer.ggml.token_type").unwrap_or_default();
        let model = gguf.string("tokenizer.ggml.model").unwrap_or("gpt2").to_owned();
        let inner = match sidecar_tokenizer(&gguf.path) {
            Some(tokenizer) => tokenizer,
            None => Self::rebuild(gguf, &model, &tokens, &types)?,
        };
        let bos = token_id(gguf, "tokenizer.ggml.bos_token_id", &tokens);
        let eos = token_id(gguf, "tokenizer.ggml.eos_token_id", &tokens);
        let mut end_tokens: HashSet<u32> = HashSet::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some((id, _)) = token_id(gguf, key, &tokens) {
                end_tokens.insert(id);
            }
        }
        // Control tokens never belong in visible text (`<|im_start|>`, `<|endoftext|>`…):
        // sampling one ends the turn. BOS is the exception models sometimes emit harmlessly,
        // but it is a control token too, and ending there is the safe reading.
        for (id, kind) in types.iter().enumerate() {
            if *kind == TOKEN_TYPE_CONTROL {
                end_tokens.insert(id as u32);
            }
        }
        let add_bos = gguf.bool("tokenizer.ggml.add_bos_token").unwrap_or(model == "llama");
        Ok(Self { inner, end_tokens, bos, eos, add_bos })
    }

    fn rebuild(gguf: &GgufFile, model: &str, tokens: &[String], types: &[u32]) -> Result<Tokenizer, LocalError> {
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let mut tokenizer = match model {
            "gpt2" => {
                let merges: Vec<(String, String)> = gguf
                    .string_array("tokenizer.ggml.merges")?
                    .into_iter()
                    .filter_map(|m| m.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned())))
                    .collect();
                let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(tokenizer_error)?;
                let mut tokenizer = Tokenizer::new(bpe);
                let (normalizer, pre) = gpt2_pre_tokenizer(gguf.string("tokenizer.ggml.pre").unwrap_or("gpt2"))?;
                if let Some(normalizer) = normalizer {
                    tokenizer.with_normalizer(Some(normalizer)).map_err(tokenizer_error)?;
                }
                tokenizer.with_pre_tokenizer(Some(pre));
                tokenizer.with_decoder(Some(DecoderWrapper::from(ByteLevel::new(false, false, true))));
                tokenizer
            }
            "llama" => {
                let scores = gguf.f32_array("tokenizer.ggml.scores").unwrap_or_default();
                let merges = spm_merges(tokens, &scores, &vocab);
                let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
                if let Some((_, unk)) = token_id(gguf, "tokenizer.ggml.unknown_token_id", tokens) {
                    builder = builder.unk_token(unk);
                }
                let bpe = builder.build().map_err(tokenizer_error)?;
                let mut tokenizer = Tokenizer::new(bpe);
                let add_space_prefix = gguf.bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
                let replace = Replace::new(" ", "\u{2581}").map_err(tokenizer_error)?;
                let normalizer: NormalizerWrapper = if add_space_prefix {
                    NormalizerSequence::new(vec![Prepend::new("\u{2581}".to_owned()).into(), replace.into()]).into()
                } else {
                    replace.into()
                };
                tokenizer.with_normalizer(Some(normalizer)).map_err(tokenizer_error)?;
                let mut decoders: Vec<DecoderWrapper> = vec![
                    Replace::new("\u{2581}", " ").map_err(tokenizer_error)?.into(),
                    ByteFallback::new().into(),
                    Fuse::new().into(),
                ];
                if add_space_prefix {
                    decoders.push(Strip::new(' ', 1, 0).into());
                }
                tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
                tokenizer
            }
            other => {
                return Err(LocalError::unsupported(
                    &gguf.path,
                    format!("tokenizer model {other:?} (supported: gpt2, llama); put a tokenizer.json beside the file"),
                ));
            }
        };
        // Control and user-defined tokens are matched whole in prompt text, never split by BPE.
        let added: Vec<AddedToken> = types
            .iter()
            .enumerate()
            .filter(|(_, kind)| **kind == TOKEN_TYPE_CONTROL || **kind == TOKEN_TYPE_USER_DEFINED)
            .filter_map(|(id, kind)| tokens.get(id).map(|t| AddedToken::from(t.clone(), *kind == TOKEN_TYPE_CONTROL)))
            .collect();
        tokenizer.add_special_tokens(added).map_err(tokenizer_error)?;
        Ok(tokenizer)
    }

    /// Token ids of `text`; special tokens written in the text are recognised.
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, LocalError> {
        let encoding = self.inner.encode_fast(text, false).map_err(tokenizer_error)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Prompt token ids, with BOS in front when the model wants it and the text lacks it.
    pub(crate) fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, LocalError> {
        let mut ids = self.encode(text)?;
        if self.add_bos
            && let Some((bos_id, _)) = &self.bos
            && ids.first() != Some(bos_id)
        {
            ids.insert(0, *bos_id);
        }
        Ok(ids)
    }

    pub(crate) fn decode(&self, ids: &[u32]) -> Result<String, LocalError> {
        self.inner.decode(ids, false).map_err(tokenizer_error)
    }
}

fn sidecar_tokenizer(model_path: &Path) -> Option<Tokenizer> {
    let dir = model_path.parent()?;
    let stem = model_path.file_stem()?.to_string_lossy().into_owned();
    [dir.join(format!("{stem}.tokenizer.json")), dir.join("tokenizer.json")]
        .into_iter()
        .filter(|p| p.is_file())
        .find_map(|p| Tokenizer::from_file(&p).ok())
}

/// Turns generated token ids into text pieces without ever cutting a UTF-8 character: a piece is
/// released only once the decoded text no longer ends in a replacement character.
#[derive(Debug, Default)]
pub(crate) struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context (so leading-space rules apply).
    prefix_offset: usize,
    /// Tokens before this index have been released as text.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// Adds a token; returns the text it completes, if any.
    pub(crate) fn push(&mut self, tokenizer: &TextTokenizer, id: u32) -> Result<Option<String>, LocalError> {
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{fffd}') && full.is_char_boundary(prefix.len()) {
            let piece = full[prefix.len()..].to_owned();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(Some(piece));
        }
        Ok(None)
    }

    /// Releases whatever is still held back (an incomplete character becomes U+FFFD).
    pub(crate) fn finish(&mut self, tokenizer: &TextTokenizer) -> Result<Option<String>, LocalError> {
        if self.read_offset >= self.ids.len() {
            return Ok(None);
        }
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.read_offset = self.ids.len();
        if full.len() > prefix.len() && full.is_char_boundary(prefix.len()) {
            return Ok(Some(full[prefix.len()..].to_owned()));
        }
        Ok(None)
    }
}
