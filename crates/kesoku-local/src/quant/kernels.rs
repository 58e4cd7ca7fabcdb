//! The choice of instruction set, made once at load, and the dot products every matrix
//! product and attention step runs: AVX2/FMA kernels (`avx2`) where the CPU has them, scalar
//! loops elsewhere.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8, BlockQ8_0};
use super::math::f16_to_f32;

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

pub(super) fn dot_q4_0(simd: Simd, x: &[BlockQ4_0], y: &[BlockQ8]) -> f32 {
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

pub(super) fn dot_q4_1(simd: Simd, x: &[BlockQ4_1], y: &[BlockQ8]) -> f32 {
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

pub(super) fn dot_q8_0(simd: Simd, x: &[BlockQ8_0], y: &[BlockQ8]) -> f32 {
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

pub(super) fn dot4_q4_0(simd: Simd, x: &[BlockQ4_0], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot4_q4_0(v3, x, ys);
    }
    ys.map(|y| dot_q4_0(simd, x, y))
}

pub(super) fn dot4_q4_1(simd: Simd, x: &[BlockQ4_1], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if let Some(v3) = simd.v3 {
        return avx2::dot4_q4_1(v3, x, ys);
    }
    ys.map(|y| dot_q4_1(simd, x, y))
}

pub(super) fn dot4_q8_0(simd: Simd, x: &[BlockQ8_0], ys: [&[BlockQ8]; 4]) -> [f32; 4] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::sample;

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
}
