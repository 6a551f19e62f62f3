//! A fused loop's prelude: the values computed once per run before the
//! loop (Adam's bias corrections), over plain scalars when they all are,
//! else over whole tensors.

use std::borrow::Cow;

use smallvec::SmallVec;

use super::ExecError;
use super::value::{Slot, read, unwritten};
use crate::compiler::executable::{Arg as InstrArg, Executable, LoweredKernel, ValueRef};
use crate::exec::error::KernelFailure;
use crate::exec::loop_plan::FusedPlan;
use crate::ir::{Tensor, TensorType};
use crate::kernels::evaluate;
use crate::kernels::scalar::{self, Scalar};

/// Whether every prelude instruction of a fused loop is an elementwise op
/// on scalars (its inputs rank 0), so the prelude runs without tensors.
pub(super) fn is_scalar_prelude(
    kernel: &LoweredKernel,
    input_types: &[TensorType],
    plan: &FusedPlan,
) -> bool {
    plan.prelude.iter().all(|&p| {
        let instr = &kernel.instrs[p as usize];
        instr.ty.dims.is_empty()
            && scalar::is_scalar_op(&instr.op)
            && instr.args.iter().all(|a| match *a {
                InstrArg::Input(i) => input_types[i as usize].dims.is_empty(),
                InstrArg::Local(l) => kernel.instrs[l as usize].ty.dims.is_empty(),
            })
    })
}

/// The value of a rank-0 kernel input, read where it lies.
pub(super) fn read_scalar(
    constants: &[Option<Scalar>],
    slots: &[Option<Slot>],
    r: ValueRef,
) -> Result<Scalar, ExecError> {
    match r {
        ValueRef::Constant(c) => constants.get(c as usize).copied().flatten(),
        ValueRef::Buffer(b) => {
            let s = slots[b as usize].as_ref().ok_or_else(|| unwritten(b))?;
            // SAFETY: a slot's address holds its type's elements for as long
            // as the slot is held; a rank-0 type has one.
            (s.ty.dims.is_empty() && s.ptr != 0).then(|| unsafe { Scalar::read(s.ty.dtype, s.ptr) })
        }
    }
    .ok_or_else(|| ExecError::Arguments("a scalar prelude input is not one element".into()))
}

/// The error of kernel `kernel`.
pub(super) fn kernel_error(kernel: &LoweredKernel, source: KernelFailure) -> ExecError {
    ExecError::Kernel {
        kernel: kernel.name.clone(),
        source,
    }
}

/// Evaluates an all-scalar prelude on plain values, without building
/// tensors: `scalars` gets one entry per kernel instruction, set for the
/// prelude's.
pub(super) fn eval_scalar_prelude(
    constants: &[Option<Scalar>],
    kernel: &LoweredKernel,
    plan: &FusedPlan,
    slots: &[Option<Slot>],
    scalars: &mut SmallVec<[Option<Scalar>; 64]>,
) -> Result<(), ExecError> {
    scalars.resize(kernel.instrs.len(), None);
    for &p in &plan.prelude {
        let instr = &kernel.instrs[p as usize];
        let mut args: SmallVec<[Scalar; 4]> = SmallVec::new();
        for a in &instr.args {
            args.push(match *a {
                InstrArg::Input(i) => read_scalar(constants, slots, kernel.inputs[i as usize])?,
                InstrArg::Local(l) => scalars[l as usize]
                    .ok_or_else(|| kernel_error(kernel, KernelFailure::PreludeReadsLoop))?,
            });
        }
        let v = scalar::evaluate(&instr.op, &args).map_err(|e| kernel_error(kernel, e.into()))?;
        scalars[p as usize] = Some(v);
    }
    Ok(())
}

/// Evaluates a prelude over whole tensors: `prelude` gets one entry per
/// kernel instruction, set for the prelude's.
pub(super) fn eval_tensor_prelude(
    exe: &Executable,
    kernel: &LoweredKernel,
    plan: &FusedPlan,
    slots: &[Option<Slot>],
    prelude: &mut Vec<Option<Tensor>>,
) -> Result<(), ExecError> {
    prelude.resize(kernel.instrs.len(), None);
    // Only the inputs the prelude reads (a borrowed input would be
    // copied to become a tensor).
    let mut inputs: Vec<Option<Cow<'_, Tensor>>> = vec![None; kernel.inputs.len()];
    for &p in &plan.prelude {
        for a in &kernel.instrs[p as usize].args {
            if let InstrArg::Input(i) = *a
                && inputs[i as usize].is_none()
            {
                inputs[i as usize] = Some(read(exe, slots, kernel.inputs[i as usize])?);
            }
        }
    }
    for &p in &plan.prelude {
        let instr = &kernel.instrs[p as usize];
        let v = {
            let args: SmallVec<[&Tensor; 4]> = instr
                .args
                .iter()
                .map(|a| match *a {
                    InstrArg::Input(i) => inputs[i as usize].as_deref(),
                    InstrArg::Local(l) => prelude[l as usize].as_ref(),
                })
                .collect::<Option<_>>()
                .ok_or_else(|| kernel_error(kernel, KernelFailure::PreludeReadsLoop))?;
            evaluate(&instr.op, &args, Some(&instr.ty))
                .map_err(|e| kernel_error(kernel, e.into()))?
        };
        prelude[p as usize] = Some(v);
    }
    Ok(())
}
