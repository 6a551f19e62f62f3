//! Negative tests of the verifier, one per rule of `verify.rs` in its
//! order: Adam's verified plan passes, and breaking exactly one rule fails
//! naming the kernel, the place and the broken rule.

use super::tests::adam;
use super::*;
use crate::compiler::executable::{Arg as InstrArg, LoweredKernel, Stage, ValueRef};

/// Adam's aliased update, its fused kernel and its verified plan.
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
fn check_body_in_kernel_order() {
    rejects(|case| {
        let at = unfolded(case);
        let other = (case.plan.body.iter())
            .find(|b| b.op != case.plan.body[at].op)
            .map(|b| b.op.clone())
            .expect("two ops");
        let j = case.kernel_instrs()[at].1;
        let message = format!(
            "kernel instruction {j} is {}",
            case.kernel().instrs[j as usize].op
        );
        case.plan.body[at].op = other;
        (body_place(case, at), message)
    });
}

#[test]
fn check_body_in_kernel_order_rejects_an_instruction_past_the_kernel() {
    rejects(|case| {
        let last = case.plan.body.last().unwrap().clone();
        case.plan.body.push(last);
        let loops = case.kernel().instrs.iter();
        let loops = loops.filter(|x| x.stage == Stage::Loop).count();
        let at = case.plan.body.len() - 1;
        let message = format!("the kernel has only {loops} loop instructions");
        (body_place(case, at), message)
    });
}

#[test]
fn check_destination_register_typed() {
    rejects(|case| {
        case.plan.body[0].reg = 999;
        let message = format!(
            "writes register 999, but {} are allocated",
            case.plan.regs.len()
        );
        (body_place(case, 0), message)
    });
}

#[test]
fn check_destination_register_typed_rejects_the_wrong_dtype() {
    rejects(|case| {
        let r = case.plan.body[0].reg;
        let value = case.plan.regs[r as usize];
        let wrong = other_dtype(value);
        case.plan.regs[r as usize] = wrong;
        let message = format!("writes {wrong:?} register {r}, but the value is {value:?}");
        (body_place(case, 0), message)
    });
}

#[test]
fn check_fold_reads_product_in_place() {
    rejects(|case| {
        let at = (case.plan.body.iter())
            .position(|b| b.product_first.is_some())
            .expect("Adam folds a multiply-add");
        let (m, j) = case.kernel_instrs()[at];
        let flipped = !case.plan.body[at].product_first.unwrap();
        case.plan.body[at].product_first = Some(flipped);
        let kernel = case.kernel();
        let pos = usize::from(!flipped);
        let message = format!(
            "folds kernel instruction {m} ({}) as operand {pos} of kernel instruction {j}, \
             which reads {:?}",
            kernel.instrs[m as usize].op, kernel.instrs[j as usize].args
        );
        (body_place(case, at), message)
    });
}

#[test]
fn check_folded_product_read_once() {
    rejects(|case| {
        let at = (case.plan.body.iter())
            .position(|b| b.product_first.is_some())
            .expect("Adam folds a multiply-add");
        // The kernel also returns the product, which the fold leaves unwritten.
        let m = case.kernel_instrs()[at].0;
        let b = case.kernel().outputs[0].1;
        case.exe.kernels[case.k].outputs.push((m, b));
        let message = format!("folds kernel instruction {m}, whose value is also read elsewhere");
        (body_place(case, at), message)
    });
}

#[test]
fn check_operand_count() {
    rejects(|case| {
        let b = &mut case.plan.body[0];
        let (args, n) = (b.args.len(), b.arg_types.len());
        b.arg_types.push(DType::F32);
        let expected = if b.product_first.is_some() { 3 } else { args };
        let message = format!(
            "{args} operands and {} operand types for {expected} kernel operands",
            n + 1
        );
        (body_place(case, 0), message)
    });
}

#[test]
fn check_operand_typed() {
    rejects(|case| {
        let at = unfolded(case);
        let j = case.kernel_instrs()[at].1;
        let arg = case.kernel().instrs[j as usize].args[0];
        let want = case.plan.body[at].arg_types[0];
        let wrong = other_dtype(want);
        case.plan.body[at].arg_types[0] = wrong;
        let message = format!(
            "operand 0 is typed {wrong:?}, but {arg:?} is {:?}",
            Some(want)
        );
        (body_place(case, at), message)
    });
}

#[test]
fn check_destination_read_in_place() {
    rejects(|case| {
        let (at, p) = operand(case, |b, a| {
            b.direct.is_none() && b.product_first.is_none() && matches!(a, Src::Input(_))
        });
        let Src::Input(d) = case.plan.body[at].args[p] else {
            unreachable!()
        };
        case.plan.body[at].args[p] = Src::Dest(d);
        let message = format!(
            "operand {p} reads the destination as input {d}, but the instruction does not \
             write an output over that input in place"
        );
        (body_place(case, at), message)
    });
}

#[test]
fn check_register_not_own_destination() {
    rejects(|case| {
        let (at, p) = operand(case, |_, a| matches!(a, Src::Reg(_)));
        let r = case.plan.body[at].reg;
        case.plan.body[at].args[p] = Src::Reg(r);
        let message = format!("operand {p} reads register {r}, the instruction's own destination");
        (body_place(case, at), message)
    });
}

#[test]
fn check_register_allocated() {
    rejects(|case| {
        let (at, p) = operand(case, |_, a| matches!(a, Src::Reg(_)));
        case.plan.body[at].args[p] = Src::Reg(999);
        let message = format!(
            "operand {p} reads register 999, but {} are allocated",
            case.plan.regs.len()
        );
        (body_place(case, at), message)
    });
}

#[test]
fn check_registers_defined_before_use() {
    rejects(|case| {
        let (at, p) = operand(case, |_, a| matches!(a, Src::Reg(_)));
        let Src::Reg(r) = case.plan.body[at].args[p] else {
            unreachable!()
        };
        // A fresh register of the same dtype that nothing writes.
        case.plan.regs.push(case.plan.regs[r as usize]);
        let fresh = (case.plan.regs.len() - 1) as u16;
        case.plan.body[at].args[p] = Src::Reg(fresh);
        let message =
            format!("operand {p} reads register {fresh} before any instruction writes it");
        (body_place(case, at), message)
    });
}

#[test]
fn check_register_holds_operand() {
    rejects(|case| {
        let js = case.kernel_instrs();
        // A register read, and another register an earlier instruction wrote.
        let (at, p, r2, h) = (case.plan.body.iter().enumerate())
            .find_map(|(at, b)| {
                if b.product_first.is_some() {
                    return None;
                }
                let p = b.args.iter().position(|a| matches!(a, Src::Reg(_)))?;
                let Src::Reg(r) = b.args[p] else {
                    return None;
                };
                let (w, earlier) = (0..at).rev().find_map(|w| {
                    let e = &case.plan.body[w];
                    (e.direct.is_none() && e.reg != r && e.reg != b.reg).then_some((w, e.reg))
                })?;
                Some((at, p, earlier, js[w].1))
            })
            .expect("two registers");
        let j = js[at].1;
        let InstrArg::Local(e) = case.kernel().instrs[j as usize].args[p] else {
            panic!("a register read of a kernel value")
        };
        case.plan.body[at].args[p] = Src::Reg(r2);
        let message = format!(
            "operand {p} reads register {r2} for kernel instruction {e}, but it holds \
             instruction {h}"
        );
        (body_place(case, at), message)
    });
}

#[test]
fn check_outputs_written_before_read() {
    rejects(|case| {
        let (at, p) = operand(case, |_, a| matches!(a, Src::Output(_)));
        let Src::Output(o) = case.plan.body[at].args[p] else {
            unreachable!()
        };
        // Its writer keeps it in its register instead.
        let w = case.writer(o as usize);
        case.plan.body[w].direct = None;
        for a in &mut case.plan.body[w].args {
            if let Src::Dest(x) = *a {
                *a = Src::Input(x);
            }
        }
        case.plan.outputs[o as usize].direct = false;
        let message = format!("operand {p} reads output {o} before an instruction writes it");
        (body_place(case, at), message)
    });
}

#[test]
fn check_operand_stands_for_kernel_operand() {
    rejects(|case| {
        let (at, p) = operand(case, |_, a| matches!(a, Src::Input(_)));
        let Src::Input(i) = case.plan.body[at].args[p] else {
            unreachable!()
        };
        let src = Src::InputScalar(i);
        case.plan.body[at].args[p] = src;
        let (j, arg) = (case.kernel_instrs()[at].1, InstrArg::Input(i));
        let message = format!("operand {p} is {src:?}, but kernel instruction {j} reads {arg:?}");
        (body_place(case, at), message)
    });
}

#[test]
fn check_direct_write_targets_its_output() {
    rejects(|case| {
        let w = case.writer(case.direct());
        case.plan.body[w].direct = Some(999);
        let message = format!(
            "writes output 999, but there are {}",
            case.plan.outputs.len()
        );
        (body_place(case, w), message)
    });
}

#[test]
fn check_direct_write_targets_its_output_rejects_a_copied_output() {
    rejects(|case| {
        let o = case.direct();
        let w = case.writer(o);
        case.plan.outputs[o].direct = false;
        let reg = case.plan.outputs[o].reg;
        let message =
            format!("writes output {o} directly, but the plan copies it from register {reg}");
        (body_place(case, w), message)
    });
}

#[test]
fn check_direct_write_targets_its_output_rejects_another_instruction() {
    rejects(|case| {
        let o = case.direct();
        let w = case.writer(o);
        let (i, _) = case.kernel().outputs[o];
        let other = usize::from(w == 0);
        let j = case.kernel_instrs()[other].1;
        case.plan.body[w].direct = None;
        case.plan.body[other].direct = Some(o as u32);
        let message = format!("writes output {o}, which is kernel instruction {i}, not {j}");
        (body_place(case, other), message)
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
fn check_output_buffer() {
    rejects(|case| {
        let b = case.plan.outputs[0].buffer;
        case.plan.outputs[0].buffer = b + 1000;
        let message = format!("goes to buffer {}, not {b}", b + 1000);
        ("output 0".into(), message)
    });
}

#[test]
fn check_output_stage() {
    rejects(|case| {
        let o = case.donated();
        let (i, _) = case.kernel().outputs[o];
        case.plan.outputs[o].prelude = Some(i);
        let message = format!("is loop instruction {i}, planned as a prelude value");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_loop_output_written() {
    rejects(|case| {
        let o = case.direct();
        case.undirect(o);
        case.plan.outputs[o].direct = true;
        let message = "is direct, but no instruction writes it".into();
        (format!("output {o}"), message)
    });
}

#[test]
fn check_loop_output_written_rejects_the_wrong_register() {
    rejects(|case| {
        let o = case.direct();
        case.undirect(o);
        let (i, _) = case.kernel().outputs[o];
        let reg = case.plan.outputs[o].reg;
        let js = case.kernel_instrs();
        // Another register, and the value it holds after the body.
        let (r2, held) = (case.plan.body.iter().enumerate().rev())
            .find_map(|(at, b)| (b.direct.is_none() && b.reg != reg).then_some((b.reg, js[at].1)))
            .expect("another register");
        case.plan.outputs[o].reg = r2;
        let message = format!(
            "is copied from register {r2}, which holds {:?} after the body, not kernel \
             instruction {i}",
            Some(held)
        );
        (format!("output {o}"), message)
    });
}

#[test]
fn check_aliased_output_has_donor() {
    rejects(|case| {
        let o = case.donated();
        if case.plan.outputs[o].direct {
            case.undirect(o);
        }
        assert!(case.plan.outputs[o].aliased);
        case.plan.outputs[o].donor = None;
        let message = "is aliased without a donor input".into();
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_is_buffer_input() {
    rejects(|case| {
        let o = case.donated();
        if case.plan.outputs[o].direct {
            case.undirect(o);
        }
        case.plan.outputs[o].donor = Some(999);
        let message = "is placed over input 999, which is not a buffer".into();
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_donates_once() {
    rejects(|case| {
        let first = case.donated();
        let o = (first + 1..case.plan.outputs.len())
            .find(|&o| case.plan.outputs[o].donor.is_some())
            .expect("two outputs over donors");
        if case.plan.outputs[o].direct {
            case.undirect(o);
        }
        let d = case.plan.outputs[first].donor.unwrap();
        case.plan.outputs[o].donor = Some(d);
        let message = format!("is placed over input {d}, which another output takes");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_read_last_here() {
    rejects(|case| {
        let o = case.donated();
        let d = case.plan.outputs[o].donor.unwrap();
        let ValueRef::Buffer(ib) = case.kernel().inputs[d as usize] else {
            panic!("a buffer donor")
        };
        // A later kernel reads the donor.
        case.last_use[ib as usize] = case.k + 1;
        let message =
            format!("is placed over input {d} (buffer {ib}), which is read after this kernel");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_type() {
    rejects(|case| {
        let o = case.donated();
        let d = case.plan.outputs[o].donor.unwrap();
        let ValueRef::Buffer(ib) = case.kernel().inputs[d as usize] else {
            panic!("a buffer donor")
        };
        let b = case.plan.outputs[o].buffer as usize;
        // The output's buffer takes another type (no input of the kernel
        // reads it, so only the donor's type is then wrong).
        let to = "f64[3]".to_owned();
        case.exe.buffers[b].ty = to.clone();
        let from = &case.exe.buffers[ib as usize].ty;
        let message = format!("is {to}, placed over input {d} of type {from}");
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_placement() {
    rejects(|case| {
        let o = case.donated();
        assert!(case.plan.outputs[o].aliased);
        let d = case.plan.outputs[o].donor.unwrap();
        let ValueRef::Buffer(ib) = case.kernel().inputs[d as usize] else {
            panic!("a buffer donor")
        };
        // The plan was made with aliases the runtime no longer gives.
        case.aliases.clear();
        let message = format!(
            "is placed over input {d} (buffer {ib}), which is not the parameter it is aliased to"
        );
        (format!("output {o}"), message)
    });
}

#[test]
fn check_donor_not_read_after_direct_write() {
    rejects(|case| {
        let kernel = case.kernel().clone();
        let reads = |b: &BodyInstr, d: u32| {
            (b.args.iter()).any(|a| matches!(*a, Src::Input(y) | Src::InputScalar(y) if y == d))
        };
        // A direct output, and a buffer input of its type that no output
        // takes and the body reads after the output's writer.
        let (o, w, d, ib, r) = (0..case.plan.outputs.len())
            .filter(|&o| case.plan.outputs[o].direct)
            .find_map(|o| {
                let w = case.writer(o);
                let to = &case.exe.buffers[case.plan.outputs[o].buffer as usize];
                kernel.inputs.iter().enumerate().find_map(|(d, r)| {
                    let (d, &ValueRef::Buffer(ib)) = (d as u32, r) else {
                        return None;
                    };
                    let from = &case.exe.buffers[ib as usize];
                    let free = case.plan.outputs.iter().all(|x| x.donor != Some(d))
                        && case.last_use[ib as usize] == case.k;
                    let r =
                        (w + 1..case.plan.body.len()).find(|&r| reads(&case.plan.body[r], d))?;
                    (free && from.ty == to.ty).then_some((o, w, d, ib, r))
                })
            })
            .expect("an input read after a direct output is written");
        // Its instruction reads its own donor as an input, and the output is
        // placed over `d` by the memory plan.
        for a in &mut case.plan.body[w].args {
            if let Src::Dest(x) = *a {
                *a = Src::Input(x);
            }
        }
        let b = case.plan.outputs[o].buffer as usize;
        case.exe.buffers[b].offset = case.exe.buffers[ib as usize].offset;
        let out = &mut case.plan.outputs[o];
        out.donor = Some(d);
        out.aliased = false;
        let message = format!(
            "is written over input {d} by body instruction {w}, but body instruction {r} reads \
             that input afterwards"
        );
        (format!("output {o}"), message)
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
