//! End-to-end: the bundled programs compile, match the reference
//! interpreter, and bad programs are rejected with errors naming the node.

use std::path::Path;

use optirs_tpu::exec::kernels::Tensor;
use optirs_tpu::xla::{self, CompileError, TensorType, interpreter::interpret};

const PROGRAMS: &[&str] = &["adam", "mlp", "conv_block", "cse_fold"];

fn asset(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("assets/programs/{name}.ron"));
    std::fs::read_to_string(path).unwrap()
}

/// Deterministic values in [0.05, 1.05) (positive, so Adam's v is valid).
fn inputs(types: &[TensorType], seed: u64) -> Vec<Tensor> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    types
        .iter()
        .map(|t| {
            let values: Vec<f64> = (0..t.element_count())
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    0.05 + (state >> 11) as f64 / (1u64 << 53) as f64
                })
                .collect();
            Tensor::from_f64s(t, &values).unwrap()
        })
        .collect()
}

fn compile_and_compare(name: &str) -> xla::CompileReport {
    // Oracle: interpret the program as written, in its own world.
    let mut world = xla::compiler_world();
    let p = xla::load_program_str(&mut world, name, &asset(name)).unwrap();
    let report = xla::compile_program_str(name, &asset(name)).unwrap();
    let args = inputs(&report.executable.parameters, 7);
    let expected = interpret(&world, p, &args).unwrap();
    let got = report.executable.run(&args).unwrap();
    assert_eq!(expected.len(), got.len());
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        assert!(e.approx_eq(g, 1e-6), "{name}: output {i} differs");
    }
    report
}

#[test]
fn bundled_programs_match_the_interpreter_and_plan_memory_tightly() {
    for name in PROGRAMS {
        let r = compile_and_compare(name);
        let m = &r.memory;
        assert!(
            m.peak_bytes as f64 <= 1.05 * m.lower_bound_bytes as f64,
            "{name}: peak {} vs lower bound {}",
            m.peak_bytes,
            m.lower_bound_bytes
        );
        assert_eq!(m.fragmentation_bytes, m.peak_bytes - m.lower_bound_bytes);
    }
}

#[test]
fn adam_is_one_kernel_reading_each_input_once() {
    let r = compile_and_compare("adam");
    assert_eq!(r.kernels, 1, "{r}");
    let k = &r.executable.kernels[0];
    let mut reads = k.inputs.clone();
    reads.sort_by_key(|r| format!("{r:?}"));
    reads.dedup();
    assert_eq!(reads.len(), k.inputs.len(), "each input is read once");
    assert_eq!(
        k.outputs.len(),
        3,
        "p', m' and v' come out of the same kernel"
    );
    assert_eq!(r.memory.in_place, 3, "p', m' and v' overwrite p, m and v");
    assert_eq!(
        k.loop_shape.as_deref(),
        Some(&[4096][..]),
        "one fused loop over the parameter"
    );
    let args = inputs(&r.executable.parameters, 3);
    let whole = r.executable.run(&args).unwrap();
    let mut chunked = (*r.executable).clone();
    chunked.loop_chunk = 1000;
    assert_eq!(
        chunked.run(&args).unwrap(),
        whole,
        "chunking never changes a bit"
    );
    assert!(r.fusion_refusals.is_empty());
}

#[test]
fn cse_fold_program_simplifies() {
    let r = compile_and_compare("cse_fold");
    let row = |n: &str| r.passes.iter().find(|p| p.name == n).unwrap().clone();
    for pass in ["constant-folding", "algebraic-simplifier", "cse", "dce"] {
        assert!(row(pass).changed, "{pass} should change cse_fold");
    }
    // What is left: x, the folded scalars, a*2 (mul), the kept `+ 0.0`, scaled.
    assert!(row("dce").nodes_after <= 9, "{r}");
    assert_eq!(r.kernels, 1);
}

#[test]
fn json_has_exactly_the_documented_keys() {
    let r = xla::compile_program_str("mlp", &asset("mlp")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let mut keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        ["cost", "fusion_refusals", "kernels", "memory", "passes"]
    );
    let pass = v["passes"][0].as_object().unwrap();
    let mut pk: Vec<&String> = pass.keys().collect();
    pk.sort();
    assert_eq!(
        pk,
        ["changed", "micros", "name", "nodes_after", "nodes_before"]
    );
    let mut mk: Vec<&String> = v["memory"].as_object().unwrap().keys().collect();
    mk.sort();
    assert_eq!(
        mk,
        ["fragmentation_bytes", "lower_bound_bytes", "peak_bytes"]
    );
    assert!(v["fusion_refusals"][0]["reason"].is_string());
    assert_eq!(v["kernels"], 4);
    let names: Vec<&str> = v["passes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "verify",
            "shape-inference",
            "constant-folding",
            "algebraic-simplifier",
            "cse",
            "dce",
            "fusion",
            "cost-analysis",
            "ordering",
            "memory-plan",
            "lower"
        ]
    );
    let text = r.to_string();
    assert!(
        text.contains("fusion refusals: ") && text.contains("lower bound"),
        "{text}"
    );
    assert!(r.to_dot().starts_with("digraph \"mlp\""));
}

fn compile_err(text: &str) -> String {
    match xla::compile_program_str("bad.ron", text) {
        Err(e) => e.to_string(),
        Ok(r) => panic!("expected an error, got\n{r}"),
    }
}

#[test]
fn bad_programs_name_the_node() {
    let shape = compile_err(
        r#"(name: "b", nodes: [
            (name: "x", op: "parameter", ty: "f32[8,128]"),
            (name: "y", op: "parameter", ty: "f32[4]"),
            (name: "s", op: "add", operands: ["x", "y"]),
        ], outputs: ["s"])"#,
    );
    assert_eq!(
        shape,
        "node %s = add(f32[8,128], f32[4]): operand shapes [8, 128] and [4] do not broadcast"
    );
    let unknown =
        compile_err(r#"(name: "b", nodes: [(name: "q", op: "softmax")], outputs: ["q"])"#);
    assert!(
        unknown.starts_with("node %q: unknown op `softmax`; known ops: parameter"),
        "{unknown}"
    );
    let dangling =
        compile_err(r#"(name: "b", nodes: [(name: "q", op: "neg", operands: ["nope"])])"#);
    assert_eq!(
        dangling,
        "node %q: operand `nope` is not defined (dangling operand)"
    );
    let cycle = compile_err(
        r#"(name: "b", nodes: [
            (name: "x", op: "parameter", ty: "f32[2]"),
            (name: "a", op: "add", operands: ["x", "c"]),
            (name: "c", op: "neg", operands: ["a"]),
        ], outputs: ["c"])"#,
    );
    assert!(
        cycle.contains("is on a cycle: %a -> %c -> %a")
            || cycle.contains("is on a cycle: %c -> %a -> %c"),
        "{cycle}"
    );
    let arity = compile_err(
        r#"(name: "b", nodes: [(name: "x", op: "parameter", ty: "f32[2]"), (name: "n", op: "neg", operands: ["x", "x"])], outputs: ["n"])"#,
    );
    assert!(
        arity.contains("node %n: neg takes 1 operand, got 2"),
        "{arity}"
    );
    let ron = compile_err(
        "(name: \"b\",\n nodes: [\n (name: \"x\", op: \"parameter\", ty: \"f32[2]\", bogus: 1)])",
    );
    assert!(ron.starts_with("bad.ron:3:"), "{ron}");
    assert!(ron.contains("nodes[0]"), "{ron}");
    let ty = compile_err(r#"(name: "b", nodes: [(name: "x", op: "parameter", ty: "f32[2")])"#);
    assert!(
        ty.starts_with("node %x: `f32[2` is not a tensor type"),
        "{ty}"
    );
}

#[test]
fn missing_file_is_an_io_error() {
    let err = xla::compile_program_file(Path::new("/nonexistent/p.ron")).unwrap_err();
    assert!(matches!(err, CompileError::Read(_)), "{err}");
}

#[test]
fn a_program_without_outputs_is_left_intact_and_reported() {
    let r = xla::compile_program_str(
        "n",
        r#"(name: "n", nodes: [(name: "x", op: "parameter", ty: "f32[2]"), (name: "e", op: "exp", operands: ["x"])])"#,
    )
    .unwrap();
    let dce = r.passes.iter().find(|p| p.name == "dce").unwrap();
    assert!(!dce.changed);
    assert_eq!(dce.nodes_after, 2);
    assert!(
        r.to_string()
            .contains("no declared outputs: graph left intact")
    );
}

#[test]
fn reports_render_for_every_bundled_program() {
    for name in PROGRAMS {
        let r = xla::compile_program_str(name, &asset(name)).unwrap();
        let text = r.to_string();
        assert!(text.starts_with(&format!("program `{name}`")));
        if std::env::var_os("SHOW_REPORTS").is_some() {
            println!("{text}\n{}", r.to_json());
        }
    }
}

#[test]
fn recompiling_a_program_replaces_its_artifacts() {
    use optirs_tpu::xla::graph::PendingCompile;
    use optirs_tpu::xla::passes::fusion::Kernel;
    use optirs_tpu::xla::passes::memory_plan::Buffer;
    let mut world = xla::compiler_world();
    let p = xla::load_program_str(&mut world, "mlp", &asset("mlp")).unwrap();
    let first = xla::compile(&mut world, p).unwrap();
    world.entity_mut(p).insert(PendingCompile);
    let second = xla::compile(&mut world, p).unwrap();
    assert_eq!(first.kernels, second.kernels);
    assert_eq!(
        second.passes.len(),
        first.passes.len(),
        "the pass log starts over"
    );
    assert_eq!(
        world.query::<&Kernel>().iter(&world).count(),
        second.kernels
    );
    assert_eq!(
        world.query::<&Buffer>().iter(&world).count(),
        second.buffers.len()
    );
}

#[test]
fn many_programs_share_one_world() {
    let mut world = xla::compiler_world();
    let programs: Vec<_> = PROGRAMS
        .iter()
        .map(|n| xla::load_program_str(&mut world, n, &asset(n)).unwrap())
        .collect();
    world.run_schedule(optirs_tpu::schedule::Compile);
    let kernels: Vec<usize> = programs
        .iter()
        .map(|&p| xla::report_for(&mut world, p).unwrap().kernels)
        .collect();
    assert_eq!(kernels, [1, 4, 5, 1]);
}

#[test]
fn optional_passes_can_be_disabled_by_name() {
    let options = xla::CompileOptions {
        disabled_passes: vec!["cse".into(), "constant-folding".into()],
        verify_each_pass: None,
    };
    let r = xla::compile_program_str_with("cse_fold", &asset("cse_fold"), &options).unwrap();
    let cse = r.passes.iter().find(|p| p.name == "cse").unwrap();
    assert!(!cse.changed && cse.note.as_deref() == Some("disabled"));
    let bad = xla::CompileOptions {
        disabled_passes: vec!["verify".into()],
        verify_each_pass: None,
    };
    let err = xla::compile_program_str_with("cse_fold", &asset("cse_fold"), &bad)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "pass `verify` cannot be disabled; optional passes: constant-folding, algebraic-simplifier, cse, dce, fusion"
    );
}

#[test]
fn dce_keeps_an_unused_custom_call() {
    // 10 nodes: the custom call and its operand are unused but must stay,
    // as CSE already treats custom calls as possibly side-effecting.
    let text = r#"(name: "cc", nodes: [
        (name: "x", op: "parameter", ty: "f32[4]"),
        (name: "two", op: "constant", ty: "f32[]", value: [2.0]),
        (name: "a", op: "mul", operands: ["x", "two"]),
        (name: "b", op: "add", operands: ["a", "x"]),
        (name: "c", op: "neg", operands: ["b"]),
        (name: "d", op: "exp", operands: ["c"]),
        (name: "e", op: "add", operands: ["d", "x"]),
        (name: "arg", op: "abs", operands: ["x"]),
        (name: "call", op: "custom_call", target: "identity", operands: ["arg"], ty: "f32[4]"),
        (name: "dead", op: "neg", operands: ["x"]),
    ], outputs: ["e"])"#;
    let r = xla::compile_program_str("cc", text).unwrap();
    let dce = r.passes.iter().find(|p| p.name == "dce").unwrap();
    assert_eq!((dce.nodes_before, dce.nodes_after), (10, 9), "{r}");
    assert!(
        r.kernel_rows
            .iter()
            .any(|k| k.summary.contains("custom_call")),
        "{r}"
    );
    let x = Tensor::from_f64s(&r.executable.parameters[0], &[1.0, -2.0, 3.0, 0.5]).unwrap();
    let out = r.executable.run(&[x]).unwrap();
    assert_eq!(out.len(), 1);
}

/// Compiles `name` with `disabled` passes off and checks both executors
/// against the interpreter of the program as written.
fn compile_disabled_and_compare(name: &str, disabled: &[&str]) -> xla::CompileReport {
    use optirs_tpu::exec::runtime::{NoCustomCalls, Runtime};
    let mut world = xla::compiler_world();
    let p = xla::load_program_str(&mut world, name, &asset(name)).unwrap();
    let options = xla::CompileOptions {
        disabled_passes: disabled.iter().map(|s| s.to_string()).collect(),
        verify_each_pass: Some(true),
    };
    let report = xla::compile_program_str_with(name, &asset(name), &options)
        .unwrap_or_else(|e| panic!("{name} without {disabled:?}: {e}"));
    let args = inputs(&report.executable.parameters, 11);
    let expected = interpret(&world, p, &args).unwrap();
    let got = report.executable.run(&args).unwrap();
    let fast = Runtime::new(report.executable.clone())
        .run_tensors(&args, &mut NoCustomCalls)
        .unwrap_or_else(|e| panic!("{name} without {disabled:?}: {e}"));
    for (i, e) in expected.iter().enumerate() {
        assert!(
            e.approx_eq(&got[i], 1e-6),
            "{name} without {disabled:?}: output {i}"
        );
        assert!(
            e.approx_eq(&fast[i], 1e-6),
            "{name} without {disabled:?}: runtime output {i}"
        );
    }
    report
}

#[test]
fn every_optional_pass_can_be_disabled_and_the_program_still_runs() {
    use optirs_tpu::xla::passes::OPTIONAL_PASSES;
    for name in PROGRAMS {
        for pass in OPTIONAL_PASSES {
            let r = compile_disabled_and_compare(name, &[pass]);
            let row = r.passes.iter().find(|p| p.name == pass).unwrap();
            assert!(!row.changed, "{name}: disabled {pass} changed the graph");
            assert!(
                row.note.as_deref().unwrap_or("").starts_with("disabled"),
                "{r}"
            );
        }
        compile_disabled_and_compare(name, &OPTIONAL_PASSES);
    }
}

#[test]
fn without_fusion_every_op_is_its_own_kernel() {
    let r = compile_disabled_and_compare("adam", &["fusion"]);
    let ops: usize = r.kernel_rows.iter().map(|k| k.ops).sum();
    assert_eq!(r.kernels, ops, "{r}");
    assert!(r.kernels > 1, "{r}");
    assert!(r.kernel_rows.iter().all(|k| k.loop_shape.is_none()), "{r}");
    assert!(r.fusion_refusals.is_empty(), "{r}");
}

#[test]
fn simplify_rows_report_each_pass_s_own_node_counts() {
    let group = ["constant-folding", "algebraic-simplifier", "cse", "dce"];
    for name in PROGRAMS {
        let r = xla::compile_program_str(name, &asset(name)).unwrap();
        let rows: Vec<_> = group
            .iter()
            .map(|g| r.passes.iter().find(|p| p.name == *g).unwrap())
            .collect();
        let after_group = r.passes.iter().find(|p| p.name == "fusion").unwrap();
        // Only DCE removes nodes; the others rewrite or redirect in place.
        for row in &rows[..3] {
            assert_eq!(row.nodes_before, row.nodes_after, "{name}: {r}");
        }
        let removed: usize = rows.iter().map(|p| p.nodes_before - p.nodes_after).sum();
        assert_eq!(
            removed,
            rows[0].nodes_before - after_group.nodes_before,
            "{name}: the rows' own removals add up to the group's: {r}"
        );
    }
    let r = xla::compile_program_str("cse_fold", &asset("cse_fold")).unwrap();
    let row = |n: &str| r.passes.iter().find(|p| p.name == n).unwrap().clone();
    assert!(row("dce").runs > 1, "{r}");
    assert_eq!(
        (
            row("algebraic-simplifier").nodes_before,
            row("algebraic-simplifier").nodes_after
        ),
        (21, 21),
        "{r}"
    );
    assert_eq!(
        (row("dce").nodes_before, row("dce").nodes_after),
        (21, 8),
        "{r}"
    );
}

#[test]
fn program_file_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "big.ron",
            r#"(name: "big", nodes: [(name: "c", op: "constant", ty: "f32[16777217]", value: [1.0])], outputs: ["c"])"#,
            "node %c: constant f32[16777217] is larger than 16777216 elements",
        ),
        (
            "shape.ron",
            r#"(name: "s", nodes: [
                (name: "x", op: "parameter", ty: "f32[8]"),
                (name: "y", op: "parameter", ty: "f32[4]"),
                (name: "s", op: "add", operands: ["x", "y"]),
            ], outputs: ["s"])"#,
            "node %s = add(f32[8], f32[4]): operand shapes [8] and [4] do not broadcast",
        ),
        (
            "cycle.ron",
            r#"(name: "b", nodes: [
                (name: "x", op: "parameter", ty: "f32[2]"),
                (name: "a", op: "add", operands: ["x", "c"]),
                (name: "c", op: "neg", operands: ["a"]),
            ], outputs: ["c"])"#,
            "program `b` is invalid",
        ),
    ];
    for (file, text, message) in cases {
        let path = dir.path().join(file);
        std::fs::write(&path, text).unwrap();
        let err = xla::compile_program_file(&path).unwrap_err();
        let shown = err.to_string();
        let prefix = format!("{}: {message}", path.display());
        assert!(shown.starts_with(&prefix), "{shown}");
        assert_eq!(shown.matches(message).count(), 1, "said once: {shown}");
        assert!(
            !matches!(err.without_file(), CompileError::InFile { .. }),
            "{err:?}"
        );
        let mut pod = optirs_tpu::Pod::load("v4-16").unwrap();
        let pod_err = pod.compile_program_file(&path).unwrap_err().to_string();
        assert!(pod_err.contains(&prefix), "{pod_err}");
    }
    // Parse errors already carry file, line and column: not named twice.
    let path = dir.path().join("syntax.ron");
    std::fs::write(&path, "(name: \"b\",\n nodes: [(name: 1)])").unwrap();
    let shown = xla::compile_program_file(&path).unwrap_err().to_string();
    let file = path.display().to_string();
    assert!(shown.starts_with(&format!("{file}:2:")), "{shown}");
    assert_eq!(shown.matches(&file).count(), 1, "{shown}");
}
