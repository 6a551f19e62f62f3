//! The fast executor: runs an optimized, lowered [`Executable`] for real.
//!
//! [`Executable::run`] is the reference evaluator (whole tensors, clones);
//! this module is what a step actually runs on:
//!
//! * **Fused loops run as native code** where their body is in the native
//!   op set (float arithmetic, `sqrt`, compares, `select`, …: see
//!   [`Runtime::native_loops`]): one Cranelift-generated loop per fusion
//!   keeps each element's whole body in vector registers, like XLA's
//!   per-fusion LLVM loops. [`Runtime::with_native_code`]`(false)` turns it
//!   off; both paths agree bit for bit (`tests/native_loops.rs`).
//! * **Loops are split over the pool** in ranges of at most [`TASK`]
//!   elements; a loop of at least [`MIN_TASK`] elements per thread is cut so
//!   that every thread gets an equal share.
//! * **A prelude of scalars** (Adam's bias corrections) is evaluated on
//!   plain values ([`crate::kernels::scalar`]), without building tensors:
//!   at 1e3 elements, one-element arrays cost more than the loop.
//! * **Other fused loops** run chunk by chunk: each body instruction is evaluated
//!   over [`CHUNK`] elements into a chunk-sized scratch register (registers
//!   are reused once their value is dead, so a kernel's working set stays in
//!   L1), each input chunk is read where it lies, and only kernel outputs are
//!   written to their buffers. Dispatch happens once per instruction per
//!   chunk; the inner loops are typed (`f32`, `f64`, `i32`, `pred`) and
//!   monomorphized per op, so they auto-vectorize. Chunks are grouped into
//!   [`TASK`]-element tasks that rayon spreads over the pool.
//! * **In place**: when the memory plan gives a kernel output the offset of
//!   an input whose last reader is that kernel, and the runtime may write
//!   that input (an argument passed with [`Arg::donated`] or [`Arg::owned`],
//!   or a buffer it allocated), the output is written over the input: the
//!   loop reads every element of a chunk before it writes it.
//! * **Other kernels** (dot, reduce, convolution, structural ops) run over
//!   whole tensors with the shared kernels ([`crate::kernels`]); a 2-D
//!   floating-point dot uses ndarray's matrix multiply instead, so it rounds
//!   differently from the reference (which accumulates in index order).
//! * **Custom calls** go to a [`CustomCallHandler`] the caller passes in;
//!   `identity` is built in.
//!
//! Arguments are borrowed ([`Arg::view`]), donated ([`Arg::donated`]) or
//! owned ([`Arg::owned`]); a result is either a new tensor or "in argument
//! `i`" ([`RunOutput::InArgument`]), so a donated buffer is never copied.
//!
//! This module is the API and the driver of a run. Fused loops are planned
//! by the `fused-loop-planning` pass ([`crate::exec::loop_plan`], reported
//! by [`Runtime::loop_plans`]) and run by the chunk interpreter
//! (`exec::interpreter`) or as native code (`exec::native`); the errors and
//! element types live in `exec::error` and `exec::element` and are
//! re-exported here.
//!
//! The run is in parts: the values and buffers of a run (`value`), the
//! split of a loop over the pool (`tasks`), a fused loop's prelude
//! (`prelude`) and its execution (`fused`), and the kernels that run over
//! whole tensors (`whole`, with the 2-D dot in `matmul`).

use std::marker::PhantomData;
use std::sync::Arc;

use ndarray::{Array, Dimension};
use smallvec::SmallVec;

use crate::compiler::executable::{Executable, ValueRef};
pub use crate::exec::error::{CustomCallError, ExecError, KernelFailure, LoopError};
use crate::exec::interpreter::{
    ExecFn, ExecInPlaceFn, ExecProductFn, select_exec, select_exec_in_place, select_exec_product,
};
use crate::exec::loop_plan::{self, FusedPlan, LoopPlanStats};
use crate::exec::native::{self, NativeLoops};
pub use crate::ir::Element;
use crate::ir::Tensor;
use crate::ir::TensorType;
use crate::kernels::scalar::Scalar;

mod fused;
mod matmul;
mod prelude;
mod tasks;
mod value;
mod whole;

use prelude::is_scalar_prelude;
use value::{Slot, ValueType, copy_raw, tensor_ptr_mut, unwritten};

/// Elements per chunk of a fused loop: 16 KiB of `f32` per register, so a
/// handful of live registers stay in L1 and a dozen in L2. Paired runs at
/// 1e7 elements (`cargo bench --bench executor -- '^none$'`) put 4096 ahead
/// of 1024 (per-chunk overhead) and level with 16384; 256 was 2x slower.
pub const CHUNK: usize = 4096;

/// Elements per rayon task (a run of chunks on one thread), at most.
pub const TASK: usize = 1 << 16;

/// Elements per task, at least, when a loop is split over threads: below
/// this, handing a range to another thread costs more than it saves.
pub const MIN_TASK: usize = 1 << 14;

/// One argument of a run: where the value lives and whether the runtime may
/// overwrite it.
pub struct Arg<'a> {
    ty: ValueType,
    ptr: usize,
    writable: bool,
    /// Boxed: a run moves its arguments and slots around, and most hold
    /// no tensor.
    owned: Option<Box<Tensor>>,
    _borrow: PhantomData<&'a mut ()>,
}

impl std::fmt::Debug for Arg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arg")
            .field("ty", &self.ty)
            .field("writable", &self.writable)
            .finish()
    }
}

impl<'a> Arg<'a> {
    /// A tensor handed over: the runtime may write it in place and returns
    /// it (or its replacement) as an output.
    pub fn owned(mut t: Tensor) -> Arg<'static> {
        let ptr = tensor_ptr_mut(&mut t);
        Arg {
            ty: ValueType::of(&t),
            ptr,
            writable: true,
            owned: Some(Box::new(t)),
            _borrow: PhantomData,
        }
    }

    /// A read-only borrow of one rank-0 value (a step count, a learning
    /// rate), without building a tensor.
    pub fn scalar<T: Element>(v: &'a T) -> Arg<'a> {
        Arg {
            ty: ValueType::new(T::DTYPE, &[]),
            ptr: v as *const T as usize,
            writable: false,
            owned: None,
            _borrow: PhantomData,
        }
    }

    /// A read-only borrow (copied once if it is not in standard layout).
    pub fn view<T: Element, D: Dimension>(a: &'a Array<T, D>) -> Arg<'a> {
        match a.as_slice() {
            Some(s) => Arg {
                ty: ValueType::new(T::DTYPE, a.shape()),
                ptr: s.as_ptr() as usize,
                writable: false,
                owned: None,
                _borrow: PhantomData,
            },
            None => Arg::owned(T::into_tensor(
                a.as_standard_layout().into_owned().into_dyn(),
            )),
        }
    }

    /// A donated borrow: outputs the plan places over it are written into
    /// it ([`RunOutput::InArgument`]). A non-standard-layout array is copied
    /// instead, and the result comes back as a new tensor.
    pub fn donated<T: Element, D: Dimension>(a: &'a mut Array<T, D>) -> Arg<'a> {
        let ty = ValueType::new(T::DTYPE, a.shape());
        match a.as_slice_mut() {
            Some(s) => Arg {
                ty,
                ptr: s.as_mut_ptr() as usize,
                writable: true,
                owned: None,
                _borrow: PhantomData,
            },
            None => Arg::owned(T::into_tensor(
                a.as_standard_layout().into_owned().into_dyn(),
            )),
        }
    }

    /// A read-only borrow of a flat slice, as a 1-D `[len]` argument.
    pub fn slice<T: Element>(s: &'a [T]) -> Arg<'a> {
        Arg {
            ty: ValueType::new(T::DTYPE, &[s.len()]),
            ptr: s.as_ptr() as usize,
            writable: false,
            owned: None,
            _borrow: PhantomData,
        }
    }

    /// A donated flat slice, as a 1-D `[len]` argument: outputs the plan
    /// places over it are written into it.
    pub fn slice_mut<T: Element>(s: &'a mut [T]) -> Arg<'a> {
        Arg {
            ty: ValueType::new(T::DTYPE, &[s.len()]),
            ptr: s.as_mut_ptr() as usize,
            writable: true,
            owned: None,
            _borrow: PhantomData,
        }
    }

    /// A read-only borrow of a tensor.
    pub fn tensor(t: &'a Tensor) -> Arg<'a> {
        match t {
            Tensor::Pred(a) => Arg::view(a),
            Tensor::I32(a) => Arg::view(a),
            Tensor::F32(a) => Arg::view(a),
            Tensor::F64(a) => Arg::view(a),
        }
    }
}

/// Where a program result is.
#[derive(Debug)]
pub enum RunOutput {
    /// A new tensor.
    Owned(Tensor),
    /// In the buffer of argument `i` (written in place, or the argument itself).
    InArgument(usize),
}

/// Runs custom calls other than the built-in `identity`.
pub trait CustomCallHandler {
    /// Computes `target(args)`, which must have type `ty`.
    fn call(
        &mut self,
        target: &str,
        args: &[&Tensor],
        ty: &TensorType,
    ) -> Result<Tensor, CustomCallError>;
}

/// A handler that knows no targets.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCustomCalls;

impl CustomCallHandler for NoCustomCalls {
    fn call(
        &mut self,
        target: &str,
        _: &[&Tensor],
        _: &TensorType,
    ) -> Result<Tensor, CustomCallError> {
        Err(CustomCallError::NoHandler(target.to_string()))
    }
}

/// An executable prepared for fast runs. Cheap to share (`Arc` inside).
#[derive(Debug, Clone)]
pub struct Runtime {
    exe: Arc<Executable>,
    plans: Vec<Option<FusedPlan>>,
    /// Per kernel: what fused-loop planning decided for its loop.
    loop_stats: Vec<Option<LoopPlanStats>>,
    /// Per kernel: its fused loop compiled to native code, when it could be.
    native: Arc<NativeLoops>,
    /// Per kernel: whether its prelude is all scalars (evaluated without
    /// allocating, [`crate::kernels::scalar`]).
    scalar_prelude: Vec<bool>,
    /// Per constant: its value when it is one element (read by scalar
    /// preludes on every run).
    constant_scalars: Vec<Option<Scalar>>,
    /// Per buffer: its type, parsed once (a fused loop's fresh outputs are
    /// allocated by it on every run).
    buffer_types: Vec<Option<ValueType>>,
    /// Whether fused loops run as native code where they have it.
    use_native: bool,
    aliases: Vec<(usize, usize)>,
    chunk: usize,
    exec: ExecFn,
    exec_in_place: ExecInPlaceFn,
    exec_product: ExecProductFn,
}

impl Runtime {
    /// Prepares `exe`: stages each fused loop into typed body instructions,
    /// allocates scratch registers and finds in-place outputs (the
    /// `fused-loop-planning` pass, [`crate::exec::loop_plan`]).
    pub fn new(exe: Arc<Executable>) -> Runtime {
        Runtime::with_aliases(exe, &[])
    }

    /// Prepares `exe` with input-output aliases `(output, parameter)`, like
    /// XLA's `input_output_alias`: output `o` is written over parameter `p`
    /// when that parameter is passed with [`Arg::donated`] and the plan lets
    /// the kernel computing `o` take it over. The result then comes back as
    /// [`RunOutput::InArgument`]`(p)`. Without an alias, a borrowed donated
    /// argument is never overwritten with another value.
    pub fn with_aliases(exe: Arc<Executable>, aliases: &[(usize, usize)]) -> Runtime {
        let (plans, loop_stats): (Vec<Option<FusedPlan>>, Vec<Option<LoopPlanStats>>) =
            loop_plan::run(&exe, aliases)
                .into_iter()
                .map(|p| match p {
                    Some((plan, stats)) => (Some(plan), Some(stats)),
                    None => (None, None),
                })
                .unzip();
        let loops: Vec<_> = exe
            .kernels
            .iter()
            .zip(&plans)
            .map(|(kernel, plan)| {
                plan.as_ref()?;
                let types = kernel
                    .inputs
                    .iter()
                    .map(|&r| match r {
                        ValueRef::Constant(c) => Some(exe.constants[c as usize].tensor_type()),
                        ValueRef::Buffer(b) => TensorType::parse(&exe.buffers[b as usize].ty),
                    })
                    .collect::<Option<Vec<_>>>()?;
                Some((kernel, types))
            })
            .collect();
        let native = Arc::new(native::compile(&loops));
        let scalar_prelude = loops
            .iter()
            .zip(&plans)
            .map(|(l, plan)| match (l, plan) {
                (Some((kernel, types)), Some(plan)) => is_scalar_prelude(kernel, types, plan),
                _ => false,
            })
            .collect();
        let chunk = exe.loop_chunk.clamp(1, CHUNK);
        let buffer_types = exe
            .buffers
            .iter()
            .map(|b| TensorType::parse(&b.ty).as_ref().map(ValueType::from_type))
            .collect();
        let constant_scalars = exe.constants.iter().map(Scalar::of).collect();
        Runtime {
            exe,
            plans,
            loop_stats,
            native,
            scalar_prelude,
            constant_scalars,
            buffer_types,
            use_native: true,
            aliases: aliases.to_vec(),
            chunk,
            exec: select_exec(),
            exec_in_place: select_exec_in_place(),
            exec_product: select_exec_product(),
        }
    }

    /// The executable this runs.
    pub fn executable(&self) -> &Arc<Executable> {
        &self.exe
    }

    /// Runs fused loops in chunks of `chunk` elements (at least 1).
    #[must_use]
    pub fn with_chunk(mut self, chunk: usize) -> Runtime {
        self.chunk = chunk.max(1);
        self
    }

    /// Runs fused loops as native code where they have it (the default), or
    /// (`false`) always with the chunk interpreter: the two agree bit for
    /// bit, so this is for comparing them.
    #[must_use]
    pub fn with_native_code(mut self, native: bool) -> Runtime {
        self.use_native = native;
        self
    }

    /// Per kernel: `Some(Ok(()))` for a fused loop that runs as native code,
    /// `Some(Err(why))` for one the interpreter runs, `None` for kernels
    /// that are not fused loops.
    pub fn native_loops(&self) -> Vec<Option<Result<(), String>>> {
        self.plans
            .iter()
            .enumerate()
            .map(|(k, p)| {
                p.as_ref()?;
                Some(match &self.native[k] {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(why)) => Err(why.to_string()),
                    None => Err("not compiled".into()),
                })
            })
            .collect()
    }

    /// Per kernel: its name and what [fused-loop
    /// planning](crate::exec::loop_plan) decided for its loop (registers,
    /// in-place and direct outputs, folded multiply-adds), `None` for
    /// kernels that are not fused loops.
    pub fn loop_plans(&self) -> Vec<Option<(&str, LoopPlanStats)>> {
        self.exe
            .kernels
            .iter()
            .zip(&self.loop_stats)
            .map(|(kernel, stats)| Some((kernel.name.as_str(), (*stats)?)))
            .collect()
    }

    /// The input-output aliases `(output, parameter)`.
    pub fn aliases(&self) -> &[(usize, usize)] {
        &self.aliases
    }

    /// Scratch registers of each fused loop (`None`: a kernel that runs
    /// whole), a measure of its working set per chunk.
    pub fn loop_registers(&self) -> Vec<Option<usize>> {
        self.plans
            .iter()
            .map(|p| p.as_ref().map(|p| p.regs.len()))
            .collect()
    }

    /// Kernels that run as fused loops.
    pub fn fused_loops(&self) -> usize {
        self.plans.iter().flatten().count()
    }

    /// Runs on borrowed tensors and returns every result as a tensor.
    pub fn run_tensors(
        &self,
        args: &[Tensor],
        calls: &mut dyn CustomCallHandler,
    ) -> Result<Vec<Tensor>, ExecError> {
        let outs = self.run_args(args.iter().map(Arg::tensor), calls)?;
        Ok(outs
            .into_iter()
            .map(|o| match o {
                RunOutput::Owned(t) => t,
                RunOutput::InArgument(i) => args[i].clone(),
            })
            .collect())
    }

    /// Runs the program. Results that live in a donated argument come back
    /// as [`RunOutput::InArgument`]; borrowed arguments are never written.
    pub fn run(
        &self,
        args: Vec<Arg<'_>>,
        calls: &mut dyn CustomCallHandler,
    ) -> Result<Vec<RunOutput>, ExecError> {
        self.run_args(args, calls)
    }

    /// [`Runtime::run`] over any list of arguments (a step passes an
    /// inline one rather than allocate a `Vec` each time).
    pub(crate) fn run_args<'a>(
        &self,
        args: impl IntoIterator<Item = Arg<'a>, IntoIter: ExactSizeIterator>,
        calls: &mut dyn CustomCallHandler,
    ) -> Result<Vec<RunOutput>, ExecError> {
        let exe = &*self.exe;
        let args = args.into_iter();
        exe.check_argument_count(args.len())
            .map_err(ExecError::ArgumentCount)?;
        let mut slots: SmallVec<[Option<Slot>; 16]> =
            (0..exe.buffers.len()).map(|_| None).collect();
        for (i, (arg, ty)) in args.into_iter().zip(&exe.parameters).enumerate() {
            if !arg.ty.is(ty) {
                return Err(ExecError::Arguments(format!(
                    "argument {i} of `{}` must be {ty}, got {}",
                    exe.name, arg.ty
                )));
            }
            slots[exe.parameter_buffers[i] as usize] = Some(Slot {
                ty: arg.ty,
                ptr: arg.ptr,
                writable: arg.writable,
                owned: arg.owned,
                arg: Some(i),
            });
        }
        for (k, kernel) in exe.kernels.iter().enumerate() {
            match &self.plans[k] {
                Some(plan) => self.run_fused(k, kernel, plan, &mut slots)?,
                None => self.run_whole(kernel, &mut slots, calls)?,
            }
        }
        let mut results = Vec::with_capacity(exe.outputs.len());
        for (i, r) in exe.outputs.iter().enumerate() {
            let out = match *r {
                ValueRef::Constant(c) => RunOutput::Owned(exe.constants[c as usize].clone()),
                ValueRef::Buffer(b) => {
                    let again = exe.outputs[i + 1..].contains(r);
                    let slot = slots[b as usize].as_mut().ok_or_else(|| unwritten(b))?;
                    match (slot.arg, &mut slot.owned) {
                        (Some(a), None) => RunOutput::InArgument(a),
                        (_, Some(t)) if again => RunOutput::Owned((**t).clone()),
                        (_, owned @ Some(_)) => RunOutput::Owned(*owned.take().expect("some")),
                        (None, None) => RunOutput::Owned(copy_raw(&slot.ty, slot.ptr)),
                    }
                }
            };
            results.push(out);
        }
        Ok(results)
    }
}
