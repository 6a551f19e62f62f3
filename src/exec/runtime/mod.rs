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

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;

use ndarray::{Array, ArrayD, Dimension, Ix2, IxDyn};
use rayon::prelude::*;
use smallvec::{SmallVec, smallvec};

use crate::compiler::executable::{Arg as InstrArg, Executable, Instr, LoweredKernel, ValueRef};
pub use crate::exec::error::ExecError;
use crate::exec::interpreter::{
    ExecFn, ExecInPlaceFn, ExecProductFn, LoopCtx, select_exec, select_exec_in_place,
    select_exec_product,
};
use crate::exec::loop_plan::{self, FusedPlan, LoopPlanStats};
use crate::exec::native::{self, NativeLoops};
pub use crate::ir::Element;
use crate::ir::Tensor;
use crate::ir::{DType, DotDims, Op, TensorType};
use crate::kernels::evaluate;
use crate::kernels::scalar::{self, Scalar, ScalarCell};

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

/// The data address of a standard-layout tensor (making it standard first).
fn tensor_ptr_mut(t: &mut Tensor) -> usize {
    macro_rules! std_ptr {
        ($a:expr) => {{
            if !$a.is_standard_layout() {
                *$a = $a.as_standard_layout().into_owned();
            }
            $a.as_mut_ptr() as usize
        }};
    }
    match t {
        Tensor::Pred(a) => std_ptr!(a),
        Tensor::I32(a) => std_ptr!(a),
        Tensor::F32(a) => std_ptr!(a),
        Tensor::F64(a) => std_ptr!(a),
    }
}

/// The data address of a standard-layout tensor, if it is one.
fn tensor_ptr(t: &Tensor) -> Option<usize> {
    match t {
        Tensor::Pred(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
        Tensor::I32(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
        Tensor::F32(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
        Tensor::F64(a) => a.is_standard_layout().then(|| a.as_ptr() as usize),
    }
}

/// The type of a run's value, kept inline: a step builds one per argument,
/// and at 1e3 elements a heap-allocated shape per argument costs as much as
/// the arithmetic.
#[derive(Clone, Debug, PartialEq)]
struct ValueType {
    dtype: DType,
    dims: SmallVec<[usize; 4]>,
}

impl ValueType {
    fn new(dtype: DType, dims: &[usize]) -> ValueType {
        ValueType {
            dtype,
            dims: SmallVec::from_slice(dims),
        }
    }

    fn of(t: &Tensor) -> ValueType {
        ValueType::new(t.dtype(), t.shape())
    }

    fn from_type(ty: &TensorType) -> ValueType {
        ValueType::new(ty.dtype, &ty.dims)
    }

    fn element_count(&self) -> usize {
        self.dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Whether this is `ty` (compared element by element: the shapes are a
    /// few words, shorter than a call to `memcmp`).
    fn is(&self, ty: &TensorType) -> bool {
        self.dtype == ty.dtype
            && self.dims.len() == ty.dims.len()
            && self.dims.iter().zip(&ty.dims).all(|(a, b)| a == b)
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        TensorType::new(self.dtype, self.dims.to_vec()).fmt(f)
    }
}

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
    fn call(&mut self, target: &str, args: &[&Tensor], ty: &TensorType) -> Result<Tensor, String>;
}

/// A handler that knows no targets.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCustomCalls;

impl CustomCallHandler for NoCustomCalls {
    fn call(&mut self, target: &str, _: &[&Tensor], _: &TensorType) -> Result<Tensor, String> {
        Err(format!("no handler for target `{target}`"))
    }
}

/// A value of the runtime: a tensor in a buffer slot.
struct Slot {
    ty: ValueType,
    ptr: usize,
    writable: bool,
    owned: Option<Box<Tensor>>,
    arg: Option<usize>,
}

impl Slot {
    fn from_tensor(mut t: Tensor) -> Slot {
        let ptr = tensor_ptr_mut(&mut t);
        Slot {
            ty: ValueType::of(&t),
            ptr,
            writable: true,
            owned: Some(Box::new(t)),
            arg: None,
        }
    }

    /// The value as a tensor: borrowed when owned, copied from a borrow.
    fn tensor(&self) -> Cow<'_, Tensor> {
        match &self.owned {
            Some(t) => Cow::Borrowed(&**t),
            None => Cow::Owned(copy_raw(&self.ty, self.ptr)),
        }
    }
}

fn copy_raw(ty: &ValueType, ptr: usize) -> Tensor {
    fn copy<T: Element>(ty: &ValueType, ptr: usize) -> Tensor {
        let n = ty.element_count();
        // SAFETY: `ptr` addresses `n` initialised elements of `T` that the
        // run borrows for its whole duration (see `Arg`).
        let s = unsafe { std::slice::from_raw_parts(ptr as *const T, n) };
        T::into_tensor(ArrayD::from_shape_vec(IxDyn(&ty.dims), s.to_vec()).expect("sizes match"))
    }
    match ty.dtype {
        DType::Pred => copy::<bool>(ty, ptr),
        DType::I32 => copy::<i32>(ty, ptr),
        DType::F32 => copy::<f32>(ty, ptr),
        DType::F64 => copy::<f64>(ty, ptr),
    }
}

/// A freshly allocated tensor of `ty` whose elements the caller writes
/// before anyone reads them; `(tensor, data address)`.
fn fresh(ty: &ValueType) -> (Tensor, usize) {
    fn make<T: Element>(ty: &ValueType) -> (Tensor, usize) {
        let n = ty.element_count();
        let mut v = crate::memory::output_buffer::<T>(n);
        // SAFETY: `fresh` is only called for the outputs of a fused loop,
        // which writes every element `[0, n)` before anything reads the
        // buffer; if the loop fails the tensor is dropped unread (dropping
        // plain-old-data elements reads nothing).
        unsafe { v.set_len(n) };
        let ptr = v.as_mut_ptr() as usize;
        let t = T::into_tensor(ArrayD::from_shape_vec(IxDyn(&ty.dims), v).expect("sizes match"));
        (t, ptr)
    }
    match ty.dtype {
        DType::Pred => make::<bool>(ty),
        DType::I32 => make::<i32>(ty),
        DType::F32 => make::<f32>(ty),
        DType::F64 => make::<f64>(ty),
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
                    Some(Err(why)) => Err(why.clone()),
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
            .map_err(|e| ExecError::Arguments(e.to_string()))?;
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

    fn run_whole(
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
                    WholeError::Kernel(message) => ExecError::Kernel {
                        kernel: kernel.name.clone(),
                        message,
                    },
                    WholeError::Call(target, message) => ExecError::CustomCall { target, message },
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

    fn run_fused(
        &self,
        k: usize,
        kernel: &LoweredKernel,
        plan: &FusedPlan,
        slots: &mut [Option<Slot>],
    ) -> Result<(), ExecError> {
        let exe = &*self.exe;
        let kernel_err = |message: String| ExecError::Kernel {
            kernel: kernel.name.clone(),
            message,
        };
        // Prelude: once per run, over scalars (no allocation) when it is all
        // scalars, else over whole tensors.
        let scalar_prelude = self.scalar_prelude[k] && !plan.prelude.is_empty();
        let mut prelude: Vec<Option<Tensor>> = Vec::new();
        let mut scalars: SmallVec<[Option<Scalar>; 64]> = SmallVec::new();
        if scalar_prelude {
            scalars.resize(kernel.instrs.len(), None);
            for &p in &plan.prelude {
                let instr = &kernel.instrs[p as usize];
                let mut args: SmallVec<[Scalar; 4]> = SmallVec::new();
                for a in &instr.args {
                    args.push(match *a {
                        InstrArg::Input(i) => {
                            read_scalar(&self.constant_scalars, slots, kernel.inputs[i as usize])?
                        }
                        InstrArg::Local(l) => scalars[l as usize]
                            .ok_or_else(|| kernel_err("a prelude value reads the loop".into()))?,
                    });
                }
                let v =
                    scalar::evaluate(&instr.op, &args).map_err(|e| kernel_err(e.to_string()))?;
                scalars[p as usize] = Some(v);
            }
        } else if !plan.prelude.is_empty() {
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
                        .ok_or_else(|| kernel_err("a prelude value reads the loop".into()))?;
                    evaluate(&instr.op, &args, Some(&instr.ty))
                        .map_err(|e| kernel_err(e.to_string()))?
                };
                prelude[p as usize] = Some(v);
            }
        }
        // Destinations: donated inputs taken over, or fresh buffers.
        let mut dest: SmallVec<[(u32, Slot); 4]> = SmallVec::with_capacity(plan.outputs.len());
        let mut dest_ptr: SmallVec<[usize; 4]> = SmallVec::with_capacity(plan.outputs.len());
        let mut donated_inputs: SmallVec<[(u32, usize); 4]> = SmallVec::new();
        let mut donated: SmallVec<[bool; 4]> = SmallVec::new();
        for out in &plan.outputs {
            donated.push(false);
            if let Some(p) = out.prelude {
                let t = if scalar_prelude {
                    scalars[p as usize].map(Scalar::to_tensor)
                } else {
                    prelude[p as usize].clone()
                }
                .ok_or_else(|| unwritten(out.buffer))?;
                dest.push((out.buffer, Slot::from_tensor(t)));
                dest_ptr.push(0);
                continue;
            }
            // A runtime-owned buffer may take any output the plan places
            // over it; a caller's donated borrow only its aliased output.
            let donor = out.donor.and_then(|i| match kernel.inputs[i as usize] {
                ValueRef::Buffer(b) => match &slots[b as usize] {
                    Some(s)
                        if s.writable
                            && (s.owned.is_some() || out.aliased)
                            && !donated_inputs.iter().any(|&(j, _)| j == i) =>
                    {
                        Some((i, b))
                    }
                    _ => None,
                },
                ValueRef::Constant(_) => None,
            });
            let slot = match donor {
                Some((i, b)) => {
                    let mut s = slots[b as usize].take().expect("checked above");
                    donated_inputs.push((i, s.ptr));
                    if let Some(last) = donated.last_mut() {
                        *last = true;
                    }
                    if s.owned.is_some() {
                        // The tensor now holds this output, not the argument.
                        s.arg = None;
                    }
                    s
                }
                None => {
                    let ty = self.buffer_types[out.buffer as usize]
                        .clone()
                        .ok_or_else(|| {
                            kernel_err(format!(
                                "buffer type `{}`",
                                exe.buffers[out.buffer as usize].ty
                            ))
                        })?;
                    let (t, ptr) = fresh(&ty);
                    Slot {
                        ty,
                        ptr,
                        writable: true,
                        owned: Some(Box::new(t)),
                        arg: None,
                    }
                }
            };
            dest_ptr.push(slot.ptr);
            dest.push((out.buffer, slot));
        }
        // Input addresses (donated inputs are read where they are written).
        let mut in_ptr: SmallVec<[usize; 32]> = SmallVec::with_capacity(kernel.inputs.len());
        // Constants are read where the executable keeps them (a copy only
        // for one not in standard layout).
        let mut copies: SmallVec<[Tensor; 2]> = SmallVec::new();
        for (i, &r) in kernel.inputs.iter().enumerate() {
            if let Some(&(_, p)) = donated_inputs.iter().find(|&&(j, _)| j as usize == i) {
                in_ptr.push(p);
                continue;
            }
            match r {
                ValueRef::Constant(c) => match tensor_ptr(&exe.constants[c as usize]) {
                    Some(p) => in_ptr.push(p),
                    None => {
                        let mut t = exe.constants[c as usize].clone();
                        in_ptr.push(tensor_ptr_mut(&mut t));
                        copies.push(t);
                    }
                },
                ValueRef::Buffer(b) => {
                    let s = slots[b as usize].as_ref().ok_or_else(|| unwritten(b))?;
                    in_ptr.push(s.ptr);
                }
            }
        }
        // Scalars are read by address from cells that live until the loop
        // ends (`cells` is not moved after the addresses are taken).
        let mut prelude_ptr: SmallVec<[usize; 64]> = smallvec![0; kernel.instrs.len()];
        let cells: SmallVec<[ScalarCell; 64]> = scalars
            .iter()
            .map(|s| s.map_or(ScalarCell([0; 8]), Scalar::to_cell))
            .collect();
        for (i, s) in scalars.iter().enumerate() {
            if s.is_some() {
                prelude_ptr[i] = cells[i].0.as_ptr() as usize;
            }
        }
        for (i, v) in prelude.iter_mut().enumerate() {
            if let Some(t) = v {
                prelude_ptr[i] = tensor_ptr_mut(t);
            }
        }
        let native = match &self.native[k] {
            Some(Ok(native)) if self.use_native => Some(native),
            _ => None,
        };
        let ran = match native {
            Some(native) => {
                let mut table: SmallVec<[usize; 96]> =
                    SmallVec::with_capacity(native.table_len(dest_ptr.len()));
                // SAFETY: a scalar's input or prelude address points to its
                // value (an argument, constant or cell held until the loop
                // ends).
                unsafe { native.fill_table(&mut table, &in_ptr, &prelude_ptr, &dest_ptr) };
                run_tasks(
                    plan.len,
                    || (),
                    |(), lo, hi| {
                        // SAFETY: the table holds the kernel's input, prelude
                        // and destination addresses, each with `plan.len`
                        // elements of the loop's type (scalars one); each task
                        // writes only its own `[lo, hi)` of the destinations,
                        // and the buffers are held by this function until the
                        // loop ends.
                        unsafe { native.run(&table, lo, hi) };
                        Ok(())
                    },
                )
            }
            None => {
                // A one-pass body streams like a hand-written loop, which the
                // hardware prefetcher serves best; longer bodies read each
                // array in a different instruction and need the software
                // prefetch.
                let mut streams: SmallVec<[(usize, usize); 8]> = SmallVec::new();
                let prefetch = plan.body.len() > 1;
                for &(input, i, size) in plan.streams.iter().filter(|_| prefetch) {
                    let base = if input {
                        in_ptr[i as usize]
                    } else {
                        dest_ptr[i as usize]
                    };
                    if !streams.iter().any(|&(b, _)| b == base) {
                        streams.push((base, size));
                    }
                }
                let ctx = LoopCtx {
                    plan,
                    exec: self.exec,
                    exec_in_place: self.exec_in_place,
                    exec_product: self.exec_product,
                    donated,
                    streams,
                    inputs: &in_ptr,
                    prelude: &prelude_ptr,
                    outputs: &dest_ptr,
                    chunk: self.chunk,
                };
                run_tasks(
                    plan.len,
                    || ctx.registers(),
                    |regs, lo, hi| ctx.run_range(lo, hi, regs),
                )
            }
        };
        ran.map_err(kernel_err)?;
        drop(copies);
        drop(cells);
        for (b, slot) in dest {
            slots[b as usize] = Some(slot);
        }
        Ok(())
    }
}

/// Runs `f(state, lo, hi)` over `[0, len)` in ranges of at most [`TASK`]
/// elements (whole chunks), spread over rayon's pool (inline when there is
/// one task), each thread with its own `init()` state.
fn run_tasks<S>(
    len: usize,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, usize, usize) -> Result<(), String> + Sync + Send,
) -> Result<(), String> {
    let size = task_size(len, rayon::current_num_threads());
    let tasks = len.div_ceil(size).max(1);
    if tasks == 1 {
        return f(&mut init(), 0, len);
    }
    (0..tasks)
        .into_par_iter()
        .try_for_each_init(init, |state, t| {
            let lo = t * size;
            f(state, lo, (lo + size).min(len))
        })
}

/// Elements per task of a `len`-element loop over `threads` threads: at
/// most [`TASK`], and small enough that every thread gets a share once the
/// loop has [`MIN_TASK`] elements per thread (a 1e5-element step would
/// otherwise be one 65536-element task and one of 34464).
fn task_size(len: usize, threads: usize) -> usize {
    let tasks = len.div_ceil(TASK).max(threads.min(len / MIN_TASK)).max(1);
    len.div_ceil(tasks)
        .next_multiple_of(CHUNK)
        .clamp(CHUNK, TASK)
}

/// Whether every prelude instruction of a fused loop is an elementwise op
/// on scalars (its inputs rank 0), so the prelude runs without tensors.
fn is_scalar_prelude(kernel: &LoweredKernel, input_types: &[TensorType], plan: &FusedPlan) -> bool {
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
fn read_scalar(
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

fn unwritten(b: u32) -> ExecError {
    ExecError::Arguments(format!("buffer {b} is read before it is written"))
}

fn read<'s>(
    exe: &'s Executable,
    slots: &'s [Option<Slot>],
    r: ValueRef,
) -> Result<Cow<'s, Tensor>, ExecError> {
    match r {
        ValueRef::Constant(c) => Ok(Cow::Borrowed(&exe.constants[c as usize])),
        ValueRef::Buffer(b) => Ok(slots[b as usize]
            .as_ref()
            .ok_or_else(|| unwritten(b))?
            .tensor()),
    }
}

enum WholeError {
    Kernel(String),
    Call(String, String),
}

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
                    format!("returned {}, expected {}", t.tensor_type(), instr.ty),
                ));
            }
            Ok(t)
        }
        Op::Dot(dims) => match matmul(args, dims) {
            Some(t) => Ok(t),
            None => evaluate(&instr.op, args, Some(&instr.ty))
                .map_err(|e| WholeError::Kernel(e.to_string())),
        },
        op => evaluate(op, args, Some(&instr.ty)).map_err(|e| WholeError::Kernel(e.to_string())),
    }
}

/// `[m, k] x [k, n]` in floating point through ndarray's matrix multiply.
fn matmul(args: &[&Tensor], dims: &DotDims) -> Option<Tensor> {
    let plain = dims.lhs_batch.is_empty()
        && dims.rhs_batch.is_empty()
        && dims.lhs_contracting == [1]
        && dims.rhs_contracting == [0];
    if !plain {
        return None;
    }
    match (args.first()?, args.get(1)?) {
        (Tensor::F32(a), Tensor::F32(b)) => {
            let (a, b) = (
                a.view().into_dimensionality::<Ix2>().ok()?,
                b.view().into_dimensionality::<Ix2>().ok()?,
            );
            (a.ncols() == b.nrows()).then(|| Tensor::F32(a.dot(&b).into_dyn()))
        }
        (Tensor::F64(a), Tensor::F64(b)) => {
            let (a, b) = (
                a.view().into_dimensionality::<Ix2>().ok()?,
                b.view().into_dimensionality::<Ix2>().ok()?,
            );
            (a.ncols() == b.nrows()).then(|| Tensor::F64(a.dot(&b).into_dyn()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod task_tests {
    use super::*;

    #[test]
    fn tasks_cover_the_loop_in_whole_chunks_and_share_it_out() {
        for threads in [1, 2, 3, 8] {
            for len in [
                0,
                1,
                4095,
                4096,
                30_000,
                100_000,
                1 << 16,
                1_000_000,
                10_000_001,
            ] {
                let size = task_size(len, threads);
                assert!(
                    size > 0 && size <= TASK && size.is_multiple_of(CHUNK),
                    "{len} {threads}"
                );
                let tasks = len.div_ceil(size);
                if len >= threads * MIN_TASK {
                    assert!(tasks >= threads, "{len} on {threads}: {tasks} tasks");
                }
                if len < 2 * MIN_TASK {
                    assert!(tasks <= 1, "{len}: {tasks} tasks");
                }
            }
        }
        // 1e5 on two threads: two near-equal halves, not 65536 + 34464.
        assert_eq!(task_size(100_000, 2), 53_248);
    }
}
