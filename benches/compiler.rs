//! Compiler benchmarks: the Adam update end to end (parse + all passes +
//! lowering), long elementwise chains (linear growth), a wide graph, and the
//! `Compile` schedule on every bundled program (`compiler::bundled/*`).
//!
//! `cargo bench --bench compiler -- --warm-up-time 1 --measurement-time 3`

use bevy_ecs::prelude::*;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::xla::{self, BinaryOp, DType, GraphBuilder, TensorType};

const ADAM: &str = include_str!("../assets/programs/adam.ron");

/// `y = op_i(y, c)` for `n` ops cycling through add, mul, max, sub.
fn chain(n: usize) -> (World, Entity) {
    let mut world = xla::compiler_world();
    let mut b = GraphBuilder::new(&mut world, "chain");
    let mut y = b.parameter(TensorType::new(DType::F32, [1024]));
    let c = b.scalar(DType::F32, 0.5);
    let ops = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Sub];
    for i in 0..n {
        y = b.binary(ops[i % ops.len()], y, c);
    }
    b.output(y);
    let p = b.finish();
    (world, p)
}

/// `width` parameters and `n / width` layers; node `(l, j)` combines nodes
/// `j` and `j + 1` of layer `l - 1`; the last layer is the output.
fn wide(n: usize, width: usize) -> (World, Entity) {
    let mut world = xla::compiler_world();
    let mut b = GraphBuilder::new(&mut world, "wide");
    let mut layer: Vec<Entity> = (0..width)
        .map(|_| b.parameter(TensorType::new(DType::F32, [256])))
        .collect();
    let ops = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Sub];
    for l in 0..n / width {
        layer = (0..width)
            .map(|j| b.binary(ops[(l + j) % ops.len()], layer[j], layer[(j + 1) % width]))
            .collect();
    }
    for &o in &layer {
        b.output(o);
    }
    let p = b.finish();
    (world, p)
}

fn compile(world_and_program: (World, Entity)) -> usize {
    let (mut world, p) = world_and_program;
    let r = xla::compile(&mut world, p).expect("compiles");
    r.kernels
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("compiler");
    g.sample_size(10);
    g.bench_function("adam_compile", |b| {
        b.iter(|| {
            xla::compile_program_str("adam", ADAM)
                .expect("compiles")
                .kernels
        })
    });
    let adam = xla::compile_program_str("adam", ADAM).expect("compiles");
    let args: Vec<Tensor> = adam
        .executable
        .parameters
        .iter()
        .map(|t| Tensor::from_f64s(t, &[0.5]).expect("splat"))
        .collect();
    g.bench_function("adam_execute_4096", |b| {
        b.iter(|| adam.executable.run(&args).expect("runs"))
    });
    for n in [10_000, 100_000] {
        g.bench_function(format!("chain_{n}"), |b| {
            b.iter_batched(|| chain(n), compile, BatchSize::PerIteration)
        });
    }
    g.bench_function("wide_40000", |b| {
        b.iter_batched(|| wide(40_000, 200), compile, BatchSize::PerIteration)
    });
    g.finish();
    bundled(c);
}

/// The `Compile` schedule alone on each bundled program: the program is
/// parsed and spawned into a fresh world outside the timed routine.
fn bundled(c: &mut Criterion) {
    use optirs_tpu::xla::backend::schedule_timing::BUNDLED_PROGRAMS;
    let mut g = c.benchmark_group("compiler::bundled");
    g.sample_size(20);
    for (file, text) in BUNDLED_PROGRAMS {
        let name = file.trim_end_matches(".ron");
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut world = xla::compiler_world();
                    let p = xla::load_program_str(&mut world, name, text).expect("parses");
                    (world, p)
                },
                compile,
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(compiler, benches);
criterion_main!(compiler);
