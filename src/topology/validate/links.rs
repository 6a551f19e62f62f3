//! Validation of the explicit links and of the whole pod's connectivity.

use super::fields::override_params;
use super::{Check, invalid};
use crate::topology::error::Problem;
use crate::topology::model::{LinkSpec, Topology};
use crate::topology::schema::{ExtraLink, LinkKind};
use std::collections::HashMap;

fn kind_name(kind: LinkKind) -> &'static str {
    match kind {
        LinkKind::Ici => "ICI",
        LinkKind::Dcn => "DCN",
    }
}

pub(super) fn resolve_extra_links(
    topology: &Topology,
    given: &[ExtraLink],
) -> Check<Vec<LinkSpec>> {
    let devices = topology.num_devices();
    let mut seen: HashMap<(u32, u32, LinkKind), String> = HashMap::new();
    for link in topology.links() {
        let key = (link.a.min(link.b), link.a.max(link.b), link.kind);
        let source = match link.kind {
            LinkKind::Ici => "a torus link",
            LinkKind::Dcn => "a DCN fabric link",
        };
        seen.insert(key, source.to_string());
    }
    let mut resolved = Vec::with_capacity(given.len());
    for (i, link) in given.iter().enumerate() {
        let field = format!("extra_links[{i}]");
        for device in [link.a, link.b] {
            if device >= devices {
                return Err(invalid(field, Problem::UnknownDevice { device, devices }));
            }
        }
        if link.a == link.b {
            return Err(invalid(field, Problem::SelfLink { device: link.a }));
        }
        let key = (link.a.min(link.b), link.a.max(link.b), link.kind);
        if let Some(previous) = seen.get(&key) {
            return Err(invalid(
                field,
                Problem::DuplicateLink {
                    a: key.0,
                    b: key.1,
                    kind: kind_name(link.kind),
                    previous: previous.clone(),
                },
            ));
        }
        seen.insert(key, format!("extra_links[{i}]"));
        let default = match link.kind {
            LinkKind::Ici => topology.ici,
            LinkKind::Dcn => topology.dcn,
        };
        let params = override_params(
            default,
            link.bandwidth_gb_per_s,
            link.latency_us,
            &format!("{field}."),
        )?;
        resolved.push(LinkSpec {
            a: link.a,
            b: link.b,
            kind: link.kind,
            axis: None,
            wraps: false,
            params,
        });
    }
    Ok(resolved)
}

/// Union-find over every link; reports the first device not joined to 0.
pub(super) fn check_connected(topology: &Topology) -> Check<()> {
    let n = topology.num_devices() as usize;
    let mut parent: Vec<u32> = (0..n as u32).collect();
    fn find(parent: &mut [u32], mut x: u32) -> u32 {
        while parent[x as usize] != x {
            let grand = parent[parent[x as usize] as usize];
            parent[x as usize] = grand;
            x = grand;
        }
        x
    }
    for link in topology.links() {
        let (ra, rb) = (find(&mut parent, link.a), find(&mut parent, link.b));
        if ra != rb {
            parent[ra.max(rb) as usize] = ra.min(rb);
        }
    }
    let root = find(&mut parent, 0);
    let unreachable: Vec<u32> = (0..n as u32)
        .filter(|&d| find(&mut parent, d) != root)
        .collect();
    match unreachable.first() {
        None => Ok(()),
        Some(&first) => Err(invalid(
            "extra_links",
            Problem::Disconnected {
                unreachable: first,
                count: unreachable.len() as u32,
            },
        )),
    }
}
