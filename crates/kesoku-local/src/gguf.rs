//! Opening a GGUF file: magic and truncation checks with errors that name the file, and typed
//! access to its metadata and tensors.
//!
//! Parsing itself is candle's (`candle_core::quantized::gguf_file`); this module adds the checks a
//! user needs to tell "wrong file" from "damaged download", and nothing about any architecture.

use crate::error::LocalError;
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// An open, validated GGUF file.
#[derive(Debug)]
pub(crate) struct GgufFile {
    pub(crate) path: PathBuf,
    pub(crate) content: Content,
    file: File,
}

/// The bytes a tensor of this type and element count occupies.
pub(crate) fn tensor_bytes(dtype: GgmlDType, elements: usize) -> Option<usize> {
    let block = dtype.block_size();
    if block == 0 || !elements.is_multiple_of(block) {
        return None;
    }
    (elements / block).checked_mul(dtype.type_size())
}

fn describe_magic(bytes: &[u8]) -> String {
    bytes.iter().map(|b| if b.is_ascii_graphic() { char::from(*b) } else { '.' }).collect()
}

impl GgufFile {
    /// Opens `path`, checks the magic bytes, parses the header and checks that every tensor lies
    /// inside the file.
    pub(crate) fn open(path: &Path) -> Result<Self, LocalError> {
        let read_error = |source| LocalError::ReadModel { path: path.to_path_buf(), source };
        let mut file = File::open(path).map_err(read_error)?;
        let file_len = file.metadata().map_err(read_error)?.len();
        let mut magic = [0u8; 4];
        let got = file.read(&mut magic).map_err(read_error)?;
        if got < 4 || &magic != b"GGUF" {
            return Err(LocalError::NotGguf { path: path.to_path_buf(), found: describe_magic(&magic[..got]) });
        }
        file.seek(SeekFrom::Start(0)).map_err(read_error)?;
        let content = Content::read(&mut file)
            .map_err(|error| LocalError::corrupt(path, format!("the header is truncated or damaged ({error})")))?;
        for (name, info) in &content.tensor_infos {
            let elements = info.shape.elem_count();
            let Some(size) = tensor_bytes(info.ggml_dtype, elements) else {
                return Err(LocalError::corrupt(
                    path,
                    format!(
                        "tensor {name} has {elements} elements, not a whole number of {:?} blocks",
                        info.ggml_dtype
                    ),
                ));
            };
            let end = content.tensor_data_offset.saturating_add(info.offset).saturating_add(size as u64);
            if end > file_len {
                return Err(LocalError::corrupt(
                    path,
                    format!(
                        "tensor {name} ends at byte {end} but the file has only {file_len} bytes (the file is truncated)"
                    ),
                ));
            }
        }
        Ok(Self { path: path.to_path_buf(), content, file })
    }

    pub(crate) fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    pub(crate) fn string(&self, key: &str) -> Option<&str> {
        self.value(key).and_then(|v| v.to_string().ok()).map(String::as_str)
    }

    fn missing(&self, key: &str) -> LocalError {
        LocalError::corrupt(&self.path, format!("metadata key {key} is missing or has the wrong type"))
    }

    pub(crate) fn required_string(&self, key: &str) -> Result<&str, LocalError> {
        self.string(key).ok_or_else(|| self.missing(key))
    }

    /// An unsigned integer of any width.
    pub(crate) fn u64(&self, key: &str) -> Option<u64> {
        match self.value(key)? {
            Value::U8(v) => Some(u64::from(*v)),
            Value::U16(v) => Some(u64::from(*v)),
            Value::U32(v) => Some(u64::from(*v)),
            Value::U64(v) => Some(*v),
            Value::I8(v) => u64::try_from(*v).ok(),
            Value::I16(v) => u64::try_from(*v).ok(),
            Value::I32(v) => u64::try_from(*v).ok(),
            Value::I64(v) => u64::try_from(*v).ok(),
            Value::F32(_) | Value::F64(_) | Value::Bool(_) | Value::String(_) | Value::Array(_) => None,
        }
    }

    pub(crate) fn usize(&self, key: &str) -> Option<usize> {
        self.u64(key).and_then(|v| usize::try_from(v).ok())
    }

    pub(crate) fn required_usize(&self, key: &str) -> Result<usize, LocalError> {
        self.usize(key).ok_or_else(|| self.missing(key))
    }

    pub(crate) fn f32(&self, key: &str) -> Option<f32> {
        match self.value(key)? {
            Value::F32(v) => Some(*v),
            Value::F64(v) => Some(*v as f32),
            Value::U8(_)
            | Value::I8(_)
            | Value::U16(_)
            | Value::I16(_)
            | Value::U32(_)
            | Value::I32(_)
            | Value::U64(_)
            | Value::I64(_) => self.u64(key).map(|v| v as f32),
            Value::Bool(_) | Value::String(_) | Value::Array(_) => None,
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Option<bool> {
        self.value(key).and_then(|v| v.to_bool().ok())
    }

    pub(crate) fn string_array(&self, key: &str) -> Result<Vec<String>, LocalError> {
        let values = self.value(key).and_then(|v| v.to_vec().ok()).ok_or_else(|| self.missing(key))?;
        values.iter().map(|v| v.to_string().cloned().map_err(|_| self.missing(key))).collect()
    }

    pub(crate) fn f32_array(&self, key: &str) -> Option<Vec<f32>> {
        let values = self.value(key)?.to_vec().ok()?;
        values.iter().map(|v| v.to_f32().ok()).collect()
    }

    pub(crate) fn u32_array(&self, key: &str) -> Option<Vec<u32>> {
        let values = self.value(key)?.to_vec().ok()?;
        values
            .iter()
            .map(|v| match v {
                Value::I32(x) => u32::try_from(*x).ok(),
                Value::U32(x) => Some(*x),
                Value::U8(x) => Some(u32::from(*x)),
                Value::I8(x) => u32::try_from(*x).ok(),
                Value::U16(x) => Some(u32::from(*x)),
                Value::I16(x) => u32::try_from(*x).ok(),
                Value::U64(x) => u32::try_from(*x).ok(),
                Value::I64(x) => u32::try_from(*x).ok(),
                Value::F32(_) | Value::F64(_) | Value::Bool(_) | Value::String(_) | Value::Array(_) => None,
            })
            .collect()
    }

    pub(crate) fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.content.tensor_infos.get(name)
    }

    pub(crate) fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads one tensor.
    pub(crate) fn tensor(&mut self, name: &str) -> Result<QTensor, LocalError> {
        if !self.has_tensor(name) {
            return Err(LocalError::corrupt(&self.path, format!("tensor {name} is missing")));
        }
        self.content
            .tensor(&mut self.file, name, &candle_core::Device::Cpu)
            .map_err(|error| LocalError::corrupt(&self.path, format!("cannot read tensor {name}: {error}")))
    }
}
