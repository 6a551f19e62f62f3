//! Whole-tensor kernels: dot, reduce, convolution, structural ops and
//! custom calls, each instruction over whole tensors with the shared
//! kernels.

use std::borrow::Cow;

use smallvec::SmallVec;

use super::matmul::matmul;
use super::value::{Slot, read, unwritten};
use super::{CustomCallError, CustomCallHandler, ExecError, Runtime};
use crate::compiler::executable::{Arg as InstrArg, Instr, LoweredKernel};
use crate::exec::error::KernelFailure;
use crate::ir::{KernelError, Op, Tensor};
use crate::kernels::evaluate;

impl Runtime {
    /// Runs a kernel that is not a fused loop, instruction by instruction
    /// over whole tensors.
    pub(super) fn run_whole(
        &self,
        kernel: &LoweredKernel,
        slots: &mut [Option<Slot>],
        calls: &mut dyn CustomCallHandler,
    ) -> Result<(), ExecError> {
        let exe = &*self.exe;
        let mut locals: Vec<Tensor> = Vec::with_capacity(kernel.instrs.len());
        {
            let inputs: Vec<Cow<'_, Tensor>> = kernel
                .inputs
                .iter()
                .map(|&r| read(exe, slots, r))
                .collect::<Result<_, _>>()?;
            for instr in &kernel.instrs {
                let value = {
                    let args: SmallVec<[&Tensor; 4]> = instr
                        .args
                        .iter()
                        .map(|a| match *a {
                            InstrArg::Input(i) => &*inputs[i as usize],
                            InstrArg::Local(l) => &locals[l as usize],
                        })
                        .collect();
                    eval_whole(instr, &args, calls)
                };
                let value = value.map_err(|e| match e {
                    WholeError::Kernel(source) => ExecError::Kernel {
                        kernel: kernel.name.clone(),
                        source: KernelFailure::Eval(source),
                    },
                    WholeError::Call(target, source) => ExecError::CustomCall { target, source },
                })?;
                locals.push(value);
            }
        }
        let mut locals: Vec<Option<Tensor>> = locals.into_iter().map(Some).collect();
        for (pos, &(i, b)) in kernel.outputs.iter().enumerate() {
            let again = kernel.outputs[pos + 1..].iter().any(|&(j, _)| j == i);
            let t = if again {
                locals[i as usize].clone()
            } else {
                locals[i as usize].take()
            }
            .ok_or_else(|| unwritten(b))?;
            slots[b as usize] = Some(Slot::from_tensor(t));
        }
        Ok(())
    }
}

/// Why one whole-tensor instruction failed: its kernel, or a custom call
/// (target, message).
enum WholeError {
    Kernel(KernelError),
    Call(String, CustomCallError),
}

/// One instruction over whole tensors.
fn eval_whole(
    instr: &Instr,
    args: &[&Tensor],
    calls: &mut dyn CustomCallHandler,
) -> Result<Tensor, WholeError> {
    match &instr.op {
        Op::CustomCall { target } if target != "identity" => {
            let t = calls
                .call(target, args, &instr.ty)
                .map_err(|m| WholeError::Call(target.clone(), m))?;
            if t.tensor_type() != instr.ty {
                return Err(WholeError::Call(
                    target.clone(),
                    CustomCallError::WrongType {
                        returned: t.tensor_type().to_string(),
                        expected: instr.ty.to_string(),
                    },
                ));
            }
            Ok(t)
        }
        Op::Dot(dims) => match matmul(args, dims) {
            Some(t) => Ok(t),
            None => evaluate(&instr.op, args, Some(&instr.ty)).map_err(WholeError::Kernel),
        },
        op => evaluate(op, args, Some(&instr.ty)).map_err(WholeError::Kernel),
    }
}
