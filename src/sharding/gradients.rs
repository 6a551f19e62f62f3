//! Where a step's per-replica gradients come from: the host's
//! ([`ReplicaGradients`], one [`ParamSet`] per replica) or a seeded
//! generator ([`SyntheticGradients`]) that makes any replica's value at
//! any element on demand, so a step over `n` replicas never holds `n`
//! gradient copies.

use super::error::ShardingError;
use super::layout::ShardLayout;
use super::params::ParamSet;
use crate::ir::FloatElement;

/// Per-replica gradients of a model, read piece by piece.
pub trait GradientSource<A>: Sync {
    /// Replicas the source has gradients for.
    fn replicas(&self) -> usize;

    /// Checks the source against the model before any work: replica count,
    /// tensor names and shapes.
    fn check(&self, layout: &ShardLayout) -> Result<(), ShardingError> {
        if self.replicas() != layout.devices() {
            return Err(ShardingError::ReplicaCount {
                expected: layout.devices(),
                got: self.replicas(),
            });
        }
        Ok(())
    }

    /// Writes replica `replica`'s gradient for the flat model elements
    /// `offset..offset + out.len()` (all inside the model) into `out`.
    fn fill(&self, replica: usize, offset: usize, out: &mut [A]);

    /// Whether [`GradientSource::fill`] already gives the reduced gradient
    /// (the same for every replica): the step then has nothing to reduce
    /// on the data, and models and charges the collectives as the pod runs
    /// them.
    fn is_reduced(&self) -> bool {
        false
    }
}

/// A gradient the host has already reduced over the replicas (for instance
/// the gradient of the loss over the global batch): every replica's
/// reduce-scatter result. The step still models the reduce-scatter and
/// charges its links as the pod would run it on per-replica gradients;
/// only the arithmetic over replicas, which has no data here, is skipped.
#[derive(Debug, Clone, Copy)]
pub struct ReducedGradients<'a, A>(pub &'a ParamSet<A>);

impl<A: FloatElement> GradientSource<A> for ReducedGradients<'_, A> {
    fn replicas(&self) -> usize {
        0
    }

    fn check(&self, layout: &ShardLayout) -> Result<(), ShardingError> {
        check_shapes(0, self.0, layout)
    }

    fn fill(&self, _replica: usize, offset: usize, out: &mut [A]) {
        copy_flat(self.0, offset, out);
    }

    fn is_reduced(&self) -> bool {
        true
    }
}

/// One host-computed [`ParamSet`] of gradients per replica, in replica
/// (device id) order.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaGradients<'a, A>(pub &'a [ParamSet<A>]);

impl<A: FloatElement> GradientSource<A> for ReplicaGradients<'_, A> {
    fn replicas(&self) -> usize {
        self.0.len()
    }

    fn check(&self, layout: &ShardLayout) -> Result<(), ShardingError> {
        if self.0.len() != layout.devices() {
            return Err(ShardingError::ReplicaCount {
                expected: layout.devices(),
                got: self.0.len(),
            });
        }
        for (replica, grads) in self.0.iter().enumerate() {
            check_shapes(replica, grads, layout)?;
        }
        Ok(())
    }

    fn fill(&self, replica: usize, offset: usize, out: &mut [A]) {
        copy_flat(&self.0[replica], offset, out);
    }
}

/// Checks that `grads` has the model's tensors, names and shapes, in order.
pub fn check_shapes<A: FloatElement>(
    replica: usize,
    grads: &ParamSet<A>,
    layout: &ShardLayout,
) -> Result<(), ShardingError> {
    let mismatch = |reason: String| ShardingError::GradientMismatch { replica, reason };
    if grads.len() != layout.tensors.len() {
        return Err(mismatch(format!(
            "{} tensors, but the model has {}",
            grads.len(),
            layout.tensors.len()
        )));
    }
    if A::DTYPE != layout.dtype {
        return Err(mismatch(format!(
            "{} values, but the model holds {}",
            A::DTYPE,
            layout.dtype
        )));
    }
    for ((name, tensor), spec) in grads.iter().zip(&layout.tensors) {
        if name != spec.name {
            return Err(mismatch(format!(
                "tensor `{name}` where the model has `{}` (gradients follow the model's order)",
                spec.name
            )));
        }
        if tensor.shape() != spec.shape.as_slice() {
            return Err(mismatch(format!(
                "tensor `{name}` has shape {:?}, but the parameter has shape {:?}",
                tensor.shape(),
                spec.shape
            )));
        }
    }
    Ok(())
}

/// Copies flat elements `offset..offset + out.len()` of `set` into `out`.
pub(crate) fn copy_flat<A: FloatElement>(set: &ParamSet<A>, offset: usize, out: &mut [A]) {
    let mut at = 0usize;
    let mut written = 0usize;
    for slice in set.slices() {
        let end = at + slice.len();
        let want = offset + written;
        if written < out.len() && want < end {
            let from = want - at;
            let take = (slice.len() - from).min(out.len() - written);
            out[written..written + take].copy_from_slice(&slice[from..from + take]);
            written += take;
        }
        at = end;
        if written == out.len() {
            break;
        }
    }
}

/// Seeded synthetic gradients: replica `r`'s gradient at flat element `i`
/// of step `step` is a uniform value in `[-scale, scale)` (24 random bits)
/// from a 32-bit integer hash of `(seed, step, r, i)` (Wellons'
/// `lowbias32` over a SplitMix64-mixed key). Any element of any replica is
/// made on demand, so nothing is stored; the loop vectorizes, so making a
/// replica's gradient costs about as much as reading one from memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyntheticGradients {
    /// The seed.
    pub seed: u64,
    /// The step the gradients are for.
    pub step: u64,
    /// Replicas.
    pub replicas: usize,
    /// Half-width of the range.
    pub scale: f64,
}

impl SyntheticGradients {
    /// The 32-bit key of `(replica, index >> 32)`.
    fn key(&self, replica: usize, high: u64) -> u32 {
        let k = splitmix64(
            self.seed
                ^ self.step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ (replica as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
                ^ high.wrapping_mul(0x1656_67B1_9E37_79F9),
        );
        (k ^ (k >> 32)) as u32
    }

    /// The value at `(replica, index)`.
    pub fn value(&self, replica: usize, index: usize) -> f64 {
        let key = self.key(replica, (index as u64) >> 32);
        self.unit(lowbias32(key ^ (index as u32).wrapping_mul(0x9E37_79B9)))
    }

    fn unit(&self, h: u32) -> f64 {
        let u = f64::from(h >> 8) * (1.0 / (1u32 << 24) as f64);
        (2.0 * u - 1.0) * self.scale
    }
}

/// Fills `out` with the values of indices `low, low + 1, …` under `key`,
/// with the widest vectors this CPU has (the same bits either way: the
/// arithmetic is integer, exact conversions and one rounded product).
fn fill_run<A: FloatElement>(key: u32, low: u32, scale: f64, out: &mut [A]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected on this CPU.
        unsafe { fill_run_avx2(key, low, scale, out) };
        return;
    }
    fill_run_portable(key, low, scale, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fill_run_avx2<A: FloatElement>(key: u32, low: u32, scale: f64, out: &mut [A]) {
    fill_run_portable(key, low, scale, out);
}

#[inline(always)]
fn fill_run_portable<A: FloatElement>(key: u32, low: u32, scale: f64, out: &mut [A]) {
    for (k, v) in out.iter_mut().enumerate() {
        let h = lowbias32(key ^ low.wrapping_add(k as u32).wrapping_mul(0x9E37_79B9));
        let u = f64::from(h >> 8) * (1.0 / (1u32 << 24) as f64);
        *v = A::from_f64_rounded((2.0 * u - 1.0) * scale);
    }
}

#[inline(always)]
fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl<A: FloatElement> GradientSource<A> for SyntheticGradients {
    fn replicas(&self) -> usize {
        self.replicas
    }

    fn fill(&self, replica: usize, offset: usize, out: &mut [A]) {
        let mut at = 0;
        while at < out.len() {
            // A run within one 2^32-element block shares its key.
            let index = offset + at;
            let block_end = ((index as u64 >> 32) + 1) << 32;
            let run = ((block_end - index as u64) as usize).min(out.len() - at);
            let key = self.key(replica, index as u64 >> 32);
            fill_run(key, index as u32, self.scale, &mut out[at..at + run]);
            at += run;
        }
    }
}
