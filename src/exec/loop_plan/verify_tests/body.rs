//! Negative tests of the rules of body instructions and their operands.

use super::*;
use crate::compiler::executable::Arg as InstrArg;

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
