//! Cost analysis against hand counts (XLA's `HloCostAnalysis` rules), the
//! `compile --json` cost object, and invariants over random graphs.

use bevy_ecs::prelude::*;
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::xla::graph::program_nodes;
use optirs_tpu::xla::passes::cost_analysis::{KernelCost, NodeCost, ProgramCost, analyze};
use optirs_tpu::xla::passes::fusion::{Kernel, ProgramKernels};
use optirs_tpu::xla::passes::shape_inference::infer_type;
use optirs_tpu::xla::{
    self, BinaryOp, CompileOptions, ConvAttrs, DType, DotDims, GraphBuilder, Op, OpCost, Padding,
    ReduceKind, TensorType, UnaryOp,
};
use proptest::prelude::*;

#[path = "common/binary.rs"]
mod binary;
#[path = "common/prop.rs"]
mod support;
use support::cases;

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims.to_vec())
}

/// Builds a program with `build`, compiles it (fusion off when `fuse` is
/// false) and returns the world, the program and its cost.
fn compiled(fuse: bool, build: impl FnOnce(&mut GraphBuilder)) -> (World, Entity, ProgramCost) {
    let mut world = xla::compiler_world();
    if !fuse {
        CompileOptions {
            disabled_passes: vec!["fusion".into()],
            verify_each_pass: None,
        }
        .apply(&mut world)
        .unwrap();
    }
    let mut b = GraphBuilder::new(&mut world, "cost");
    build(&mut b);
    let p = b.finish();
    xla::compile(&mut world, p).unwrap();
    let cost = world
        .get::<ProgramCost>(p)
        .expect("cost-analysis ran")
        .clone();
    (world, p, cost)
}

fn node_sum(world: &World, p: Entity) -> OpCost {
    program_nodes(world, p)
        .iter()
        .map(|&n| world.get::<NodeCost>(n).expect("every node is costed").0)
        .sum()
}

#[test]
fn matmul_costs_two_m_k_n() {
    let (m, k, n) = (24usize, 40usize, 56usize);
    let (_, _, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[m, k]));
        let w = b.parameter(f32t(&[k, n]));
        let y = b.matmul(x, w);
        b.output(y);
    });
    let c = cost.totals;
    assert_eq!(c.flops, (2 * m * k * n) as u64, "2mkn = {}", 2 * m * k * n);
    assert_eq!(c.transcendentals, 0);
    assert_eq!(c.bytes_read, (4 * (m * k + k * n)) as u64);
    assert_eq!(c.bytes_written, (4 * m * n) as u64);
    assert_eq!(cost.kernels.len(), 1);
}

#[test]
fn batched_dot_general_counts_the_batch_in_the_result() {
    // [b, m, k] x [b, k, n] -> [b, m, n]: 2 * b * m * n * k flops.
    let (bt, m, k, n) = (3usize, 5usize, 7usize, 11usize);
    let (_, _, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[bt, m, k]));
        let w = b.parameter(f32t(&[bt, k, n]));
        let y = b.dot(
            x,
            w,
            DotDims {
                lhs_contracting: vec![2],
                rhs_contracting: vec![1],
                lhs_batch: vec![0],
                rhs_batch: vec![0],
            },
        );
        b.output(y);
    });
    assert_eq!(cost.totals.flops, (2 * bt * m * n * k) as u64);
    assert_eq!(cost.totals.bytes_written, (4 * bt * m * n) as u64);
}

#[test]
fn grouped_convolution_counts_input_features_per_group() {
    // Input [2, 4, 5, 5], kernel [6, 2, 3, 3], 2 groups, valid padding:
    // output [2, 6, 3, 3] = 108 elements, each 3*3 taps x 4/2 features.
    let (_, _, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[2, 4, 5, 5]));
        let w = b.parameter(f32t(&[6, 2, 3, 3]));
        let y = b.convolution(
            x,
            w,
            ConvAttrs {
                feature_groups: 2,
                ..Default::default()
            },
        );
        b.output(y);
    });
    assert_eq!(cost.totals.flops, 2 * 108 * 9 * 2);
    assert_eq!(cost.totals.bytes_read, 4 * (200 + 108));
    assert_eq!(cost.totals.bytes_written, 4 * 108);
}

#[test]
fn padded_strided_convolution_counts_only_taps_inside_the_input() {
    // Input [1, 1, 5, 5], kernel [1, 1, 3, 3], stride 2, pads (1, 1): output
    // 3x3. Per spatial dim, output o reads input 2o - 1 + t for t in 0..3:
    // o = 0 -> {-1, 0, 1}: 2 inside; o = 1 -> {1, 2, 3}: 3; o = 2 -> {3, 4, 5}: 2.
    // 7 valid pairs per dim, 49 in 2-D (81 counting the padding).
    let (_, _, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[1, 1, 5, 5]));
        let w = b.parameter(f32t(&[1, 1, 3, 3]));
        let y = b.convolution(
            x,
            w,
            ConvAttrs {
                stride: [2, 2],
                padding: Padding::Explicit(vec![(1, 1), (1, 1)]),
                ..Default::default()
            },
        );
        b.output(y);
    });
    assert_eq!(cost.totals.flops, 2 * 49);
}

#[test]
fn an_elementwise_chain_is_one_kernel_that_touches_only_its_boundary() {
    // x, y: f32[8, 16] (512 bytes each). a = x + y; b = a * x; c = -b; d = c - y.
    let (world, p, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[8, 16]));
        let y = b.parameter(f32t(&[8, 16]));
        let a = b.add(x, y);
        let m = b.mul(a, x);
        let c = b.unary(UnaryOp::Neg, m);
        let d = b.sub(c, y);
        b.output(d);
    });
    assert_eq!(cost.kernels.len(), 1, "the chain fuses into one loop");
    let k = cost.totals;
    assert_eq!(k.flops, 4 * 128, "four ops of 128 elements");
    assert_eq!(k.bytes_read, 512 + 512, "x and y, each read once");
    assert_eq!(k.bytes_written, 512, "only d leaves the kernel");
    let nodes = node_sum(&world, p);
    assert_eq!(nodes.flops, k.flops);
    // Unfused: add 1024+512, mul 1024+512, neg 512+512, sub 1024+512.
    assert_eq!(nodes.bytes_read, 1024 + 1024 + 512 + 1024);
    assert_eq!(nodes.bytes_written, 4 * 512);
    let kernel = world.get::<ProgramKernels>(p).unwrap().0[0];
    assert_eq!(world.get::<KernelCost>(kernel).unwrap().0, k);
}

#[test]
fn exp_and_tanh_are_transcendentals() {
    let (_, _, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[10, 10]));
        let e = b.unary(UnaryOp::Exp, x);
        let t = b.unary(UnaryOp::Tanh, e);
        let s = b.add(t, x);
        b.output(s);
    });
    assert_eq!(cost.totals.transcendentals, 200);
    assert_eq!(cost.totals.flops, 100, "only the add is a flop");
}

#[test]
fn reduce_counts_input_minus_output_elements() {
    let (_, _, sum) = compiled(true, |b| {
        let x = b.parameter(f32t(&[6, 10]));
        let r = b.reduce(x, ReduceKind::Sum, vec![1]);
        b.output(r);
    });
    assert_eq!(sum.totals.flops, 60 - 6);
    assert_eq!(sum.totals.bytes_read, 240);
    assert_eq!(sum.totals.bytes_written, 24);
    let (_, _, mean) = compiled(true, |b| {
        let x = b.parameter(f32t(&[6, 10]));
        let r = b.reduce(x, ReduceKind::Mean, vec![0, 1]);
        b.output(r);
    });
    assert_eq!(mean.totals.flops, 59 + 1, "59 adds and one divide");
}

#[test]
fn softmax_matches_the_hand_count() {
    // softmax over the rows of x: f32[4, 8] (32 elements, 128 bytes).
    //   m  = reduce_max(x, [1])      28 flops (32 - 4)
    //   mb = broadcast(m)             0
    //   s  = x - mb                  32 flops
    //   e  = exp(s)                  32 transcendentals
    //   z  = reduce_sum(e, [1])      28 flops
    //   zb = broadcast(z)             0
    //   y  = e / zb                  32 flops
    // flops 120, transcendentals 32. Kernels: max (reads x 128, writes m 16),
    // fusion {mb, s, e} (reads x 128 + m 16, writes e 128), sum (reads e 128,
    // writes z 16), fusion {zb, y} (reads e 128 + z 16, writes y 128):
    // 544 bytes read, 288 written.
    let (_, _, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[4, 8]));
        let m = b.reduce(x, ReduceKind::Max, vec![1]);
        let mb = b.broadcast(m, vec![4, 8], Some(vec![0]));
        let s = b.sub(x, mb);
        let e = b.unary(UnaryOp::Exp, s);
        let z = b.reduce(e, ReduceKind::Sum, vec![1]);
        let zb = b.broadcast(z, vec![4, 8], Some(vec![0]));
        let y = b.div(e, zb);
        b.output(y);
    });
    assert_eq!(cost.kernels.len(), 4);
    assert_eq!(cost.totals.flops, 120);
    assert_eq!(cost.totals.transcendentals, 32);
    assert_eq!(cost.totals.bytes_read, 544);
    assert_eq!(cost.totals.bytes_written, 288);
}

#[test]
fn analyze_before_fusion_costs_nodes_and_after_matches_the_pass() {
    let mut world = xla::compiler_world();
    let mut b = GraphBuilder::new(&mut world, "a");
    let x = b.parameter(f32t(&[16]));
    let e = b.unary(UnaryOp::Exp, x);
    let y = b.mul(e, x);
    b.output(y);
    let p = b.finish();
    assert!(
        analyze(&world, p)
            .unwrap_err()
            .to_string()
            .contains("shape inference"),
        "no types yet"
    );
    xla::compile(&mut world, p).unwrap();
    assert_eq!(
        analyze(&world, p).unwrap(),
        *world.get::<ProgramCost>(p).unwrap()
    );
}

#[test]
fn compile_json_reports_the_mlp_cost() {
    // mlp.ron: x f32[32,64], W1 [64,128], b1 [128], W2 [128,10], b2 [10].
    //   dot.0   2*32*64*128 = 524288 flops, reads x + W1 = 8192 + 32768 bytes
    //   fusion  broadcast b1, add, max: 2 * 4096 flops, reads h 16384 + b1 512
    //           + the scalar 0 (4), writes relu 16384
    //   dot.2   2*32*128*10 = 81920 flops, reads relu 16384 + W2 5120
    //   add     320 flops, reads logits 1280 + b2 40, writes 1280
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs/mlp.ron");
    let out = binary::optirs(&["compile", path, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cost = &v["cost"];
    assert_eq!(cost["flops"], 524288 + 8192 + 81920 + 320);
    assert_eq!(cost["transcendentals"], 0);
    assert_eq!(cost["bytes_read"], 40960 + 16900 + 21504 + 1320);
    assert_eq!(cost["bytes_written"], 16384 + 16384 + 1280 + 1280);
    let kernels = cost["kernels"].as_array().unwrap();
    assert_eq!(kernels.len(), v["kernels"].as_u64().unwrap() as usize);
    let dot = &kernels[0];
    assert_eq!(dot["flops"], 524288);
    let intensity = dot["arithmetic_intensity"].as_f64().unwrap();
    let expected = 524288.0 / (40960.0 + 16384.0);
    assert!(
        (intensity - expected).abs() < 1e-12,
        "{intensity} vs {expected}"
    );
    for k in kernels {
        for key in [
            "name",
            "flops",
            "transcendentals",
            "bytes_read",
            "bytes_written",
        ] {
            assert!(k.get(key).is_some(), "no `{key}` in {k}");
        }
    }
    let text = binary::optirs(&["compile", path]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(
            "cost: 614720 flops, 0 transcendentals, 80684 bytes read, 35328 bytes written"
        ),
        "{text}"
    );
}

/// One step of a random graph (operand picks are indices modulo the values so far).
#[derive(Debug, Clone)]
enum Step {
    Parameter(u8),
    Unary(u8, usize),
    Binary(u8, usize, usize),
    Reduce(u8, usize),
    Broadcast(usize),
    Dot(usize, usize),
    Slice(usize),
}

const SHAPES: [&[usize]; 3] = [&[], &[4], &[2, 4]];
const UNARY: [UnaryOp; 4] = [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Abs];
const BINARY: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Pow];
const REDUCE: [ReduceKind; 4] = [
    ReduceKind::Sum,
    ReduceKind::Max,
    ReduceKind::Min,
    ReduceKind::Mean,
];

fn step() -> impl Strategy<Value = Step> {
    let i = || 0usize..64;
    prop_oneof![
        1 => (0u8..3).prop_map(Step::Parameter),
        3 => (0u8..4, i()).prop_map(|(o, a)| Step::Unary(o, a)),
        5 => (0u8..4, i(), i()).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        1 => (0u8..4, i()).prop_map(|(k, a)| Step::Reduce(k, a)),
        1 => i().prop_map(Step::Broadcast),
        1 => (i(), i()).prop_map(|(a, b)| Step::Dot(a, b)),
        1 => i().prop_map(Step::Slice),
    ]
}

/// Builds the steps into `world`; steps whose types do not check are skipped.
fn build(world: &mut World, steps: &[Step], outputs: &[usize]) -> Entity {
    let mut b = GraphBuilder::new(world, "random");
    let first = f32t(&[2, 4]);
    let x = b.parameter(first.clone());
    let mut values: Vec<(Entity, TensorType)> = vec![(x, first)];
    for s in steps {
        let pick = |i: usize| values[i % values.len()].clone();
        let (op, operands) = match *s {
            Step::Parameter(sh) => {
                let t = f32t(SHAPES[sh as usize]);
                let e = b.parameter(t.clone());
                values.push((e, t));
                continue;
            }
            Step::Unary(o, a) => (Op::Unary(UNARY[o as usize]), vec![pick(a)]),
            Step::Binary(o, a, c) => (Op::Binary(BINARY[o as usize]), vec![pick(a), pick(c)]),
            Step::Reduce(k, a) => {
                let v = pick(a);
                let dims = if v.1.rank() == 0 { vec![] } else { vec![0] };
                let kind = REDUCE[k as usize];
                (Op::Reduce { kind, dims }, vec![v])
            }
            Step::Broadcast(a) => (
                Op::Broadcast {
                    shape: vec![2, 4],
                    dims: None,
                },
                vec![pick(a)],
            ),
            Step::Dot(a, c) => (
                Op::Dot(DotDims {
                    lhs_contracting: vec![1],
                    rhs_contracting: vec![0],
                    ..Default::default()
                }),
                vec![pick(a), pick(c)],
            ),
            Step::Slice(a) => {
                let v = pick(a);
                let n = v.1.rank();
                let op = Op::Slice {
                    start: vec![0; n],
                    limit: v.1.dims.clone(),
                    stride: vec![2; n],
                };
                (op, vec![v])
            }
        };
        let types: Vec<&TensorType> = operands.iter().map(|o| &o.1).collect();
        let Ok(t) = infer_type(&op, &types, None, None) else {
            continue;
        };
        let ents: Vec<Entity> = operands.iter().map(|o| o.0).collect();
        let e = b.node_named(None, op, &ents, None, None);
        values.push((e, t));
    }
    for &o in outputs {
        let v = values[o % values.len()].0;
        b.output(v);
    }
    if outputs.is_empty() {
        let v = values.last().unwrap().0;
        b.output(v);
    }
    b.finish()
}

fn compile_random(steps: &[Step], outputs: &[usize], fuse: bool) -> (World, Entity, ProgramCost) {
    let mut world = xla::compiler_world();
    if !fuse {
        CompileOptions {
            disabled_passes: vec!["fusion".into()],
            verify_each_pass: None,
        }
        .apply(&mut world)
        .unwrap();
    }
    let p = build(&mut world, steps, outputs);
    xla::compile(&mut world, p).unwrap();
    let cost = world.get::<ProgramCost>(p).unwrap().clone();
    (world, p, cost)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]

    #[test]
    fn costs_add_up_and_fusion_only_saves_bytes(
        steps in proptest::collection::vec(step(), 1..32),
        outputs in proptest::collection::vec(0usize..64, 0..3),
    ) {
        let (world, p, fused) = compile_random(&steps, &outputs, true);
        let nodes = node_sum(&world, p);
        prop_assert_eq!(fused.totals.flops, nodes.flops);
        prop_assert_eq!(fused.totals.transcendentals, nodes.transcendentals);
        for &(k, cost) in &fused.kernels {
            let kernel = world.get::<Kernel>(k).unwrap();
            let members: OpCost = kernel
                .members
                .iter()
                .map(|&m| world.get::<NodeCost>(m).unwrap().0)
                .sum();
            prop_assert_eq!(cost.flops, members.flops);
            prop_assert!(cost.bytes_read <= members.bytes_read, "{cost:?} vs {members:?}");
            prop_assert!(cost.bytes_written <= members.bytes_written, "{cost:?} vs {members:?}");
        }
        prop_assert!(fused.totals.bytes_accessed() <= nodes.bytes_accessed());

        let (world_u, pu, unfused) = compile_random(&steps, &outputs, false);
        prop_assert_eq!(unfused.totals.flops, fused.totals.flops, "fusion changed the flops");
        prop_assert_eq!(unfused.totals.transcendentals, fused.totals.transcendentals);
        prop_assert_eq!(unfused.totals, node_sum(&world_u, pu), "unfused bytes are the nodes' bytes");
        prop_assert!(fused.totals.bytes_accessed() <= unfused.totals.bytes_accessed());
    }
}

#[test]
fn constants_cost_nothing_until_read() {
    let (world, p, cost) = compiled(true, |b| {
        let x = b.parameter(f32t(&[4]));
        let c = b.constant(Tensor::from_f64s(&f32t(&[4]), &[1.0, 2.0, 3.0, 4.0]).unwrap());
        let y = b.mul(x, c);
        b.output(y);
    });
    assert_eq!(cost.totals.bytes_read, 32, "x and c, 16 bytes each");
    for n in program_nodes(&world, p) {
        let op = &world.get::<xla::graph::Node>(n).unwrap().op;
        if matches!(op, Op::Constant | Op::Parameter { .. }) {
            assert_eq!(world.get::<NodeCost>(n).unwrap().0, OpCost::default());
        }
    }
}

#[test]
fn adam_is_thirteen_flops_and_one_sqrt_per_element() {
    // adam.ron, n = 4096: m' (3 ops), g², v' (3 more), m̂, v̂, sqrt, + eps,
    // ratio, × lr, p − step: 13 flops and 1 transcendental per element;
    // scalars: two pows (transcendentals), 1 − b1^t and 1 − b2^t (2 flops).
    // One fused kernel reads p, g, m, v (4 × 16384), t and 7 scalar
    // constants (32 bytes) and writes p', m', v' (3 × 16384).
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs/adam.ron");
    let r = xla::compile_program_file(path.as_ref()).unwrap();
    let c = r.cost.totals;
    assert_eq!(c.flops, 13 * 4096 + 2);
    assert_eq!(c.transcendentals, 4096 + 2);
    assert_eq!(c.bytes_read, 4 * 16384 + 32);
    assert_eq!(c.bytes_written, 3 * 16384);
    assert_eq!(r.cost.kernels.len(), 1);
    assert!(
        r.to_string()
            .contains("cost: 53250 flops, 4098 transcendentals")
    );
}
