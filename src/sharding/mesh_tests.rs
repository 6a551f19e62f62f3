use super::*;

#[test]
fn strategies_round_trip_through_their_names() {
    for s in Strategy::ALL {
        assert_eq!(s.name().parse::<Strategy>(), Ok(s));
        assert_eq!(s.to_string(), s.name());
    }
    let err = "zero3".parse::<Strategy>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown strategy `zero3` (expected replicated, zero2 or fsdp); did you mean `fsdp`?"
    );
    let err = "fsd".parse::<Strategy>().unwrap_err();
    assert!(err.to_string().ends_with("did you mean `fsdp`?"), "{err}");
    assert_eq!(Strategy::default(), Strategy::Replicated);
}

#[test]
fn a_mesh_prints_as_the_flag_takes_it() {
    let mesh = Mesh {
        axes: vec![
            MeshAxis {
                name: MeshAxisName::Data,
                size: 2,
                physical: vec![PhysicalAxis::Slices],
            },
            MeshAxis {
                name: MeshAxisName::Fsdp,
                size: 16,
                physical: vec![PhysicalAxis::Torus(0), PhysicalAxis::Torus(1)],
            },
            MeshAxis {
                name: MeshAxisName::Tensor,
                size: 1,
                physical: vec![],
            },
        ],
    };
    assert_eq!(mesh.to_string(), "data=2,fsdp=16,tensor=1");
    assert_eq!(mesh.devices(), 32);
    assert_eq!(mesh.size(MeshAxisName::Fsdp), 16);
}

use crate::topology::{load_preset, parse_topology};
use proptest::prelude::{Just, prop_assert, prop_assert_eq, prop_oneof, proptest};

fn pod(shape: &str) -> Topology {
    parse_topology(
        &format!("Pod(name: \"p\", generation: \"v4\", shape: \"{shape}\")"),
        "p.ron",
    )
    .unwrap()
}

fn multislice(shape: &str, slices: u32) -> Topology {
    parse_topology(
        &format!(
            "Pod(name: \"m\", generation: \"v5e\", shape: \"{shape}\", slices: {slices}, \
             dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))"
        ),
        "m.ron",
    )
    .unwrap()
}

#[test]
fn the_default_mesh_is_fsdp_over_a_slice_and_data_over_slices() {
    let v4 = pod("4x4x8");
    let mesh = Mesh::default_for(&v4);
    assert_eq!(mesh.to_string(), "data=1,fsdp=128,tensor=1");
    assert_eq!(
        mesh.axis(MeshAxisName::Fsdp).unwrap().physical,
        [
            PhysicalAxis::Torus(0),
            PhysicalAxis::Torus(1),
            PhysicalAxis::Torus(2)
        ]
    );
    let two = multislice("4x4", 2);
    let mesh = Mesh::default_for(&two);
    assert_eq!(mesh.to_string(), "data=2,fsdp=16,tensor=1");
    assert_eq!(
        mesh.axis(MeshAxisName::Data).unwrap().physical,
        [PhysicalAxis::Slices]
    );
    assert!(mesh.crosses_slices(MeshAxisName::Data));
    assert_eq!(mesh.torus_axes(MeshAxisName::Fsdp), [0, 1]);
    assert_eq!(Mesh::parse("fsdp=-1,data=2", &two), Ok(mesh.clone()));
    mesh.check_on(&two).unwrap();
}

#[test]
fn data_takes_the_slices_then_the_outermost_torus_axes() {
    let v4 = pod("4x4x8");
    let mesh = Mesh::parse("data=8,fsdp=16", &v4).unwrap();
    assert_eq!(
        mesh.axis(MeshAxisName::Data).unwrap().physical,
        [PhysicalAxis::Torus(2)]
    );
    let mesh = Mesh::parse("data=4,fsdp=-1", &v4).unwrap();
    assert_eq!(
        mesh.axis(MeshAxisName::Data).unwrap().physical,
        [PhysicalAxis::Torus(1)]
    );
    assert_eq!(mesh.size(MeshAxisName::Fsdp), 32);
    let mesh = Mesh::parse("data=32,fsdp=-1", &v4).unwrap();
    assert_eq!(
        mesh.axis(MeshAxisName::Data).unwrap().physical,
        [PhysicalAxis::Torus(1), PhysicalAxis::Torus(2)]
    );
    let two = multislice("4x4", 2);
    let mesh = Mesh::parse("data=8,fsdp=4", &two).unwrap();
    assert_eq!(
        mesh.axis(MeshAxisName::Data).unwrap().physical,
        [PhysicalAxis::Torus(1), PhysicalAxis::Slices]
    );
    let mesh = Mesh::parse("data=4,fsdp=8", &two).unwrap();
    assert_eq!(
        mesh.axis(MeshAxisName::Data).unwrap().physical,
        [PhysicalAxis::Torus(1)]
    );
    assert!(mesh.crosses_slices(MeshAxisName::Fsdp));
}

#[test]
fn bad_mesh_text_is_a_typed_error_naming_the_axis_and_the_pod() {
    let v4 = pod("4x4x8");
    let err = |text: &str| Mesh::parse(text, &v4).unwrap_err();
    assert_eq!(
        err("data=2,fsdp=64").to_string(),
        "mesh axis data=2 is not a product of whole axes of v4 4x4x8 (torus axes 4, 4, 8): \
         JAX does not split a physical axis"
    );
    assert!(matches!(err("model=2"), MeshError::UnknownAxis { .. }));
    assert!(err("model=2").to_string().contains("`model`"));
    let twice = err("data=4,fsdp=8,data=4");
    assert!(matches!(
        twice,
        MeshError::Repeated {
            axis: MeshAxisName::Data,
            ..
        }
    ));
    assert!(twice.to_string().contains("v4 4x4x8"), "{twice}");
    for bad in [
        "data=0",
        "data=x",
        "data=NaN",
        "data=1.5",
        "data=+4",
        "data=-2",
        "data=99999999999999999999999",
    ] {
        assert!(
            matches!(
                err(bad),
                MeshError::BadSize {
                    axis: MeshAxisName::Data,
                    ..
                }
            ),
            "{bad}"
        );
    }
    assert!(matches!(err("data"), MeshError::Malformed { .. }));
    assert!(matches!(err(""), MeshError::Malformed { .. }));
    assert!(matches!(err("data=-1,fsdp=-1"), MeshError::TwoRests { .. }));
    let product = err("data=4,fsdp=4");
    assert!(
        matches!(
            product,
            MeshError::Product {
                product: 16,
                devices: 128,
                ..
            }
        ),
        "{product}"
    );
    assert!(matches!(err("data=3,fsdp=-1"), MeshError::NoRest { .. }));
    let tensor = err("tensor=4,fsdp=32");
    assert_eq!(
        tensor.to_string(),
        "tensor=4 needs a model that declares how its tensors split (its heads, experts and \
         layers: --model); --params gives flat tensors (on v4 4x4x8 (torus axes 4, 4, 8))"
    );
    assert!(Mesh::parse("tensor=-1,fsdp=128", &v4).is_ok());
    assert!(matches!(
        err("tensor=-1,fsdp=32"),
        MeshError::NeedsModel {
            axis: MeshAxisName::Tensor,
            size: 4,
            ..
        }
    ));
    for (text, axis) in [
        ("expert=8,fsdp=-1", MeshAxisName::Expert),
        ("stage=-1,fsdp=16", MeshAxisName::Stage),
    ] {
        assert!(
            matches!(err(text), MeshError::NeedsModel { axis: a, .. } if a == axis),
            "{text}"
        );
    }
    let unknown = err("experts=8").to_string();
    assert!(unknown.contains("did you mean `expert`?"), "{unknown}");
    let two = multislice("4x4", 2);
    let e = Mesh::parse("data=3", &two).unwrap_err().to_string();
    assert!(
        e.contains("v5e 4x4, 2 slices (torus axes 4, 4; slices 2)"),
        "{e}"
    );
}

#[test]
fn a_mesh_the_pod_does_not_have_is_refused_by_check_on() {
    let v4 = pod("4x4x8");
    let mut mesh = Mesh::default_for(&v4);
    mesh.check_on(&v4).unwrap();
    mesh.axes[1].physical.pop();
    assert!(mesh.check_on(&v4).is_err());
    assert!(
        Mesh::default_for(&load_preset("v5e-16").unwrap())
            .check_on(&v4)
            .is_err()
    );
}

/// The sizes of a mesh made by giving each physical axis to an axis.
fn sizes_of(phys: &[(PhysicalAxis, usize)], choice: &[usize]) -> MeshSizes {
    let mut sizes = [1usize; 5];
    for (&(_, n), &a) in phys.iter().zip(choice) {
        sizes[a] *= n;
    }
    MeshSizes::from_order(sizes)
}

proptest! {
    #[test]
    fn a_laid_out_mesh_covers_each_physical_axis_once_and_round_trips(
        dims in proptest::collection::vec(prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], 3),
        slices in prop_oneof![Just(1u32), Just(2), Just(4)],
        choice in proptest::collection::vec(0usize..5, 4),
    ) {
        let shape = format!("{}x{}x{}", dims[0], dims[1], dims[2]);
        let topology = if slices > 1 {
            parse_topology(
                &format!(
                    "Pod(name: \"m\", generation: \"v4\", shape: \"{shape}\", slices: {slices}, \
                     dcn: (latency_us: 10.0, host_gb_per_s: 25.0, oversubscription: 1.0))"
                ),
                "m.ron",
            )
        } else {
            parse_topology(&format!("Pod(name: \"p\", generation: \"v4\", shape: \"{shape}\")"), "p.ron")
        };
        let Ok(topology) = topology else { return Ok(()) };
        let phys = physical_axes(&topology);
        let sizes = sizes_of(&phys, &choice[..phys.len()]);
        let mesh = Mesh::lay_out(sizes, &topology).unwrap();
        prop_assert!(mesh.check_on(&topology).is_ok());
        let mut covered: Vec<PhysicalAxis> = mesh.axes.iter().flat_map(|a| a.physical.clone()).collect();
        covered.sort();
        let mut all: Vec<PhysicalAxis> = phys.iter().map(|&(p, _)| p).collect();
        all.sort();
        prop_assert_eq!(covered, all);
        for a in &mesh.axes {
            prop_assert_eq!(physical_extent(&topology, &a.physical), a.size);
        }
        prop_assert_eq!(mesh.devices(), topology.num_devices() as usize);
        prop_assert_eq!(Mesh::parse_split(&mesh.to_string(), &topology), Ok(mesh.clone()));
        prop_assert_eq!(mesh.sizes(), sizes);
    }
}

#[test]
fn a_models_mesh_may_share_the_slices_and_a_flat_one_may_not() {
    let four = multislice("4x4", 4);
    let mesh = Mesh::parse_split("data=2,stage=2,fsdp=-1", &four).unwrap();
    assert_eq!(mesh.to_string(), "data=2,stage=2,fsdp=16,tensor=1");
    assert!(mesh.shares_slices());
    for axis in [MeshAxisName::Data, MeshAxisName::Stage] {
        assert!(mesh.crosses_slices(axis));
        assert_eq!(mesh.slices_along(axis, &four), 2);
    }
    assert_eq!(mesh.slices_along(MeshAxisName::Fsdp, &four), 1);
    mesh.check_on(&four).unwrap();
    // Whole slices are preferred when a layout has them.
    let whole = Mesh::parse_split("stage=4,fsdp=-1", &four).unwrap();
    assert!(!whole.shares_slices());
    assert_eq!(whole.slices_along(MeshAxisName::Stage, &four), 4);
    // Flat tensors lay out on whole physical axes only.
    assert!(Mesh::parse("data=2,fsdp=-1", &four).is_err());
    // A shared factor that does not multiply to the slices is refused.
    let mut wrong = mesh.clone();
    wrong.axes[0].size = 4;
    wrong.axes[2].size = 8;
    assert!(wrong.check_on(&four).is_err());
}
