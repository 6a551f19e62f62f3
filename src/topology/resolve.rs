//! From pod file text to a validated [`Topology`]: the paths this crate has
//! always offered, over [`super::parse`] (text → [`PodFile`](super::PodFile))
//! and [`super::validate`] (`PodFile` → `Topology`).

pub use super::model::{
    DEFAULT_HEARTBEAT_INTERVAL_NS, DEFAULT_HEARTBEAT_TIMEOUT_NS, DEFAULT_TICK_NS, DcnFabric,
    LinkParams, LinkSpec, MAX_FABRIC_LINKS, MAX_HEARTBEAT_INTERVAL_NS, MAX_HEARTBEAT_TIMEOUT_NS,
    MAX_POD_CHIPS, MAX_TICK_NS, MIN_TICK_NS, Topology,
};
pub use super::parse::{parse_pod_file, parse_topology};
pub use super::validate::{parse_shape, resolve, twist_offsets};
