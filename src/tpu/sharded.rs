//! The seed's path to the sharded optimizer, which lives in
//! [`crate::training`]: [`ShardedOptimizer`] and what it returns, and its
//! constructors that take a [`TPUConfig`] repeating the pod's devices
//! (deprecated for [`ShardedOptimizer::on_pod`], which reads them from the
//! pod).

use ndarray::IxDyn;

use crate::error::{OptimError, Result};
use crate::exec::runtime::Element;
use crate::optimizers::{FloatElement, Optimizer};
use crate::pod::Pod;
use crate::pod::ranks::RankedPod;
use crate::sharding::ParamSet;
use crate::topology::Topology;

pub use crate::training::{
    CheckpointWrite, Resumed, ShardedOptimizer, ShardedStepReport, ShardingConfig, WriteOutcome,
    compile_update, participants,
};

use super::TPUConfig;

/// Refuses a configuration that does not name every chip of `topology`
/// in its generation: a sharded model spans the whole pod.
fn check_config(config: &TPUConfig, topology: &Topology) -> Result<()> {
    let chips = config.validate()?;
    if topology.generation != config.tpu_version {
        return Err(OptimError::invalid_config(format!(
            "the optimizer is configured for {}, but {} is a {} pod",
            config.tpu_version, topology.name, topology.generation
        )));
    }
    let devices = topology.num_devices() as usize;
    if chips != devices {
        let per_chip = config.tpu_version.spec().cores_per_chip as usize;
        return Err(OptimError::invalid_config(format!(
            "num_cores = {} names {chips} chips, but a sharded model spans every chip of \
             {} ({devices} chips): use num_cores = {}",
            config.num_cores,
            topology.name,
            devices * per_chip
        )));
    }
    Ok(())
}

/// `sharding` with the configuration's HBM, if it sets one.
fn with_hbm(config: &TPUConfig, sharding: ShardingConfig) -> ShardingConfig {
    ShardingConfig {
        hbm_bytes: config.hbm_bytes.or(sharding.hbm_bytes),
        ..sharding
    }
}

impl<O, A> ShardedOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// [`ShardedOptimizer::on_pod`] with a configuration that repeats the
    /// pod: `config.num_cores` must name all the pod's chips and
    /// `config.tpu_version` its generation; `config.hbm_bytes`, if set,
    /// becomes every device's HBM.
    #[deprecated(
        since = "0.2.0",
        note = "the devices come from the pod: use `ShardedOptimizer::on_pod` (HBM override in `ShardingConfig::hbm_bytes`)"
    )]
    pub fn new(
        base: O,
        config: TPUConfig,
        pod: Pod,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        Self::with_config(base, config, pod, params, sharding)
    }

    /// [`ShardedOptimizer::on_ranked_pod`] with a configuration that
    /// repeats the pod, checked as [`ShardedOptimizer::new`] checks it.
    #[deprecated(
        since = "0.2.0",
        note = "the devices come from the pod: use `ShardedOptimizer::on_ranked_pod` (HBM override in `ShardingConfig::hbm_bytes`)"
    )]
    pub fn new_ranked(
        base: O,
        config: TPUConfig,
        pod: RankedPod,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        check_config(&config, pod.pod().topology())?;
        Self::on_ranked_pod(base, pod, params, with_hbm(&config, sharding))
    }

    /// The configuration checked against the pod, then
    /// [`ShardedOptimizer::on_pod`] (what [`super::TPUOptimizer::into_sharded`]
    /// builds).
    pub(crate) fn with_config(
        base: O,
        config: TPUConfig,
        pod: Pod,
        params: ParamSet<A>,
        sharding: ShardingConfig,
    ) -> Result<Self> {
        check_config(&config, pod.topology())?;
        Self::on_pod(base, pod, params, with_hbm(&config, sharding))
    }
}
