//! Scalar float helpers of the forward pass: half-precision scales, a vectorizable `exp`, and
//! lane-wise reductions the compiler can vectorize.

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::sample;

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
