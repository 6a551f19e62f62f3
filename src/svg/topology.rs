//! The pod as SVG: hosts as pale boxes, devices as squares on their torus
//! coordinates, ICI links as lines (wraparound links as dashed stubs at the
//! edge they leave), DCN links in blue; suspect devices orange, failed or
//! killed devices red with a cross. A 3-D pod is drawn as its z-planes side
//! by side, left to right then top to bottom in a near-square grid, slice
//! after slice; a z-axis link, which joins the same (x, y) in neighbouring
//! planes, is a green stub at each end.
//!
//! Every link is exactly one `<path class="link">` with a `<title>` naming
//! its ends, kind and axis, so the picture can be checked against the pod.
//!
//! A cube-built pod ([`crate::topology::cubes`]) also shows its cubes: each
//! cube's part of a plane is outlined (`<rect class="cube">`, titled with
//! the cube and its place in the slice), a link over an optical circuit
//! switch is drawn thicker and its title names the switch and the two
//! cubes it joins, and a list under the header gives every cube's role
//! (slice position, spare, retired, failed) — the OCS assignment.

use super::{escape, open, pale};
use crate::health::{DeviceState, Health};
use crate::topology::Host;
use crate::topology::{
    Cube, CubeRole, Device, InCube, Link, LinkKind, OcsCircuit, OnHost, PodTopology, Topology,
    TorusCoords,
};
use bevy_ecs::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write;

const MARGIN: f64 = 20.0;
const HEADER: f64 = 92.0;
const PLANE_GAP: f64 = 36.0;

/// A link between two placed devices (indices into the placed list).
struct Line {
    a: usize,
    b: usize,
    kind: LinkKind,
    axis: Option<u8>,
    wraps: bool,
    circuit: Option<OcsCircuit>,
}

fn axis_name(axis: u8) -> &'static str {
    match axis {
        0 => "x",
        1 => "y",
        2 => "z",
        _ => "axis",
    }
}

/// The path of one link and its style: every link is one element.
///
/// * DCN and links between unrelated planes: a straight line (red dashed for
///   a twisted torus's wraparound, which lands in another plane).
/// * In-plane ICI: a straight line; a wraparound as a dashed stub leaving
///   each end towards the edge it wraps across.
/// * z-axis ICI (the same (x, y) in neighbouring planes): a stub from each
///   end, up-right towards the next plane from the lower z and down-left
///   from the higher z; dashed for the wraparound from the last plane to
///   the first.
fn link_path(
    line: &Line,
    pa: &Placed,
    pb: &Placed,
    (ax, ay): (f64, f64),
    (bx, by): (f64, f64),
    cell: f64,
) -> (String, &'static str) {
    let straight = format!("M{ax:.1},{ay:.1}L{bx:.1},{by:.1}");
    let same_plane = pa.slice == pb.slice && pa.xyz[2] == pb.xyz[2];
    let z_link = line.kind == LinkKind::Ici
        && line.axis == Some(2)
        && pa.slice == pb.slice
        && pa.xyz[..2] == pb.xyz[..2];
    match line.kind {
        LinkKind::Dcn => (
            straight,
            "stroke=\"#1f5fbf\" stroke-width=\"1.5\" stroke-opacity=\"0.6\"",
        ),
        LinkKind::Ici if z_link => {
            // The end whose plane the link leaves upwards: the lower z, or
            // the last plane for the wraparound.
            let lower_is_a = (pa.xyz[2] < pb.xyz[2]) != line.wraps;
            let (ux, uy, vx, vy) = if lower_is_a {
                (ax, ay, bx, by)
            } else {
                (bx, by, ax, ay)
            };
            let r = cell * 0.45;
            (
                format!(
                    "M{ux:.1},{uy:.1}l{r:.1},{:.1}M{vx:.1},{vy:.1}l{:.1},{r:.1}",
                    -r, -r
                ),
                if line.wraps {
                    "stroke=\"#2ca02c\" stroke-width=\"1.2\" stroke-dasharray=\"2,2\""
                } else {
                    "stroke=\"#2ca02c\" stroke-width=\"1.2\""
                },
            )
        }
        // A twisted torus's wraparound lands in another plane.
        LinkKind::Ici if !same_plane && line.wraps => (
            straight,
            "stroke=\"#d62728\" stroke-width=\"1\" stroke-opacity=\"0.5\" stroke-dasharray=\"3,2\"",
        ),
        LinkKind::Ici if !same_plane => (straight, "stroke=\"#555\" stroke-width=\"1\""),
        LinkKind::Ici if line.wraps => {
            let stub = |from: &Placed, to: &Placed, (fx, fy): (f64, f64)| {
                // Not `f64::signum`, which is 1 for 0: a stub along x must
                // not lean along y.
                let sign = |to: u32, from: u32| f64::from(to.cmp(&from) as i8);
                let dx = sign(to.xyz[0], from.xyz[0]);
                let dy = sign(to.xyz[1], from.xyz[1]);
                format!(
                    "M{fx:.1},{fy:.1}L{:.1},{:.1}",
                    fx - dx * cell * 0.8,
                    fy - dy * cell * 0.8
                )
            };
            (
                stub(pa, pb, (ax, ay)) + &stub(pb, pa, (bx, by)),
                "stroke=\"#888\" stroke-dasharray=\"2,2\"",
            )
        }
        LinkKind::Ici => (straight, "stroke=\"#555\" stroke-width=\"1\""),
    }
}

struct Placed {
    id: u32,
    cube: Option<u32>,
    host: u32,
    slice: u32,
    xyz: [u32; 3],
    status: &'static str,
}

/// Where the picture puts things: the cell of one device, the planes (one
/// per slice and z) in a near-square grid, in (slice, z) order, under a
/// header tall enough for the OCS assignment.
struct Layout {
    dims: [u32; 3],
    cell: f64,
    plane_w: f64,
    plane_h: f64,
    header: f64,
    columns: u32,
    width: f64,
    height: f64,
}

impl Layout {
    fn new(dims: [u32; 3], slices: u32, devices: usize, assignment_lines: usize) -> Layout {
        let cell = if devices > 1024 { 16.0 } else { 30.0 };
        let plane_w = dims[0].max(1) as f64 * cell;
        let plane_h = dims[1].max(1) as f64 * cell;
        let header = HEADER + assignment_lines as f64 * 16.0;
        let planes = dims[2].max(1) * slices.max(1);
        let columns = (planes as f64).sqrt().ceil().max(1.0) as u32;
        let rows = planes.div_ceil(columns);
        let width = (2.0 * MARGIN + columns as f64 * (plane_w + PLANE_GAP) + cell).max(720.0);
        let height = header + MARGIN + rows as f64 * (plane_h + PLANE_GAP) + cell;
        Layout {
            dims,
            cell,
            plane_w,
            plane_h,
            header,
            columns,
            width,
            height,
        }
    }

    /// The top-left corner of plane `(slice, z)`.
    fn origin(&self, slice: u32, z: u32) -> (f64, f64) {
        let slot = slice * self.dims[2].max(1) + z;
        (
            MARGIN + self.cell + (slot % self.columns) as f64 * (self.plane_w + PLANE_GAP),
            self.header
                + self.cell / 2.0
                + (slot / self.columns) as f64 * (self.plane_h + PLANE_GAP),
        )
    }

    /// The centre of a device's cell.
    fn center(&self, p: &Placed) -> (f64, f64) {
        let (x0, y0) = self.origin(p.slice, p.xyz[2]);
        (
            x0 + (p.xyz[0] as f64 + 0.5) * self.cell,
            y0 + (p.xyz[1] as f64 + 0.5) * self.cell,
        )
    }
}

/// The pod in `world` as an SVG document.
pub fn topology_svg(world: &mut World) -> String {
    let topology = world.resource::<PodTopology>().0.clone();
    let placed = place_devices(world);
    let assignment = cube_assignment(world);
    let layout = Layout::new(
        topology.dims,
        topology.slices,
        placed.len(),
        assignment.len(),
    );
    let mut out = String::new();
    open(
        &mut out,
        layout.width,
        layout.height,
        &format!("pod {}", topology.name),
    );
    write_header(&mut out, &topology, &placed, &assignment);
    write_plane_labels(&mut out, &layout, topology.slices);
    write_host_boxes(&mut out, &placed, &layout);
    draw_cubes(&mut out, &placed, &cube_roles(world), &layout);
    let lines = link_lines(world, &placed);
    write_links(&mut out, &lines, &placed, &layout);
    write_devices(&mut out, &placed, &layout);
    out.push_str("</svg>\n");
    out
}

/// Every device with its coordinates, host, cube and status, by id.
fn place_devices(world: &mut World) -> Vec<Placed> {
    let mut hosts = world.query::<&Host>();
    let mut devices = world.query::<(
        &Device,
        &TorusCoords,
        Option<&OnHost>,
        Option<&Health>,
        Option<&DeviceState>,
        Option<&InCube>,
    )>();
    let mut placed: Vec<Placed> = devices
        .iter(world)
        .map(|(device, coords, host, health, state, in_cube)| Placed {
            id: device.id.0,
            cube: in_cube.map(|c| c.cube),
            host: host
                .and_then(|h| hosts.get(world, h.0).ok())
                .map_or(0, |h| h.index),
            slice: coords.slice,
            xyz: coords.xyz,
            status: match (health, state) {
                (Some(Health::Failed { .. }), _) | (_, Some(DeviceState::Killed { .. })) => {
                    "failed"
                }
                (Some(Health::Suspect { .. }), _) => "suspect",
                _ => "healthy",
            },
        })
        .collect();
    placed.sort_by_key(|p| p.id);
    placed
}

/// The title, the legend and the OCS assignment.
fn write_header(out: &mut String, topology: &Topology, placed: &[Placed], assignment: &[String]) {
    let dims = topology.dims;
    let failed = placed.iter().filter(|p| p.status == "failed").count();
    let _ = writeln!(
        out,
        "<text x=\"{MARGIN}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{} — {} {}x{}x{} ({} devices, {} slice(s), {} failed)</text>\n\
         <text x=\"{MARGIN}\" y=\"38\">pale boxes: hosts · blue: healthy · orange: suspect · red ✕: failed</text>\n\
         <text x=\"{MARGIN}\" y=\"54\">solid: ICI · dashed stub: wraparound · blue line: DCN</text>{}",
        escape(&topology.name),
        topology.generation,
        dims[0],
        dims[1],
        dims[2],
        placed.len(),
        topology.slices,
        failed,
        if dims[2] > 1 {
            "\n<text x=\"20\" y=\"70\">one box per (slice, z) plane · green stubs: z links (↗ to z+1, ↙ to z−1; dashed: wraparound)</text>"
        } else {
            ""
        }
    );
    for (i, line) in assignment.iter().enumerate() {
        let _ = writeln!(
            out,
            "<text class=\"ocs-assignment\" x=\"{MARGIN}\" y=\"{:.1}\">{}</text>",
            HEADER - 6.0 + i as f64 * 16.0,
            escape(line)
        );
    }
}

/// A `slice s z=z` label over every plane.
fn write_plane_labels(out: &mut String, layout: &Layout, slices: u32) {
    for s in 0..slices.max(1) {
        for z in 0..layout.dims[2].max(1) {
            let (x0, y0) = layout.origin(s, z);
            let _ = writeln!(
                out,
                "<text x=\"{x0:.1}\" y=\"{:.1}\" fill=\"#555\">slice {s} z={z}</text>",
                y0 - 12.0
            );
        }
    }
}

/// The bounding box (`[x0, y0, x1, y1]`) of the devices of each group in
/// each plane, keyed by `(group, slice, z)`; devices without a group are left
/// out.
fn plane_boxes(
    placed: &[Placed],
    group: impl Fn(&Placed) -> Option<u32>,
) -> BTreeMap<(u32, u32, u32), [u32; 4]> {
    let mut boxes: BTreeMap<(u32, u32, u32), [u32; 4]> = BTreeMap::new();
    for p in placed {
        let Some(key) = group(p) else { continue };
        let b = boxes
            .entry((key, p.slice, p.xyz[2]))
            .or_insert([p.xyz[0], p.xyz[1], p.xyz[0], p.xyz[1]]);
        b[0] = b[0].min(p.xyz[0]);
        b[1] = b[1].min(p.xyz[1]);
        b[2] = b[2].max(p.xyz[0]);
        b[3] = b[3].max(p.xyz[1]);
    }
    boxes
}

/// Host boxes: the bounding box of each host's devices in each plane.
fn write_host_boxes(out: &mut String, placed: &[Placed], layout: &Layout) {
    let cell = layout.cell;
    for ((host, slice, z), [x0, y0, x1, y1]) in &plane_boxes(placed, |p| Some(p.host)) {
        let (ox, oy) = layout.origin(*slice, *z);
        let _ = writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"4\" fill=\"{}\" stroke=\"#999\" stroke-width=\"0.5\"><title>host {host}</title></rect>",
            ox + *x0 as f64 * cell + 1.0,
            oy + *y0 as f64 * cell + 1.0,
            (x1 - x0 + 1) as f64 * cell - 2.0,
            (y1 - y0 + 1) as f64 * cell - 2.0,
            pale(*host as usize)
        );
    }
}

/// Every link between placed devices, ordered by its ends.
fn link_lines(world: &mut World, placed: &[Placed]) -> Vec<Line> {
    let by_entity: BTreeMap<Entity, usize> = {
        let mut q = world.query::<(Entity, &Device)>();
        let ids: BTreeMap<u32, usize> = placed.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
        q.iter(world)
            .filter_map(|(e, d)| ids.get(&d.id.0).map(|&i| (e, i)))
            .collect()
    };
    let mut links = world.query::<(&Link, Option<&OcsCircuit>)>();
    let mut lines: Vec<Line> = links
        .iter(world)
        .filter_map(|(l, circuit)| {
            Some(Line {
                a: *by_entity.get(&l.a)?,
                b: *by_entity.get(&l.b)?,
                kind: l.kind,
                axis: l.axis,
                wraps: l.wraps,
                circuit: circuit.copied(),
            })
        })
        .collect();
    lines.sort_by_key(|l| (l.a, l.b));
    lines
}

/// A link's title: its ends, kind, axis, wraparound and optical circuit.
fn link_title(line: &Line, pa: &Placed, pb: &Placed) -> String {
    let circuit = line.circuit.map_or_else(String::new, |c| {
        format!(
            ", via OCS {} (cube {} to cube {})",
            c.ocs, c.cube_a, c.cube_b
        )
    });
    format!(
        "link {}–{}: {}{}{}{circuit}",
        pa.id,
        pb.id,
        match line.kind {
            LinkKind::Ici => "ICI",
            LinkKind::Dcn => "DCN",
        },
        line.axis
            .map_or_else(String::new, |axis| format!(" {}", axis_name(axis))),
        if line.wraps { ", wraparound" } else { "" }
    )
}

/// Every link as one `<path class="link">`, thicker over an optical circuit.
fn write_links(out: &mut String, lines: &[Line], placed: &[Placed], layout: &Layout) {
    out.push_str("<g stroke-linecap=\"round\" fill=\"none\">\n");
    for line in lines {
        let (pa, pb) = (&placed[line.a], &placed[line.b]);
        let (a, b) = (layout.center(pa), layout.center(pb));
        let title = link_title(line, pa, pb);
        let (d, style) = link_path(line, pa, pb, a, b, layout.cell);
        let optical = line.circuit.map_or_else(
            || " class=\"link\"".to_string(),
            |c| format!(" class=\"link\" data-ocs=\"{}\" stroke-width=\"2\"", c.ocs),
        );
        let style = if line.circuit.is_some() {
            style
                .replace("stroke-width=\"1\"", "")
                .replace("stroke-width=\"1.2\"", "")
        } else {
            style.to_string()
        };
        let _ = writeln!(
            out,
            "<path{optical} d=\"{d}\" {style}><title>{}</title></path>",
            escape(&title)
        );
    }
    out.push_str("</g>\n");
}

/// Every device as a square coloured by status, a cross when failed, and
/// its id when the cells are large enough.
fn write_devices(out: &mut String, placed: &[Placed], layout: &Layout) {
    let cell = layout.cell;
    let side = cell * 0.6;
    for p in placed {
        let (cx, cy) = layout.center(p);
        let fill = match p.status {
            "failed" => "#d62728",
            "suspect" => "#ff9f1c",
            _ => "#4e79a7",
        };
        let [x, y, z] = p.xyz;
        let _ = write!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{side:.1}\" height=\"{side:.1}\" fill=\"{fill}\" stroke=\"#222\" stroke-width=\"0.5\"><title>device {} ({x},{y},{z}) slice {} host {}{}: {}</title></rect>",
            cx - side / 2.0,
            cy - side / 2.0,
            p.id,
            p.slice,
            p.host,
            p.cube.map_or_else(String::new, |c| format!(" cube {c}")),
            p.status
        );
        if p.status == "failed" {
            let h = side / 2.0;
            let _ = write!(
                out,
                "<path d=\"M{:.1},{:.1}L{:.1},{:.1}M{:.1},{:.1}L{:.1},{:.1}\" stroke=\"white\" stroke-width=\"1.5\"/>",
                cx - h,
                cy - h,
                cx + h,
                cy + h,
                cx - h,
                cy + h,
                cx + h,
                cy - h
            );
        }
        if cell >= 30.0 {
            let _ = write!(
                out,
                "<text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"8\" fill=\"white\">{}</text>",
                cy + 3.0,
                p.id
            );
        }
        out.push('\n');
    }
}

/// Every cube's role, by index.
fn cube_roles(world: &mut World) -> BTreeMap<u32, Cube> {
    let mut q = world.query::<&Cube>();
    q.iter(world).map(|c| (c.index, *c)).collect()
}

/// The OCS assignment as lines of text: the slices' cubes by position,
/// then the spares, retired and unallocated cubes (counted, not listed).
fn cube_assignment(world: &mut World) -> Vec<String> {
    let roles = cube_roles(world);
    if roles.is_empty() {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "OCS assignment ({} cubes; thick links run over an optical circuit switch):",
        roles.len()
    )];
    let mut unallocated = 0;
    for cube in roles.values() {
        let failed = cube.failed_at_ns.map_or_else(String::new, |t| {
            format!(" (failed at {:.3} s)", t as f64 * 1e-9)
        });
        let role = match cube.role {
            CubeRole::Slice { slice, position } => format!(
                "slice {slice} position ({},{},{})",
                position[0], position[1], position[2]
            ),
            CubeRole::Spare => "spare".to_string(),
            CubeRole::Retired => "retired".to_string(),
            CubeRole::Unallocated => {
                unallocated += 1;
                continue;
            }
        };
        lines.push(format!("cube {}: {role}{failed}", cube.index));
    }
    if unallocated > 0 {
        lines.push(format!(
            "{unallocated} more cube(s) unallocated (other jobs)"
        ));
    }
    lines
}

/// Outlines each cube's part of every plane (class `cube`).
fn draw_cubes(out: &mut String, placed: &[Placed], roles: &BTreeMap<u32, Cube>, layout: &Layout) {
    let cell = layout.cell;
    for ((cube, slice, z), [x0, y0, x1, y1]) in &plane_boxes(placed, |p| p.cube) {
        let (ox, oy) = layout.origin(*slice, *z);
        let failed = roles.get(cube).is_some_and(|c| c.failed_at_ns.is_some());
        let stroke = if failed { "#d62728" } else { "#7b3294" };
        let _ = writeln!(
            out,
            "<rect class=\"cube\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"{stroke}\" stroke-width=\"1.5\" stroke-dasharray=\"6,3\"><title>cube {cube}{}</title></rect>",
            ox + *x0 as f64 * cell - 2.0,
            oy + *y0 as f64 * cell - 2.0,
            (x1 - x0 + 1) as f64 * cell + 4.0,
            (y1 - y0 + 1) as f64 * cell + 4.0,
            if failed { " (failed)" } else { "" }
        );
    }
}
