//! The AVX2/FMA kernels, written with `pulp`'s safe wrappers over `core::arch`.

use core::arch::x86_64::{__m128i, __m256, __m256i};
use pulp::bytemuck;
use pulp::x86::V3;

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0};
use super::math::f16_to_f32;

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
