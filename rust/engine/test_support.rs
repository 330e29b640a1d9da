//! Helpers for the allocator tests: a seeded PRNG and checks shared by the model-based tests.

/// SplitMix64: small, seedable, good enough to drive random alloc/free sequences.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    pub(crate) fn range(&mut self, low: usize, high: usize) -> usize {
        low + (self.next() % (high - low + 1) as u64) as usize
    }
}

/// Panics if any two `(address, size)` blocks overlap.
pub(crate) fn assert_disjoint(blocks: &mut [(usize, usize)]) {
    blocks.sort_unstable();
    for pair in blocks.windows(2) {
        assert!(
            pair[0].0 + pair[0].1 <= pair[1].0,
            "blocks overlap: {:x?} and {:x?}",
            pair[0],
            pair[1]
        );
    }
}
