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
/// of step `step` is a uniform value in `[-scale, scale)` from a
/// SplitMix64 hash of `(seed, step, r, i)`. Any element of any replica is
/// made on demand, so nothing is stored.
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
    /// The value at `(replica, index)`.
    pub fn value(&self, replica: usize, index: usize) -> f64 {
        let key = self.seed
            ^ self.step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (replica as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        let bits = splitmix64(key.wrapping_add((index as u64).wrapping_mul(0x1656_67B1_9E37_79F9)));
        // 53 random bits → [0, 1), then to [-scale, scale).
        let unit = (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        (2.0 * unit - 1.0) * self.scale
    }
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
        for (k, v) in out.iter_mut().enumerate() {
            *v = A::from_f64_rounded(self.value(replica, offset + k));
        }
    }
}
