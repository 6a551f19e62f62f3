//! The plan verifier: the invariants of the module doc (`super`), one
//! function per rule, each named for it. [`verify_plan`] runs them in this
//! order and returns the first violation; a rule may rely on the ones
//! before it.
//!
//! The plan and its kernel:
//! 1. `check_kernel_exists`: the plan is for a kernel of the executable;
//! 2. `check_loop_shape`: the kernel is fused and the plan covers its loop
//!    shape;
//! 3. `check_inputs_typed`: every kernel input has a type;
//! 4. `check_prelude_in_order`: the prelude is the kernel's prelude
//!    instructions, in order.
//!
//! Each body instruction, in order:
//! 5. `check_body_in_kernel_order`: it is the next loop instruction (two,
//!    for a folded multiply-add), with its op;
//! 6. `check_destination_register_typed`: it writes an allocated register
//!    of its value's dtype;
//! 7. `check_fold_reads_product_in_place`: a folded multiply-add is a
//!    multiply and the float add or subtract right after it, which reads
//!    the product as the same operand;
//! 8. `check_folded_product_read_once`: that add or subtract is the only
//!    reader of the product;
//! 9. `check_operand_count`: one operand and one type per kernel operand;
//!
//! and each of its operands:
//! 10. `check_operand_typed`: typed as its kernel operand;
//! 11. `check_destination_read_in_place`: it reads the destination only
//!     when the instruction writes an output over that input, as the
//!     operand of a binary float op or the addend of a folded multiply-add;
//! 12. `check_register_not_own_destination`: it never reads the
//!     instruction's own destination register;
//! 13. `check_register_allocated`: it reads a register within the
//!     allocated count;
//! 14. `check_registers_defined_before_use`: an earlier instruction wrote
//!     that register;
//! 15. `check_register_holds_operand`: with that value, not reused since;
//! 16. `check_outputs_written_before_read`: it reads an output its
//!     instruction already wrote;
//! 17. `check_operand_stands_for_kernel_operand`: the source is its kernel
//!     operand (an input or prelude value of the loop shape or a scalar, a
//!     register or output holding that value);
//!
//! then, for an instruction writing an output directly:
//! 18. `check_direct_write_targets_its_output`: the output exists, is
//!     direct and is this instruction's value;
//! 19. `check_outputs_written_once`: no earlier instruction wrote it.
//!
//! After the body:
//! 20. `check_body_complete`: the body covers every loop instruction;
//! 21. `check_output_count`: one planned output per kernel output;
//!
//! and each output:
//! 22. `check_output_buffer`: it goes to the kernel output's buffer;
//! 23. `check_output_stage`: a prelude value is planned as one, a loop
//!     value is not;
//! 24. `check_loop_output_written`: a direct output was written by its
//!     instruction, any other is copied from the register holding its value
//!     after the body;
//! 25. `check_aliased_output_has_donor`: an aliased output has a donor;
//! 26. `check_donor_is_buffer_input`: the donor is a buffer input;
//! 27. `check_donor_donates_once`: to this output only;
//! 28. `check_donor_read_last_here`: no later kernel reads it;
//! 29. `check_donor_type`: of the output's type;
//! 30. `check_donor_placement`: the parameter the output is aliased to, or
//!     at the output's offset;
//! 31. `check_donor_not_read_after_direct_write`: no instruction after the
//!     one writing a direct output reads its donor.
//!
//! Last:
//! 32. `check_streams_loop_shaped`: each prefetched stream is a kernel
//!     input or a loop output.

use smallvec::SmallVec;

use super::{BodyInstr, FusedOutput, FusedPlan, LoopPlanError, Src};
use crate::compiler::executable::{
    Arg as InstrArg, Executable, Instr, LoweredKernel, Stage, ValueRef,
};
use crate::ir::{BinaryOp, Op, TensorType};

/// Checks `plan` against kernel `k` of `exe`, planned with `aliases` and
/// the last reader of each buffer `last_use`: the invariants of the module
/// doc. The error names the kernel and the instruction or output.
pub(in crate::exec) fn verify_plan(
    exe: &Executable,
    k: usize,
    last_use: &[usize],
    aliases: &[(usize, usize)],
    plan: &FusedPlan,
) -> Result<(), LoopPlanError> {
    let kernel = check_kernel_exists(exe, k)?;
    let v = Verifier {
        exe,
        k,
        kernel,
        last_use,
        aliases,
        plan,
        input_types: Vec::new(),
        loop_instrs: Vec::new(),
    };
    check_loop_shape(&v)?;
    let v = Verifier {
        input_types: check_inputs_typed(&v)?,
        loop_instrs: (0..kernel.instrs.len() as u32)
            .filter(|&j| kernel.instrs[j as usize].stage == Stage::Loop)
            .collect(),
        ..v
    };
    check_prelude_in_order(&v)?;
    let mut walk = Walk {
        holds: vec![None; plan.regs.len()],
        written: vec![None; plan.outputs.len()],
        next: 0,
    };
    for (at, instr) in plan.body.iter().enumerate() {
        check_body_instr(&v, &mut walk, at, instr)?;
    }
    check_body_complete(&v, &walk)?;
    check_output_count(&v)?;
    let mut donors: Vec<u32> = Vec::new();
    for o in 0..plan.outputs.len() {
        check_output(&v, &walk, &mut donors, o)?;
    }
    check_streams_loop_shaped(&v)
}

/// What every rule reads: the plan, its kernel and what it was planned
/// with.
struct Verifier<'a> {
    exe: &'a Executable,
    k: usize,
    kernel: &'a LoweredKernel,
    last_use: &'a [usize],
    aliases: &'a [(usize, usize)],
    plan: &'a FusedPlan,
    /// The type of each kernel input (once `check_inputs_typed` passed).
    input_types: Vec<TensorType>,
    /// The kernel's loop instructions, in order.
    loop_instrs: Vec<u32>,
}

impl Verifier<'_> {
    fn fail(&self, place: String, message: String) -> LoopPlanError {
        LoopPlanError {
            kernel: self.kernel.name.clone(),
            place,
            message,
        }
    }

    /// A violation of the plan as a whole.
    fn whole(&self, message: String) -> LoopPlanError {
        self.fail("plan".into(), message)
    }

    /// Whether a value of type `t` is read chunk by chunk.
    fn is_chunk(&self, t: &TensorType) -> bool {
        !t.dims.is_empty() && t.element_count() == self.plan.len
    }

    fn instr_of(&self, l: u32) -> Option<&Instr> {
        self.kernel.instrs.get(l as usize)
    }
}

/// What the walk over the body has established so far.
struct Walk {
    /// The kernel instruction whose value each register holds.
    holds: Vec<Option<u32>>,
    /// The body instruction that wrote each direct output.
    written: Vec<Option<usize>>,
    /// The next kernel loop instruction, by position.
    next: usize,
}

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

/// A planned output and its kernel output.
struct OutputAt<'a> {
    o: usize,
    out: &'a FusedOutput,
    /// The kernel instruction computing it.
    i: u32,
    /// Its buffer.
    b: u32,
}

impl Verifier<'_> {
    fn at_body(&self, b: &BodyAt<'_>, message: String) -> LoopPlanError {
        self.fail(b.place.clone(), message)
    }

    fn at_output(&self, out: &OutputAt<'_>, message: String) -> LoopPlanError {
        self.fail(format!("output {}", out.o), message)
    }
}

fn check_kernel_exists(exe: &Executable, k: usize) -> Result<&LoweredKernel, LoopPlanError> {
    exe.kernels.get(k).ok_or_else(|| LoopPlanError {
        kernel: format!("#{k}"),
        place: "plan".into(),
        message: format!("the executable has {} kernels", exe.kernels.len()),
    })
}

fn check_loop_shape(v: &Verifier<'_>) -> Result<(), LoopPlanError> {
    let Some(shape) = v.kernel.loop_shape.as_ref() else {
        return Err(v.whole("the kernel has no loop shape".into()));
    };
    if v.plan.len != shape.iter().product::<usize>() {
        return Err(v.whole(format!("{} elements for loop shape {shape:?}", v.plan.len)));
    }
    Ok(())
}

fn check_inputs_typed(v: &Verifier<'_>) -> Result<Vec<TensorType>, LoopPlanError> {
    let exe = v.exe;
    let mut input_types = Vec::with_capacity(v.kernel.inputs.len());
    for (i, &r) in v.kernel.inputs.iter().enumerate() {
        let ty = match r {
            ValueRef::Constant(c) => exe.constants.get(c as usize).map(|t| t.tensor_type()),
            ValueRef::Buffer(b) => exe
                .buffers
                .get(b as usize)
                .and_then(|s| TensorType::parse(&s.ty)),
        };
        input_types.push(ty.ok_or_else(|| v.whole(format!("input {i} has no type")))?);
    }
    Ok(input_types)
}

fn check_prelude_in_order(v: &Verifier<'_>) -> Result<(), LoopPlanError> {
    let kernel = v.kernel;
    let prelude: Vec<u32> = (0..kernel.instrs.len() as u32)
        .filter(|&j| kernel.instrs[j as usize].stage == Stage::Prelude)
        .collect();
    if v.plan.prelude != prelude {
        return Err(v.whole(format!(
            "prelude {:?}, but the kernel's prelude instructions are {prelude:?}",
            v.plan.prelude
        )));
    }
    Ok(())
}

/// The rules of one body instruction, then what it leaves in `walk`.
fn check_body_instr(
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

fn check_body_complete(v: &Verifier<'_>, walk: &Walk) -> Result<(), LoopPlanError> {
    if walk.next != v.loop_instrs.len() {
        return Err(v.whole(format!(
            "the body computes {} of the kernel's {} loop instructions",
            walk.next,
            v.loop_instrs.len()
        )));
    }
    Ok(())
}

fn check_output_count(v: &Verifier<'_>) -> Result<(), LoopPlanError> {
    if v.plan.outputs.len() != v.kernel.outputs.len() {
        return Err(v.whole(format!(
            "{} outputs for the kernel's {}",
            v.plan.outputs.len(),
            v.kernel.outputs.len()
        )));
    }
    Ok(())
}

/// The rules of output `o`; `donors` are the inputs earlier outputs take.
fn check_output(
    v: &Verifier<'_>,
    walk: &Walk,
    donors: &mut Vec<u32>,
    o: usize,
) -> Result<(), LoopPlanError> {
    let (i, b) = v.kernel.outputs[o];
    let at = OutputAt {
        o,
        out: &v.plan.outputs[o],
        i,
        b,
    };
    check_output_buffer(v, &at)?;
    if check_output_stage(v, &at)? == Stage::Prelude {
        return Ok(());
    }
    check_loop_output_written(v, walk, &at)?;
    let Some(d) = at.out.donor else {
        return check_aliased_output_has_donor(v, &at);
    };
    let ib = check_donor_is_buffer_input(v, &at, d)?;
    check_donor_donates_once(v, &at, d, donors)?;
    donors.push(d);
    check_donor_read_last_here(v, &at, d, ib)?;
    check_donor_type(v, &at, d, ib)?;
    check_donor_placement(v, &at, d, ib)?;
    check_donor_not_read_after_direct_write(v, walk, &at, d)
}

fn check_output_buffer(v: &Verifier<'_>, at: &OutputAt<'_>) -> Result<(), LoopPlanError> {
    if at.out.buffer != at.b {
        return Err(v.at_output(
            at,
            format!("goes to buffer {}, not {}", at.out.buffer, at.b),
        ));
    }
    Ok(())
}

/// The stage of the output's instruction, as planned.
fn check_output_stage(v: &Verifier<'_>, at: &OutputAt<'_>) -> Result<Stage, LoopPlanError> {
    let (out, i) = (at.out, at.i);
    if v.instr_of(i).is_some_and(|x| x.stage == Stage::Prelude) {
        if out.prelude != Some(i) || out.donor.is_some() || out.direct {
            return Err(v.at_output(
                at,
                format!("is prelude instruction {i}, planned as {out:?}"),
            ));
        }
        return Ok(Stage::Prelude);
    }
    if out.prelude.is_some() {
        return Err(v.at_output(
            at,
            format!("is loop instruction {i}, planned as a prelude value"),
        ));
    }
    Ok(Stage::Loop)
}

fn check_loop_output_written(
    v: &Verifier<'_>,
    walk: &Walk,
    at: &OutputAt<'_>,
) -> Result<(), LoopPlanError> {
    let (out, i) = (at.out, at.i);
    match (out.direct, walk.written[at.o]) {
        (true, None) => Err(v.at_output(at, "is direct, but no instruction writes it".into())),
        (false, Some(w)) => Err(v.at_output(
            at,
            format!("is copied from a register, but body instruction {w} writes it directly"),
        )),
        (false, None) if walk.holds.get(out.reg as usize) != Some(&Some(i)) => Err(v.at_output(
            at,
            format!(
                "is copied from register {}, which holds {:?} after the body, not \
                 kernel instruction {i}",
                out.reg,
                walk.holds.get(out.reg as usize).copied().flatten()
            ),
        )),
        _ => Ok(()),
    }
}

/// Run for an output without a donor.
fn check_aliased_output_has_donor(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
) -> Result<(), LoopPlanError> {
    if at.out.aliased {
        return Err(v.at_output(at, "is aliased without a donor input".into()));
    }
    Ok(())
}

/// The donor's buffer.
fn check_donor_is_buffer_input(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
) -> Result<u32, LoopPlanError> {
    let Some(&ValueRef::Buffer(ib)) = v.kernel.inputs.get(d as usize) else {
        return Err(v.at_output(
            at,
            format!("is placed over input {d}, which is not a buffer"),
        ));
    };
    Ok(ib)
}

fn check_donor_donates_once(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    donors: &[u32],
) -> Result<(), LoopPlanError> {
    if donors.contains(&d) {
        return Err(v.at_output(
            at,
            format!("is placed over input {d}, which another output takes"),
        ));
    }
    Ok(())
}

fn check_donor_read_last_here(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    ib: u32,
) -> Result<(), LoopPlanError> {
    if v.last_use.get(ib as usize) != Some(&v.k) {
        return Err(v.at_output(
            at,
            format!("is placed over input {d} (buffer {ib}), which is read after this kernel"),
        ));
    }
    Ok(())
}

fn check_donor_type(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    ib: u32,
) -> Result<(), LoopPlanError> {
    let (from, to) = (&v.exe.buffers[ib as usize], &v.exe.buffers[at.b as usize]);
    if from.ty != to.ty {
        return Err(v.at_output(
            at,
            format!("is {}, placed over input {d} of type {}", to.ty, from.ty),
        ));
    }
    Ok(())
}

fn check_donor_placement(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    ib: u32,
) -> Result<(), LoopPlanError> {
    let (exe, b) = (v.exe, at.b);
    let (from, to) = (&exe.buffers[ib as usize], &exe.buffers[b as usize]);
    let allowed = if at.out.aliased {
        v.aliases.iter().any(|&(ao, p)| {
            exe.outputs.get(ao) == Some(&ValueRef::Buffer(b))
                && exe.parameter_buffers.get(p) == Some(&ib)
        })
    } else {
        from.offset == to.offset
    };
    if !allowed {
        return Err(v.at_output(
            at,
            format!(
                "is placed over input {d} (buffer {ib}), which {}",
                if at.out.aliased {
                    "is not the parameter it is aliased to"
                } else {
                    "the memory plan puts elsewhere"
                }
            ),
        ));
    }
    Ok(())
}

/// Written during the body: no later instruction may read the input it
/// overwrites (its own instruction reads each element before it writes
/// it).
fn check_donor_not_read_after_direct_write(
    v: &Verifier<'_>,
    walk: &Walk,
    at: &OutputAt<'_>,
    d: u32,
) -> Result<(), LoopPlanError> {
    let Some(w) = walk.written[at.o] else {
        return Ok(());
    };
    let reads = |x: &BodyInstr| {
        x.args
            .iter()
            .any(|a| matches!(*a, Src::Input(y) | Src::InputScalar(y) | Src::Dest(y) if y == d))
    };
    let body = &v.plan.body;
    if let Some(r) = (w + 1..body.len()).find(|&r| reads(&body[r])) {
        return Err(v.at_output(
            at,
            format!(
                "is written over input {d} by body instruction {w}, but body \
                 instruction {r} reads that input afterwards"
            ),
        ));
    }
    Ok(())
}

fn check_streams_loop_shaped(v: &Verifier<'_>) -> Result<(), LoopPlanError> {
    for &(input, i, _) in &v.plan.streams {
        let ok = if input {
            (i as usize) < v.kernel.inputs.len()
        } else {
            v.plan
                .outputs
                .get(i as usize)
                .is_some_and(|o| o.prelude.is_none())
        };
        if !ok {
            return Err(v.whole(format!(
                "prefetches {} {i}, which is not a loop-shaped one",
                if input { "input" } else { "output" }
            )));
        }
    }
    Ok(())
}
