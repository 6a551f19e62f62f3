//! Native fused loops (`exec::native`, through `exec::runtime::Runtime`)
//! against the chunk interpreter and the reference evaluator: random
//! elementwise bodies of the native op set over `f32` and `f64` values
//! (converted into each other), lengths that leave every tail,
//! and inputs full of the values where float semantics differ (NaN, ±0,
//! ±inf, subnormals).

use bevy_ecs::prelude::*;
use ndarray::{ArrayD, IxDyn};
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::exec::runtime::{Arg, NoCustomCalls, RunOutput, Runtime};
use optirs_tpu::xla::{self, BinaryOp, CompareDir, DType, GraphBuilder, Op, TensorType, UnaryOp};
use proptest::prelude::*;

#[path = "common/prop.rs"]
mod support;
use support::{cases, random_tensors};

const UNARY: [UnaryOp; 7] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Sign,
];
const BINARY: [BinaryOp; 6] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
];
const DIRS: [CompareDir; 6] = [
    CompareDir::Lt,
    CompareDir::Le,
    CompareDir::Gt,
    CompareDir::Ge,
    CompareDir::Eq,
    CompareDir::Ne,
];
/// Values where the kernels' rules matter: NaN, signed zeros, infinities,
/// a subnormal, ties for floor/ceil and ordinary numbers.
const SPECIAL: [f64; 14] = [
    f64::NAN,
    0.0,
    -0.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1e-40,
    -2.5,
    2.5,
    1.0,
    -1.0,
    3.0,
    0.75,
    -1e30,
    7.25,
];

#[derive(Debug, Clone)]
enum Step {
    Parameter(bool),
    Scalar(usize),
    Unary(usize, usize),
    Binary(usize, usize, usize),
    Select(usize, usize, usize, usize, usize),
    Not(usize, usize, usize, usize, usize),
    AndOr(bool, usize, usize, usize, usize, usize, usize),
    /// Converts a value of this pool to the other float type.
    Convert(usize),
}

/// A step on one of the two float pools (`true`: the recipe's dtype).
type PoolStep = (bool, Step);

fn step() -> impl Strategy<Value = PoolStep> {
    let i = || 0usize..64;
    let op = prop_oneof![
        1 => any::<bool>().prop_map(Step::Parameter),
        1 => (0usize..SPECIAL.len()).prop_map(Step::Scalar),
        3 => (0usize..UNARY.len(), i()).prop_map(|(o, a)| Step::Unary(o, a)),
        6 => (0usize..BINARY.len(), i(), i()).prop_map(|(o, a, b)| Step::Binary(o, a, b)),
        1 => (0usize..DIRS.len(), i(), i(), i(), i())
            .prop_map(|(c, a, b, t, f)| Step::Select(c, a, b, t, f)),
        1 => (0usize..DIRS.len(), i(), i(), i(), i())
            .prop_map(|(c, a, b, t, f)| Step::Not(c, a, b, t, f)),
        1 => (any::<bool>(), 0usize..DIRS.len(), i(), i(), i(), i(), i())
            .prop_map(|(and, c, a, b, d, t, f)| Step::AndOr(and, c, a, b, d, t, f)),
        2 => i().prop_map(Step::Convert),
    ];
    // Mostly the main pool, so most bodies are one type with some mixing.
    (prop::bool::weighted(0.75), op)
}

#[derive(Debug, Clone)]
struct Recipe {
    dtype: DType,
    len: usize,
    steps: Vec<PoolStep>,
    outputs: Vec<(bool, usize)>,
}

fn recipe() -> impl Strategy<Value = Recipe> {
    (
        prop_oneof![Just(DType::F32), Just(DType::F64)],
        1usize..70,
        proptest::collection::vec(step(), 1..30),
        proptest::collection::vec((any::<bool>(), 0usize..64), 1..4),
    )
        .prop_map(|(dtype, len, steps, outputs)| Recipe {
            dtype,
            len,
            steps,
            outputs,
        })
}

/// One float type's values: all of them (loop-shaped and scalar) and the
/// loop-shaped ones.
#[derive(Default)]
struct Pool {
    values: Vec<Entity>,
    loop_values: Vec<Entity>,
}

/// Builds the recipe over two pools, the recipe's dtype and the other
/// float type: values of the loop shape (parameters and results) and
/// scalar constants; every result is elementwise.
fn build(world: &mut World, r: &Recipe) -> (Entity, Vec<TensorType>) {
    let other = if r.dtype == DType::F32 {
        DType::F64
    } else {
        DType::F32
    };
    let mut b = GraphBuilder::new(world, "native");
    let mut params = Vec::new();
    let mut pools = [Pool::default(), Pool::default()];
    for (k, dtype) in [r.dtype, other].into_iter().enumerate() {
        let full = TensorType::new(dtype, [r.len]);
        let e = b.parameter(full.clone());
        params.push(full);
        pools[k].values.push(e);
        pools[k].loop_values.push(e);
    }
    for (main, s) in &r.steps {
        let k = usize::from(!main);
        let dtype = [r.dtype, other][k];
        let pool = &pools[k];
        let pick = |i: usize| pool.values[i % pool.values.len()];
        let pick_loop = |i: usize| pool.loop_values[i % pool.loop_values.len()];
        let (into, v) = match *s {
            Step::Parameter(scalar) => {
                let t = if scalar {
                    TensorType::new(dtype, Vec::<usize>::new())
                } else {
                    TensorType::new(dtype, [r.len])
                };
                params.push(t.clone());
                let e = b.parameter(t);
                pools[k].values.push(e);
                if !scalar {
                    pools[k].loop_values.push(e);
                }
                continue;
            }
            Step::Scalar(c) => {
                let t = TensorType::new(dtype, Vec::<usize>::new());
                let e = b.constant(Tensor::from_f64s(&t, &[SPECIAL[c]]).unwrap());
                pools[k].values.push(e);
                continue;
            }
            Step::Unary(o, a) => (k, b.unary(UNARY[o], pick_loop(a))),
            Step::Binary(o, a, c) => (k, b.binary(BINARY[o], pick_loop(a), pick(c))),
            Step::Select(c, a, d, t, f) => {
                let p = b.compare(DIRS[c], pick_loop(a), pick(d));
                (k, b.select(p, pick_loop(t), pick_loop(f)))
            }
            Step::Not(c, a, d, t, f) => {
                let p = b.compare(DIRS[c], pick_loop(a), pick(d));
                let n = b.unary(UnaryOp::Not, p);
                (k, b.select(n, pick_loop(t), pick_loop(f)))
            }
            Step::AndOr(and, c, a, d, e, t, f) => {
                let p = b.compare(DIRS[c], pick_loop(a), pick(d));
                let q = b.compare(DIRS[(c + 1) % DIRS.len()], pick_loop(e), pick(a));
                let op = if and { BinaryOp::And } else { BinaryOp::Or };
                let pq = b.binary(op, p, q);
                (k, b.select(pq, pick_loop(t), pick_loop(f)))
            }
            Step::Convert(a) => (
                1 - k,
                b.node(Op::Convert([r.dtype, other][1 - k]), &[pick_loop(a)]),
            ),
        };
        pools[into].values.push(v);
        pools[into].loop_values.push(v);
    }
    for &(main, o) in &r.outputs {
        let pool = &pools[usize::from(!main)];
        b.output(pool.loop_values[o % pool.loop_values.len()]);
    }
    (b.finish(), params)
}

fn args_for(types: &[TensorType], seed: u64) -> Vec<Tensor> {
    random_tensors(types, seed, |_, r| {
        SPECIAL[(r % SPECIAL.len() as u64) as usize]
    })
}

/// Bit-for-bit equal, except that any two NaNs match (which NaN an
/// operation returns when both operands are NaN depends on operand order,
/// which IEEE 754 leaves open and compilers may swap).
fn same(a: &Tensor, b: &Tensor) -> bool {
    fn close<T: Copy + PartialEq>(
        a: &ArrayD<T>,
        b: &ArrayD<T>,
        bits: impl Fn(T) -> (u64, bool),
    ) -> bool {
        a.shape() == b.shape()
            && a.iter().zip(b.iter()).all(|(&x, &y)| {
                let ((xb, xn), (yb, yn)) = (bits(x), bits(y));
                xb == yb || (xn && yn)
            })
    }
    match (a, b) {
        (Tensor::F32(x), Tensor::F32(y)) => close(x, y, |v| (u64::from(v.to_bits()), v.is_nan())),
        (Tensor::F64(x), Tensor::F64(y)) => close(x, y, |v| (v.to_bits(), v.is_nan())),
        _ => a.bitwise_eq(b),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(128), ..ProptestConfig::default() })]

    #[test]
    fn native_loops_match_the_interpreter_bit_for_bit(r in recipe(), seed in any::<u64>()) {
        let mut world = xla::compiler_world();
        let (p, params) = build(&mut world, &r);
        let report = xla::compile(&mut world, p).unwrap();
        let args = args_for(&params, seed);
        let runtime = Runtime::new(report.executable.clone());
        for (k, native) in runtime.native_loops().iter().enumerate() {
            if let Some(native) = native {
                prop_assert!(native.is_ok(), "kernel {k} interpreted: {native:?}");
            }
        }
        let interpreted = runtime.clone().with_native_code(false);
        let got = runtime.run_tensors(&args, &mut NoCustomCalls).unwrap();
        let want = interpreted.run_tensors(&args, &mut NoCustomCalls).unwrap();
        let reference = report.executable.run(&args).unwrap();
        prop_assert_eq!(got.len(), want.len());
        for ((g, w), e) in got.iter().zip(&want).zip(&reference) {
            prop_assert!(same(g, w), "native {g:?}\ninterpreted {w:?}");
            prop_assert!(same(g, e), "native {g:?}\nreference {e:?}");
        }
        // Owned arguments: outputs may be written over their inputs.
        let outs = runtime
            .run(args.iter().cloned().map(Arg::owned).collect(), &mut NoCustomCalls)
            .unwrap();
        for (o, w) in outs.into_iter().zip(&want) {
            match o {
                RunOutput::Owned(t) => prop_assert!(same(&t, w)),
                RunOutput::InArgument(i) => prop_assert!(same(&args[i], w)),
            }
        }
    }
}

/// Compiles `ops` applied to one `f32[n]` parameter.
fn one_body(n: usize, build_ops: impl FnOnce(&mut GraphBuilder<'_>, Entity) -> Entity) -> Runtime {
    let mut world = xla::compiler_world();
    let mut b = GraphBuilder::new(&mut world, "body");
    let x = b.parameter(TensorType::new(DType::F32, [n]));
    let y = build_ops(&mut b, x);
    b.output(y);
    let p = b.finish();
    Runtime::new(xla::compile(&mut world, p).unwrap().executable)
}

#[test]
fn the_bundled_adam_program_runs_as_one_native_loop() {
    let report =
        xla::compile_program_file(std::path::Path::new("assets/programs/adam.ron")).unwrap();
    let runtime = Runtime::new(report.executable);
    assert_eq!(runtime.native_loops(), vec![Some(Ok(()))]);
}

#[test]
fn a_body_outside_the_native_set_is_interpreted_with_the_reason() {
    let runtime = one_body(100, |b, x| {
        let e = b.unary(UnaryOp::Exp, x);
        b.binary(BinaryOp::Add, e, x)
    });
    let loops = runtime.native_loops();
    assert_eq!(loops.len(), 1);
    let why = loops[0].clone().unwrap().unwrap_err();
    assert!(why.contains("exp"), "{why}");
    // And it still runs, through the interpreter.
    let arg = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[100]), vec![0.5f32; 100]).unwrap());
    let out = runtime.run_tensors(&[arg], &mut NoCustomCalls).unwrap();
    let want = 0.5f32.exp() + 0.5;
    assert!(out[0].is_all(f64::from(want)));
}

#[test]
fn max_and_min_keep_the_kernels_rules_for_nan_and_signed_zero() {
    let runtime = one_body(8, |b, x| {
        let zero = b.constant(Tensor::F32(ArrayD::from_elem(IxDyn(&[]), 0.0f32)));
        let m = b.binary(BinaryOp::Max, x, zero);
        b.binary(BinaryOp::Min, m, x)
    });
    assert_eq!(runtime.native_loops(), vec![Some(Ok(()))]);
    let xs = [
        f32::NAN,
        -0.0,
        0.0,
        -3.0,
        3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-40,
    ];
    let arg = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[8]), xs.to_vec()).unwrap());
    let native = runtime
        .run_tensors(std::slice::from_ref(&arg), &mut NoCustomCalls)
        .unwrap();
    let interpreted = runtime
        .clone()
        .with_native_code(false)
        .run_tensors(&[arg], &mut NoCustomCalls)
        .unwrap();
    assert!(
        native[0].bitwise_eq(&interpreted[0]),
        "{native:?} vs {interpreted:?}"
    );
}

/// `f32` inputs where `rsqrt`'s special cases live: zeros, infinities,
/// NaNs (quiet and signalling, both signs, with payloads), negatives,
/// subnormals and the ends of the normal range.
const RSQRT_SPECIAL: [u32; 16] = [
    0x0000_0000,
    0x8000_0000,
    0x7f80_0000,
    0xff80_0000,
    0x7fc0_0000,
    0x7fc1_2345,
    0x7f80_0001,
    0xffc0_0001,
    0xbf80_0000,
    0x8000_0001,
    0x0000_0001,
    0x007f_ffff,
    0x0080_0000,
    0x7f7f_ffff,
    0x3f80_0001,
    0x407f_ffff,
];

/// Runs the compiled `rsqrt` (native, `f32x4` and the scalar tail) over
/// `xs` and checks every result against [`FloatElement::rsqrt`], the
/// correctly rounded `1 / sqrt` (NaNs match any NaN).
fn check_rsqrt(xs: Vec<f32>) {
    use optirs_tpu::optimizers::FloatElement;
    let n = xs.len();
    let runtime = one_body(n, |b, x| b.unary(UnaryOp::Rsqrt, x));
    assert_eq!(runtime.native_loops(), vec![Some(Ok(()))]);
    let arg = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[n]), xs).unwrap());
    let out = runtime
        .run_tensors(std::slice::from_ref(&arg), &mut NoCustomCalls)
        .unwrap();
    let (Tensor::F32(xs), Tensor::F32(ys)) = (&arg, &out[0]) else {
        panic!("rsqrt of f32 is f32");
    };
    let wrong: Vec<(u32, u32, u32)> = xs
        .iter()
        .zip(ys.iter())
        .filter_map(|(&x, &y)| {
            let want = x.rsqrt();
            (y.to_bits() != want.to_bits() && !(y.is_nan() && want.is_nan()))
                .then(|| (x.to_bits(), y.to_bits(), want.to_bits()))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {n} wrong, first (x, got, want): {:08x?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
}

/// Every finite `f32` is `4^k · m` with `m` in [1, 4), and `rsqrt(4^k · m)`
/// is `2^-k · rsqrt(m)` in every rounding step of the native sequence, so
/// [1, 4) (2^24 inputs) is the whole domain of finite values; the special
/// values are run at both ends, in vector lanes and in the scalar tail.
#[test]
fn native_rsqrt_is_correctly_rounded_for_every_f32_in_one_to_four() {
    let specials = RSQRT_SPECIAL.map(f32::from_bits);
    let xs: Vec<f32> = specials
        .iter()
        .copied()
        .chain((0x3f80_0000u32..0x4080_0000).map(f32::from_bits))
        .chain(specials.iter().copied().take(7))
        .collect();
    check_rsqrt(xs);
}

/// All 2^32 `f32` bit patterns, 2^24 at a time (about a minute).
#[test]
#[ignore = "exhaustive; run with --ignored"]
fn rsqrt_f32x4_matches_every_f32() {
    for high in 0u32..256 {
        let start = high << 24;
        check_rsqrt((start..=start | 0x00ff_ffff).map(f32::from_bits).collect());
    }
}

/// Every optimizer's compiled update is one native loop, in `f32` and
/// `f64`.
#[test]
fn every_optimizer_update_runs_as_native_code() {
    use optirs_tpu::optimizers::{Adagrad, Adam, AdamW, Momentum, Nesterov, RMSProp, SGD};
    use optirs_tpu::optimizers::{FloatElement, UpdateRule};
    use optirs_tpu::tpu::graph::build_update_graph;

    fn check<A: FloatElement + optirs_tpu::exec::runtime::Element>(
        rules: Vec<Box<dyn UpdateRule<A>>>,
    ) {
        for rule in rules {
            let mut world = xla::compiler_world();
            let program = build_update_graph(&mut world, rule.as_ref(), &[1000]).unwrap();
            let exe = xla::compile(&mut world, program).unwrap().executable;
            let loops = Runtime::new(exe).native_loops();
            assert!(
                loops.iter().flatten().count() >= 1 && loops.iter().flatten().all(Result::is_ok),
                "{}: {loops:?}",
                rule.update_kind()
            );
        }
    }
    check::<f32>(vec![
        Box::new(SGD::new(0.1)),
        Box::new(Momentum::new(0.1, 0.9)),
        Box::new(Nesterov::new(0.1, 0.9)),
        Box::new(Adam::new(0.1)),
        Box::new(AdamW::new(0.1, 0.01)),
        Box::new(RMSProp::new(0.1)),
        Box::new(Adagrad::new(0.1)),
    ]);
    check::<f64>(vec![Box::new(Adam::new(0.1)), Box::new(RMSProp::new(0.1))]);
}
