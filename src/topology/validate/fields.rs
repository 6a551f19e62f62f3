//! Validation of single fields and figures: shapes, wraparound, twist,
//! host blocks, the DCN fabric, and numbers within their ranges.

use super::{Check, bad_number, invalid};
use crate::hardware::{HardwareSpec, WraparoundRule, twisted_torus_edge};
use crate::topology::error::Problem;
use crate::topology::model::{DcnFabric, LinkParams};
use crate::topology::schema::{DcnFigures, LinkFigures};

/// Parses `AxB` or `AxBxC`; unused trailing axes become 1.
pub fn parse_shape(text: &str) -> Result<([u32; 3], usize), Problem> {
    let malformed = |reason: String| Problem::MalformedShape {
        text: text.to_string(),
        reason,
    };
    let parts: Vec<&str> = text.trim().split(['x', 'X']).collect();
    if parts.len() > 3 {
        return Err(malformed(format!("{} dimensions; at most 3", parts.len())));
    }
    let mut dims = [1u32; 3];
    for (axis, part) in parts.iter().enumerate() {
        let part = part.trim();
        dims[axis] = part
            .parse::<u32>()
            .map_err(|_| malformed(format!("`{part}` is not a whole number")))?;
        if dims[axis] == 0 {
            return Err(Problem::ZeroDimension {
                text: text.to_string(),
                axis,
            });
        }
    }
    Ok((dims, parts.len()))
}

pub(super) fn resolve_wraparound(
    given: Option<&[bool]>,
    dims: [u32; 3],
    ndims: usize,
    spec: &HardwareSpec,
) -> Check<[bool; 3]> {
    let Some(given) = given else {
        return Ok([0, 1, 2].map(|axis| axis < ndims && spec.can_wrap(dims[axis])));
    };
    if given.len() != ndims {
        return Err(invalid(
            "wraparound",
            Problem::WrongLength {
                expected: ndims,
                got: given.len(),
            },
        ));
    }
    let mut wraparound = [false; 3];
    for (axis, &wrap) in given.iter().enumerate() {
        if wrap && !spec.can_wrap(dims[axis]) {
            let rule = match spec.wraparound {
                WraparoundRule::MultipleOf(k) => {
                    format!("only dimensions that are a multiple of {k} can wrap")
                }
                WraparoundRule::OnlySize(k) => {
                    format!("only a dimension of exactly {k} chips can wrap")
                }
                WraparoundRule::AnyDimension => {
                    "a ring needs at least 3 chips (2 chips already share their one link)".into()
                }
            };
            return Err(invalid(
                format!("wraparound[{axis}]"),
                Problem::WraparoundNotAllowed {
                    generation: spec.name.to_string(),
                    axis,
                    size: dims[axis],
                    rule,
                },
            ));
        }
        wraparound[axis] = wrap;
    }
    Ok(wraparound)
}

/// The wraparound offsets of a `twist` value.
///
/// `"twisted"` is the twisted torus of Jouppi et al. (ISCA 2023) and of
/// Cámara et al. ("Twisted Torus Topologies for Enhanced Interconnection
/// Networks", IEEE TPDS 2010) for slices `k x k x 2k` and `k x 2k x 2k`:
/// the wraparound link of every short axis (`k` chips) lands `k` chips
/// further along every long axis (`2k` chips), so `(k-1, y, z)` joins
/// `(0, y, z + k mod 2k)` on a 4x4x8. Long axes keep plain rings. Every chip
/// keeps its 6 links; the short rings become one long ring through both
/// halves of the long axis, which shortens paths across the long axis.
pub fn twist_offsets(
    given: Option<&str>,
    shape: &str,
    dims: [u32; 3],
    wraparound: [bool; 3],
    spec: &HardwareSpec,
) -> Check<[[u32; 3]; 3]> {
    let none = [[0; 3]; 3];
    match given.map(str::trim) {
        None | Some("none") => return Ok(none),
        Some("twisted") => {}
        Some(other) => {
            return Err(invalid(
                "twist",
                Problem::UnknownTwist {
                    given: other.to_string(),
                },
            ));
        }
    }
    let refuse = |reason: String| {
        invalid(
            "twist",
            Problem::TwistNotAllowed {
                generation: spec.name.to_string(),
                shape: shape.to_string(),
                reason,
            },
        )
    };
    if !spec.twisted_tori {
        return Err(refuse("only v4 and v5p slices can be twisted".into()));
    }
    let Some(k) = twisted_torus_edge(dims) else {
        return Err(refuse(
            "twisted tori are k x k x 2k or k x 2k x 2k with k a multiple of 4 \
             (4x4x8, 4x8x8, 8x8x16, 8x16x16)"
                .into(),
        ));
    };
    if let Some(axis) = (0..3).find(|&a| !wraparound[a]) {
        return Err(refuse(format!(
            "the twist moves wraparound links, and wraparound[{axis}] is off"
        )));
    }
    let mut twist = none;
    for short in (0..3).filter(|&a| dims[a] == k) {
        for long in (0..3).filter(|&a| dims[a] == 2 * k) {
            twist[short][long] = k;
        }
    }
    Ok(twist)
}

pub(super) fn resolve_fabric(
    given: &DcnFigures,
    slices: u32,
    spec: &HardwareSpec,
) -> Check<Option<DcnFabric>> {
    let wanted = given.fabric.unwrap_or(slices > 1);
    if wanted && slices < 2 {
        return Err(invalid(
            "dcn.fabric",
            Problem::NoFabric {
                reason: "`fabric: true` needs 2 or more slices; one slice has no slices to join"
                    .into(),
            },
        ));
    }
    if !wanted {
        let figure = [
            ("dcn.host_gb_per_s", given.host_gb_per_s.is_some()),
            ("dcn.oversubscription", given.oversubscription.is_some()),
        ]
        .into_iter()
        .find(|(_, set)| *set);
        if let Some((field, _)) = figure {
            return Err(invalid(
                field,
                Problem::NoFabric {
                    reason: "sets a DCN fabric figure, but the pod has no fabric \
                             (one slice, or `fabric: false`)"
                        .into(),
                },
            ));
        }
        return Ok(None);
    }
    let host_bytes_per_s = match given.host_gb_per_s {
        None => spec.dcn_host_bytes_per_s,
        Some(gb) => {
            let bytes = positive_finite(gb, "dcn.host_gb_per_s")? * 1e9;
            positive_finite(bytes, "dcn.host_gb_per_s")?
        }
    };
    let oversubscription = given.oversubscription.unwrap_or(1.0);
    if !(oversubscription.is_finite() && oversubscription >= 1.0) {
        return Err(invalid(
            "dcn.oversubscription",
            bad_number(oversubscription, "at least 1 (1 = non-blocking) and finite"),
        ));
    }
    Ok(Some(DcnFabric {
        host_bytes_per_s,
        oversubscription,
    }))
}

pub(super) fn resolve_host_bounds(
    given: Option<&str>,
    dims: [u32; 3],
    ndims: usize,
    spec: &HardwareSpec,
) -> Check<[u32; 3]> {
    let bounds = match given {
        None => spec.chips_per_host_bounds,
        Some(text) => {
            let (bounds, n) = parse_shape(text).map_err(|p| invalid("chips_per_host", p))?;
            if n != ndims {
                return Err(invalid(
                    "chips_per_host",
                    Problem::WrongLength {
                        expected: ndims,
                        got: n,
                    },
                ));
            }
            bounds
        }
    };
    let mut effective = [1u32; 3];
    for axis in 0..3 {
        // A slice smaller than the host block is driven by one host.
        effective[axis] = bounds[axis].min(dims[axis]);
        if !dims[axis].is_multiple_of(effective[axis]) {
            return Err(invalid(
                "chips_per_host",
                Problem::HostBlockDoesNotDivide {
                    axis,
                    bound: bounds[axis],
                    size: dims[axis],
                },
            ));
        }
    }
    Ok(effective)
}

fn positive_finite(value: f64, field: &str) -> Check<f64> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(invalid(field, bad_number(value, "positive and finite")))
    }
}

/// Converts a millisecond figure to whole nanoseconds within `min..=max` ns;
/// `requirement` says the range in milliseconds.
pub(super) fn millis_to_ns(
    value: Option<f64>,
    default_ns: u64,
    field: &str,
    (min, max): (u64, u64),
    requirement: &'static str,
) -> Check<u64> {
    let Some(ms) = value else {
        return Ok(default_ns);
    };
    let ms = positive_finite(ms, field)?;
    let ns = (ms * 1e6).round();
    if !(min.max(1) as f64..=max as f64).contains(&ns) {
        return Err(invalid(field, bad_number(ms, requirement)));
    }
    Ok(ns as u64)
}

pub(super) fn link_params(
    given: Option<&LinkFigures>,
    default: LinkParams,
    field: &str,
) -> Check<LinkParams> {
    let Some(given) = given else {
        return Ok(default);
    };
    override_params(
        default,
        given.bandwidth_gb_per_s,
        given.latency_us,
        &format!("{field}."),
    )
}

pub(super) fn override_params(
    default: LinkParams,
    bandwidth_gb_per_s: Option<f64>,
    latency_us: Option<f64>,
    prefix: &str,
) -> Check<LinkParams> {
    let mut params = default;
    if let Some(gb) = bandwidth_gb_per_s {
        let field = format!("{prefix}bandwidth_gb_per_s");
        params.bytes_per_s = positive_finite(gb, &field)? * 1e9;
        if !params.bytes_per_s.is_finite() {
            return Err(invalid(field, bad_number(gb, "below 1e300")));
        }
    }
    if let Some(us) = latency_us {
        let field = format!("{prefix}latency_us");
        if !(us.is_finite() && (0.0..=1e9).contains(&us)) {
            return Err(invalid(field, bad_number(us, "between 0 and 1e9 µs")));
        }
        params.latency_ns = (us * 1e3).round() as u64;
    }
    Ok(params)
}
