//! [`TPUConfig`]: what a [`super::TPUOptimizer`] runs on (generation, cores,
//! HBM, cache size) and its check against the generation's figures, kept
//! apart from the optimizer so the configuration reads on its own.

use crate::error::{OptimError, Result};
use crate::hardware::TpuGeneration;

/// The TPU generation of a [`TPUConfig`] (the crate's [`TpuGeneration`]).
pub type TPUVersion = TpuGeneration;

/// Programs kept compiled by default.
pub const DEFAULT_CACHE_CAPACITY: usize = 16;

/// What a [`TPUOptimizer`](super::TPUOptimizer) runs on.
#[derive(Debug, Clone, PartialEq)]
pub struct TPUConfig {
    /// Chip generation.
    pub tpu_version: TPUVersion,
    /// TensorCores: a positive multiple of the generation's cores per chip,
    /// at most its largest pod.
    pub num_cores: usize,
    /// HBM per chip in bytes; `None` takes the generation's figure.
    pub hbm_bytes: Option<u64>,
    /// Compiled programs kept (least recently used evicted first), ≥ 1.
    pub cache_capacity: usize,
}

impl Default for TPUConfig {
    fn default() -> Self {
        TPUConfig {
            tpu_version: TPUVersion::V4,
            num_cores: 8,
            hbm_bytes: None,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        }
    }
}

impl TPUConfig {
    /// The configuration that names every chip of `topology` in its
    /// generation (what [`ShardedOptimizer`](super::ShardedOptimizer)
    /// needs), with the generation's HBM and the default cache.
    pub fn for_pod(topology: &crate::topology::Topology) -> TPUConfig {
        TPUConfig {
            tpu_version: topology.generation,
            num_cores: topology.num_devices() as usize
                * topology.generation.spec().cores_per_chip as usize,
            ..Default::default()
        }
    }

    /// Checks the configuration against the generation's figures; returns
    /// the number of chips.
    pub fn validate(&self) -> Result<usize> {
        let spec = self.tpu_version.spec();
        let per_chip = spec.cores_per_chip as usize;
        let invalid = |m: String| Err(OptimError::invalid_config(m));
        if self.num_cores == 0 {
            return invalid("num_cores is 0; a TPU optimizer needs at least one core".into());
        }
        if !self.num_cores.is_multiple_of(per_chip) {
            return invalid(format!(
                "num_cores = {} is not a multiple of {per_chip}, the TensorCores per {} chip; \
                 use {} or {}",
                self.num_cores,
                spec.name,
                self.num_cores / per_chip * per_chip.max(1),
                self.num_cores.next_multiple_of(per_chip)
            ));
        }
        let chips = self.num_cores / per_chip;
        if chips > spec.max_pod_chips as usize {
            return invalid(format!(
                "num_cores = {} needs {chips} {} chips, but the largest {} pod has {} chips ({} cores)",
                self.num_cores,
                spec.name,
                spec.name,
                spec.max_pod_chips,
                spec.max_pod_chips as usize * per_chip
            ));
        }
        if self.hbm_bytes == Some(0) {
            return invalid("hbm_bytes is 0; leave it None for the generation's HBM".into());
        }
        if self.cache_capacity == 0 {
            return invalid("cache_capacity is 0; at least one compiled program must fit".into());
        }
        Ok(chips)
    }
}
