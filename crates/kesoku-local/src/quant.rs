//! Quantized weight matrices and the matrix-vector kernels the forward pass runs on.
//!
//! Weights keep the GGML block layouts of the file (Q4_0, Q4_1, Q8_0) so a token reads as few
//! bytes as llama.cpp does; any other GGML type is dequantized once at load and re-quantized to
//! Q8_0. Activations are quantized per 32-value block to 8 bits (scale and sum kept in f32), and
//! the dot products run on AVX2 through `pulp`'s safe intrinsics where the CPU has it, with a
//! scalar fallback elsewhere. Rows are spread over the caller's rayon pool.
//!
//! This module is not a tensor library: no shapes beyond row-major matrices, no autograd, no GPU.

use pulp::bytemuck;
use rayon::prelude::*;

/// Values per quantization block, for every supported type.
pub(crate) const BLOCK: usize = 32;

/// Converts IEEE half-precision bits to f32; the fast path covers normal numbers, the rare
/// zero/subnormal/infinite scales go through `half`.
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let exponent = (bits >> 10) & 0x1f;
    if exponent == 0 || exponent == 31 {
        return half::f16::from_bits(bits).to_f32();
    }
    let sign = u32::from(bits & 0x8000) << 16;
    let mantissa = u32::from(bits & 0x3ff) << 13;
    f32::from_bits(sign | ((u32::from(exponent) + 112) << 23) | mantissa)
}

/// `e^x` without a libm call, so loops over it vectorize: range reduction by powers of two and
/// a degree-6 polynomial (relative error below 2e-7 over the f32 range; 0 below -87.3).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer with plain arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.7);
    let k = (x * LOG2_E + ROUND) - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((k as i32 + 127) as u32) << 23);
    p * scale
}

/// Sum with eight independent lanes, which the compiler vectorizes (a plain float fold cannot be
/// reordered, so it would not be).
pub(crate) fn sum_f32(values: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = values.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, value) in lanes.iter_mut().zip(chunk) {
            *lane += value;
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// Maximum with eight independent lanes (see [`sum_f32`]).
pub(crate) fn max_f32(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = values.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, value) in lanes.iter_mut().zip(chunk) {
            *lane = if *value > *lane { *value } else { *lane };
        }
    }
    lanes.iter().chain(chunks.remainder()).fold(f32::NEG_INFINITY, |m, v| if *v > m { *v } else { m })
}

/// GGML Q4_0: 32 weights as 4-bit values centred on 8, one f16 scale.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ4_0 {
    pub(crate) d: u16,
    pub(crate) qs: [u8; 16],
}

/// GGML Q4_1: 32 weights as 4-bit values, an f16 scale and an f16 minimum.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ4_1 {
    pub(crate) d: u16,
    pub(crate) m: u16,
    pub(crate) qs: [u8; 16],
}

/// GGML Q8_0: 32 weights as signed bytes and one f16 scale.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ8_0 {
    pub(crate) d: u16,
    pub(crate) qs: [i8; 32],
}

/// A quantized activation block: `value ≈ d * qs[i]`, and `s = d * Σ qs` for the Q4 offsets.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockQ8 {
    pub(crate) d: f32,
    pub(crate) s: f32,
    pub(crate) qs: [i8; 32],
}

impl BlockQ8 {
    const ZERO: Self = Self { d: 0.0, s: 0.0, qs: [0; 32] };
}

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

/// Quantizes `tokens` activation vectors of `cols` values each (cols a multiple of 32).
pub(crate) fn quantize_activations(values: &[f32], out: &mut Vec<BlockQ8>) {
    out.clear();
    out.resize(values.len() / BLOCK, BlockQ8::ZERO);
    for (block, chunk) in out.iter_mut().zip(values.chunks_exact(BLOCK)) {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in block.qs.iter_mut().zip(chunk) {
            // |v·id| ≤ 127: adding and removing 1.5·2^23 rounds without a libm call.
            let rounded = ((v * id + 12_582_912.0) - 12_582_912.0) as i8;
            *q = rounded;
            sum += i32::from(rounded);
        }
        block.d = d;
        block.s = d * sum as f32;
    }
}

/// The instruction set the kernels may use, decided once at load.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Simd {
    #[cfg(target_arch = "x86_64")]
    v3: Option<pulp::x86::V3>,
}

impl Simd {
    pub(crate) fn detect() -> Self {
        Self {
            #[cfg(target_arch = "x86_64")]
            v3: pulp::x86::V3::try_new(),
        }
    }

    /// A scalar-only instance, so tests can compare both paths.
    #[cfg(test)]
    pub(crate) fn scalar() -> Self {
        Self {
            #[cfg(target_arch = "x86_64")]
            v3: None,
        }
    }

    pub(crate) fn describe(&self) -> &'static str {
        #[cfg(target_arch = "x86_64")]
        if self.v3.is_some() {
            return "avx2+fma";
        }
        "scalar"
    }
}

fn dot_q4_0(simd: Simd, x: &[BlockQ4_0], y: &[BlockQ8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot_q4_0(v3, x, y);
    }
    let _ = simd;
    let mut sum = 0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut acc = 0i32;
        for j in 0..16 {
            acc += (i32::from(bx.qs[j] & 0x0f) - 8) * i32::from(by.qs[j]);
            acc += (i32::from(bx.qs[j] >> 4) - 8) * i32::from(by.qs[j + 16]);
        }
        sum += acc as f32 * f16_to_f32(bx.d) * by.d;
    }
    sum
}

fn dot_q4_1(simd: Simd, x: &[BlockQ4_1], y: &[BlockQ8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot_q4_1(v3, x, y);
    }
    let _ = simd;
    let mut sum = 0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut acc = 0i32;
        for j in 0..16 {
            acc += i32::from(bx.qs[j] & 0x0f) * i32::from(by.qs[j]);
            acc += i32::from(bx.qs[j] >> 4) * i32::from(by.qs[j + 16]);
        }
        sum += acc as f32 * f16_to_f32(bx.d) * by.d + f16_to_f32(bx.m) * by.s;
    }
    sum
}

fn dot_q8_0(simd: Simd, x: &[BlockQ8_0], y: &[BlockQ8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot_q8_0(v3, x, y);
    }
    let _ = simd;
    let mut sum = 0f32;
    for (bx, by) in x.iter().zip(y) {
        let acc: i32 = bx.qs.iter().zip(by.qs).map(|(a, b)| i32::from(*a) * i32::from(b)).sum();
        sum += acc as f32 * f16_to_f32(bx.d) * by.d;
    }
    sum
}

fn dot4_q4_0(simd: Simd, x: &[BlockQ4_0], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot4_q4_0(v3, x, ys);
    }
    ys.map(|y| dot_q4_0(simd, x, y))
}

fn dot4_q4_1(simd: Simd, x: &[BlockQ4_1], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot4_q4_1(v3, x, ys);
    }
    ys.map(|y| dot_q4_1(simd, x, y))
}

fn dot4_q8_0(simd: Simd, x: &[BlockQ8_0], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot4_q8_0(v3, x, ys);
    }
    ys.map(|y| dot_q8_0(simd, x, y))
}

/// Four f32 dot products of `q` with four keys, sharing the loads of `q`.
pub(crate) fn dot4_f32(simd: Simd, q: &[f32], keys: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot4_f32(v3, q, keys);
    }
    keys.map(|k| dot_f32(simd, q, k))
}

/// f32 dot product, vectorized where possible.
pub(crate) fn dot_f32(simd: Simd, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot_f32(v3, a, b);
    }
    let _ = simd;
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += alpha * x`, vectorized where possible.
pub(crate) fn axpy_f32(simd: Simd, alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        avx2::axpy_f32(v3, alpha, x, y);
        return;
    }
    let _ = simd;
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The AVX2/FMA kernels, written with `pulp`'s safe wrappers over `core::arch`.

    use super::{BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0, bytemuck, f16_to_f32};
    use core::arch::x86_64::{__m128i, __m256, __m256i};
    use pulp::x86::V3;

    #[inline(always)]
    fn hsum(simd: V3, v: __m256) -> f32 {
        let high = simd.avx._mm256_extractf128_ps::<1>(v);
        let sum4 = simd.sse._mm_add_ps(high, simd.avx._mm256_castps256_ps128(v));
        let sum2 = simd.sse._mm_add_ps(sum4, simd.sse._mm_movehl_ps(sum4, sum4));
        let sum1 = simd.sse._mm_add_ss(sum2, simd.sse3._mm_movehdup_ps(sum2));
        simd.sse._mm_cvtss_f32(sum1)
    }

    /// Spreads 16 bytes of nibbles over 32 bytes: low nibbles first, then high nibbles.
    #[inline(always)]
    fn nibbles(simd: V3, qs: [u8; 16]) -> __m256i {
        let packed: __m128i = bytemuck::cast(qs);
        let high = simd.sse2._mm_srli_epi16::<4>(packed);
        let bytes = simd.avx._mm256_set_m128i(high, packed);
        simd.avx2._mm256_and_si256(bytes, simd.avx._mm256_set1_epi8(0x0f))
    }

    /// Σ u8 × i8 over 32 lanes, as eight f32 partial sums.
    #[inline(always)]
    fn dot_u8_i8(simd: V3, x: __m256i, y: __m256i) -> __m256 {
        let pairs = simd.avx2._mm256_maddubs_epi16(x, y);
        let quads = simd.avx2._mm256_madd_epi16(pairs, simd.avx._mm256_set1_epi16(1));
        simd.avx._mm256_cvtepi32_ps(quads)
    }

    pub(super) fn dot_q4_1(simd: V3, x: &[BlockQ4_1], y: &[BlockQ8]) -> f32 {
        simd.vectorize(
            #[inline(always)]
            || {
                let mut acc = simd.avx._mm256_setzero_ps();
                let mut offsets = 0f32;
                for (bx, by) in x.iter().zip(y) {
                    let qx = nibbles(simd, bx.qs);
                    let qy: __m256i = bytemuck::cast(by.qs);
                    let partial = dot_u8_i8(simd, qx, qy);
                    let scale = simd.avx._mm256_set1_ps(f16_to_f32(bx.d) * by.d);
                    acc = simd.fma._mm256_fmadd_ps(scale, partial, acc);
                    offsets += f16_to_f32(bx.m) * by.s;
                }
                hsum(simd, acc) + offsets
            },
        )
    }

    pub(super) fn dot_q4_0(simd: V3, x: &[BlockQ4_0], y: &[BlockQ8]) -> f32 {
        simd.vectorize(
            #[inline(always)]
            || {
                let mut acc = simd.avx._mm256_setzero_ps();
                let mut offsets = 0f32;
                for (bx, by) in x.iter().zip(y) {
                    let qx = nibbles(simd, bx.qs);
                    let qy: __m256i = bytemuck::cast(by.qs);
                    let partial = dot_u8_i8(simd, qx, qy);
                    let d = f16_to_f32(bx.d);
                    let scale = simd.avx._mm256_set1_ps(d * by.d);
                    acc = simd.fma._mm256_fmadd_ps(scale, partial, acc);
                    // The stored nibbles are offset by 8: subtract 8·Σy once per block.
                    offsets -= 8.0 * d * by.s;
                }
                hsum(simd, acc) + offsets
            },
        )
    }

    pub(super) fn dot_q8_0(simd: V3, x: &[BlockQ8_0], y: &[BlockQ8]) -> f32 {
        simd.vectorize(
            #[inline(always)]
            || {
                let mut acc = simd.avx._mm256_setzero_ps();
                for (bx, by) in x.iter().zip(y) {
                    let qx: __m256i = bytemuck::cast(bx.qs);
                    let qy: __m256i = bytemuck::cast(by.qs);
                    // maddubs wants an unsigned left side: move x's sign onto y.
                    let ax = simd.avx2._mm256_sign_epi8(qx, qx);
                    let sy = simd.avx2._mm256_sign_epi8(qy, qx);
                    let partial = dot_u8_i8(simd, ax, sy);
                    let scale = simd.avx._mm256_set1_ps(f16_to_f32(bx.d) * by.d);
                    acc = simd.fma._mm256_fmadd_ps(scale, partial, acc);
                }
                hsum(simd, acc)
            },
        )
    }

    /// Four accumulators, one per input.
    #[inline(always)]
    fn finish4(simd: V3, acc: [__m256; 4], offsets: [f32; 4]) -> [f32; 4] {
        [
            hsum(simd, acc[0]) + offsets[0],
            hsum(simd, acc[1]) + offsets[1],
            hsum(simd, acc[2]) + offsets[2],
            hsum(simd, acc[3]) + offsets[3],
        ]
    }

    pub(super) fn dot4_q4_1(simd: V3, x: &[BlockQ4_1], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
        simd.vectorize(
            #[inline(always)]
            || {
                let mut acc = [simd.avx._mm256_setzero_ps(); 4];
                let mut offsets = [0f32; 4];
                for (i, bx) in x.iter().enumerate() {
                    let qx = nibbles(simd, bx.qs);
                    let (d, m) = (f16_to_f32(bx.d), f16_to_f32(bx.m));
                    for k in 0..4 {
                        let by = &ys[k][i];
                        let qy: __m256i = bytemuck::cast(by.qs);
                        let partial = dot_u8_i8(simd, qx, qy);
                        acc[k] = simd.fma._mm256_fmadd_ps(simd.avx._mm256_set1_ps(d * by.d), partial, acc[k]);
                        offsets[k] += m * by.s;
                    }
                }
                finish4(simd, acc, offsets)
            },
        )
    }

    pub(super) fn dot4_q4_0(simd: V3, x: &[BlockQ4_0], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
        simd.vectorize(
            #[inline(always)]
            || {
                let mut acc = [simd.avx._mm256_setzero_ps(); 4];
                let mut offsets = [0f32; 4];
                for (i, bx) in x.iter().enumerate() {
                    let qx = nibbles(simd, bx.qs);
                    let d = f16_to_f32(bx.d);
                    for k in 0..4 {
                        let by = &ys[k][i];
                        let qy: __m256i = bytemuck::cast(by.qs);
                        let partial = dot_u8_i8(simd, qx, qy);
                        acc[k] = simd.fma._mm256_fmadd_ps(simd.avx._mm256_set1_ps(d * by.d), partial, acc[k]);
                        offsets[k] -= 8.0 * d * by.s;
                    }
                }
                finish4(simd, acc, offsets)
            },
        )
    }

    pub(super) fn dot4_q8_0(simd: V3, x: &[BlockQ8_0], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
        simd.vectorize(
            #[inline(always)]
            || {
                let mut acc = [simd.avx._mm256_setzero_ps(); 4];
                for (i, bx) in x.iter().enumerate() {
                    let qx: __m256i = bytemuck::cast(bx.qs);
                    let ax = simd.avx2._mm256_sign_epi8(qx, qx);
                    let d = f16_to_f32(bx.d);
                    for k in 0..4 {
                        let by = &ys[k][i];
                        let qy: __m256i = bytemuck::cast(by.qs);
                        let sy = simd.avx2._mm256_sign_epi8(qy, qx);
                        let partial = dot_u8_i8(simd, ax, sy);
                        acc[k] = simd.fma._mm256_fmadd_ps(simd.avx._mm256_set1_ps(d * by.d), partial, acc[k]);
                    }
                }
                finish4(simd, acc, [0.0; 4])
            },
        )
    }

    pub(super) fn dot4_f32(simd: V3, q: &[f32], keys: [&[f32]; 4]) -> [f32; 4] {
        simd.vectorize(
            #[inline(always)]
            || {
                let (q8, q_tail) = pulp::as_arrays::<8, f32>(q);
                let k8 = keys.map(|k| pulp::as_arrays::<8, f32>(k).0);
                let mut acc = [simd.avx._mm256_setzero_ps(); 4];
                for (i, qv) in q8.iter().enumerate() {
                    let qv: __m256 = bytemuck::cast(*qv);
                    for k in 0..4 {
                        let kv: __m256 = bytemuck::cast(k8[k][i]);
                        acc[k] = simd.fma._mm256_fmadd_ps(qv, kv, acc[k]);
                    }
                }
                let mut tails = [0f32; 4];
                let start = q8.len() * 8;
                for (k, tail) in tails.iter_mut().enumerate() {
                    *tail = q_tail.iter().zip(&keys[k][start..]).map(|(a, b)| a * b).sum();
                }
                finish4(simd, acc, tails)
            },
        )
    }

    pub(super) fn dot_f32(simd: V3, a: &[f32], b: &[f32]) -> f32 {
        simd.vectorize(
            #[inline(always)]
            || {
                let (a8, a_tail) = pulp::as_arrays::<8, f32>(a);
                let (b8, b_tail) = pulp::as_arrays::<8, f32>(b);
                let mut acc = simd.avx._mm256_setzero_ps();
                for (x, y) in a8.iter().zip(b8) {
                    let x: __m256 = bytemuck::cast(*x);
                    let y: __m256 = bytemuck::cast(*y);
                    acc = simd.fma._mm256_fmadd_ps(x, y, acc);
                }
                let tail: f32 = a_tail.iter().zip(b_tail).map(|(x, y)| x * y).sum();
                hsum(simd, acc) + tail
            },
        )
    }

    pub(super) fn axpy_f32(simd: V3, alpha: f32, x: &[f32], y: &mut [f32]) {
        simd.vectorize(
            #[inline(always)]
            || {
                let (x8, x_tail) = pulp::as_arrays::<8, f32>(x);
                let (y8, y_tail) = pulp::as_arrays_mut::<8, f32>(y);
                let scale = simd.avx._mm256_set1_ps(alpha);
                for (xv, yv) in x8.iter().zip(y8.iter_mut()) {
                    let xs: __m256 = bytemuck::cast(*xv);
                    let ys: __m256 = bytemuck::cast(*yv);
                    *yv = bytemuck::cast(simd.fma._mm256_fmadd_ps(scale, xs, ys));
                }
                for (yv, xv) in y_tail.iter_mut().zip(x_tail) {
                    *yv += alpha * xv;
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0 - 1.0)
            .collect()
    }

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

    #[test]
    fn vector_helpers_match_scalar() {
        let a = sample(70, 1);
        let b = sample(70, 2);
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot_f32(Simd::detect(), &a, &b) - want).abs() < 1e-3);
        let mut y1 = b.clone();
        let mut y2 = b.clone();
        axpy_f32(Simd::detect(), 0.5, &a, &mut y1);
        axpy_f32(Simd::scalar(), 0.5, &a, &mut y2);
        for (p, q) in y1.iter().zip(&y2) {
            assert!((p - q).abs() < 1e-5);
        }
    }

    #[test]
    fn lane_reductions_match_folds() {
        let values = sample(77, 9);
        let sum: f32 = values.iter().sum();
        assert!((sum_f32(&values) - sum).abs() < 1e-4);
        assert_eq!(max_f32(&values), values.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max_f32(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0f32;
        for i in -8700..=8800 {
            let x = i as f32 / 100.0;
            let (fast, exact) = (exp_f32(x), x.exp());
            worst = worst.max(((fast - exact) / exact).abs());
        }
        assert!(worst < 1e-6, "relative error {worst}");
        assert!(exp_f32(-1000.0) < 1e-37);
    }

    #[test]
    fn half_conversion_matches_the_half_crate() {
        for bits in (0u16..=u16::MAX).step_by(7) {
            let fast = f16_to_f32(bits);
            let slow = half::f16::from_bits(bits).to_f32();
            assert!(fast == slow || (fast.is_nan() && slow.is_nan()), "bits {bits:#x}");
        }
    }
}
