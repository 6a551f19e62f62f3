//! The `fused-loop-planning` report (`exec::loop_plan`), through
//! `Runtime::loop_plans` and `optirs-tpu compile`.

use std::process::Command;

use optirs_tpu::exec::loop_plan::{self, LoopPlanStats};
use optirs_tpu::exec::runtime::Runtime;
use optirs_tpu::xla;

const ADAM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs/adam.ron");

#[test]
fn the_pass_has_a_kebab_case_name() {
    assert_eq!(loop_plan::NAME, "fused-loop-planning");
}

#[test]
fn loop_plans_report_each_fused_loop_beside_native_loops() {
    let exe = xla::compile_program_file(ADAM.as_ref()).unwrap().executable;
    let runtime = Runtime::new(exe.clone());
    let plans = runtime.loop_plans();
    assert_eq!(plans.len(), exe.kernels.len());
    for ((plan, native), kernel) in plans.iter().zip(runtime.native_loops()).zip(&exe.kernels) {
        assert_eq!(plan.is_some(), native.is_some(), "{}", kernel.name);
        if let Some((name, _)) = plan {
            assert_eq!(*name, kernel.name);
        }
    }
    let stats: Vec<LoopPlanStats> = plans.into_iter().flatten().map(|(_, s)| s).collect();
    assert_eq!(stats.len(), 1, "Adam is one fused loop");
    let s = stats[0];
    assert_eq!(
        s.registers,
        runtime
            .loop_registers()
            .into_iter()
            .flatten()
            .sum::<usize>()
    );
    assert!(s.body_instrs >= 1 && s.elements == 4096, "{s:?}");
    // Parameter and both moments are written over their inputs.
    assert_eq!((s.loop_outputs, s.in_place_outputs), (3, 3), "{s:?}");
    assert!(
        s.direct_outputs <= s.loop_outputs && s.folded_multiply_adds >= 1,
        "{s:?}"
    );
}

#[test]
fn compile_prints_the_plan_in_the_execution_section() {
    let out = Command::new(env!("CARGO_BIN_EXE_optirs-tpu"))
        .args(["compile", ADAM])
        .output()
        .expect("the binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let execution = &text[text
        .find("\nexecution (exec::runtime)")
        .expect("an execution section")..];
    assert!(
        execution.contains("fused-loop-planning: ") && execution.contains(" registers, "),
        "{execution}"
    );
}
