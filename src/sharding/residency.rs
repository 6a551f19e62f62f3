//! What a sharded model holds in each device's HBM under each
//! [`Strategy`], in closed form: the one figure the world's placement
//! ([`super::model::install_model`]), the step's transient reservations
//! ([`super::step`]) and the closed-form step model charge, byte for byte.
//!
//! Every allocation is a separate heap block, aligned as the heaps align
//! them ([`ALIGNMENT`], at least one byte each). Per device:
//!
//! | strategy | parameters | gradients (while a step is in flight) | gathered (in flight) |
//! |---|---|---|---|
//! | replicated | the replica | the whole model | — |
//! | zero2 | the replica | its shard of every bucket + the bucket being reduce-scattered | — |
//! | fsdp | its shard | its shard of every bucket + the bucket being reduce-scattered | `min(prefetch + 1, buckets)` bucket buffers |
//!
//! plus `slots` state shards, and under the redundant policy (more than one
//! device) a copy of the ring predecessor's state shards and, under fsdp,
//! of its parameter shard too (the only other place those values live).

use serde::Serialize;

use super::layout::ShardLayout;
use super::mesh::Strategy;
use crate::memory::ALIGNMENT;

/// The default number of buckets an fsdp step gathers ahead of the one in
/// use (PyTorch FSDP's forward prefetch of one bucket).
pub const DEFAULT_PREFETCH: usize = 1;

/// The most buckets an fsdp step may gather ahead of the one in use: far
/// beyond any useful prefetch (each gathered bucket is a bucket of HBM; one
/// or two is usual), and what keeps a schedule's state bounded whatever the
/// model's size.
pub const MAX_PREFETCH: usize = 4096;

/// `bytes` as a heap block holds them: at least 1, rounded up to
/// [`ALIGNMENT`].
pub fn aligned(bytes: usize) -> u64 {
    bytes.max(1).next_multiple_of(ALIGNMENT) as u64
}

/// The figures residency depends on, with no layout or world behind them
/// (so the closed-form model can build one for a 175e9-parameter model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResidencyInput {
    /// How the model is split.
    pub strategy: Strategy,
    /// Elements of the model (unpadded).
    pub elements: usize,
    /// Elements of one device's shard of every bucket
    /// ([`ShardLayout::shard_elements`]).
    pub shard_elements: usize,
    /// Elements of the largest padded bucket (the buffer a bucket in flight
    /// takes).
    pub bucket_elements: usize,
    /// Buckets in the model.
    pub buckets: usize,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Optimizer-state slots.
    pub slots: usize,
    /// Buckets an fsdp step gathers ahead of the one in use (0: each is
    /// gathered only when its use begins).
    pub prefetch: usize,
    /// Whether each device also holds its predecessor's copies (the
    /// redundant policy, on more than one device).
    pub redundant: bool,
}

impl ResidencyInput {
    /// The input for `layout` under `strategy`, with `slots` state slots,
    /// `prefetch` and whether the redundant policy is on (copies are held
    /// only when the layout has more than one device, as the world places
    /// them).
    pub fn of_layout(
        layout: &ShardLayout,
        strategy: Strategy,
        slots: usize,
        prefetch: usize,
        redundant_policy: bool,
    ) -> ResidencyInput {
        ResidencyInput {
            strategy,
            elements: layout.elements,
            shard_elements: layout.shard_elements(),
            bucket_elements: layout
                .buckets
                .iter()
                .map(|b| b.padded_len)
                .max()
                .unwrap_or(0),
            buckets: layout.buckets.len(),
            elem_bytes: layout.element_bytes(),
            slots,
            prefetch,
            redundant: redundant_policy && layout.devices() > 1,
        }
    }

    /// Bucket buffers an fsdp step holds gathered at once.
    pub fn gathered_buffers(&self) -> usize {
        match self.strategy {
            Strategy::Fsdp => self.prefetch.saturating_add(1).min(self.buckets.max(1)),
            Strategy::Replicated | Strategy::Zero2 => 0,
        }
    }
}

/// One device's HBM by what it holds, bytes (each allocation aligned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HbmByKind {
    /// Its parameters: the replica, or (fsdp) its shard.
    pub params: u64,
    /// The step's gradient buffers (while a step is in flight).
    pub grads: u64,
    /// Its optimizer-state shards.
    pub state: u64,
    /// The redundant copies it holds for its predecessor.
    pub redundant: u64,
    /// The gathered parameter buckets (fsdp, while a step is in flight).
    pub gathered: u64,
    /// All of it: the figure while a step is in flight.
    pub total: u64,
}

impl HbmByKind {
    /// What stays between steps: parameters, state and copies.
    pub fn resident(&self) -> u64 {
        self.params + self.state + self.redundant
    }
}

/// One device's HBM under `input` (module docs).
pub fn hbm_bytes_per_device(input: &ResidencyInput) -> HbmByKind {
    let e = input.elem_bytes;
    let shard = aligned(input.shard_elements * e);
    let state = input.slots as u64 * shard;
    let params = match input.strategy {
        Strategy::Replicated | Strategy::Zero2 => aligned(input.elements * e),
        Strategy::Fsdp => shard,
    };
    let redundant = if input.redundant {
        state
            + match input.strategy {
                Strategy::Fsdp => shard,
                Strategy::Replicated | Strategy::Zero2 => 0,
            }
    } else {
        0
    };
    let grads = step_buffers(input)
        .iter()
        .filter(|b| b.kind != StepBufferKind::Gathered)
        .map(|b| aligned(b.bytes))
        .sum();
    let gathered = input.gathered_buffers() as u64 * aligned(input.bucket_elements * e);
    HbmByKind {
        params,
        grads,
        state,
        redundant,
        gathered,
        total: params + grads + state + redundant + gathered,
    }
}

/// What one of a step's transient buffers holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepBufferKind {
    /// The whole model's gradient (replicated).
    Gradients,
    /// The device's reduced shard of every bucket's gradient.
    GradientShards,
    /// The bucket being reduce-scattered.
    BucketInFlight,
    /// A bucket's gathered parameters (fsdp).
    Gathered,
}

/// One transient buffer a step reserves on every device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBuffer {
    /// What it holds.
    pub kind: StepBufferKind,
    /// Bytes asked (the heap aligns them).
    pub bytes: usize,
}

impl StepBuffer {
    /// What asked, as an out-of-memory error names it.
    pub fn purpose(&self, step: u64) -> String {
        match self.kind {
            StepBufferKind::Gradients => format!("step {step}'s gradients"),
            StepBufferKind::GradientShards => format!("step {step}'s gradient shards"),
            StepBufferKind::BucketInFlight => {
                format!("step {step}'s gradient bucket being reduce-scattered")
            }
            StepBufferKind::Gathered => format!("step {step}'s gathered parameter bucket"),
        }
    }
}

/// The transient buffers a step reserves on each device, in reservation
/// order (module docs).
pub fn step_buffers(input: &ResidencyInput) -> Vec<StepBuffer> {
    let e = input.elem_bytes;
    let buffer = |kind, bytes| StepBuffer { kind, bytes };
    match input.strategy {
        Strategy::Replicated => vec![buffer(StepBufferKind::Gradients, input.elements * e)],
        Strategy::Zero2 | Strategy::Fsdp => {
            let mut buffers = vec![
                buffer(StepBufferKind::GradientShards, input.shard_elements * e),
                buffer(StepBufferKind::BucketInFlight, input.bucket_elements * e),
            ];
            buffers.extend(
                (0..input.gathered_buffers())
                    .map(|_| buffer(StepBufferKind::Gathered, input.bucket_elements * e)),
            );
            buffers
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(strategy: Strategy) -> ResidencyInput {
        ResidencyInput {
            strategy,
            elements: 1000,
            shard_elements: 128,
            bucket_elements: 512,
            buckets: 2,
            elem_bytes: 4,
            slots: 2,
            prefetch: 1,
            redundant: false,
        }
    }

    #[test]
    fn replicated_is_the_closed_form_of_today() {
        // 2·align(elements·e) + slots·align(shard·e): 4032 + 2·512.
        let r = hbm_bytes_per_device(&input(Strategy::Replicated));
        assert_eq!(r.params, 4032);
        assert_eq!(r.grads, 4032);
        assert_eq!(r.state, 1024);
        assert_eq!(r.total, 2 * 4032 + 1024);
        let redundant = hbm_bytes_per_device(&ResidencyInput {
            redundant: true,
            ..input(Strategy::Replicated)
        });
        assert_eq!(redundant.total, 2 * 4032 + 2 * 1024);
    }

    #[test]
    fn zero2_and_fsdp_hold_shards_and_buckets_in_flight() {
        let z = hbm_bytes_per_device(&input(Strategy::Zero2));
        assert_eq!((z.params, z.grads, z.gathered), (4032, 512 + 2048, 0));
        let f = hbm_bytes_per_device(&input(Strategy::Fsdp));
        assert_eq!((f.params, f.grads, f.gathered), (512, 512 + 2048, 2 * 2048));
        assert_eq!(f.resident(), 512 + 1024);
        // prefetch 0: only the bucket in use; more than the model's buckets
        // never gathers more than it has.
        for (prefetch, buffers) in [(0, 1), (1, 2), (5, 2)] {
            let i = ResidencyInput {
                prefetch,
                ..input(Strategy::Fsdp)
            };
            assert_eq!(i.gathered_buffers(), buffers);
            assert_eq!(hbm_bytes_per_device(&i).gathered, buffers as u64 * 2048);
        }
        // Redundant fsdp copies the parameter shard with the state.
        let fr = hbm_bytes_per_device(&ResidencyInput {
            redundant: true,
            ..input(Strategy::Fsdp)
        });
        assert_eq!(fr.redundant, 1024 + 512);
    }
}
