//! Graphviz export of a pod: devices grouped into host clusters, ICI links
//! solid (wraparound hops dashed grey), DCN links bold blue.

use super::components::{Device, Host, HostDevices, Link, PodTopology, TorusCoords};
use super::schema::LinkKind;
use bevy_ecs::prelude::*;
use std::fmt::Write;

/// The pod in `world` as a Graphviz `graph`.
pub fn to_dot(world: &mut World) -> String {
    let name = world.resource::<PodTopology>().0.name.clone();
    let mut dot = format!(
        "graph \"{}\" {{\n  node [shape=box, fontsize=9];\n",
        escape(&name)
    );
    let mut hosts: Vec<(u32, Vec<Entity>)> = world
        .query::<(&Host, &HostDevices)>()
        .iter(world)
        .map(|(host, devices)| (host.index, devices.devices().to_vec()))
        .collect();
    hosts.sort_by_key(|(index, _)| *index);
    let mut devices = world.query::<(&Device, &TorusCoords)>();
    for (index, members) in hosts {
        let _ = writeln!(
            dot,
            "  subgraph cluster_host{index} {{\n    label=\"host {index}\";"
        );
        let mut rows: Vec<(u32, String)> = members
            .iter()
            .filter_map(|&entity| devices.get(world, entity).ok())
            .map(|(device, place)| {
                let [x, y, z] = place.xyz;
                (
                    device.id.0,
                    format!(
                        "    d{} [label=\"{}\\n({x},{y},{z})\"];",
                        device.id.0, device.id.0
                    ),
                )
            })
            .collect();
        rows.sort();
        for (_, row) in rows {
            let _ = writeln!(dot, "{row}");
        }
        dot.push_str("  }\n");
    }
    let mut ids = world.query::<&Device>();
    let mut links = world.query::<&Link>();
    let edges: Vec<(u32, u32, LinkKind, bool)> = links
        .iter(world)
        .filter_map(|link| {
            let a = ids.get(world, link.a).ok()?.id.0;
            let b = ids.get(world, link.b).ok()?.id.0;
            Some((a, b, link.kind, link.wraps))
        })
        .collect();
    for (a, b, kind, wraps) in edges {
        let style = match (kind, wraps) {
            (LinkKind::Dcn, _) => " [color=blue, penwidth=2]",
            (LinkKind::Ici, true) => " [style=dashed, color=grey]",
            (LinkKind::Ici, false) => "",
        };
        let _ = writeln!(dot, "  d{a} -- d{b}{style};");
    }
    dot.push_str("}\n");
    dot
}

fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}
