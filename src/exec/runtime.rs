//! The fast executor: runs an optimized, lowered [`Executable`] for real.
//!
//! [`Executable::run`] is the reference evaluator (whole tensors, clones);
//! this module is what a step actually runs on:
//!
//! * **Fused loops run as native code** where their body is in the native
//!   op set (float arithmetic, `sqrt`, compares, `select`, …: see
//!   [`Runtime::native_loops`]): one Cranelift-generated loop per fusion
//!   keeps each element's whole body in vector registers, like XLA's
//!   per-fusion LLVM loops, over [`TASK`]-element ranges that rayon spreads
//!   over the pool. [`Runtime::with_native_code`]`(false)` turns it off;
//!   both paths agree bit for bit (`tests/native_loops.rs`).
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

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;

use ndarray::{Array, ArrayD, Dimension, Ix2, IxDyn};
use rayon::prelude::*;
use smallvec::SmallVec;

use crate::compiler::executable::{
    Arg as InstrArg, Executable, Instr, LoweredKernel, Stage, ValueRef,
};
use crate::exec::native::{self, NativeLoops};
use crate::ir::Tensor;
use crate::ir::{BinaryOp, CompareDir, DType, DotDims, Op, TensorType, UnaryOp};
use crate::kernels::elementwise::{float_max, float_min, int_pow};
use crate::kernels::evaluate;

/// Elements per chunk of a fused loop: 16 KiB of `f32` per register, so a
/// handful of live registers stay in L1 and a dozen in L2. Paired runs at
/// 1e7 elements (`cargo bench --bench executor -- '^none$'`) put 4096 ahead
/// of 1024 (per-chunk overhead) and level with 16384; 256 was 2x slower.
pub const CHUNK: usize = 4096;

/// Elements per rayon task (a run of chunks on one thread).
pub const TASK: usize = 1 << 16;

/// An execution failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The arguments do not match the program's parameters.
    #[error("{0}")]
    Arguments(String),
    /// A kernel could not run.
    #[error("kernel `{kernel}`: {message}")]
    Kernel {
        /// The kernel's name (`fusion.0`).
        kernel: String,
        /// What went wrong.
        message: String,
    },
    /// A custom call failed or has no handler.
    #[error("custom call `{target}`: {message}")]
    CustomCall {
        /// The call target.
        target: String,
        /// What went wrong.
        message: String,
    },
}

/// Element types a runtime buffer can hold.
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype.
    const DTYPE: DType;
    /// Wraps an array.
    fn into_tensor(a: ArrayD<Self>) -> Tensor;
    /// Unwraps an array of this type; gives the tensor back otherwise.
    fn from_tensor(t: Tensor) -> Result<ArrayD<Self>, Tensor>;
    /// The array inside a tensor of this type.
    fn array_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>>;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn into_tensor(a: ArrayD<Self>) -> Tensor {
                Tensor::$d(a)
            }
            fn from_tensor(t: Tensor) -> Result<ArrayD<Self>, Tensor> {
                match t {
                    Tensor::$d(a) => Ok(a),
                    other => Err(other),
                }
            }
            fn array_mut(t: &mut Tensor) -> Option<&mut ArrayD<Self>> {
                match t {
                    Tensor::$d(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(i32, I32);
element!(bool, Pred);

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

/// One argument of a run: where the value lives and whether the runtime may
/// overwrite it.
pub struct Arg<'a> {
    ty: TensorType,
    ptr: usize,
    writable: bool,
    owned: Option<Tensor>,
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
            ty: t.tensor_type(),
            ptr,
            writable: true,
            owned: Some(t),
            _borrow: PhantomData,
        }
    }

    /// A read-only borrow (copied once if it is not in standard layout).
    pub fn view<T: Element, D: Dimension>(a: &'a Array<T, D>) -> Arg<'a> {
        match a.as_slice() {
            Some(s) => Arg {
                ty: TensorType::new(T::DTYPE, a.shape().to_vec()),
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
        let ty = TensorType::new(T::DTYPE, a.shape().to_vec());
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
    ty: TensorType,
    ptr: usize,
    writable: bool,
    owned: Option<Tensor>,
    arg: Option<usize>,
}

impl Slot {
    fn from_tensor(mut t: Tensor) -> Slot {
        let ptr = tensor_ptr_mut(&mut t);
        Slot {
            ty: t.tensor_type(),
            ptr,
            writable: true,
            owned: Some(t),
            arg: None,
        }
    }

    /// The value as a tensor: borrowed when owned, copied from a borrow.
    fn tensor(&self) -> Cow<'_, Tensor> {
        match &self.owned {
            Some(t) => Cow::Borrowed(t),
            None => Cow::Owned(copy_raw(&self.ty, self.ptr)),
        }
    }
}

fn copy_raw(ty: &TensorType, ptr: usize) -> Tensor {
    fn copy<T: Element>(ty: &TensorType, ptr: usize) -> Tensor {
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
fn fresh(ty: &TensorType) -> (Tensor, usize) {
    fn make<T: Element>(ty: &TensorType) -> (Tensor, usize) {
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

/// Where a loop-body operand comes from.
#[derive(Debug, Clone, Copy)]
enum Src {
    /// A kernel input of the loop shape, read chunk by chunk.
    Input(u32),
    /// A scalar kernel input.
    InputScalar(u32),
    /// A prelude value of the loop shape.
    Prelude(u32),
    /// A scalar prelude value.
    PreludeScalar(u32),
    /// A scratch register.
    Reg(u16),
    /// A loop output written directly to its destination (by index).
    Output(u32),
    /// The instruction's own destination, which holds kernel input `.0`
    /// when the output took that input over (read in place), else that
    /// input is read as usual.
    Dest(u32),
}

#[derive(Debug, Clone)]
struct BodyInstr {
    op: Op,
    args: SmallVec<[Src; 4]>,
    arg_types: SmallVec<[DType; 4]>,
    reg: u16,
    /// Writes straight into this loop output instead of a register.
    direct: Option<u32>,
    /// A multiply folded into this add or subtract: its two operands are
    /// `args[0]` and `args[1]`, the other operand is `args[2]`, and the
    /// flag says whether the product is the op's first operand.
    product_first: Option<bool>,
}

impl BodyInstr {
    /// `Some(true)` when operand 0 is the destination, `Some(false)` when
    /// operand 1 is.
    fn reads_dest(&self) -> Option<bool> {
        match self.args[..] {
            [Src::Dest(_), _] => Some(true),
            [_, Src::Dest(_)] => Some(false),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
struct FusedOutput {
    /// The instruction, when it is a prelude value.
    prelude: Option<u32>,
    /// The register holding the loop value.
    reg: u16,
    buffer: u32,
    /// The kernel input whose buffer the output may take over.
    donor: Option<u32>,
    /// Whether the donor is the parameter this output is aliased to.
    aliased: bool,
    /// Whether its instruction writes it directly (no register copy).
    direct: bool,
}

#[derive(Debug, Clone)]
struct FusedPlan {
    len: usize,
    /// Loop-shaped inputs and fresh outputs to prefetch, with their element
    /// sizes: `(true, input)` or `(false, output)`.
    streams: Vec<(bool, u32, usize)>,
    prelude: Vec<u32>,
    body: Vec<BodyInstr>,
    regs: Vec<DType>,
    outputs: Vec<FusedOutput>,
}

/// An executable prepared for fast runs. Cheap to share (`Arc` inside).
#[derive(Debug, Clone)]
pub struct Runtime {
    exe: Arc<Executable>,
    plans: Vec<Option<FusedPlan>>,
    /// Per kernel: its fused loop compiled to native code, when it could be.
    native: Arc<NativeLoops>,
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
    /// allocates scratch registers and finds in-place outputs.
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
        // Last kernel reading each buffer (`usize::MAX`: a program output).
        let mut last_use = vec![0usize; exe.buffers.len()];
        for (k, kernel) in exe.kernels.iter().enumerate() {
            for r in &kernel.inputs {
                if let ValueRef::Buffer(b) = r {
                    last_use[*b as usize] = k;
                }
            }
        }
        for r in &exe.outputs {
            if let ValueRef::Buffer(b) = r {
                last_use[*b as usize] = usize::MAX;
            }
        }
        let plans: Vec<Option<FusedPlan>> = exe
            .kernels
            .iter()
            .enumerate()
            .map(|(k, kernel)| plan_fused(&exe, kernel, k, &last_use, aliases))
            .collect();
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
        let chunk = exe.loop_chunk.clamp(1, CHUNK);
        Runtime {
            exe,
            plans,
            native,
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
        let outs = self.run(args.iter().map(Arg::tensor).collect(), calls)?;
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
        let exe = &*self.exe;
        if args.len() != exe.parameters.len() {
            return Err(ExecError::Arguments(format!(
                "program `{}` takes {} arguments, got {}",
                exe.name,
                exe.parameters.len(),
                args.len()
            )));
        }
        let mut slots: Vec<Option<Slot>> = (0..exe.buffers.len()).map(|_| None).collect();
        for (i, (arg, ty)) in args.into_iter().zip(&exe.parameters).enumerate() {
            if &arg.ty != ty {
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
                        (_, Some(t)) if again => RunOutput::Owned(t.clone()),
                        (_, owned @ Some(_)) => RunOutput::Owned(owned.take().expect("some")),
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
        // Prelude: whole tensors, once.
        let mut prelude: Vec<Option<Tensor>> = vec![None; kernel.instrs.len()];
        if !plan.prelude.is_empty() {
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
                    evaluate(&instr.op, &args, Some(&instr.ty)).map_err(|e| kernel_err(e.0))?
                };
                prelude[p as usize] = Some(v);
            }
        }
        // Destinations: donated inputs taken over, or fresh buffers.
        let mut dest: Vec<(u32, Slot)> = Vec::with_capacity(plan.outputs.len());
        let mut dest_ptr: Vec<usize> = Vec::with_capacity(plan.outputs.len());
        let mut donated_inputs: SmallVec<[(u32, usize); 4]> = SmallVec::new();
        let mut donated: SmallVec<[bool; 4]> = SmallVec::new();
        for out in &plan.outputs {
            donated.push(false);
            if let Some(p) = out.prelude {
                let t = prelude[p as usize]
                    .clone()
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
                    let ty = &exe.buffers[out.buffer as usize];
                    let ty = TensorType::parse(&ty.ty)
                        .ok_or_else(|| kernel_err(format!("buffer type `{}`", ty.ty)))?;
                    let (t, ptr) = fresh(&ty);
                    Slot {
                        ty,
                        ptr,
                        writable: true,
                        owned: Some(t),
                        arg: None,
                    }
                }
            };
            dest_ptr.push(slot.ptr);
            dest.push((out.buffer, slot));
        }
        // Input addresses (donated inputs are read where they are written).
        let mut in_ptr: SmallVec<[usize; 8]> = SmallVec::with_capacity(kernel.inputs.len());
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
        let mut prelude_ptr = vec![0usize; kernel.instrs.len()];
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
                let mut table = Vec::with_capacity(native.table().len(dest_ptr.len()));
                native
                    .table()
                    .fill(&mut table, &in_ptr, &prelude_ptr, &dest_ptr);
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
        for (b, slot) in dest {
            slots[b as usize] = Some(slot);
        }
        Ok(())
    }
}

/// Runs `f(state, lo, hi)` over `[0, len)` in [`TASK`]-element ranges,
/// spread over rayon's pool (inline when there is one task), each thread
/// with its own `init()` state.
fn run_tasks<S>(
    len: usize,
    init: impl Fn() -> S + Sync + Send,
    f: impl Fn(&mut S, usize, usize) -> Result<(), String> + Sync + Send,
) -> Result<(), String> {
    let tasks = len.div_ceil(TASK).max(1);
    if tasks == 1 {
        return f(&mut init(), 0, len);
    }
    (0..tasks)
        .into_par_iter()
        .try_for_each_init(init, |state, t| {
            let lo = t * TASK;
            f(state, lo, (lo + TASK).min(len))
        })
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
            None => evaluate(&instr.op, args, Some(&instr.ty)).map_err(|e| WholeError::Kernel(e.0)),
        },
        op => evaluate(op, args, Some(&instr.ty)).map_err(|e| WholeError::Kernel(e.0)),
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

/// Builds the fused plan of kernel `k`, or `None` when it runs whole.
fn plan_fused(
    exe: &Executable,
    kernel: &LoweredKernel,
    k: usize,
    last_use: &[usize],
    aliases: &[(usize, usize)],
) -> Option<FusedPlan> {
    let shape = kernel.loop_shape.as_ref()?;
    let len: usize = shape.iter().product();
    let input_ty = |i: u32| -> Option<TensorType> {
        match kernel.inputs[i as usize] {
            ValueRef::Constant(c) => Some(exe.constants[c as usize].tensor_type()),
            ValueRef::Buffer(b) => TensorType::parse(&exe.buffers[b as usize].ty),
        }
    };
    let input_types: Vec<TensorType> = (0..kernel.inputs.len() as u32)
        .map(input_ty)
        .collect::<Option<_>>()?;
    // Register allocation over the body: a register is freed after the last
    // body instruction that reads it (outputs keep theirs to the end).
    let n = kernel.instrs.len();
    let mut last_read = vec![0usize; n];
    for (j, instr) in kernel.instrs.iter().enumerate() {
        for a in &instr.args {
            if let InstrArg::Local(l) = *a {
                last_read[l as usize] = j;
            }
        }
    }
    for &(i, _) in &kernel.outputs {
        last_read[i as usize] = usize::MAX;
    }
    let mut reg_of = vec![u16::MAX; n];
    let mut regs: Vec<DType> = Vec::new();
    let mut free: Vec<u16> = Vec::new();
    let mut prelude = Vec::new();
    let mut body = Vec::new();
    for (j, instr) in kernel.instrs.iter().enumerate() {
        if instr.stage == Stage::Prelude {
            prelude.push(j as u32);
            continue;
        }
        let mut args = SmallVec::new();
        let mut arg_types = SmallVec::new();
        for a in &instr.args {
            arg_types.push(match *a {
                InstrArg::Input(i) => input_types[i as usize].dtype,
                InstrArg::Local(l) => kernel.instrs[l as usize].ty.dtype,
            });
            args.push(match *a {
                InstrArg::Input(i) if input_types[i as usize].dims.is_empty() => {
                    Src::InputScalar(i)
                }
                InstrArg::Input(i) if input_types[i as usize].element_count() == len => {
                    Src::Input(i)
                }
                InstrArg::Local(l) if kernel.instrs[l as usize].stage == Stage::Loop => {
                    Src::Reg(reg_of[l as usize])
                }
                InstrArg::Local(l) if kernel.instrs[l as usize].ty.dims.is_empty() => {
                    Src::PreludeScalar(l)
                }
                InstrArg::Local(l) if kernel.instrs[l as usize].ty.element_count() == len => {
                    Src::Prelude(l)
                }
                _ => return None,
            });
        }
        let dtype = instr.ty.dtype;
        let reg = match free.iter().position(|&r| regs[r as usize] == dtype) {
            Some(p) => free.swap_remove(p),
            None => {
                regs.push(dtype);
                (regs.len() - 1) as u16
            }
        };
        reg_of[j] = reg;
        for a in &instr.args {
            if let InstrArg::Local(l) = *a
                && kernel.instrs[l as usize].stage == Stage::Loop
                && last_read[l as usize] == j
                && !free.contains(&reg_of[l as usize])
            {
                free.push(reg_of[l as usize]);
            }
        }
        body.push(BodyInstr {
            op: instr.op.clone(),
            args,
            arg_types,
            reg,
            direct: None,
            product_first: None,
        });
    }
    let mut outputs = Vec::new();
    let mut taken: Vec<u32> = Vec::new();
    for &(i, b) in &kernel.outputs {
        let instr = &kernel.instrs[i as usize];
        if instr.stage == Stage::Prelude {
            outputs.push(FusedOutput {
                prelude: Some(i),
                reg: 0,
                buffer: b,
                donor: None,
                aliased: false,
                direct: false,
            });
            continue;
        }
        // The aliased parameter, when it is an input read last here.
        let aliased = aliases
            .iter()
            .filter(|&&(o, _)| exe.outputs.get(o) == Some(&ValueRef::Buffer(b)))
            .filter_map(|&(_, p)| exe.parameter_buffers.get(p).copied())
            .find_map(|pb| {
                kernel
                    .inputs
                    .iter()
                    .position(|r| *r == ValueRef::Buffer(pb))
                    .filter(|&j| last_use[pb as usize] == k && !taken.contains(&(j as u32)))
            })
            .map(|j| j as u32);
        if let Some(j) = aliased {
            taken.push(j);
            outputs.push(FusedOutput {
                prelude: None,
                reg: reg_of[i as usize],
                buffer: b,
                donor: Some(j),
                aliased: true,
                direct: false,
            });
            continue;
        }
        let out_slot = &exe.buffers[b as usize];
        let donor = kernel
            .inputs
            .iter()
            .enumerate()
            .find(|&(j, r)| match *r {
                ValueRef::Buffer(ib) => {
                    let s = &exe.buffers[ib as usize];
                    s.offset == out_slot.offset
                        && s.ty == out_slot.ty
                        && last_use[ib as usize] == k
                        && !taken.contains(&(j as u32))
                }
                ValueRef::Constant(_) => false,
            })
            .map(|(j, _)| j as u32);
        if let Some(d) = donor {
            taken.push(d);
        }
        outputs.push(FusedOutput {
            prelude: None,
            reg: reg_of[i as usize],
            buffer: b,
            donor,
            aliased: false,
            direct: false,
        });
    }
    mark_direct_outputs(kernel, &mut body, &mut outputs);
    let out_regs: Vec<u16> = outputs
        .iter()
        .filter(|o| !o.direct)
        .map(|o| o.reg)
        .collect();
    fold_multiplies(&mut body, &out_regs);
    let mut streams: Vec<(bool, u32, usize)> = Vec::new();
    for instr in &body {
        for (src, ty) in instr.args.iter().zip(&instr.arg_types) {
            if let Src::Input(i) = *src
                && !streams.iter().any(|&(inp, j, _)| inp && j == i)
            {
                streams.push((true, i, ty.byte_size()));
            }
        }
    }
    for (o, out) in outputs.iter().enumerate() {
        if out.prelude.is_none() {
            streams.push((false, o as u32, regs[out.reg as usize].byte_size()));
        }
    }
    Some(FusedPlan {
        len,
        streams,
        prelude,
        body,
        regs,
        outputs,
    })
}

/// Lets the instruction computing a loop output write it in place of a
/// register when nothing can observe the early write: the output is
/// computed by exactly one body instruction that produces no other output,
/// and the input whose memory it may take over (its donor) is not read by
/// that instruction or any later one. Later readers of the value read the
/// output memory.
fn mark_direct_outputs(
    kernel: &LoweredKernel,
    body: &mut [BodyInstr],
    outputs: &mut [FusedOutput],
) {
    let body_index: Vec<usize> = {
        let mut at = Vec::with_capacity(kernel.instrs.len());
        let mut k = 0;
        for instr in &kernel.instrs {
            at.push(k);
            if instr.stage == Stage::Loop {
                k += 1;
            }
        }
        at
    };
    for (o, out) in outputs.iter_mut().enumerate() {
        let (i, _) = kernel.outputs[o];
        if out.prelude.is_some() || kernel.outputs.iter().filter(|&&(j, _)| j == i).count() != 1 {
            continue;
        }
        let at = body_index[i as usize];
        let reads = |b: &BodyInstr, d: u32| {
            b.args
                .iter()
                .filter(|a| matches!(**a, Src::Input(x) if x == d))
                .count()
        };
        if let Some(d) = out.donor {
            if body[at + 1..].iter().any(|b| reads(b, d) > 0) {
                continue;
            }
            match reads(&body[at], d) {
                0 => {}
                // `p + u` over `p`: a binary float op reads the donor from
                // its destination, element by element, before writing it.
                1 if matches!(body[at].op, Op::Binary(_))
                    && body[at].arg_types.iter().all(|t| t.is_float()) =>
                {
                    for a in &mut body[at].args {
                        if matches!(*a, Src::Input(x) if x == d) {
                            *a = Src::Dest(d);
                        }
                    }
                }
                _ => continue,
            }
        }
        let reg = out.reg;
        body[at].direct = Some(o as u32);
        for b in &mut body[at + 1..] {
            for a in &mut b.args {
                if matches!(*a, Src::Reg(r) if r == reg) {
                    *a = Src::Output(o as u32);
                }
            }
        }
        out.direct = true;
    }
}

/// Folds `m = x * y` into the next instruction when that is `m + z`,
/// `z + m`, `m - z` or `z - m` in floating point and reads `m` nowhere else:
/// one pass instead of two, with the same two roundings (Rust never
/// contracts them into an FMA). Only adjacent pairs fold, so no write can
/// come between the multiply's reads and their new place.
fn fold_multiplies(body: &mut Vec<BodyInstr>, out_regs: &[u16]) {
    let mut k = 0;
    while k + 1 < body.len() {
        let (mul, next) = (&body[k], &body[k + 1]);
        let reg = mul.reg;
        let uses = |b: &BodyInstr| {
            b.args
                .iter()
                .filter(|a| matches!(**a, Src::Reg(r) if r == reg))
                .count()
        };
        let foldable = matches!(mul.op, Op::Binary(BinaryOp::Mul))
            && mul.direct.is_none()
            && mul.product_first.is_none()
            && mul.arg_types.iter().all(|t| t.is_float())
            && !out_regs.contains(&reg)
            && !mul
                .args
                .iter()
                .all(|a| matches!(a, Src::InputScalar(_) | Src::PreludeScalar(_)))
            && matches!(next.op, Op::Binary(BinaryOp::Add | BinaryOp::Sub))
            && next.product_first.is_none()
            && next.args.len() == 2
            && uses(next) == 1
            && body[k + 2..].iter().all(|b| uses(b) == 0);
        let other = next
            .args
            .iter()
            .position(|a| !matches!(*a, Src::Reg(r) if r == reg));
        let Some(other) = other.filter(|_| foldable) else {
            k += 1;
            continue;
        };
        let c = next.args[other];
        let (x, y) = (mul.args[0], mul.args[1]);
        // The add's register may be one the multiply's operands freed.
        if [x, y]
            .iter()
            .any(|a| matches!(*a, Src::Reg(r) if r == next.reg))
        {
            k += 1;
            continue;
        }
        let fused = BodyInstr {
            op: next.op.clone(),
            args: SmallVec::from_slice(&[x, y, c]),
            arg_types: SmallVec::from_slice(&[
                mul.arg_types[0],
                mul.arg_types[1],
                next.arg_types[other],
            ]),
            reg: next.reg,
            direct: next.direct,
            product_first: Some(other == 1),
        };
        body[k + 1] = fused;
        body.remove(k);
    }
}

fn reg_mut(r: &mut Reg, n: usize) -> ChunkMut<'_> {
    match r {
        Reg::Pred(v) => ChunkMut::Pred(&mut v[..n]),
        Reg::I32(v) => ChunkMut::I32(&mut v[..n]),
        Reg::F32(v) => ChunkMut::F32(&mut v[..n]),
        Reg::F64(v) => ChunkMut::F64(&mut v[..n]),
    }
}

/// A typed mutable chunk view of `n` elements at element offset `lo`.
///
/// # Safety
/// `ptr` must address at least `lo + n` elements of the dtype that nothing
/// else reads or writes while the view lives.
unsafe fn chunk_mut_at<'a>(dtype: DType, ptr: usize, lo: usize, n: usize) -> ChunkMut<'a> {
    // SAFETY: the caller's contract.
    unsafe {
        match dtype {
            DType::Pred => ChunkMut::Pred(std::slice::from_raw_parts_mut(
                (ptr as *mut bool).add(lo),
                n,
            )),
            DType::I32 => {
                ChunkMut::I32(std::slice::from_raw_parts_mut((ptr as *mut i32).add(lo), n))
            }
            DType::F32 => {
                ChunkMut::F32(std::slice::from_raw_parts_mut((ptr as *mut f32).add(lo), n))
            }
            DType::F64 => {
                ChunkMut::F64(std::slice::from_raw_parts_mut((ptr as *mut f64).add(lo), n))
            }
        }
    }
}

/// Scratch registers of one thread.
enum Reg {
    Pred(Vec<bool>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl Default for Reg {
    fn default() -> Self {
        Reg::Pred(Vec::new())
    }
}

/// A chunk of an operand: a slice or a scalar broadcast over the chunk.
#[derive(Clone, Copy)]
enum S<'a, T> {
    Slice(&'a [T]),
    Scalar(T),
}

#[derive(Clone, Copy)]
enum Chunk<'a> {
    Pred(S<'a, bool>),
    I32(S<'a, i32>),
    F32(S<'a, f32>),
    F64(S<'a, f64>),
}

enum ChunkMut<'a> {
    Pred(&'a mut [bool]),
    I32(&'a mut [i32]),
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
}

struct LoopCtx<'p> {
    plan: &'p FusedPlan,
    exec: ExecFn,
    exec_in_place: ExecInPlaceFn,
    exec_product: ExecProductFn,
    /// Per output: whether it took its donor input over in this run.
    donated: SmallVec<[bool; 4]>,
    /// Distinct `(address, element size)` of the loop's inputs and outputs.
    streams: SmallVec<[(usize, usize); 8]>,
    inputs: &'p [usize],
    prelude: &'p [usize],
    outputs: &'p [usize],
    chunk: usize,
}

// SAFETY (for the raw addresses shared by the tasks): every task reads the
// inputs and writes the outputs only inside its own element range, and the
// buffers outlive the parallel loop (they are held by `run_fused`).
unsafe impl Sync for LoopCtx<'_> {}

/// A typed chunk view of `n` elements at element offset `lo` of address `ptr`.
///
/// # Safety
/// `ptr` must address at least `lo + n` initialised elements of the dtype.
unsafe fn chunk_at<'a>(dtype: DType, ptr: usize, lo: usize, n: usize) -> Chunk<'a> {
    // SAFETY: the caller's contract.
    unsafe {
        match dtype {
            DType::Pred => Chunk::Pred(S::Slice(std::slice::from_raw_parts(
                (ptr as *const bool).add(lo),
                n,
            ))),
            DType::I32 => Chunk::I32(S::Slice(std::slice::from_raw_parts(
                (ptr as *const i32).add(lo),
                n,
            ))),
            DType::F32 => Chunk::F32(S::Slice(std::slice::from_raw_parts(
                (ptr as *const f32).add(lo),
                n,
            ))),
            DType::F64 => Chunk::F64(S::Slice(std::slice::from_raw_parts(
                (ptr as *const f64).add(lo),
                n,
            ))),
        }
    }
}

/// The element at `ptr` as a scalar chunk.
///
/// # Safety
/// `ptr` must address one initialised element of the dtype.
unsafe fn scalar_at<'a>(dtype: DType, ptr: usize) -> Chunk<'a> {
    // SAFETY: the caller's contract.
    unsafe {
        match dtype {
            DType::Pred => Chunk::Pred(S::Scalar(*(ptr as *const bool))),
            DType::I32 => Chunk::I32(S::Scalar(*(ptr as *const i32))),
            DType::F32 => Chunk::F32(S::Scalar(*(ptr as *const f32))),
            DType::F64 => Chunk::F64(S::Scalar(*(ptr as *const f64))),
        }
    }
}

impl LoopCtx<'_> {
    fn registers(&self) -> Vec<Reg> {
        let n = self.chunk.min(self.plan.len);
        self.plan
            .regs
            .iter()
            .map(|d| match d {
                DType::Pred => Reg::Pred(vec![false; n]),
                DType::I32 => Reg::I32(vec![0; n]),
                DType::F32 => Reg::F32(vec![0.0; n]),
                DType::F64 => Reg::F64(vec![0.0; n]),
            })
            .collect()
    }

    fn run_range(&self, lo: usize, hi: usize, regs: &mut [Reg]) -> Result<(), String> {
        let mut at = lo;
        while at < hi {
            let n = self.chunk.min(hi - at);
            self.run_chunk(at, n, regs)?;
            at += n;
        }
        Ok(())
    }

    /// Asks for part `part` of `parts` of the next chunk `[from, from + n)`
    /// of every stream. Spread over the body's instructions, the loads of
    /// all inputs overlap the arithmetic instead of stalling in one burst.
    #[inline]
    fn prefetch(&self, from: usize, n: usize, part: usize, parts: usize) {
        #[cfg(target_arch = "x86_64")]
        for &(base, size) in &self.streams {
            let start = (base + from * size) & !63;
            let lines = (base + (from + n) * size)
                .saturating_sub(start)
                .div_ceil(64);
            let (a, b) = (lines * part / parts, lines * (part + 1) / parts);
            for line in a..b {
                // SAFETY: a prefetch never faults and has no visible effect.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        (start + line * 64) as *const i8,
                    );
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (from, n, part, parts);
    }

    fn chunk_args<'r>(
        &self,
        instr: &BodyInstr,
        lo: usize,
        n: usize,
        regs: &'r [Reg],
    ) -> SmallVec<[Chunk<'r>; 4]> {
        instr
            .args
            .iter()
            .zip(&instr.arg_types)
            .map(|(&src, &dtype)| self.chunk_src(src, dtype, lo, n, regs))
            .collect()
    }

    fn chunk_src<'r>(
        &self,
        src: Src,
        dtype: DType,
        lo: usize,
        n: usize,
        regs: &'r [Reg],
    ) -> Chunk<'r> {
        // SAFETY: inputs, outputs and prelude values of the loop shape hold
        // `plan.len` elements; scalars hold one; the chunk lies inside the
        // loop shape. `Dest` reaches here only when its output did not take
        // the input over, so it reads the input itself.
        unsafe {
            match src {
                Src::Input(i) | Src::Dest(i) => chunk_at(dtype, self.inputs[i as usize], lo, n),
                Src::Prelude(l) => chunk_at(dtype, self.prelude[l as usize], lo, n),
                Src::InputScalar(i) => scalar_at(dtype, self.inputs[i as usize]),
                Src::PreludeScalar(l) => scalar_at(dtype, self.prelude[l as usize]),
                Src::Reg(r) => reg_chunk(&regs[r as usize], n),
                Src::Output(o) => chunk_at(dtype, self.outputs[o as usize], lo, n),
            }
        }
    }

    fn run_chunk(&self, lo: usize, n: usize, regs: &mut [Reg]) -> Result<(), String> {
        let plan = self.plan;
        let next = (lo + n).min(plan.len);
        let ahead = n.min(plan.len - next);
        let parts = plan.body.len().max(1);
        for (k, instr) in plan.body.iter().enumerate() {
            self.prefetch(next, ahead, k, parts);
            if let Some(first) = instr.product_first {
                let dtype = plan.regs[instr.reg as usize];
                let mut dst = match instr.direct {
                    Some(_) => None,
                    None => Some(std::mem::take(&mut regs[instr.reg as usize])),
                };
                let [a, b, c] = instr.args[..] else {
                    return Err("a folded multiply needs three operands".into());
                };
                let (a, b) = (
                    self.chunk_src(a, dtype, lo, n, regs),
                    self.chunk_src(b, dtype, lo, n, regs),
                );
                let in_place = matches!(c, Src::Dest(_))
                    && instr.direct.is_some_and(|o| self.donated[o as usize]);
                let c = (!in_place).then(|| self.chunk_src(c, dtype, lo, n, regs));
                let sub = matches!(instr.op, Op::Binary(BinaryOp::Sub));
                let result = match (instr.direct, dst.as_mut()) {
                    (Some(o), _) => {
                        // SAFETY: as for any direct output (below); with
                        // `in_place` the destination holds the donor, read
                        // only here.
                        let out = unsafe { chunk_mut_at(dtype, self.outputs[o as usize], lo, n) };
                        (self.exec_product)(a, b, c, first, sub, out)
                    }
                    (None, Some(d)) => (self.exec_product)(a, b, c, first, sub, reg_mut(d, n)),
                    (None, None) => Err("no destination".into()),
                };
                if let Some(d) = dst {
                    regs[instr.reg as usize] = d;
                }
                result?;
                continue;
            }
            if let Some(o) = instr.direct {
                let dtype = plan.regs[instr.reg as usize];
                if let Some(dest_first) = instr.reads_dest()
                    && self.donated[o as usize]
                {
                    let other = instr.args[usize::from(dest_first)];
                    let other = self.chunk_src(other, instr.arg_types[0], lo, n, regs);
                    // SAFETY: as below; the destination holds the donor
                    // input, which only this instruction reads.
                    let out = unsafe { chunk_mut_at(dtype, self.outputs[o as usize], lo, n) };
                    (self.exec_in_place)(&instr.op, other, dest_first, out)?;
                    continue;
                }
                let args = self.chunk_args(instr, lo, n, regs);
                // SAFETY: the output holds `plan.len` elements of `dtype`,
                // this task alone writes `[lo, lo + n)`, and no operand of
                // this or a later instruction reads that memory as an input
                // (`mark_direct_outputs`).
                let out = unsafe { chunk_mut_at(dtype, self.outputs[o as usize], lo, n) };
                (self.exec)(&instr.op, &args, out)?;
                continue;
            }
            let mut dst = std::mem::take(&mut regs[instr.reg as usize]);
            {
                let args = self.chunk_args(instr, lo, n, regs);
                let out = match &mut dst {
                    Reg::Pred(v) => ChunkMut::Pred(&mut v[..n]),
                    Reg::I32(v) => ChunkMut::I32(&mut v[..n]),
                    Reg::F32(v) => ChunkMut::F32(&mut v[..n]),
                    Reg::F64(v) => ChunkMut::F64(&mut v[..n]),
                };
                (self.exec)(&instr.op, &args, out)?;
            }
            regs[instr.reg as usize] = dst;
        }
        for (o, out) in plan.outputs.iter().enumerate() {
            if out.prelude.is_some() || out.direct {
                continue;
            }
            let ptr = self.outputs[o];
            // SAFETY: the destination holds `plan.len` elements of the
            // register's dtype; this task alone writes `[lo, lo + n)`, and
            // every read of that range in this chunk happened above.
            unsafe {
                match &regs[out.reg as usize] {
                    Reg::Pred(v) => copy_out(v, ptr as *mut bool, lo, n),
                    Reg::I32(v) => copy_out(v, ptr as *mut i32, lo, n),
                    Reg::F32(v) => copy_out(v, ptr as *mut f32, lo, n),
                    Reg::F64(v) => copy_out(v, ptr as *mut f64, lo, n),
                }
            }
        }
        Ok(())
    }
}

/// # Safety
/// `dst` must address at least `lo + n` elements this thread may write.
unsafe fn copy_out<T: Copy>(src: &[T], dst: *mut T, lo: usize, n: usize) {
    // SAFETY: the caller's contract; `src` is scratch, never the destination.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(lo), n) };
}

fn reg_chunk(r: &Reg, n: usize) -> Chunk<'_> {
    match r {
        Reg::Pred(v) => Chunk::Pred(S::Slice(&v[..n])),
        Reg::I32(v) => Chunk::I32(S::Slice(&v[..n])),
        Reg::F32(v) => Chunk::F32(S::Slice(&v[..n])),
        Reg::F64(v) => Chunk::F64(S::Slice(&v[..n])),
    }
}

#[inline(always)]
fn map1<A: Copy, R: Copy>(a: S<'_, A>, out: &mut [R], f: impl Fn(A) -> R) {
    match a {
        S::Slice(x) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x);
            }
        }
        S::Scalar(x) => out.fill(f(x)),
    }
}

#[inline(always)]
fn map2<A: Copy, B: Copy, R: Copy>(a: S<'_, A>, b: S<'_, B>, out: &mut [R], f: impl Fn(A, B) -> R) {
    match (a, b) {
        (S::Slice(x), S::Slice(y)) => {
            let n = out.len().min(x.len()).min(y.len());
            let (x, y, out) = (&x[..n], &y[..n], &mut out[..n]);
            for i in 0..n {
                out[i] = f(x[i], y[i]);
            }
        }
        (S::Slice(x), S::Scalar(y)) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x, y);
            }
        }
        (S::Scalar(x), S::Slice(y)) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x, y);
            }
        }
        (S::Scalar(x), S::Scalar(y)) => out.fill(f(x, y)),
    }
}

#[inline(always)]
fn get<T: Copy>(s: S<'_, T>, i: usize) -> T {
    match s {
        S::Slice(x) => x[i],
        S::Scalar(x) => x,
    }
}

fn select<T: Copy>(p: S<'_, bool>, t: S<'_, T>, f: S<'_, T>, out: &mut [T]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = if get(p, i) { get(t, i) } else { get(f, i) };
    }
}

macro_rules! float_unary {
    ($u:expr, $a:expr, $out:expr) => {
        match $u {
            UnaryOp::Neg => map1($a, $out, |x| -x),
            UnaryOp::Abs => map1($a, $out, |x| x.abs()),
            UnaryOp::Exp => map1($a, $out, |x| x.exp()),
            UnaryOp::Log => map1($a, $out, |x| x.ln()),
            UnaryOp::Sqrt => map1($a, $out, |x| x.sqrt()),
            UnaryOp::Rsqrt => map1($a, $out, |x| 1.0 / x.sqrt()),
            UnaryOp::Tanh => map1($a, $out, |x| x.tanh()),
            UnaryOp::Logistic => map1($a, $out, |x| 1.0 / (1.0 + (-x).exp())),
            UnaryOp::Sin => map1($a, $out, |x| x.sin()),
            UnaryOp::Cos => map1($a, $out, |x| x.cos()),
            UnaryOp::Floor => map1($a, $out, |x| x.floor()),
            UnaryOp::Ceil => map1($a, $out, |x| x.ceil()),
            UnaryOp::Sign => map1($a, $out, |x| {
                if x == 0.0 || x.is_nan() {
                    x
                } else {
                    x.signum()
                }
            }),
            UnaryOp::Not => return Err("not is defined for pred and i32".into()),
        }
    };
}

/// `$map(args…, f)` with the float op `$b` as `f`: one table of float
/// binary ops for the out-of-place (`map2`) and in-place (`map_in_place`)
/// loops.
macro_rules! float_binary {
    ($b:expr, $map:ident($($arg:expr),*)) => {
        match $b {
            BinaryOp::Add => $map($($arg,)* |a, b| a + b),
            BinaryOp::Sub => $map($($arg,)* |a, b| a - b),
            BinaryOp::Mul => $map($($arg,)* |a, b| a * b),
            BinaryOp::Div => $map($($arg,)* |a, b| a / b),
            BinaryOp::Rem => $map($($arg,)* |a, b| a % b),
            BinaryOp::Max => $map($($arg,)* float_max),
            BinaryOp::Min => $map($($arg,)* float_min),
            BinaryOp::Pow => $map($($arg,)* |a, b| a.powf(b)),
            BinaryOp::And | BinaryOp::Or => {
                return Err("and/or are defined for pred and i32".into());
            }
        }
    };
}

macro_rules! compare {
    ($c:expr, $x:expr, $y:expr, $out:expr) => {
        match $c {
            CompareDir::Eq => map2($x, $y, $out, |a, b| a == b),
            CompareDir::Ne => map2($x, $y, $out, |a, b| a != b),
            CompareDir::Lt => map2($x, $y, $out, |a, b| a < b),
            CompareDir::Le => map2($x, $y, $out, |a, b| a <= b),
            CompareDir::Gt => map2($x, $y, $out, |a, b| a > b),
            CompareDir::Ge => map2($x, $y, $out, |a, b| a >= b),
        }
    };
}

/// Defines `$select() -> $ty`, which returns `$base` compiled for AVX-512
/// or AVX2 when this CPU has them (checked once, when the runtime is
/// built), else `$base` as compiled for the target.
macro_rules! cpu_dispatch {
    (
        $(#[$doc:meta])*
        $select:ident -> $ty:ty = $base:ident($($arg:ident: $argty:ty),* $(,)?)
    ) => {
        $(#[$doc])*
        fn $select() -> $ty {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2")]
                unsafe fn avx512_inner($($arg: $argty),*) -> Result<(), String> {
                    $base($($arg),*)
                }
                fn avx512($($arg: $argty),*) -> Result<(), String> {
                    // SAFETY: only returned after detecting AVX-512F.
                    unsafe { avx512_inner($($arg),*) }
                }
                #[target_feature(enable = "avx2")]
                unsafe fn avx2_inner($($arg: $argty),*) -> Result<(), String> {
                    $base($($arg),*)
                }
                fn avx2($($arg: $argty),*) -> Result<(), String> {
                    // SAFETY: only returned after detecting AVX2.
                    unsafe { avx2_inner($($arg),*) }
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    return avx512;
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    return avx2;
                }
            }
            $base
        }
    };
}

/// One body instruction over one chunk, compiled for the best vector
/// extension the CPU has (selected once per process).
type ExecFn = fn(&Op, &[Chunk<'_>], ChunkMut<'_>) -> Result<(), String>;

cpu_dispatch!(
    /// The widest instruction set the loops were compiled for that this CPU
    /// runs. Rust never contracts `a * b + c` into an FMA, so every variant
    /// rounds exactly like the shared kernels.
    select_exec -> ExecFn = exec(op: &Op, args: &[Chunk<'_>], out: ChunkMut<'_>)
);

/// A binary float op whose operand `dest_first ? 0 : 1` is its own
/// destination: `out[i] = op(out[i], other[i])` (or mirrored).
type ExecInPlaceFn = fn(&Op, Chunk<'_>, bool, ChunkMut<'_>) -> Result<(), String>;

cpu_dispatch!(
    /// [`exec_in_place`] for the widest instruction set this CPU runs.
    select_exec_in_place -> ExecInPlaceFn =
        exec_in_place(op: &Op, b: Chunk<'_>, first: bool, out: ChunkMut<'_>)
);

#[inline(always)]
fn map_in_place<T: Copy>(out: &mut [T], other: S<'_, T>, first: bool, f: impl Fn(T, T) -> T) {
    match (other, first) {
        (S::Slice(y), true) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(*o, y);
            }
        }
        (S::Slice(y), false) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(y, *o);
            }
        }
        (S::Scalar(y), true) => out.iter_mut().for_each(|o| *o = f(*o, y)),
        (S::Scalar(y), false) => out.iter_mut().for_each(|o| *o = f(y, *o)),
    }
}

#[inline(always)]
fn exec_in_place(op: &Op, other: Chunk<'_>, first: bool, out: ChunkMut<'_>) -> Result<(), String> {
    match (op, other, out) {
        (Op::Binary(b), Chunk::F32(y), ChunkMut::F32(o)) => {
            float_binary!(*b, map_in_place(o, y, first))
        }
        (Op::Binary(b), Chunk::F64(y), ChunkMut::F64(o)) => {
            float_binary!(*b, map_in_place(o, y, first))
        }
        _ => return Err(format!("{op} cannot run in place on these operand types")),
    }
    Ok(())
}

/// `x * y` combined with `z` (`None`: the destination's own contents) by
/// add or subtract, the product first or second.
type ExecProductFn =
    fn(Chunk<'_>, Chunk<'_>, Option<Chunk<'_>>, bool, bool, ChunkMut<'_>) -> Result<(), String>;

cpu_dispatch!(
    /// [`exec_product`] for the widest instruction set this CPU runs.
    select_exec_product -> ExecProductFn = exec_product(
        x: Chunk<'_>,
        y: Chunk<'_>,
        z: Option<Chunk<'_>>,
        first: bool,
        sub: bool,
        out: ChunkMut<'_>,
    )
);

/// The loops of a folded multiply, one per operand layout so each
/// vectorizes; `f(product, z)` applies the add or subtract.
#[inline(always)]
fn product_loop<T: Copy + std::ops::Mul<Output = T>>(
    x: S<'_, T>,
    y: S<'_, T>,
    z: Option<S<'_, T>>,
    out: &mut [T],
    f: impl Fn(T, T) -> T,
) -> Result<(), String> {
    match (x, y, z) {
        (S::Scalar(x), S::Slice(y), Some(S::Slice(z))) => {
            for ((o, &y), &z) in out.iter_mut().zip(y).zip(z) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Scalar(y), Some(S::Slice(z))) => {
            for ((o, &x), &z) in out.iter_mut().zip(x).zip(z) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Slice(y), Some(S::Slice(z))) => {
            for (((o, &x), &y), &z) in out.iter_mut().zip(x).zip(y).zip(z) {
                *o = f(x * y, z);
            }
        }
        (S::Scalar(x), S::Slice(y), Some(S::Scalar(z))) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Scalar(y), Some(S::Scalar(z))) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x * y, z);
            }
        }
        (S::Slice(x), S::Slice(y), Some(S::Scalar(z))) => {
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = f(x * y, z);
            }
        }
        (S::Scalar(x), S::Slice(y), None) => {
            for (o, &y) in out.iter_mut().zip(y) {
                *o = f(x * y, *o);
            }
        }
        (S::Slice(x), S::Scalar(y), None) => {
            for (o, &x) in out.iter_mut().zip(x) {
                *o = f(x * y, *o);
            }
        }
        (S::Slice(x), S::Slice(y), None) => {
            for ((o, &x), &y) in out.iter_mut().zip(x).zip(y) {
                *o = f(x * y, *o);
            }
        }
        _ => return Err("a folded multiply needs a chunk operand".into()),
    }
    Ok(())
}

macro_rules! product_ops {
    ($x:expr, $y:expr, $z:expr, $first:expr, $sub:expr, $o:expr) => {
        match ($first, $sub) {
            (true, false) => product_loop($x, $y, $z, $o, |m, z| m + z),
            (false, false) => product_loop($x, $y, $z, $o, |m, z| z + m),
            (true, true) => product_loop($x, $y, $z, $o, |m, z| m - z),
            (false, true) => product_loop($x, $y, $z, $o, |m, z| z - m),
        }
    };
}

#[inline(always)]
fn exec_product(
    x: Chunk<'_>,
    y: Chunk<'_>,
    z: Option<Chunk<'_>>,
    first: bool,
    sub: bool,
    out: ChunkMut<'_>,
) -> Result<(), String> {
    match (x, y, z, out) {
        (Chunk::F32(x), Chunk::F32(y), Some(Chunk::F32(z)), ChunkMut::F32(o)) => {
            product_ops!(x, y, Some(z), first, sub, o)
        }
        (Chunk::F32(x), Chunk::F32(y), None, ChunkMut::F32(o)) => {
            product_ops!(x, y, None, first, sub, o)
        }
        (Chunk::F64(x), Chunk::F64(y), Some(Chunk::F64(z)), ChunkMut::F64(o)) => {
            product_ops!(x, y, Some(z), first, sub, o)
        }
        (Chunk::F64(x), Chunk::F64(y), None, ChunkMut::F64(o)) => {
            product_ops!(x, y, None, first, sub, o)
        }
        _ => Err("a folded multiply needs floats of one type".into()),
    }
}

/// One body instruction over one chunk.
#[inline(always)]
fn exec(op: &Op, args: &[Chunk<'_>], out: ChunkMut<'_>) -> Result<(), String> {
    let bad = || format!("{op} cannot run on these operand types");
    match (op, args, out) {
        (Op::Unary(u), [Chunk::F32(a)], ChunkMut::F32(o)) => float_unary!(*u, *a, o),
        (Op::Unary(u), [Chunk::F64(a)], ChunkMut::F64(o)) => float_unary!(*u, *a, o),
        (Op::Unary(u), [Chunk::I32(a)], ChunkMut::I32(o)) => match u {
            UnaryOp::Neg => map1(*a, o, |x: i32| x.wrapping_neg()),
            UnaryOp::Abs => map1(*a, o, |x: i32| x.wrapping_abs()),
            UnaryOp::Sign => map1(*a, o, |x: i32| x.signum()),
            UnaryOp::Not => map1(*a, o, |x: i32| !x),
            UnaryOp::Floor | UnaryOp::Ceil => map1(*a, o, |x: i32| x),
            _ => return Err(format!("{u:?} is not defined for i32")),
        },
        (Op::Unary(UnaryOp::Not), [Chunk::Pred(a)], ChunkMut::Pred(o)) => map1(*a, o, |x| !x),
        (Op::Binary(b), [Chunk::F32(x), Chunk::F32(y)], ChunkMut::F32(o)) => {
            float_binary!(*b, map2(*x, *y, o))
        }
        (Op::Binary(b), [Chunk::F64(x), Chunk::F64(y)], ChunkMut::F64(o)) => {
            float_binary!(*b, map2(*x, *y, o))
        }
        (Op::Binary(b), [Chunk::I32(x), Chunk::I32(y)], ChunkMut::I32(o)) => {
            let (x, y) = (*x, *y);
            match b {
                BinaryOp::Add => map2(x, y, o, |a: i32, b: i32| a.wrapping_add(b)),
                BinaryOp::Sub => map2(x, y, o, |a: i32, b: i32| a.wrapping_sub(b)),
                BinaryOp::Mul => map2(x, y, o, |a: i32, b: i32| a.wrapping_mul(b)),
                BinaryOp::Div => map2(
                    x,
                    y,
                    o,
                    |a: i32, b: i32| {
                        if b == 0 { -1 } else { a.wrapping_div(b) }
                    },
                ),
                BinaryOp::Rem => map2(
                    x,
                    y,
                    o,
                    |a: i32, b: i32| {
                        if b == 0 { a } else { a.wrapping_rem(b) }
                    },
                ),
                BinaryOp::Max => map2(x, y, o, |a: i32, b: i32| a.max(b)),
                BinaryOp::Min => map2(x, y, o, |a: i32, b: i32| a.min(b)),
                BinaryOp::Pow => map2(x, y, o, int_pow),
                BinaryOp::And => map2(x, y, o, |a: i32, b: i32| a & b),
                BinaryOp::Or => map2(x, y, o, |a: i32, b: i32| a | b),
            }
        }
        (Op::Binary(b), [Chunk::Pred(x), Chunk::Pred(y)], ChunkMut::Pred(o)) => match b {
            BinaryOp::And | BinaryOp::Min => map2(*x, *y, o, |a: bool, b: bool| a & b),
            BinaryOp::Or | BinaryOp::Max => map2(*x, *y, o, |a: bool, b: bool| a | b),
            _ => return Err(format!("{b:?} is not defined for pred")),
        },
        (Op::Compare(c), [Chunk::F32(x), Chunk::F32(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Compare(c), [Chunk::F64(x), Chunk::F64(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Compare(c), [Chunk::I32(x), Chunk::I32(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Compare(c), [Chunk::Pred(x), Chunk::Pred(y)], ChunkMut::Pred(o)) => {
            compare!(*c, *x, *y, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::F32(t), Chunk::F32(f)], ChunkMut::F32(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::F64(t), Chunk::F64(f)], ChunkMut::F64(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::I32(t), Chunk::I32(f)], ChunkMut::I32(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Select, [Chunk::Pred(p), Chunk::Pred(t), Chunk::Pred(f)], ChunkMut::Pred(o)) => {
            select(*p, *t, *f, o)
        }
        (Op::Convert(_), [a], o) => convert(*a, o),
        _ => return Err(bad()),
    }
    Ok(())
}

/// Elementwise conversion with the shared kernel's rules (float→int
/// truncates and saturates, NaN→0; pred↔number is 0/1 and `!= 0`).
fn convert(a: Chunk<'_>, out: ChunkMut<'_>) {
    match (a, out) {
        (Chunk::Pred(x), ChunkMut::Pred(o)) => map1(x, o, |v| v),
        (Chunk::Pred(x), ChunkMut::I32(o)) => map1(x, o, i32::from),
        (Chunk::Pred(x), ChunkMut::F32(o)) => map1(x, o, |v| f32::from(u8::from(v))),
        (Chunk::Pred(x), ChunkMut::F64(o)) => map1(x, o, |v| f64::from(u8::from(v))),
        (Chunk::I32(x), ChunkMut::Pred(o)) => map1(x, o, |v| v != 0),
        (Chunk::I32(x), ChunkMut::I32(o)) => map1(x, o, |v| v),
        (Chunk::I32(x), ChunkMut::F32(o)) => map1(x, o, |v| v as f32),
        (Chunk::I32(x), ChunkMut::F64(o)) => map1(x, o, f64::from),
        (Chunk::F32(x), ChunkMut::Pred(o)) => map1(x, o, |v| v != 0.0),
        (Chunk::F32(x), ChunkMut::I32(o)) => map1(x, o, |v| v as i32),
        (Chunk::F32(x), ChunkMut::F32(o)) => map1(x, o, |v| v),
        (Chunk::F32(x), ChunkMut::F64(o)) => map1(x, o, f64::from),
        (Chunk::F64(x), ChunkMut::Pred(o)) => map1(x, o, |v| v != 0.0),
        (Chunk::F64(x), ChunkMut::I32(o)) => map1(x, o, |v| v as i32),
        (Chunk::F64(x), ChunkMut::F32(o)) => map1(x, o, |v| v as f32),
        (Chunk::F64(x), ChunkMut::F64(o)) => map1(x, o, |v| v),
    }
}
