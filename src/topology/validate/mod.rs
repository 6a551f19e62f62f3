//! A parsed [`PodFile`] → a validated [`Topology`].
//!
//! Validation checks, in this order: name, generation, shape, slices,
//! offered shape (or `custom`), wraparound, twist, host block, cores, link
//! figures, cubes, tick and heartbeat (each within its documented range, the
//! interval at least one tick, the timeout longer than the interval plus the
//! control latency), explicit links, connectivity. The first
//! violation is returned with the field it belongs to; no input panics.

mod fields;
mod links;

pub use fields::{parse_shape, twist_offsets};

use super::cubes::resolve_cubes;
use super::error::{Problem, TopologyError};
use super::model::{
    DEFAULT_HEARTBEAT_INTERVAL_NS, DEFAULT_HEARTBEAT_TIMEOUT_NS, DEFAULT_TICK_NS, DcnFabric,
    LinkParams, MAX_FABRIC_LINKS, MAX_HEARTBEAT_INTERVAL_NS, MAX_HEARTBEAT_TIMEOUT_NS,
    MAX_POD_CHIPS, MAX_TICK_NS, MIN_TICK_NS, Topology,
};
use super::parse::line_of_field;
use super::schema::PodFile;
use crate::hardware::{HardwareSpec, TpuGeneration};
use fields::{
    link_params, millis_to_ns, override_params, resolve_fabric, resolve_host_bounds,
    resolve_wraparound,
};
use links::{check_connected, resolve_extra_links};

/// A validation step's result: the problem and the field it belongs to.
type Check<T> = Result<T, (String, Problem)>;

fn invalid(field: impl Into<String>, problem: Problem) -> (String, Problem) {
    (field.into(), problem)
}

fn bad_number(value: impl ToString, requirement: &'static str) -> Problem {
    Problem::BadNumber {
        value: value.to_string(),
        requirement,
    }
}

/// Validates a parsed pod file. `text` is used only to find line numbers.
pub fn resolve(file: &PodFile, text: &str, origin: &str) -> Result<Topology, TopologyError> {
    resolve_fields(file).map_err(|(field, problem)| TopologyError::Invalid {
        origin: origin.to_string(),
        line: line_of_field(text, &field),
        field,
        problem: Box::new(problem),
    })
}

/// The torus of one slice as written: its dimensions, how many were
/// written, and the slice count.
struct Shape {
    dims: [u32; 3],
    ndims: usize,
    slices: u32,
}

/// Link figures: the torus's, the explicit links' default, the fabric.
struct LinkFiguresResolved {
    ici: LinkParams,
    dcn: LinkParams,
    dcn_fabric: Option<DcnFabric>,
}

/// The simulated clock and the heartbeat detector's figures, ns.
struct Timing {
    tick_ns: u64,
    heartbeat_interval_ns: u64,
    heartbeat_timeout_ns: u64,
}

fn resolve_fields(file: &PodFile) -> Check<Topology> {
    // Reports, figures and checkpoints name the pod; a blank name names nothing.
    if file.name.trim().is_empty() {
        return Err(invalid("name", Problem::EmptyName));
    }
    let generation: TpuGeneration = file.generation.parse().map_err(|_| {
        invalid(
            "generation",
            Problem::UnknownGeneration(file.generation.clone()),
        )
    })?;
    let spec = generation.spec();
    let Shape {
        dims,
        ndims,
        slices,
    } = resolve_shape(file, spec)?;
    let warnings = offered_shape_warnings(file, spec, dims, ndims)?;
    let wraparound = resolve_wraparound(file.wraparound.as_deref(), dims, ndims, spec)?;
    let twist = twist_offsets(file.twist.as_deref(), &file.shape, dims, wraparound, spec)?;
    let host_bounds = resolve_host_bounds(file.chips_per_host.as_deref(), dims, ndims, spec)?;
    let cores_per_chip = file.cores_per_chip.unwrap_or(spec.cores_per_chip);
    if !(1..=8).contains(&cores_per_chip) {
        return Err(invalid(
            "cores_per_chip",
            bad_number(cores_per_chip, "between 1 and 8"),
        ));
    }
    let LinkFiguresResolved {
        ici,
        dcn,
        dcn_fabric,
    } = resolve_link_figures(file, slices, spec)?;
    let cubes = resolve_cubes(file.cubes.as_ref(), spec, &file.shape, dims, slices)?;
    let Timing {
        tick_ns,
        heartbeat_interval_ns,
        heartbeat_timeout_ns,
    } = resolve_timing(file, dcn)?;
    let mut topology = Topology {
        name: file.name.clone(),
        description: file.description.clone().unwrap_or_default(),
        generation,
        dims,
        ndims,
        slices,
        wraparound,
        twist,
        host_bounds,
        cores_per_chip,
        hbm_bytes: spec.hbm_bytes,
        ici,
        dcn,
        dcn_fabric,
        extra_links: Vec::new(),
        cubes,
        heartbeat_interval_ns,
        heartbeat_timeout_ns,
        tick_ns,
        warnings,
    };
    check_fabric_size(&topology)?;
    topology.extra_links = resolve_extra_links(&topology, &file.extra_links)?;
    check_connected(&topology)?;
    Ok(topology)
}

/// The shape (its dimension count the generation's), the slices (at least
/// one) and the pod's chips (at most [`MAX_POD_CHIPS`]).
fn resolve_shape(file: &PodFile, spec: &HardwareSpec) -> Check<Shape> {
    let (dims, ndims) = parse_shape(&file.shape).map_err(|p| invalid("shape", p))?;
    if ndims != spec.torus_dims {
        return Err(invalid(
            "shape",
            Problem::WrongDimensionCount {
                generation: spec.name.to_string(),
                expected: spec.torus_dims,
                got: ndims,
                text: file.shape.clone(),
            },
        ));
    }
    let slices = file.slices.unwrap_or(1);
    if slices == 0 {
        return Err(invalid("slices", bad_number(0, "at least 1")));
    }
    let chips = dims.iter().fold(u64::from(slices), |acc, &d| {
        acc.saturating_mul(u64::from(d))
    });
    if chips > MAX_POD_CHIPS {
        // The field that takes it over the cap: the slice count when one
        // slice fits.
        let one_slice = chips / u64::from(slices);
        return Err(invalid(
            if slices > 1 && one_slice <= MAX_POD_CHIPS {
                "slices"
            } else {
                "shape"
            },
            Problem::TooManyChips {
                chips,
                max: MAX_POD_CHIPS,
            },
        ));
    }
    Ok(Shape {
        dims,
        ndims,
        slices,
    })
}

/// Refuses a shape Google Cloud does not offer unless `custom: true`; the
/// warnings a custom shape (or a needless `custom`) is accepted with.
fn offered_shape_warnings(
    file: &PodFile,
    spec: &HardwareSpec,
    dims: [u32; 3],
    ndims: usize,
) -> Check<Vec<String>> {
    let mut warnings = Vec::new();
    let offered = spec.slice_shapes.offers(dims);
    match (offered, file.custom.unwrap_or(false)) {
        (false, false) => {
            return Err(invalid(
                "shape",
                Problem::ShapeNotOffered {
                    generation: spec.name.to_string(),
                    shape: file.shape.clone(),
                    offered: spec.slice_shapes.describe(ndims),
                },
            ));
        }
        (false, true) => warnings.push(format!(
            "shape `{}` is not a slice shape Google Cloud offers for {} (offered: {}); \
             loaded because `custom: true`",
            file.shape,
            spec.name,
            spec.slice_shapes.describe(ndims)
        )),
        (true, true) => warnings.push(format!(
            "`custom: true` changes nothing: `{}` is an offered {} shape",
            file.shape, spec.name
        )),
        (true, false) => {}
    }
    Ok(warnings)
}

/// The ICI and DCN figures (defaults from the generation) and the fabric.
fn resolve_link_figures(
    file: &PodFile,
    slices: u32,
    spec: &HardwareSpec,
) -> Check<LinkFiguresResolved> {
    let ici_default = LinkParams {
        bytes_per_s: spec.ici_bytes_per_s,
        latency_ns: spec.ici_latency_ns,
    };
    let dcn_default = LinkParams {
        bytes_per_s: spec.dcn_bytes_per_s,
        latency_ns: spec.dcn_latency_ns,
    };
    let ici = link_params(file.ici.as_ref(), ici_default, "ici")?;
    let dcn_file = file.dcn.clone().unwrap_or_default();
    let dcn = override_params(
        dcn_default,
        dcn_file.bandwidth_gb_per_s,
        dcn_file.latency_us,
        "dcn.",
    )?;
    let dcn_fabric = resolve_fabric(&dcn_file, slices, spec)?;
    Ok(LinkFiguresResolved {
        ici,
        dcn,
        dcn_fabric,
    })
}

/// The tick and the heartbeat figures, each within its range, the interval
/// at least one tick and the timeout room for the interval plus the control
/// latency (`dcn`'s).
fn resolve_timing(file: &PodFile, dcn: LinkParams) -> Check<Timing> {
    let heartbeat = file.heartbeat.clone().unwrap_or_default();
    let tick_ns = millis_to_ns(
        file.tick_ms,
        DEFAULT_TICK_NS,
        "tick_ms",
        (MIN_TICK_NS, MAX_TICK_NS),
        "between 0.001 and 60000 ms",
    )?;
    let heartbeat_interval_ns = millis_to_ns(
        heartbeat.interval_ms,
        DEFAULT_HEARTBEAT_INTERVAL_NS,
        "heartbeat.interval_ms",
        (1, MAX_HEARTBEAT_INTERVAL_NS),
        "at most 3600000 ms (one hour)",
    )?;
    let heartbeat_timeout_ns = millis_to_ns(
        heartbeat.timeout_ms,
        DEFAULT_HEARTBEAT_TIMEOUT_NS,
        "heartbeat.timeout_ms",
        (1, MAX_HEARTBEAT_TIMEOUT_NS),
        "at most 86400000 ms (one day)",
    )?;
    if heartbeat_interval_ns < tick_ns {
        // Name the figure that was written (both may be defaults' partners).
        let field = if heartbeat.interval_ms.is_some() {
            "heartbeat.interval_ms"
        } else {
            "tick_ms"
        };
        return Err(invalid(
            field,
            Problem::IntervalShorterThanTick {
                interval_ms: heartbeat_interval_ns as f64 / 1e6,
                tick_ms: tick_ns as f64 / 1e6,
            },
        ));
    }
    if heartbeat_timeout_ns <= heartbeat_interval_ns {
        return Err(invalid(
            "heartbeat.timeout_ms",
            Problem::TimeoutNotAfterInterval {
                interval_ms: heartbeat_interval_ns as f64 / 1e6,
                timeout_ms: heartbeat_timeout_ns as f64 / 1e6,
            },
        ));
    }
    // The detector's guarantee (see `crate::health`): a running device whose
    // heartbeats take the control latency plus its jitter is never failed
    // while latency + jitter + interval <= timeout. The pod starts with no
    // jitter, so the control latency alone must leave that room.
    let control_latency_ns = dcn.latency_ns;
    if control_latency_ns.saturating_add(heartbeat_interval_ns) > heartbeat_timeout_ns {
        let field = if file.dcn.as_ref().is_some_and(|d| d.latency_us.is_some()) {
            "dcn.latency_us"
        } else {
            "heartbeat.timeout_ms"
        };
        return Err(invalid(
            field,
            Problem::ControlLatencyExceedsTimeout {
                latency_ms: control_latency_ns as f64 / 1e6,
                interval_ms: heartbeat_interval_ns as f64 / 1e6,
                timeout_ms: heartbeat_timeout_ns as f64 / 1e6,
            },
        ));
    }
    Ok(Timing {
        tick_ns,
        heartbeat_interval_ns,
        heartbeat_timeout_ns,
    })
}

/// Refuses a fabric of more than [`MAX_FABRIC_LINKS`] links.
fn check_fabric_size(topology: &Topology) -> Check<()> {
    let slices = topology.slices;
    let fabric_links = topology.fabric_link_count();
    if fabric_links > MAX_FABRIC_LINKS {
        return Err(invalid(
            "slices",
            Problem::NoFabric {
                reason: format!(
                    "{slices} slices of {} hosts need {fabric_links} DCN fabric links (every host \
                     to its twin in each other slice), more than {MAX_FABRIC_LINKS}; use fewer, \
                     larger slices, or `dcn: (fabric: false)` and `extra_links`",
                    topology.num_hosts() / slices
                ),
            },
        ));
    }
    Ok(())
}
