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
//! 19. `check_outputs_written_once`: no earlier instruction wrote it
//!     (rules 5 and 18 already tie each output to one body instruction:
//!     a guard).
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

mod body;
mod outputs;

use super::{FusedPlan, LoopPlanError};
use crate::compiler::executable::{Executable, Instr, LoweredKernel, Stage, ValueRef};
use crate::ir::TensorType;
use body::check_body_instr;
use outputs::check_output;

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
