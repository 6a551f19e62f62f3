//! The unit tests of planning and the verifier on real compiled executables.

use super::*;
use crate::compiler;
use crate::exec::update_graph::build_update_graph;
use crate::ir::Element;
use crate::optimizers::{Adagrad, Adam, AdamW, Momentum, Nesterov, RMSProp, SGD};
use crate::optimizers::{FloatElement, UpdateRule};
use std::sync::Arc;

/// Each fused kernel of `exe` with its plan (verified by `run` in debug
/// builds, and again here).
pub(super) fn plans(
    exe: &Executable,
    aliases: &[(usize, usize)],
) -> Vec<(usize, FusedPlan, LoopPlanStats)> {
    let planned: Vec<_> = run(exe, aliases)
        .into_iter()
        .enumerate()
        .filter_map(|(k, p)| p.map(|(plan, stats)| (k, plan, stats)))
        .collect();
    for (k, plan, stats) in &planned {
        verify_plan(exe, *k, &last_uses(exe), aliases, plan).unwrap();
        assert_eq!(*stats, LoopPlanStats::of(plan));
    }
    planned
}

/// The aliases the TPU optimizer gives an update: output 0 over
/// parameter 0, output `o` over parameter `o + 1`.
pub(super) fn update_aliases(exe: &Executable) -> Vec<(usize, usize)> {
    (0..exe.outputs.len())
        .map(|o| (o, if o == 0 { 0 } else { o + 1 }))
        .collect()
}

pub(super) fn update<A: FloatElement + Element>(rule: &dyn UpdateRule<A>) -> Arc<Executable> {
    let mut world = compiler::compiler_world();
    let program = build_update_graph(&mut world, rule, &[1000]).unwrap();
    compiler::compile(&mut world, program).unwrap().executable
}

#[test]
fn the_bundled_programs_plan_verified_loops() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs");
    let mut fused = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "ron") {
            let exe = compiler::compile_program_file(&path).unwrap().executable;
            fused += plans(&exe, &[]).len();
        }
    }
    assert!(fused >= 1, "no bundled program has a fused loop");
}

#[test]
fn every_optimizer_update_plans_a_verified_in_place_loop() {
    fn check<A: FloatElement + Element>(rules: Vec<Box<dyn UpdateRule<A>>>) {
        for rule in rules {
            let exe = update(rule.as_ref());
            let aliases = update_aliases(&exe);
            let planned = plans(&exe, &aliases);
            assert!(!planned.is_empty(), "{}", rule.update_kind());
            // Without aliases too (the plan then follows the memory plan).
            plans(&exe, &[]);
            for (_, _, stats) in &planned {
                assert_eq!(
                    stats.aliased_outputs,
                    stats.loop_outputs,
                    "{}: every state is updated over its parameter: {stats:?}",
                    rule.update_kind()
                );
            }
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

/// Adam's update (aliased) and its one fused plan.
pub(super) fn adam() -> (Arc<Executable>, Vec<(usize, usize)>, usize, FusedPlan) {
    let exe = update::<f32>(&Adam::new(0.1));
    let aliases = update_aliases(&exe);
    let (k, plan, _) = plans(&exe, &aliases).remove(0);
    (exe, aliases, k, plan)
}

/// `corrupt(plan)` is rejected with a message naming the kernel and
/// containing every part of `expected`.
fn rejected(corrupt: impl FnOnce(&mut FusedPlan), expected: &[&str]) {
    let (exe, aliases, k, mut plan) = adam();
    corrupt(&mut plan);
    let err =
        verify_plan(&exe, k, &last_uses(&exe), &aliases, &plan).expect_err("a corrupted plan");
    let message = err.to_string();
    assert!(message.starts_with(NAME), "{message}");
    assert!(
        message.contains(&format!("kernel `{}`", exe.kernels[k].name)),
        "{message}"
    );
    for part in expected {
        assert!(message.contains(part), "`{part}` not in: {message}");
    }
}

/// The first body instruction reading a register, and that operand.
fn first_register_read(plan: &FusedPlan) -> (usize, usize) {
    plan.body
        .iter()
        .enumerate()
        .find_map(|(at, b)| {
            let p = b.args.iter().position(|a| matches!(a, Src::Reg(_)))?;
            Some((at, p))
        })
        .expect("a register read")
}

#[test]
fn a_register_read_before_it_is_written_is_rejected() {
    rejected(
        |plan| {
            let (at, p) = first_register_read(plan);
            let Src::Reg(r) = plan.body[at].args[p] else {
                unreachable!()
            };
            // A fresh register of the same dtype that nothing writes.
            plan.regs.push(plan.regs[r as usize]);
            plan.body[at].args[p] = Src::Reg((plan.regs.len() - 1) as u16);
        },
        &["body instruction", "before any instruction writes it"],
    );
}

#[test]
fn a_register_beyond_the_allocated_count_is_rejected() {
    rejected(
        |plan| {
            let (at, p) = first_register_read(plan);
            plan.body[at].args[p] = Src::Reg(999);
        },
        &["reads register 999", "are allocated"],
    );
}

#[test]
fn an_output_written_by_the_wrong_instruction_is_rejected() {
    rejected(
        |plan| {
            let o = plan
                .outputs
                .iter()
                .position(|o| o.direct)
                .expect("a direct output");
            let writer = plan
                .body
                .iter()
                .position(|b| b.direct == Some(o as u32))
                .unwrap();
            let other = if writer == 0 { 1 } else { 0 };
            plan.body[writer].direct = None;
            plan.body[other].direct = Some(o as u32);
        },
        &["body instruction", "output"],
    );
}

#[test]
fn an_output_over_an_input_it_may_not_write_is_rejected() {
    let (exe, _, k, plan) = adam();
    // An input no output may take over (the gradients, the step count).
    let d = (0..exe.kernels[k].inputs.len() as u32)
        .find(|&d| plan.outputs.iter().all(|o| o.donor != Some(d)))
        .expect("an input that is not a donor");
    rejected(
        |plan| {
            let out = plan.outputs.iter_mut().find(|o| o.donor.is_some()).unwrap();
            out.donor = Some(d);
        },
        &["output", &format!("over input {d}")],
    );
}

#[test]
fn a_folded_multiply_add_with_its_operands_swapped_is_rejected() {
    rejected(
        |plan| {
            let b = plan
                .body
                .iter_mut()
                .find(|b| b.product_first.is_some())
                .expect("Adam folds a multiply-add");
            b.product_first = b.product_first.map(|f| !f);
        },
        &["body instruction", "folds kernel instruction"],
    );
}
