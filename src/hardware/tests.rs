//! Unit tests of `hardware.rs`: the figures' laws and the shape rules.

use super::*;

#[test]
fn a_checkpoint_costs_its_bytes_over_every_hosts_stream() {
    // 12 GB over 4 hosts at 1 GB/s each: 3 s.
    assert_eq!(checkpoint_io_seconds(12e9, 4), 3.0);
    assert_eq!(checkpoint_io_seconds(12e9, 0), 12.0);
    assert_eq!(checkpoint_io_seconds(0.0, 4), 0.0);
}

#[test]
fn names_round_trip() {
    for generation in TpuGeneration::ALL {
        assert_eq!(generation.name().parse::<TpuGeneration>(), Ok(generation));
    }
    assert_eq!("V5E".parse::<TpuGeneration>(), Ok(TpuGeneration::V5e));
    assert!("v7".parse::<TpuGeneration>().is_err());
}

#[test]
fn port_counts_match_torus_dimensions() {
    for generation in TpuGeneration::ALL {
        let spec = generation.spec();
        assert_eq!(spec.ici_ports as usize, 2 * spec.torus_dims, "{generation}");
    }
}

#[test]
fn offered_shapes_follow_the_cloud_lists() {
    let v5p = &TpuGeneration::V5p.spec().slice_shapes;
    assert!(v5p.offers([16, 16, 24]) && v5p.offers([24, 16, 16]));
    assert!(v5p.offers([2, 2, 1]) && v5p.offers([4, 4, 8]));
    // XPK's v5p-17920, the whole pod as one slice, beyond the page's rule.
    assert!(v5p.offers([16, 20, 28]) && v5p.offers([4, 4, 244]));
    assert!(!v5p.offers([4, 4, 6]) && !v5p.offers([16, 16, 28]) && !v5p.offers([20, 20, 20]));
    let v4 = &TpuGeneration::V4.spec().slice_shapes;
    assert!(v4.offers([8, 8, 12]) && v4.offers([16, 16, 16]) && v4.offers([2, 2, 1]));
    assert!(!v4.offers([16, 16, 24]) && !v4.offers([3, 4, 4]) && !v4.offers([1, 1, 1]));
    let v5e = &TpuGeneration::V5e.spec().slice_shapes;
    assert!(v5e.offers([16, 16, 1]) && v5e.offers([4, 2, 1]) && v5e.offers([1, 1, 1]));
    assert!(!v5e.offers([3, 5, 1]) && !v5e.offers([4, 1, 1]) && !v5e.offers([16, 32, 1]));
    for generation in TpuGeneration::ALL {
        let shapes = &generation.spec().slice_shapes;
        assert!(shapes.largest_slice_chips <= generation.spec().max_pod_chips);
        for shape in shapes.listed {
            assert!(shape.iter().product::<u32>() <= generation.spec().max_pod_chips);
        }
    }
}

#[test]
fn twisted_shapes_are_k_k_2k_and_k_2k_2k() {
    assert_eq!(twisted_torus_edge([4, 4, 8]), Some(4));
    assert_eq!(twisted_torus_edge([8, 4, 8]), Some(4));
    assert_eq!(twisted_torus_edge([8, 8, 16]), Some(8));
    assert_eq!(twisted_torus_edge([4, 4, 4]), None);
    assert_eq!(twisted_torus_edge([4, 8, 16]), None);
    assert_eq!(twisted_torus_edge([2, 2, 4]), None);
}

#[test]
fn ocs_figures_match_the_v4_paper() {
    let ocs = TpuGeneration::V4.spec().ocs.expect("v4 is built of cubes");
    assert_eq!(ocs.ocs_count(), 48);
    assert_eq!(ocs.pod_cubes * ocs.chips_per_cube(), 4096);
    // 6 faces x 16 links per cube, 6144 optical links in the pod.
    assert_eq!(6 * ocs.cube_edge.pow(2) * ocs.pod_cubes, 6144);
    assert_eq!(ocs.ports_per_ocs, 2 * ocs.pod_cubes);
    for generation in TpuGeneration::ALL {
        let spec = generation.spec();
        if let Some(ocs) = spec.ocs {
            assert_eq!(spec.slice_shapes.cube_edge, Some(ocs.cube_edge));
            assert!(ocs.pod_cubes * ocs.chips_per_cube() >= spec.max_pod_chips);
        }
    }
}

#[test]
fn v4_wraps_only_multiples_of_four() {
    let v4 = TpuGeneration::V4.spec();
    assert!(v4.can_wrap(4) && v4.can_wrap(16));
    assert!(!v4.can_wrap(2) && !v4.can_wrap(6));
    // v5e and v6e close a ring only along a full 16-chip axis.
    for generation in [TpuGeneration::V5e, TpuGeneration::V6e] {
        let spec = generation.spec();
        assert!(spec.can_wrap(16));
        assert!(!spec.can_wrap(2) && !spec.can_wrap(4) && !spec.can_wrap(8));
        assert!(!spec.can_wrap(32));
    }
    let v3 = TpuGeneration::V3.spec();
    assert!(v3.can_wrap(3) && !v3.can_wrap(2));
}

#[test]
fn every_generations_figures_obey_the_laws_between_them() {
    for generation in TpuGeneration::ALL {
        let spec = generation.spec();
        let bf16 = spec.peak_bf16_flops;
        assert!(bf16 > 0.0, "{generation}");
        // int8 is never slower than bf16 where it is published.
        assert!(
            spec.peak_int8_ops == 0.0 || spec.peak_int8_ops >= bf16,
            "{generation}"
        );
        // Native fp8 is at least the bf16 rate, and TPU7x is the first
        // generation to have it.
        assert!(
            spec.peak_fp8_flops == 0.0 || spec.peak_fp8_flops >= bf16,
            "{generation}"
        );
        assert_eq!(
            spec.peak_fp8_flops > 0.0,
            generation >= TpuGeneration::Tpu7x,
            "{generation}"
        );
        // A host link far slower than HBM, and a host that holds every HBM
        // byte of its chips (an offloaded or host-copied state fits).
        assert!(spec.host_link_bytes_per_s > 0.0, "{generation}");
        assert!(
            spec.host_link_bytes_per_s < spec.hbm_bytes_per_s / 10.0,
            "{generation}"
        );
        let host_hbm = spec.hbm_bytes * u64::from(spec.chips_per_host());
        assert!(spec.host_dram_bytes > host_hbm, "{generation}");
        // A host's NICs carry at least one chip's DCN share.
        assert!(spec.dcn_host_bytes_per_s >= spec.dcn_bytes_per_s);
    }
    // Each figure against its source.
    let int8: Vec<f64> = TpuGeneration::ALL.map(|g| g.spec().peak_int8_ops).to_vec();
    assert_eq!(int8, [0.0, 0.0, 275e12, 393e12, 918e12, 1836e12, 4614e12]);
    let link = TpuGeneration::ALL.map(|g| g.spec().host_link_bytes_per_s / 1e9);
    assert_eq!(link, [15.75, 15.75, 15.75, 16.0, 16.0, 32.0, 16.0]);
    let dram = TpuGeneration::ALL.map(|g| g.spec().host_dram_bytes / GIB);
    assert_eq!(dram, [335, 335, 407, 384, 448, 1440, 960]);
}

#[test]
fn tpu7x_is_cloud_s_ironwood() {
    let generation: TpuGeneration = "tpu7x".parse().unwrap();
    assert_eq!(generation, TpuGeneration::Tpu7x);
    assert_eq!("TPU7x".parse::<TpuGeneration>(), Ok(TpuGeneration::Tpu7x));
    assert_eq!(generation.to_string(), "tpu7x");
    let spec = generation.spec();
    assert_eq!(
        (spec.peak_bf16_flops, spec.peak_fp8_flops),
        (2307e12, 4614e12)
    );
    assert_eq!((spec.hbm_bytes, spec.hbm_bytes_per_s), (192 * GIB, 7.38e12));
    // Two TensorCores, two JAX devices, per chip; one device entity.
    assert_eq!(spec.cores_per_chip, 2);
    // 1.2 TB/s bidirectional per chip over 6 ports: 100 GB/s per link each
    // way.
    assert_eq!(spec.ici_ports, 6);
    assert_eq!(spec.ici_bytes_per_s, 100e9);
    assert_eq!(
        spec.ici_bytes_per_s * 2.0 * f64::from(spec.ici_ports),
        1.2e12
    );
    assert_eq!(
        (spec.chips_per_host(), spec.host_dram_bytes),
        (4, 960 * GIB)
    );
    assert_eq!(spec.dcn_host_bytes_per_s, 50e9);
    // A pod of 144 4x4x4 cubes, 9216 chips, that slices may fill.
    let ocs = spec.ocs.expect("TPU7x is built of cubes");
    assert_eq!((ocs.pod_cubes, ocs.ports_per_ocs), (144, 288));
    assert_eq!(ocs.pod_cubes * ocs.chips_per_cube(), spec.max_pod_chips);
    assert_eq!(spec.max_pod_chips, 9216);
    let shapes = &spec.slice_shapes;
    for offered in [
        [2, 2, 1],
        [2, 2, 2],
        [2, 4, 4],
        [4, 4, 4],
        [4, 8, 8],
        [16, 24, 24],
    ] {
        assert!(shapes.offers(offered), "{offered:?}");
    }
    // XPK's tpu7x-2 is one chip.
    assert!(shapes.offers([4, 4, 244]) && shapes.offers([12, 12, 36]) && shapes.offers([1, 1, 1]));
    for refused in [[2, 2, 3], [4, 4, 6], [1, 1, 2], [24, 24, 24], [4, 4, 260]] {
        assert!(!shapes.offers(refused), "{refused:?}");
    }
    assert!(spec.can_wrap(4) && spec.can_wrap(24) && !spec.can_wrap(2) && !spec.can_wrap(6));
    assert!(!spec.twisted_tori);
}

#[test]
fn generation_lists_name_every_generation() {
    assert_eq!(TpuGeneration::names(), "v2, v3, v4, v5e, v5p, v6e, tpu7x");
    assert_eq!(TpuGeneration::cube_built_names(), "v4, v5p and tpu7x");
    let error = "v7".parse::<TpuGeneration>().unwrap_err();
    assert!(error.to_string().ends_with("v6e, tpu7x)"), "{error}");
    let mut sorted = TpuGeneration::ALL;
    sorted.sort();
    assert_eq!(sorted, TpuGeneration::ALL, "oldest first");
}
