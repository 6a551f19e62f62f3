//! The pod's topology: RON pod files, presets, validation, the device, host
//! and link entities, and figures derived from them.
//!
//! The schema is documented in [`schema`] and in `docs/topology.md`.
//! Loading goes text → [`PodFile`] (syntax errors carry file, line, column and
//! field) → [`Topology`] (semantic errors name the field) → entities
//! ([`spawn_topology`]).

pub mod components;
pub mod cubes;
pub mod dot;
pub mod error;
pub mod figures;
mod invariants;
pub mod model;
pub mod parse;
pub mod presets;
pub mod resolve;
pub mod schema;
pub mod spawn;
pub mod validate;

pub use components::*;
pub use cubes::{Cube, CubeLayout, CubeRole, InCube, Ocs, OcsCircuit};
pub use dot::to_dot;
pub use error::{InvariantError, Problem, TopologyError};
pub use figures::{CubeFigures, TopologyFigures, compute_figures};
pub use presets::{
    CloudType, DEFAULT_PRESET, PRESETS, RENAMED, cloud_type, cloud_types, preset_names, preset_text,
};
pub use resolve::{LinkParams, LinkSpec, Topology, parse_pod_file, parse_topology, resolve};
pub use schema::{LinkKind, PodFile};
pub use spawn::spawn_topology;

use std::path::Path;

/// The largest pod file read: an explicit link list of a 4,096-chip pod is
/// about a megabyte.
pub const MAX_POD_FILE_BYTES: u64 = 16 << 20;

/// Reads and validates a pod file: a regular file of at most
/// [`MAX_POD_FILE_BYTES`] (a named pipe or a device is refused unopened).
pub fn load_topology_file(path: &Path) -> Result<Topology, TopologyError> {
    let text = crate::files::read_text(path, MAX_POD_FILE_BYTES, "a pod file")
        .map_err(TopologyError::Read)?;
    parse_topology(&text, &path.display().to_string())
}

/// Validates a preset (a Cloud accelerator type) by name.
pub fn load_preset(name: &str) -> Result<Topology, TopologyError> {
    let text = preset_text(name).ok_or_else(|| unknown_pod(name))?;
    parse_topology(&text, &format!("preset {name}"))
}

/// Loads `spec` as a preset name, or else as a path to a pod file.
pub fn load_topology(spec: &str) -> Result<Topology, TopologyError> {
    if preset_text(spec).is_some() {
        return load_preset(spec);
    }
    let path = Path::new(spec);
    if path.exists() {
        return load_topology_file(path);
    }
    Err(unknown_pod(spec))
}

/// No preset and no file is named `name`: a name of a Cloud family's form
/// that Cloud does not sell is refused with the Cloud name to use; any
/// other with the presets and the nearest.
fn unknown_pod(name: &str) -> TopologyError {
    if let Some((hint, near)) = presets::not_a_cloud_size(name) {
        return TopologyError::NotCloudType {
            name: name.to_string(),
            hint,
            near,
        };
    }
    TopologyError::UnknownPod {
        name: name.to_string(),
        known: preset_names(),
        near: crate::error::nearest_name(name, presets::all_names()).map(str::to_string),
    }
}
