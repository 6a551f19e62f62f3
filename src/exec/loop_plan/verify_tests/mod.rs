//! Negative tests of the verifier, one per rule of `verify` in its order
//! (the rules of body instructions in `body`, of outputs in `outputs`):
//! Adam's verified plan passes, and breaking exactly one rule fails naming
//! the kernel, the place and the broken rule. Rule 19 cannot be broken
//! alone (rules 5 and 18 tie each output to one body instruction): its
//! test is beside it, in `verify/body.rs`.

use super::tests::adam;
use super::*;
use crate::compiler::executable::{LoweredKernel, Stage, ValueRef};

/// Adam's aliased update, its fused kernel and its verified plan.
mod body;
mod outputs;

struct Case {
    exe: Executable,
    aliases: Vec<(usize, usize)>,
    last_use: Vec<usize>,
    k: usize,
    plan: FusedPlan,
}

impl Case {
    fn adam() -> Case {
        let (exe, aliases, k, plan) = adam();
        Case {
            last_use: last_uses(&exe),
            exe: (*exe).clone(),
            aliases,
            k,
            plan,
        }
    }

    fn verify(&self) -> Result<(), LoopPlanError> {
        verify_plan(&self.exe, self.k, &self.last_use, &self.aliases, &self.plan)
    }

    fn kernel(&self) -> &LoweredKernel {
        &self.exe.kernels[self.k]
    }

    /// Per body instruction, the first kernel instruction it stands for
    /// (the multiply, when folded) and the one it computes.
    fn kernel_instrs(&self) -> Vec<(u32, u32)> {
        let kernel = self.kernel();
        let mut loop_instrs = (0..kernel.instrs.len() as u32)
            .filter(|&j| kernel.instrs[j as usize].stage == Stage::Loop);
        self.plan
            .body
            .iter()
            .map(|b| {
                let first = loop_instrs.next().unwrap();
                match b.product_first {
                    Some(_) => (first, loop_instrs.next().unwrap()),
                    None => (first, first),
                }
            })
            .collect()
    }

    /// The body instruction writing direct output `o`.
    fn writer(&self, o: usize) -> usize {
        self.plan
            .body
            .iter()
            .position(|b| b.direct == Some(o as u32))
            .expect("a direct output's writer")
    }

    /// Turns direct output `o` into one copied from its register after the
    /// body, as if `mark_direct_outputs` had left it: still a valid plan.
    fn undirect(&mut self, o: usize) {
        let w = self.writer(o);
        let plan = &mut self.plan;
        plan.body[w].direct = None;
        for a in &mut plan.body[w].args {
            if let Src::Dest(d) = *a {
                *a = Src::Input(d);
            }
        }
        let reg = plan.outputs[o].reg;
        for b in &mut plan.body[w + 1..] {
            for a in &mut b.args {
                if matches!(*a, Src::Output(x) if x == o as u32) {
                    *a = Src::Reg(reg);
                }
            }
        }
        plan.outputs[o].direct = false;
        self.verify().expect("an output copied from its register");
    }

    /// The first loop output placed over a donor.
    fn donated(&self) -> usize {
        self.plan
            .outputs
            .iter()
            .position(|o| o.donor.is_some())
            .expect("an output over a donor")
    }

    /// The first direct output.
    fn direct(&self) -> usize {
        self.plan
            .outputs
            .iter()
            .position(|o| o.direct)
            .expect("a direct output")
    }
}

/// The plan passes; `corrupt` breaks one rule and returns the place and
/// the message the verifier must fail with.
fn rejects(corrupt: impl FnOnce(&mut Case) -> (String, String)) {
    let mut case = Case::adam();
    case.verify().expect("the plan before it is broken");
    let kernel = case.kernel().name.clone();
    let (place, message) = corrupt(&mut case);
    let err = case.verify().expect_err("a broken plan");
    assert_eq!(
        err,
        LoopPlanError {
            kernel,
            place,
            message
        }
    );
}

fn body_place(case: &Case, at: usize) -> String {
    format!("body instruction {at} ({})", case.plan.body[at].op)
}

/// The first body instruction that is not a folded multiply-add.
fn unfolded(case: &Case) -> usize {
    case.plan
        .body
        .iter()
        .position(|b| b.product_first.is_none())
        .expect("an unfolded instruction")
}

/// The first operand `p` of a body instruction `at` matching `pick`.
fn operand(case: &Case, pick: impl Fn(&BodyInstr, Src) -> bool) -> (usize, usize) {
    case.plan
        .body
        .iter()
        .enumerate()
        .find_map(|(at, b)| Some((at, b.args.iter().position(|&a| pick(b, a))?)))
        .expect("a matching operand")
}

fn other_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F32
    } else {
        DType::F64
    }
}

#[test]
fn check_kernel_exists() {
    let case = Case::adam();
    let n = case.exe.kernels.len();
    let err = verify_plan(&case.exe, n, &case.last_use, &case.aliases, &case.plan).unwrap_err();
    assert_eq!(
        err,
        LoopPlanError {
            kernel: format!("#{n}"),
            place: "plan".into(),
            message: format!("the executable has {n} kernels"),
        }
    );
}

#[test]
fn check_loop_shape() {
    rejects(|case| {
        case.plan.len += 1;
        let shape = case.kernel().loop_shape.clone().unwrap();
        let message = format!("{} elements for loop shape {shape:?}", case.plan.len);
        ("plan".into(), message)
    });
}

#[test]
fn check_loop_shape_rejects_a_kernel_that_runs_whole() {
    rejects(|case| {
        case.exe.kernels[case.k].loop_shape = None;
        ("plan".into(), "the kernel has no loop shape".into())
    });
}

#[test]
fn check_inputs_typed() {
    rejects(|case| {
        let (i, b) = (case.kernel().inputs.iter().enumerate())
            .find_map(|(i, r)| match *r {
                ValueRef::Buffer(b) => Some((i, b)),
                ValueRef::Constant(_) => None,
            })
            .expect("a buffer input");
        case.exe.buffers[b as usize].ty = "not a type".into();
        ("plan".into(), format!("input {i} has no type"))
    });
}

#[test]
fn check_prelude_in_order() {
    rejects(|case| {
        let prelude = case.plan.prelude.clone();
        case.plan.prelude.push(999);
        let message = format!(
            "prelude {:?}, but the kernel's prelude instructions are {prelude:?}",
            case.plan.prelude
        );
        ("plan".into(), message)
    });
}

#[test]
fn check_body_complete() {
    rejects(|case| {
        let last = case.plan.body.pop().unwrap();
        let loops = case.kernel().instrs.iter();
        let loops = loops.filter(|x| x.stage == Stage::Loop).count();
        let covers = if last.product_first.is_some() { 2 } else { 1 };
        let message = format!(
            "the body computes {} of the kernel's {loops} loop instructions",
            loops - covers
        );
        ("plan".into(), message)
    });
}

#[test]
fn check_output_count() {
    rejects(|case| {
        let n = case.plan.outputs.len();
        let extra = case.plan.outputs[0].clone();
        case.plan.outputs.push(extra);
        (
            "plan".into(),
            format!("{} outputs for the kernel's {n}", n + 1),
        )
    });
}

#[test]
fn check_streams_loop_shaped() {
    rejects(|case| {
        case.plan.streams.push((true, 999, 4));
        let message = "prefetches input 999, which is not a loop-shaped one".into();
        ("plan".into(), message)
    });
}
