//! The GGML block layouts the weights keep (Q4_0, Q4_1, Q8_0) and the 8-bit blocks the
//! activations are quantized to before each matrix product.

/// Values per quantization block, for every supported type.
pub(crate) const BLOCK: usize = 32;

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
