//! [`Executable`]: the lowered program, free of entities, and its evaluator.
//!
//! Every kernel is a list of instructions over the shared kernels
//! ([`crate::kernels::evaluate`]). A loop-fusion kernel is a **fused
//! loop**: lowering picks its loop shape (its largest output) and splits its
//! instructions into a [`Stage::Prelude`] (scalars, broadcasts and anything
//! not of the loop shape, computed once over whole tensors) and a
//! [`Stage::Loop`] body (elementwise ops of the loop shape). The body runs
//! chunk by chunk over [`LOOP_CHUNK`] elements, so its intermediates live in
//! chunk-sized scratch, each input chunk is read once, and only the kernel's
//! outputs are written to their planned buffers. Other kernels run their one
//! op over whole tensors.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::time::Instant;

use super::op::Op;
use super::types::TensorType;
use super::{ArgumentCount, CompileError};
use crate::ir::Tensor;
use crate::kernels::evaluate;

/// Where a value lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValueRef {
    /// A planned buffer (parameters and kernel outputs).
    Buffer(u32),
    /// The constant pool.
    Constant(u32),
}

/// An instruction operand inside a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Arg {
    /// The kernel's `i`-th input.
    Input(u32),
    /// The result of the kernel's `i`-th instruction.
    Local(u32),
}

/// Elements per chunk of a fused loop.
pub const LOOP_CHUNK: usize = 4096;

/// When an instruction of a fused kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stage {
    /// Once, over whole tensors, before the loop.
    Prelude,
    /// Per chunk, inside the loop.
    Loop,
}

/// One op of a kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instr {
    /// The op.
    pub op: Op,
    /// Its operands.
    pub args: SmallVec<[Arg; 4]>,
    /// Its result type.
    pub ty: TensorType,
    /// Prelude or loop body.
    pub stage: Stage,
}

/// A kernel of the executable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoweredKernel {
    /// A readable name (`fusion.0: exp, add`).
    pub name: String,
    /// Whether this is a loop fusion.
    pub fused: bool,
    /// Values read, each once.
    pub inputs: Vec<ValueRef>,
    /// Instructions in order.
    pub instrs: Vec<Instr>,
    /// `(instruction, buffer)` pairs written.
    pub outputs: Vec<(u32, u32)>,
    /// The loop shape of a fused loop (`None`: every instruction is prelude).
    pub loop_shape: Option<Vec<usize>>,
}

/// Stages the instructions of a loop-fusion kernel: the loop shape is the
/// largest output's; an instruction joins the loop body when it is
/// elementwise, has the loop shape, and each operand is a body value, a
/// value of the loop shape (read chunk by chunk) or a scalar. When a prelude
/// instruction would need a body value the kernel falls back to running
/// every instruction whole. Returns the loop shape, if any.
pub fn stage_fused_loop(
    instrs: &mut [Instr],
    input_dims: &[Vec<usize>],
    outputs: &[(u32, u32)],
) -> Option<Vec<usize>> {
    let shape = outputs
        .iter()
        .map(|&(i, _)| &instrs[i as usize].ty.dims)
        .max_by_key(|d| d.iter().product::<usize>())?
        .clone();
    let mut stages: Vec<Stage> = Vec::with_capacity(instrs.len());
    for instr in instrs.iter() {
        let arg_ok = |a: &Arg| match *a {
            Arg::Input(i) => input_dims[i as usize] == shape || input_dims[i as usize].is_empty(),
            Arg::Local(l) => {
                stages[l as usize] == Stage::Loop
                    || instrs[l as usize].ty.dims == shape
                    || instrs[l as usize].ty.dims.is_empty()
            }
        };
        let in_loop =
            instr.op.is_elementwise() && instr.ty.dims == shape && instr.args.iter().all(arg_ok);
        if !in_loop
            && instr
                .args
                .iter()
                .any(|a| matches!(*a, Arg::Local(l) if stages[l as usize] == Stage::Loop))
        {
            return None;
        }
        stages.push(if in_loop { Stage::Loop } else { Stage::Prelude });
    }
    if !stages.contains(&Stage::Loop) {
        return None;
    }
    for (instr, stage) in instrs.iter_mut().zip(stages) {
        instr.stage = stage;
    }
    Some(shape)
}

/// A planned buffer slot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BufferSlot {
    /// Offset in the heap.
    pub offset: usize,
    /// Aligned size in bytes.
    pub size: usize,
    /// The value's type.
    pub ty: String,
}

/// A compiled program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Executable {
    /// Program name.
    pub name: String,
    /// Parameter types, by index.
    pub parameters: Vec<TensorType>,
    /// The buffer of each parameter.
    pub parameter_buffers: Vec<u32>,
    /// Constant pool.
    pub constants: Vec<Tensor>,
    /// Planned buffers.
    pub buffers: Vec<BufferSlot>,
    /// Kernels in execution order.
    pub kernels: Vec<LoweredKernel>,
    /// Program results, in declared order.
    pub outputs: Vec<ValueRef>,
    /// Heap bytes the plan needs.
    pub heap_bytes: usize,
    /// Elements per chunk of fused loops ([`LOOP_CHUNK`] by default).
    pub loop_chunk: usize,
}

/// Wall time of one kernel run (profiling only).
#[derive(Debug, Clone)]
pub struct KernelTiming {
    /// The kernel's name.
    pub name: String,
    /// Whether it is a fused loop.
    pub fused: bool,
    /// When it started.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
}

impl Executable {
    /// Runs the program on `args` (one tensor per parameter, in index order).
    pub fn run(&self, args: &[Tensor]) -> Result<Vec<Tensor>, CompileError> {
        self.run_observed(args, &mut |_, _, _| {})
    }

    /// [`Executable::run`], also returning the wall time of each kernel (for
    /// the profiler's trace).
    pub fn run_timed(
        &self,
        args: &[Tensor],
    ) -> Result<(Vec<Tensor>, Vec<KernelTiming>), CompileError> {
        let mut timings = Vec::with_capacity(self.kernels.len());
        let outputs = self.run_observed(args, &mut |kernel, start, end| {
            timings.push(KernelTiming {
                name: kernel.name.clone(),
                fused: kernel.fused,
                start,
                end,
            })
        })?;
        Ok((outputs, timings))
    }

    /// Errors, naming the program, unless it is given `got` arguments (one
    /// per parameter). Every evaluator of an executable checks this first.
    pub fn check_argument_count(&self, got: usize) -> Result<(), ArgumentCount> {
        if got == self.parameters.len() {
            Ok(())
        } else {
            Err(ArgumentCount {
                program: self.name.clone(),
                expected: self.parameters.len(),
                got,
            })
        }
    }

    fn run_observed(
        &self,
        args: &[Tensor],
        on_kernel: &mut dyn FnMut(&LoweredKernel, Instant, Instant),
    ) -> Result<Vec<Tensor>, CompileError> {
        self.check_argument_count(args.len())
            .map_err(CompileError::ArgumentCount)?;
        let mut slots: Vec<Option<Tensor>> = vec![None; self.buffers.len()];
        for (i, (arg, ty)) in args.iter().zip(&self.parameters).enumerate() {
            if &arg.tensor_type() != ty {
                return Err(CompileError::Arguments(format!(
                    "argument {i} of `{}` must be {ty}, got {}",
                    self.name,
                    arg.tensor_type()
                )));
            }
            slots[self.parameter_buffers[i] as usize] = Some(arg.clone());
        }
        for kernel in &self.kernels {
            let start = Instant::now();
            let outputs = self.run_kernel(kernel, &slots)?;
            on_kernel(kernel, start, Instant::now());
            for ((_, buffer), value) in kernel.outputs.iter().zip(outputs) {
                slots[*buffer as usize] = Some(value);
            }
        }
        self.outputs
            .iter()
            .map(|r| self.read(&slots, *r).cloned())
            .collect()
    }

    fn read<'a>(
        &'a self,
        slots: &'a [Option<Tensor>],
        r: ValueRef,
    ) -> Result<&'a Tensor, CompileError> {
        match r {
            ValueRef::Constant(c) => Ok(&self.constants[c as usize]),
            ValueRef::Buffer(b) => slots[b as usize].as_ref().ok_or_else(|| {
                CompileError::Arguments(format!("buffer {b} is read before it is written"))
            }),
        }
    }

    fn run_kernel(
        &self,
        kernel: &LoweredKernel,
        slots: &[Option<Tensor>],
    ) -> Result<Vec<Tensor>, CompileError> {
        let inputs: Vec<&Tensor> = kernel
            .inputs
            .iter()
            .map(|&r| self.read(slots, r))
            .collect::<Result<_, _>>()?;
        let mut locals: Vec<Tensor> = Vec::with_capacity(kernel.instrs.len());
        for instr in &kernel.instrs {
            let value = {
                let args: SmallVec<[&Tensor; 4]> = instr
                    .args
                    .iter()
                    .map(|a| match *a {
                        Arg::Input(i) => inputs[i as usize],
                        Arg::Local(l) => &locals[l as usize],
                    })
                    .collect();
                evaluate(&instr.op, &args, Some(&instr.ty)).map_err(|source| {
                    CompileError::Kernel {
                        node: kernel.name.clone(),
                        source,
                    }
                })?
            };
            locals.push(value);
        }
        Ok(kernel
            .outputs
            .iter()
            .map(|&(i, _)| locals[i as usize].clone())
            .collect())
    }
}
