//! Host offload: what a step keeps in the host's memory instead of HBM,
//! and what moving it costs.
//!
//! - **Activations** a `custom` remat policy offloads
//!   ([`crate::model::Placement::Offload`], MaxText's
//!   `save_and_offload_only_these_names(…, offload_dst="pinned_host")`)
//!   are written over the chip's host link in the forward pass and read
//!   back in the backward, each layer's as its pass runs: the DMA runs
//!   beside the layer's matmuls, and only what outlasts them is exposed.
//! - **Optimizer state** (`optimizer_memory_host_offload`) and
//!   **parameters** (`parameter_memory_host_offload`) live on the host
//!   between steps: the update brings each device's shard in and writes it
//!   back, over the host link, on the step (nothing is left to hide it
//!   behind at the update).
//!
//! Every offloaded byte is also held in the host's DRAM: each host holds
//! its chips' (`chips_per_host`), which must fit ([`HostOffload::fits`]).

use serde::Serialize;

use crate::hardware::HardwareSpec;
use crate::model::{ModelConfig, activation_memory_per_layer, parameter_count};
use crate::sharding::strategy::StrategyMemory;
use crate::units::bytes as binary_bytes;

/// A step's host offload on one chip and its host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct HostOffload {
    /// Bytes of one layer's offloaded activations, each way.
    pub layer_activation_bytes: f64,
    /// Seconds those take over the host link, per layer and pass.
    pub layer_seconds: f64,
    /// Optimizer state held on the host per chip, bytes.
    pub state_bytes: u64,
    /// Parameters held on the host per chip, bytes.
    pub params_bytes: u64,
    /// Seconds the update spends bringing offloaded state and parameters
    /// in and writing them back.
    pub update_seconds: f64,
    /// What one host holds: every layer's offloaded activations, the
    /// state and the parameters, for each of its chips, bytes.
    pub host_bytes: u64,
    /// One host's memory, bytes.
    pub host_capacity: u64,
}

impl HostOffload {
    /// Whether the host holds it.
    pub fn fits(&self) -> bool {
        self.host_bytes <= self.host_capacity
    }

    /// What does not fit the host, and by how much.
    pub fn not_fitting(&self) -> Option<String> {
        (!self.fits()).then(|| {
            format!(
                "{} offloaded per host (activations, optimizer state and parameters of its \
                 chips) of the host's {}: {} over",
                binary_bytes(self.host_bytes),
                binary_bytes(self.host_capacity),
                binary_bytes(self.host_bytes - self.host_capacity)
            )
        })
    }
}

/// Seconds one layer's offloaded activations take over a chip's host link
/// of `spec`, each way (each pass).
pub fn layer_transfer_seconds(config: &ModelConfig, spec: &HardwareSpec) -> f64 {
    activation_memory_per_layer(config).host_bytes / spec.host_link_bytes_per_s
}

/// `config`'s offload on a chip of `spec` holding `memory`.
pub fn host_offload(
    config: &ModelConfig,
    spec: &HardwareSpec,
    memory: &StrategyMemory,
) -> HostOffload {
    let layers = parameter_count(config).layers;
    let layer_activation_bytes = activation_memory_per_layer(config).host_bytes;
    let link = spec.host_link_bytes_per_s;
    let state_bytes = if config.optimizer_memory_host_offload {
        memory.state
    } else {
        0
    };
    let params_bytes = if config.parameter_memory_host_offload {
        memory.params + memory.master
    } else {
        0
    };
    let moved = state_bytes.saturating_add(params_bytes) as f64;
    let per_chip = (layer_activation_bytes * layers as f64).ceil() as u64;
    let per_chip = per_chip
        .saturating_add(state_bytes)
        .saturating_add(params_bytes);
    HostOffload {
        layer_activation_bytes,
        layer_seconds: layer_transfer_seconds(config, spec),
        state_bytes,
        params_bytes,
        // In before the update, out after it.
        update_seconds: 2.0 * moved / link,
        host_bytes: per_chip.saturating_mul(u64::from(spec.chips_per_host())),
        host_capacity: spec.host_dram_bytes,
    }
}
