//! A quantized weight matrix: built from a GGML tensor's bytes (or re-quantized from f32),
//! dequantized row by row for embedding look-ups, and multiplied with a batch of quantized
//! activations on the current rayon pool.

use rayon::prelude::*;

use super::blocks::{BLOCK, BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0};
use super::kernels::{Simd, dot_q4_0, dot_q4_1, dot_q8_0, dot4_q4_0, dot4_q4_1, dot4_q8_0};
use super::math::f16_to_f32;

/// The storage of one weight matrix, rows of `cols / 32` blocks.
#[derive(Debug)]
pub(crate) enum Blocks {
    Q4_0(Vec<BlockQ4_0>),
    Q4_1(Vec<BlockQ4_1>),
    Q8_0(Vec<BlockQ8_0>),
}

/// The GGML storage types this module keeps as they are in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NativeType {
    Q4_0,
    Q4_1,
    Q8_0,
}

/// A row-major quantized matrix: `rows` outputs, each the dot product of a row with the input.
#[derive(Debug)]
pub(crate) struct QMatrix {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) blocks: Blocks,
}

fn read_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn array16(bytes: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&bytes[..16]);
    out
}

impl QMatrix {
    /// Builds a matrix from the raw bytes of a GGML tensor of a native type.
    ///
    /// The caller has checked that `raw` holds exactly `rows * cols / 32` blocks.
    pub(crate) fn from_raw(native: NativeType, rows: usize, cols: usize, raw: &[u8]) -> Self {
        let blocks = match native {
            NativeType::Q4_0 => Blocks::Q4_0(
                raw.chunks_exact(18).map(|b| BlockQ4_0 { d: read_u16(b, 0), qs: array16(&b[2..]) }).collect(),
            ),
            NativeType::Q4_1 => Blocks::Q4_1(
                raw.chunks_exact(20)
                    .map(|b| BlockQ4_1 { d: read_u16(b, 0), m: read_u16(b, 2), qs: array16(&b[4..]) })
                    .collect(),
            ),
            NativeType::Q8_0 => Blocks::Q8_0(
                raw.chunks_exact(34)
                    .map(|b| {
                        let mut qs = [0i8; 32];
                        for (q, byte) in qs.iter_mut().zip(&b[2..34]) {
                            *q = i8::from_ne_bytes([*byte]);
                        }
                        BlockQ8_0 { d: read_u16(b, 0), qs }
                    })
                    .collect(),
            ),
        };
        Self { rows, cols, blocks }
    }

    /// Quantizes f32 rows (row-major, `cols` a multiple of 32) to Q8_0.
    pub(crate) fn q8_0_from_f32(rows: usize, cols: usize, values: &[f32]) -> Self {
        let blocks = values
            .chunks_exact(BLOCK)
            .map(|chunk| {
                let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                let mut qs = [0i8; 32];
                for (q, v) in qs.iter_mut().zip(chunk) {
                    *q = (v * id).round() as i8;
                }
                BlockQ8_0 { d: half::f16::from_f32(d).to_bits(), qs }
            })
            .collect();
        Self { rows, cols, blocks: Blocks::Q8_0(blocks) }
    }

    pub(crate) fn blocks_per_row(&self) -> usize {
        self.cols / BLOCK
    }

    /// Bytes of weight data, for the load report.
    pub(crate) fn size_in_bytes(&self) -> usize {
        match &self.blocks {
            Blocks::Q4_0(b) => b.len() * size_of::<BlockQ4_0>(),
            Blocks::Q4_1(b) => b.len() * size_of::<BlockQ4_1>(),
            Blocks::Q8_0(b) => b.len() * size_of::<BlockQ8_0>(),
        }
    }

    /// Writes row `row` as f32 values into `out` (used for embedding look-ups).
    pub(crate) fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let per_row = self.blocks_per_row();
        let range = row * per_row..(row + 1) * per_row;
        match &self.blocks {
            Blocks::Q4_0(blocks) => {
                for (block, out) in blocks[range].iter().zip(out.chunks_exact_mut(BLOCK)) {
                    let d = f16_to_f32(block.d);
                    for j in 0..16 {
                        out[j] = (f32::from(block.qs[j] & 0x0f) - 8.0) * d;
                        out[j + 16] = (f32::from(block.qs[j] >> 4) - 8.0) * d;
                    }
                }
            }
            Blocks::Q4_1(blocks) => {
                for (block, out) in blocks[range].iter().zip(out.chunks_exact_mut(BLOCK)) {
                    let d = f16_to_f32(block.d);
                    let m = f16_to_f32(block.m);
                    for j in 0..16 {
                        out[j] = f32::from(block.qs[j] & 0x0f) * d + m;
                        out[j + 16] = f32::from(block.qs[j] >> 4) * d + m;
                    }
                }
            }
            Blocks::Q8_0(blocks) => {
                for (block, out) in blocks[range].iter().zip(out.chunks_exact_mut(BLOCK)) {
                    let d = f16_to_f32(block.d);
                    for (o, q) in out.iter_mut().zip(block.qs) {
                        *o = f32::from(q) * d;
                    }
                }
            }
        }
    }

    /// The dot product of row `row` with a quantized input.
    #[inline]
    fn dot_row(&self, simd: Simd, row: usize, input: &[BlockQ8]) -> f32 {
        let per_row = self.blocks_per_row();
        let range = row * per_row..(row + 1) * per_row;
        match &self.blocks {
            Blocks::Q4_0(blocks) => dot_q4_0(simd, &blocks[range], input),
            Blocks::Q4_1(blocks) => dot_q4_1(simd, &blocks[range], input),
            Blocks::Q8_0(blocks) => dot_q8_0(simd, &blocks[range], input),
        }
    }

    /// The dot products of row `row` with four quantized inputs at once (the weights are
    /// unpacked once for all four).
    #[inline]
    fn dot_row_x4(&self, simd: Simd, row: usize, inputs: [&[BlockQ8]; 4]) -> [f32; 4] {
        let per_row = self.blocks_per_row();
        let range = row * per_row..(row + 1) * per_row;
        match &self.blocks {
            Blocks::Q4_0(blocks) => dot4_q4_0(simd, &blocks[range], inputs),
            Blocks::Q4_1(blocks) => dot4_q4_1(simd, &blocks[range], inputs),
            Blocks::Q8_0(blocks) => dot4_q8_0(simd, &blocks[range], inputs),
        }
    }

    /// `out[t][r] = row r · input[t]` for every token `t` of the batch.
    ///
    /// `input` holds `tokens` quantized vectors of `cols` values back to back; `out` holds
    /// `tokens` rows of `self.rows` values. Runs on the current rayon pool.
    pub(crate) fn matmul(&self, simd: Simd, input: &[BlockQ8], tokens: usize, out: &mut [f32], scratch: &mut Vec<f32>) {
        let per_row = self.blocks_per_row();
        debug_assert_eq!(input.len(), tokens * per_row);
        debug_assert_eq!(out.len(), tokens * self.rows);
        let threads = rayon::current_num_threads().max(1);
        // Enough chunks to balance the pool, few enough that scheduling stays cheap.
        let chunk_rows = self.rows.div_ceil(threads * 4).max(16);
        if tokens == 1 {
            out.par_chunks_mut(chunk_rows).enumerate().for_each(|(chunk, out)| {
                let first = chunk * chunk_rows;
                for (offset, value) in out.iter_mut().enumerate() {
                    *value = self.dot_row(simd, first + offset, input);
                }
            });
            return;
        }
        // Batches are computed row-major ([row][token]) so each task owns a contiguous slice
        // and a weight row stays in cache while it meets every token; then transposed.
        scratch.clear();
        scratch.resize(tokens * self.rows, 0.0);
        // Tokens go in tiles of four (one weight unpacking serves four dot products); the tile
        // stays in L1 while the chunk's rows stream past it.
        scratch.par_chunks_mut(chunk_rows * tokens).enumerate().for_each(|(chunk, out)| {
            let first = chunk * chunk_rows;
            let rows_here = out.len() / tokens;
            for tile in (0..tokens).step_by(4) {
                let inputs = [0, 1, 2, 3].map(|i| {
                    let token = (tile + i).min(tokens - 1);
                    &input[token * per_row..(token + 1) * per_row]
                });
                let width = (tokens - tile).min(4);
                for offset in 0..rows_here {
                    let dots = self.dot_row_x4(simd, first + offset, inputs);
                    out[offset * tokens + tile..offset * tokens + tile + width].copy_from_slice(&dots[..width]);
                }
            }
        });
        // Transposed in blocks of 16 rows, so each token's writes fill whole cache lines.
        for first in (0..self.rows).step_by(16) {
            let last = (first + 16).min(self.rows);
            for token in 0..tokens {
                let out = &mut out[token * self.rows + first..token * self.rows + last];
                for (offset, value) in out.iter_mut().enumerate() {
                    *value = scratch[(first + offset) * tokens + token];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{quantize_activations, sample};

    fn reference(rows: usize, cols: usize, w: &[f32], x: &[f32]) -> Vec<f32> {
        (0..rows).map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(a, b)| a * b).sum()).collect()
    }

    fn q4_1_raw(values: &[f32]) -> Vec<u8> {
        let mut raw = Vec::new();
        for chunk in values.chunks_exact(32) {
            let min = chunk.iter().copied().fold(f32::INFINITY, f32::min);
            let max = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let d = (max - min) / 15.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            raw.extend(half::f16::from_f32(d).to_bits().to_le_bytes());
            raw.extend(half::f16::from_f32(min).to_bits().to_le_bytes());
            for j in 0..16 {
                let lo = (((chunk[j] - min) * id).round() as u8).min(15);
                let hi = (((chunk[j + 16] - min) * id).round() as u8).min(15);
                raw.push(lo | (hi << 4));
            }
        }
        raw
    }

    fn q4_0_raw(values: &[f32]) -> Vec<u8> {
        let mut raw = Vec::new();
        for chunk in values.chunks_exact(32) {
            let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 7.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            raw.extend(half::f16::from_f32(d).to_bits().to_le_bytes());
            for j in 0..16 {
                let lo = ((chunk[j] * id + 8.5) as u8).min(15);
                let hi = ((chunk[j + 16] * id + 8.5) as u8).min(15);
                raw.push(lo | (hi << 4));
            }
        }
        raw
    }

    fn check(matrix: &QMatrix, w: &[f32], tolerance: f32) {
        let (rows, cols) = (matrix.rows, matrix.cols);
        let tokens = 3;
        let x = sample(cols * tokens, 7);
        let mut qx = Vec::new();
        quantize_activations(&x, &mut qx);
        for simd in [Simd::detect(), Simd::scalar()] {
            let mut out = vec![0f32; rows * tokens];
            let mut scratch = Vec::new();
            matrix.matmul(simd, &qx, tokens, &mut out, &mut scratch);
            for t in 0..tokens {
                let expected = reference(rows, cols, w, &x[t * cols..(t + 1) * cols]);
                for (got, want) in out[t * rows..(t + 1) * rows].iter().zip(&expected) {
                    assert!((got - want).abs() < tolerance, "{} kernel: got {got}, want {want}", simd.describe());
                }
            }
            let mut single = vec![0f32; rows];
            matrix.matmul(simd, &qx[..cols / 32], 1, &mut single, &mut scratch);
            assert_eq!(single, out[..rows].to_vec(), "batch and single-token paths agree");
        }
    }

    #[test]
    fn kernels_match_a_float_reference() {
        let (rows, cols) = (40, 96);
        let w = sample(rows * cols, 3);

        let q8 = QMatrix::q8_0_from_f32(rows, cols, &w);
        check(&q8, &w, 0.05);

        let raw = q4_1_raw(&w);
        let q41 = QMatrix::from_raw(NativeType::Q4_1, rows, cols, &raw);
        let mut deq = vec![0f32; rows * cols];
        for r in 0..rows {
            q41.dequantize_row(r, &mut deq[r * cols..(r + 1) * cols]);
        }
        check(&q41, &deq, 0.05);

        let raw = q4_0_raw(&w);
        let q40 = QMatrix::from_raw(NativeType::Q4_0, rows, cols, &raw);
        for r in 0..rows {
            q40.dequantize_row(r, &mut deq[r * cols..(r + 1) * cols]);
        }
        check(&q40, &deq, 0.05);
    }
}
