//! `--mesh` text to a mesh, and a mesh's sizes laid out on a pod's
//! physical axes.

use super::mesh::{
    Mesh, MeshAxis, MeshAxisName, MeshError, MeshSizes, PhysicalAxis, physical_axes, pod_shape,
};
use crate::topology::Topology;

/// Named axes a mesh has ([`MeshAxisName::ALL`]).
const AXES: usize = MeshAxisName::ALL.len();

/// A size as `--mesh` gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    Fixed(usize),
    Rest,
}

impl Mesh {
    /// Parses `data=2,fsdp=64` (any order; an axis left out is 1; one axis
    /// may be -1, the devices the others leave, as MaxText's -1) and lays it
    /// out on `topology` ([`Mesh::lay_out`]). `tensor`, `expert` and
    /// `stage` above 1 are refused: flat tensors declare no split.
    pub fn parse(text: &str, topology: &Topology) -> Result<Mesh, MeshError> {
        Mesh::parse_with(text, topology, false)
    }

    /// [`Mesh::parse`] for a model whose tensors declare their splits
    /// ([`MeshSizes::lay_out_split`]): every axis is taken.
    pub fn parse_split(text: &str, topology: &Topology) -> Result<Mesh, MeshError> {
        Mesh::parse_with(text, topology, true)
    }

    fn parse_with(text: &str, topology: &Topology, split: bool) -> Result<Mesh, MeshError> {
        let pod = pod_shape(topology);
        let given = given_sizes(text, &pod)?;
        let sizes = given.map(|g| g.map_or(Size::Fixed(1), |(s, _)| s));
        let shown = show_sizes(&sizes);
        // Flat tensors: an axis given above 1 is refused before the sizes
        // are resolved, one taking the rest after.
        if !split {
            MeshSizes::from_order(sizes.map(|s| match s {
                Size::Fixed(n) => n,
                Size::Rest => 1,
            }))
            .refuse_undeclared_splits(&pod)?;
        }
        let rests: Vec<usize> = (0..AXES).filter(|&i| sizes[i] == Size::Rest).collect();
        if let [first, second, ..] = rests[..] {
            return Err(MeshError::TwoRests {
                first: MeshAxisName::ALL[first],
                second: MeshAxisName::ALL[second],
                pod,
            });
        }
        let devices = topology.num_devices() as usize;
        let product: u128 = sizes
            .iter()
            .map(|s| match s {
                Size::Fixed(n) => *n as u128,
                Size::Rest => 1,
            })
            .product();
        let mut resolved = [0usize; AXES];
        for (i, s) in sizes.iter().enumerate() {
            resolved[i] = match s {
                Size::Fixed(n) => *n,
                Size::Rest => {
                    if product == 0 || !(devices as u128).is_multiple_of(product) {
                        return Err(MeshError::NoRest {
                            mesh: shown,
                            axis: MeshAxisName::ALL[i],
                            product,
                            devices,
                            pod,
                        });
                    }
                    (devices as u128 / product) as usize
                }
            };
        }
        if rests.is_empty() && product != devices as u128 {
            return Err(MeshError::Product {
                mesh: shown,
                product,
                devices,
                pod,
            });
        }
        let resolved = MeshSizes::from_order(resolved);
        if !split {
            resolved.refuse_undeclared_splits(&pod)?;
        }
        Mesh::lay_out_with(resolved, topology, split)
    }

    /// Lays out a mesh of `sizes` on `topology`: every physical axis of
    /// extent above 1 ([`physical_axes`]) goes to exactly one named axis,
    /// the extents of each multiplying to its size. Of the assignments
    /// that do, the slices go to the outermost axis that can take them
    /// (`data`, then `stage`), then the outer axes take the outermost torus
    /// axes (the highest dimension index), as `create_hybrid_device_mesh`
    /// puts DCN outermost and MaxText's `expert` innermost.
    pub fn lay_out(sizes: MeshSizes, topology: &Topology) -> Result<Mesh, MeshError> {
        Mesh::lay_out_with(sizes, topology, false)
    }

    /// [`Mesh::lay_out`] for a model's mesh, where the slices may also be
    /// shared by several axes, each taking a factor of their count (MaxText's
    /// `dcn_data_parallelism × dcn_pipeline_parallelism × …`, which
    /// `create_hybrid_device_mesh` reshapes the slices into): a layout with
    /// the slices whole is preferred.
    pub fn lay_out_splitting_slices(
        sizes: MeshSizes,
        topology: &Topology,
    ) -> Result<Mesh, MeshError> {
        Mesh::lay_out_with(sizes, topology, true)
    }

    fn lay_out_with(
        sizes: MeshSizes,
        topology: &Topology,
        split_slices: bool,
    ) -> Result<Mesh, MeshError> {
        let sizes = sizes.in_order();
        let pod = pod_shape(topology);
        let devices = topology.num_devices() as usize;
        let product: u128 = sizes.iter().map(|&n| n as u128).product();
        let shown = show_sizes(&sizes.map(Size::Fixed));
        if product != devices as u128 {
            return Err(MeshError::Product {
                mesh: shown,
                product,
                devices,
                pod,
            });
        }
        // The torus axes in preference order (outermost first); the slices
        // take what each mesh axis's torus axes leave of its size.
        let phys = physical_axes(topology);
        let mut torus: Vec<(PhysicalAxis, usize)> = phys
            .iter()
            .copied()
            .filter(|&(p, _)| p != PhysicalAxis::Slices)
            .collect();
        torus.reverse();
        let slices = topology.slices.max(1) as usize;
        let m = torus.len();
        // Ranked by the axes holding slices (fewest, then outermost), then
        // the torus assignment (outer axes on outer torus axes).
        let mut best: Option<(Vec<usize>, Vec<usize>)> = None;
        let mut choice = vec![0usize; m];
        for code in 0..AXES.pow(m as u32) {
            let mut c = code;
            for slot in choice.iter_mut() {
                *slot = c % AXES;
                c /= AXES;
            }
            let Some(owners) = slice_owners(&sizes, &torus, &choice, slices) else {
                continue;
            };
            if owners.len() > 1 && !split_slices {
                continue;
            }
            let key = (owners, choice.clone());
            let better = best
                .as_ref()
                .is_none_or(|(o, c)| (key.0.len(), &key.0, &key.1) < (o.len(), o, c));
            if better {
                best = Some(key);
            }
        }
        let Some((owners, best)) = best else {
            let all: Vec<(PhysicalAxis, usize)> = phys.clone();
            for (axis, &size) in MeshAxisName::ALL.iter().zip(&sizes) {
                if !subset_product(&all, size) && !split_slices {
                    return Err(MeshError::NotWholeAxes {
                        axis: *axis,
                        size,
                        pod,
                    });
                }
            }
            return Err(MeshError::NoLayout { mesh: shown, pod });
        };
        let axes = MeshAxisName::ALL
            .iter()
            .enumerate()
            .filter(|&(a, name)| name.always_listed() || sizes[a] > 1)
            .map(|(a, &name)| {
                let mut physical: Vec<PhysicalAxis> = (0..m)
                    .filter(|&i| best[i] == a)
                    .map(|i| torus[i].0)
                    .collect();
                if owners.contains(&a) {
                    physical.push(PhysicalAxis::Slices);
                }
                physical.sort();
                MeshAxis {
                    name,
                    size: sizes[a],
                    physical,
                }
            })
            .collect();
        Ok(Mesh { axes })
    }
}

/// The mesh axes that hold a factor of the `slices` when the torus axes
/// go to the axes `choice` names: each axis's size over its torus axes'
/// extents, which must be whole and multiply to the slice count (`None`
/// when they do not).
fn slice_owners(
    sizes: &[usize; AXES],
    torus: &[(PhysicalAxis, usize)],
    choice: &[usize],
    slices: usize,
) -> Option<Vec<usize>> {
    let mut owners = Vec::new();
    let mut product = 1usize;
    for (axis, &size) in sizes.iter().enumerate() {
        let extent: usize = (0..torus.len())
            .filter(|&i| choice[i] == axis)
            .map(|i| torus[i].1)
            .product();
        if extent == 0 || !size.is_multiple_of(extent) {
            return None;
        }
        let factor = size / extent;
        if factor > 1 {
            owners.push(axis);
            product = product.checked_mul(factor)?;
        }
    }
    (product == slices).then_some(owners)
}

/// The sizes `text` gives each axis, with the text of each (for a
/// repeated axis's message).
fn given_sizes(text: &str, pod: &str) -> Result<[Option<(Size, String)>; AXES], MeshError> {
    let mut given: [Option<(Size, String)>; AXES] = Default::default();
    for entry in text.split(',') {
        let entry = entry.trim();
        let Some((name, value)) = entry.split_once('=') else {
            return Err(MeshError::Malformed {
                entry: entry.to_string(),
                pod: pod.to_string(),
            });
        };
        let (name, value) = (name.trim(), value.trim());
        let Some(at) = MeshAxisName::ALL.iter().position(|a| a.name() == name) else {
            return Err(MeshError::UnknownAxis {
                axis: name.to_string(),
                pod: pod.to_string(),
            });
        };
        let axis = MeshAxisName::ALL[at];
        if let Some((_, first)) = &given[at] {
            return Err(MeshError::Repeated {
                axis,
                first: first.clone(),
                second: value.to_string(),
                pod: pod.to_string(),
            });
        }
        let size = match value {
            "-1" => Size::Rest,
            _ => match value.parse::<usize>() {
                Ok(n) if n > 0 && value.bytes().all(|b| b.is_ascii_digit()) => Size::Fixed(n),
                _ => {
                    return Err(MeshError::BadSize {
                        axis,
                        value: value.to_string(),
                        pod: pod.to_string(),
                    });
                }
            },
        };
        given[at] = Some((size, value.to_string()));
    }
    Ok(given)
}

/// Whether some of `phys`'s extents multiply to `size`.
fn subset_product(phys: &[(PhysicalAxis, usize)], size: usize) -> bool {
    (0..1usize << phys.len()).any(|mask| {
        (0..phys.len())
            .filter(|i| mask >> i & 1 == 1)
            .map(|i| phys[i].1)
            .product::<usize>()
            == size
    })
}

/// `data=2,fsdp=-1,tensor=1` (with `stage` and `expert` when above 1).
fn show_sizes(sizes: &[Size; AXES]) -> String {
    MeshAxisName::ALL
        .iter()
        .zip(sizes)
        .filter(|(a, s)| a.always_listed() || **s != Size::Fixed(1))
        .map(|(a, s)| match s {
            Size::Fixed(n) => format!("{a}={n}"),
            Size::Rest => format!("{a}=-1"),
        })
        .collect::<Vec<_>>()
        .join(",")
}
