//! A deterministic random source for simulated effects (jitter).
//!
//! SplitMix64 (Steele, Lea and Flood, OOPSLA 2014): one `u64` of state, so the
//! stream is part of the world and a checkpoint restores it exactly.

use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

/// The world's random stream.
#[derive(Resource, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max` (Lemire's multiply-shift; the bias is below 2^-32
    /// for any `max` used here).
    pub fn up_to(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        if max == u64::MAX {
            return self.next_u64();
        }
        ((u128::from(self.next_u64()) * u128::from(max + 1)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_bounded() {
        let (mut a, mut b) = (SimRng::new(7), SimRng::new(7));
        for _ in 0..1000 {
            let x = a.up_to(10);
            assert_eq!(x, b.up_to(10));
            assert!(x <= 10);
        }
        assert_ne!(SimRng::new(1).next_u64(), SimRng::new(2).next_u64());
        assert_eq!(SimRng::new(3).up_to(0), 0);
    }
}
