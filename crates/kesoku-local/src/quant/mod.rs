//! Quantized weight matrices and the matrix-vector kernels the forward pass runs on.
//!
//! Weights keep the GGML block layouts of the file (Q4_0, Q4_1, Q8_0) so a token reads as few
//! bytes as llama.cpp does; any other GGML type is dequantized once at load and re-quantized to
//! Q8_0. Activations are quantized per 32-value block to 8 bits (scale and sum kept in f32), and
//! the dot products run on AVX2 through `pulp`'s safe intrinsics where the CPU has it, with a
//! scalar fallback elsewhere. Rows are spread over the caller's rayon pool.
//!
//! One module per job: [`math`] the scalar float helpers, [`blocks`] the block layouts and the
//! activations' quantization, [`matrix`] a weight matrix (load, dequantize, multiply),
//! [`kernels`] the choice of instruction set and the dot products, `avx2` the x86_64 kernels.
//!
//! This module is not a tensor library: no shapes beyond row-major matrices, no autograd, no GPU.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod blocks;
mod kernels;
mod math;
mod matrix;

pub(crate) use blocks::{BLOCK, BlockQ8, quantize_activations};
pub(crate) use kernels::{Simd, axpy_f32, dot_f32, dot4_f32};
pub(crate) use math::{exp_f32, max_f32, sum_f32};
pub(crate) use matrix::{Blocks, NativeType, QMatrix};

/// Deterministic values in [-1, 1) for the kernels' tests.
#[cfg(test)]
fn sample(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0 - 1.0)
        .collect()
}
