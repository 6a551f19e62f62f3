//! Deterministic randomness for simulated effects (jitter).
//!
//! Counter-based: every draw is a pure function of the pod's seed and a key
//! that names the event (`device, heartbeat send time`, `barrier, device`,
//! `message sequence number`). No stream advances, so the same event gets the
//! same jitter whatever order systems visit entities in — which keeps a
//! restored world, whose query order may differ, stepping bit for bit like
//! the original. The mixer is SplitMix64's finalizer (Steele, Lea and Flood,
//! OOPSLA 2014).

use bevy_ecs::prelude::*;
use serde::{Deserialize, Serialize};

/// The seed of every random draw in the world.
#[derive(Resource, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimRng {
    /// The pod's seed.
    pub seed: u64,
}

/// Keys that name the kind of event a draw is for.
pub mod stream {
    /// Heartbeat delivery jitter.
    pub const HEARTBEAT: u64 = 1;
    /// Barrier arrival jitter.
    pub const BARRIER_ARRIVAL: u64 = 2;
    /// Per-hop link jitter of data messages.
    pub const LINK_HOP: u64 = 3;
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SimRng {
    /// A source with `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng { seed }
    }

    /// 64 random bits for the event named by `stream` and `key`.
    pub fn bits(&self, stream: u64, key: [u64; 2]) -> u64 {
        mix(mix(mix(self.seed ^ stream) ^ key[0]) ^ key[1])
    }

    /// Uniform in `0..=max` for the event (Lemire's multiply-shift; the bias
    /// is below 2^-32 for any `max` used here).
    pub fn up_to(&self, max: u64, stream: u64, key: [u64; 2]) -> u64 {
        match max {
            0 => 0,
            u64::MAX => self.bits(stream, key),
            _ => ((u128::from(self.bits(stream, key)) * u128::from(max + 1)) >> 64) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_pure_bounded_and_spread() {
        let rng = SimRng::new(7);
        let mut hits = [0u32; 11];
        for k in 0..11_000u64 {
            let x = rng.up_to(10, stream::HEARTBEAT, [k, 3]);
            assert_eq!(x, rng.up_to(10, stream::HEARTBEAT, [k, 3]));
            hits[x as usize] += 1;
        }
        // Every value appears, none dominates (expected 1000 each).
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
        assert_ne!(
            SimRng::new(1).bits(stream::HEARTBEAT, [0, 0]),
            SimRng::new(2).bits(stream::HEARTBEAT, [0, 0])
        );
        assert_ne!(
            rng.bits(stream::HEARTBEAT, [1, 0]),
            rng.bits(stream::LINK_HOP, [1, 0])
        );
        assert_eq!(rng.up_to(0, 1, [1, 1]), 0);
    }
}
