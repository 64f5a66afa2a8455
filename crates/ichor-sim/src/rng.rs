//! The simulation's one source of randomness: SplitMix64 from the run's seed, so that a
//! seed replays a run exactly.

use std::ops::RangeInclusive;

/// SplitMix64.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
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

    /// A whole number in the range, uniformly.
    pub(crate) fn in_range(&mut self, range: RangeInclusive<u64>) -> u64 {
        let (low, high) = (*range.start(), *range.end());
        if high <= low {
            return low;
        }
        low + self.next_u64() % (high - low + 1)
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A boot ID shaped like the kernel's (a version-4 UUID).
    pub(crate) fn boot_id(&mut self) -> String {
        let a = self.next_u64();
        let b = self.next_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn ranges_stay_in_bounds_and_boot_ids_are_valid() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            let n = r.in_range(5..=9);
            assert!((5..=9).contains(&n));
        }
        assert_eq!(r.in_range(3..=3), 3);
        let id = r.boot_id();
        assert!(ichor_upgrade_core::upgrade_marker::is_valid_boot_id(&id) && id.len() == 36, "{id}");
    }
}
