//! The rules of each body instruction and its operands, 5 to 19 of the
//! list in `super`, run by `check_body_instr` in that order.

use smallvec::SmallVec;

use super::{Verifier, Walk};
use crate::compiler::executable::{Arg as InstrArg, Instr, Stage};
use crate::exec::loop_plan::{BodyInstr, LoopPlanError, Src};
use crate::ir::{BinaryOp, Op};

/// A body instruction and the kernel instructions it stands for.
struct BodyAt<'a> {
    instr: &'a BodyInstr,
    /// `body instruction 3 (add)`.
    place: String,
    /// The first kernel instruction (the multiply, when folded).
    first: u32,
    /// The kernel instruction whose value it computes.
    j: u32,
    ki: &'a Instr,
}

impl Verifier<'_> {
    fn at_body(&self, b: &BodyAt<'_>, message: String) -> LoopPlanError {
        self.fail(b.place.clone(), message)
    }
}

/// The rules of one body instruction, then what it leaves in `walk`.
pub(super) fn check_body_instr(
    v: &Verifier<'_>,
    walk: &mut Walk,
    at: usize,
    instr: &BodyInstr,
) -> Result<(), LoopPlanError> {
    let b = check_body_in_kernel_order(v, walk, at, instr)?;
    check_destination_register_typed(v, &b)?;
    // The kernel operands the body operands stand for.
    let expected: SmallVec<[InstrArg; 4]> = match instr.product_first {
        None => b.ki.args.iter().copied().collect(),
        Some(product_first) => {
            let pos = usize::from(!product_first);
            check_fold_reads_product_in_place(v, &b, pos)?;
            check_folded_product_read_once(v, &b)?;
            let mul = &v.kernel.instrs[b.first as usize];
            [mul.args[0], mul.args[1], b.ki.args[1 - pos]]
                .into_iter()
                .collect()
        }
    };
    check_operand_count(v, &b, &expected)?;
    for (p, (&src, &arg)) in instr.args.iter().zip(&expected).enumerate() {
        check_operand(v, walk, &b, p, src, arg)?;
    }
    match instr.direct {
        None => walk.holds[instr.reg as usize] = Some(b.j),
        Some(o) => {
            check_direct_write_targets_its_output(v, &b, o)?;
            check_outputs_written_once(v, walk, &b, o)?;
            walk.written[o as usize] = Some(at);
        }
    }
    Ok(())
}

fn check_body_in_kernel_order<'a>(
    v: &Verifier<'a>,
    walk: &mut Walk,
    at: usize,
    instr: &'a BodyInstr,
) -> Result<BodyAt<'a>, LoopPlanError> {
    let place = format!("body instruction {at} ({})", instr.op);
    let covers = if instr.product_first.is_some() { 2 } else { 1 };
    let next = walk.next;
    let Some(span) = v.loop_instrs.get(next..next + covers) else {
        return Err(v.fail(
            place,
            format!(
                "the kernel has only {} loop instructions",
                v.loop_instrs.len()
            ),
        ));
    };
    walk.next += covers;
    let (first, j) = (span[0], span[covers - 1]);
    let ki = &v.kernel.instrs[j as usize];
    if instr.op != ki.op {
        return Err(v.fail(place, format!("kernel instruction {j} is {}", ki.op)));
    }
    Ok(BodyAt {
        instr,
        place,
        first,
        j,
        ki,
    })
}

fn check_destination_register_typed(v: &Verifier<'_>, b: &BodyAt<'_>) -> Result<(), LoopPlanError> {
    let (instr, regs) = (b.instr, &v.plan.regs);
    match regs.get(instr.reg as usize) {
        None => Err(v.at_body(
            b,
            format!(
                "writes register {}, but {} are allocated",
                instr.reg,
                regs.len()
            ),
        )),
        Some(&d) if d != b.ki.ty.dtype => Err(v.at_body(
            b,
            format!(
                "writes {d:?} register {}, but the value is {:?}",
                instr.reg, b.ki.ty.dtype
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// `pos`: the operand of the add or subtract that is the product.
fn check_fold_reads_product_in_place(
    v: &Verifier<'_>,
    b: &BodyAt<'_>,
    pos: usize,
) -> Result<(), LoopPlanError> {
    let (m, j, ki, instr) = (b.first, b.j, b.ki, b.instr);
    let mul = &v.kernel.instrs[m as usize];
    let fold_ok = mul.op == Op::Binary(BinaryOp::Mul)
        && mul.args.len() == 2
        && matches!(ki.op, Op::Binary(BinaryOp::Add | BinaryOp::Sub))
        && ki.args.len() == 2
        && ki.args[pos] == InstrArg::Local(m)
        && ki.args[1 - pos] != InstrArg::Local(m)
        && instr.arg_types.iter().all(|t| t.is_float())
        && !instr
            .args
            .iter()
            .take(2)
            .all(|a| matches!(a, Src::InputScalar(_) | Src::PreludeScalar(_)));
    if !fold_ok {
        return Err(v.at_body(
            b,
            format!(
                "folds kernel instruction {m} ({}) as operand {pos} of kernel \
                 instruction {j}, which reads {:?}",
                mul.op, ki.args
            ),
        ));
    }
    Ok(())
}

fn check_folded_product_read_once(v: &Verifier<'_>, b: &BodyAt<'_>) -> Result<(), LoopPlanError> {
    let (m, j) = (b.first, b.j);
    let kernel = v.kernel;
    let elsewhere = kernel.outputs.iter().any(|&(o, _)| o == m)
        || kernel
            .instrs
            .iter()
            .enumerate()
            .any(|(x, other)| x != j as usize && other.args.contains(&InstrArg::Local(m)));
    if elsewhere {
        return Err(v.at_body(
            b,
            format!("folds kernel instruction {m}, whose value is also read elsewhere"),
        ));
    }
    Ok(())
}

fn check_operand_count(
    v: &Verifier<'_>,
    b: &BodyAt<'_>,
    expected: &[InstrArg],
) -> Result<(), LoopPlanError> {
    let instr = b.instr;
    if instr.args.len() != expected.len() || instr.arg_types.len() != expected.len() {
        return Err(v.at_body(
            b,
            format!(
                "{} operands and {} operand types for {} kernel operands",
                instr.args.len(),
                instr.arg_types.len(),
                expected.len()
            ),
        ));
    }
    Ok(())
}

/// The rules of operand `p`, `src`, standing for kernel operand `arg`.
fn check_operand(
    v: &Verifier<'_>,
    walk: &Walk,
    b: &BodyAt<'_>,
    p: usize,
    src: Src,
    arg: InstrArg,
) -> Result<(), LoopPlanError> {
    check_operand_typed(v, b, p, arg)?;
    match (src, arg) {
        (Src::Dest(d), InstrArg::Input(_)) => check_destination_read_in_place(v, b, p, d)?,
        (Src::Reg(r), InstrArg::Local(e)) => {
            check_register_not_own_destination(v, b, p, r)?;
            check_register_allocated(v, walk, b, p, r)?;
            check_registers_defined_before_use(v, walk, b, p, r)?;
            check_register_holds_operand(v, walk, b, p, r, e)?;
        }
        (Src::Output(o), InstrArg::Local(_)) => {
            check_outputs_written_before_read(v, walk, b, p, o)?
        }
        _ => {}
    }
    check_operand_stands_for_kernel_operand(v, b, p, src, arg)
}

fn check_operand_typed(
    v: &Verifier<'_>,
    b: &BodyAt<'_>,
    p: usize,
    arg: InstrArg,
) -> Result<(), LoopPlanError> {
    let want = match arg {
        InstrArg::Input(i) => v.input_types.get(i as usize).map(|t| t.dtype),
        InstrArg::Local(l) => v.instr_of(l).map(|x| x.ty.dtype),
    };
    if want != Some(b.instr.arg_types[p]) {
        return Err(v.at_body(
            b,
            format!(
                "operand {p} is typed {:?}, but {arg:?} is {want:?}",
                b.instr.arg_types[p]
            ),
        ));
    }
    Ok(())
}

fn check_destination_read_in_place(
    v: &Verifier<'_>,
    b: &BodyAt<'_>,
    p: usize,
    d: u32,
) -> Result<(), LoopPlanError> {
    let instr = b.instr;
    let donor_of_own_output = instr
        .direct
        .is_some_and(|o| v.plan.outputs.get(o as usize).and_then(|o| o.donor) == Some(d));
    let in_place_form = match instr.product_first {
        Some(_) => p == 2,
        None => {
            matches!(instr.op, Op::Binary(_))
                && instr.args.len() == 2
                && instr.arg_types.iter().all(|t| t.is_float())
        }
    };
    if !donor_of_own_output || !in_place_form {
        return Err(v.at_body(
            b,
            format!(
                "operand {p} reads the destination as input {d}, but the \
                 instruction does not write an output over that input in place"
            ),
        ));
    }
    Ok(())
}

fn check_register_not_own_destination(
    v: &Verifier<'_>,
    b: &BodyAt<'_>,
    p: usize,
    r: u16,
) -> Result<(), LoopPlanError> {
    if r == b.instr.reg {
        return Err(v.at_body(
            b,
            format!("operand {p} reads register {r}, the instruction's own destination"),
        ));
    }
    Ok(())
}

fn check_register_allocated(
    v: &Verifier<'_>,
    walk: &Walk,
    b: &BodyAt<'_>,
    p: usize,
    r: u16,
) -> Result<(), LoopPlanError> {
    if walk.holds.get(r as usize).is_none() {
        return Err(v.at_body(
            b,
            format!(
                "operand {p} reads register {r}, but {} are allocated",
                v.plan.regs.len()
            ),
        ));
    }
    Ok(())
}

fn check_registers_defined_before_use(
    v: &Verifier<'_>,
    walk: &Walk,
    b: &BodyAt<'_>,
    p: usize,
    r: u16,
) -> Result<(), LoopPlanError> {
    if walk.holds[r as usize].is_none() {
        return Err(v.at_body(
            b,
            format!("operand {p} reads register {r} before any instruction writes it"),
        ));
    }
    Ok(())
}

/// `e`: the kernel instruction whose value the operand is.
fn check_register_holds_operand(
    v: &Verifier<'_>,
    walk: &Walk,
    b: &BodyAt<'_>,
    p: usize,
    r: u16,
    e: u32,
) -> Result<(), LoopPlanError> {
    match walk.holds[r as usize] {
        Some(h) if h != e => Err(v.at_body(
            b,
            format!(
                "operand {p} reads register {r} for kernel instruction {e}, \
                 but it holds instruction {h}"
            ),
        )),
        _ => Ok(()),
    }
}

fn check_outputs_written_before_read(
    v: &Verifier<'_>,
    walk: &Walk,
    b: &BodyAt<'_>,
    p: usize,
    o: u32,
) -> Result<(), LoopPlanError> {
    let (Some(Some(_)), Some(_)) = (
        walk.written.get(o as usize),
        v.kernel.outputs.get(o as usize),
    ) else {
        return Err(v.at_body(
            b,
            format!("operand {p} reads output {o} before an instruction writes it"),
        ));
    };
    Ok(())
}

/// Run after the source-specific rules: a register or output operand has
/// passed them.
fn check_operand_stands_for_kernel_operand(
    v: &Verifier<'_>,
    b: &BodyAt<'_>,
    p: usize,
    src: Src,
    arg: InstrArg,
) -> Result<(), LoopPlanError> {
    let ok = match (src, arg) {
        (Src::Input(i), InstrArg::Input(e)) => i == e && v.is_chunk(&v.input_types[i as usize]),
        (Src::InputScalar(i), InstrArg::Input(e)) => {
            i == e && v.input_types[i as usize].dims.is_empty()
        }
        (Src::Dest(d), InstrArg::Input(e)) => d == e && v.is_chunk(&v.input_types[d as usize]),
        (Src::Prelude(l), InstrArg::Local(e)) => {
            l == e
                && v.instr_of(l)
                    .is_some_and(|x| x.stage == Stage::Prelude && v.is_chunk(&x.ty))
        }
        (Src::PreludeScalar(l), InstrArg::Local(e)) => {
            l == e
                && v.instr_of(l)
                    .is_some_and(|x| x.stage == Stage::Prelude && x.ty.dims.is_empty())
        }
        (Src::Reg(_), InstrArg::Local(_)) => true,
        (Src::Output(o), InstrArg::Local(e)) => v.kernel.outputs[o as usize].0 == e,
        _ => false,
    };
    if !ok {
        return Err(v.at_body(
            b,
            format!(
                "operand {p} is {src:?}, but kernel instruction {} reads {arg:?}",
                b.j
            ),
        ));
    }
    Ok(())
}

fn check_direct_write_targets_its_output(
    v: &Verifier<'_>,
    b: &BodyAt<'_>,
    o: u32,
) -> Result<(), LoopPlanError> {
    let (Some(out), Some(&(i, _))) = (
        v.plan.outputs.get(o as usize),
        v.kernel.outputs.get(o as usize),
    ) else {
        return Err(v.at_body(
            b,
            format!("writes output {o}, but there are {}", v.plan.outputs.len()),
        ));
    };
    if !out.direct {
        return Err(v.at_body(
            b,
            format!(
                "writes output {o} directly, but the plan copies it from register {}",
                out.reg
            ),
        ));
    }
    if i != b.j {
        return Err(v.at_body(
            b,
            format!(
                "writes output {o}, which is kernel instruction {i}, not {}",
                b.j
            ),
        ));
    }
    Ok(())
}

fn check_outputs_written_once(
    v: &Verifier<'_>,
    walk: &Walk,
    b: &BodyAt<'_>,
    o: u32,
) -> Result<(), LoopPlanError> {
    if let Some(w) = walk.written[o as usize] {
        return Err(v.at_body(
            b,
            format!("writes output {o}, already written by body instruction {w}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::loop_plan::{last_uses, tests::adam};

    /// Rule 19 on a walk that already saw the output written: a plan
    /// cannot break it alone (see the rule).
    #[test]
    fn check_outputs_written_once_rejects_a_second_write() {
        let (exe, aliases, k, plan) = adam();
        let last_use = last_uses(&exe);
        let kernel = &exe.kernels[k];
        let v = Verifier {
            exe: &exe,
            k,
            kernel,
            last_use: &last_use,
            aliases: &aliases,
            plan: &plan,
            input_types: Vec::new(),
            loop_instrs: Vec::new(),
        };
        let at = (plan.body.iter())
            .position(|b| b.direct.is_some())
            .expect("a direct output");
        let instr = &plan.body[at];
        let o = instr.direct.unwrap();
        let j = kernel.outputs[o as usize].0;
        let place = format!("body instruction {at} ({})", instr.op);
        let b = BodyAt {
            instr,
            place: place.clone(),
            first: j,
            j,
            ki: &kernel.instrs[j as usize],
        };
        let mut walk = Walk {
            holds: vec![None; plan.regs.len()],
            written: vec![None; plan.outputs.len()],
            next: 0,
        };
        assert_eq!(check_outputs_written_once(&v, &walk, &b, o), Ok(()));
        walk.written[o as usize] = Some(0);
        assert_eq!(
            check_outputs_written_once(&v, &walk, &b, o),
            Err(LoopPlanError {
                kernel: kernel.name.clone(),
                place,
                message: format!("writes output {o}, already written by body instruction 0"),
            })
        );
    }
}
