//! Choosing the next token from logits: greedy at temperature 0, otherwise top-k (40, as
//! llama.cpp's default chain) then temperature, then top-p, drawn from a seeded generator.
//!
//! The generator is a SplitMix64 of our own so a seed gives the same tokens across builds and
//! dependency upgrades.

/// SplitMix64: tiny, fast, and stable by construction.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Candidates kept before temperature and top-p.
const TOP_K: usize = 40;

#[derive(Clone, Debug)]
pub(crate) struct Sampler {
    temperature: f32,
    top_p: f32,
    rng: SplitMix64,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub(crate) fn new(temperature: f32, top_p: f32, seed: u64) -> Self {
        Self { temperature, top_p, rng: SplitMix64::new(seed), candidates: Vec::new() }
    }

    pub(crate) fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.temperature <= 1e-4 {
            return argmax(logits);
        }
        self.candidates.clear();
        self.candidates.extend(logits.iter().enumerate().map(|(i, l)| (i as u32, *l)));
        let keep = TOP_K.min(self.candidates.len());
        if keep < self.candidates.len() {
            self.candidates.select_nth_unstable_by(keep - 1, |a, b| b.1.total_cmp(&a.1));
            self.candidates.truncate(keep);
        }
        self.candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
        let max = self.candidates.first().map_or(0.0, |c| c.1);
        let mut total = 0.0;
        for candidate in &mut self.candidates {
            candidate.1 = ((candidate.1 - max) / self.temperature).exp();
            total += candidate.1;
        }
        // Top-p: the smallest prefix whose probability reaches top_p.
        let mut cumulative = 0.0;
        let mut cut = self.candidates.len();
        for (i, candidate) in self.candidates.iter().enumerate() {
            cumulative += candidate.1 / total;
            if cumulative >= self.top_p {
                cut = i + 1;
                break;
            }
        }
        self.candidates.truncate(cut.max(1));
        let kept: f32 = self.candidates.iter().map(|c| c.1).sum();
        let mut draw = self.rng.next_f32() * kept;
        for candidate in &self.candidates {
            draw -= candidate.1;
            if draw <= 0.0 {
                return candidate.0;
            }
        }
        self.candidates.last().map_or(0, |c| c.0)
    }
}

pub(crate) fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    for (i, value) in logits.iter().enumerate() {
        if *value > best_value {
            best = i;
            best_value = *value;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_largest() {
        let mut sampler = Sampler::new(0.0, 1.0, 1);
        assert_eq!(sampler.sample(&[0.1, 3.0, -2.0, 2.9]), 1);
    }

    #[test]
    fn same_seed_same_draws_and_top_p_cuts() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 17) as f32 * 0.3).collect();
        let draws = |seed| {
            let mut sampler = Sampler::new(0.8, 0.9, seed);
            (0..20).map(|_| sampler.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        // A tiny top-p keeps only the most likely token.
        let mut sampler = Sampler::new(1.0, 0.01, 3);
        let best = argmax(&logits);
        assert!((0..20).all(|_| logits[sampler.sample(&logits) as usize] == logits[best as usize]));
    }
}
