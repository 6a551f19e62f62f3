//! Native code for fused loops, generated with Cranelift.
//!
//! The chunk interpreter of [`crate::exec::runtime`] evaluates a fused body
//! one instruction at a time over an L1-resident chunk: every op loads its
//! operands from L1 and stores its result back. A 15-op body (Adam) is then
//! bound by L1 stores, not by DRAM, and runs ~1.5–2x slower than a
//! hand-written loop that keeps every value in registers. XLA's CPU backend
//! avoids this by emitting one LLVM loop per fusion; this module does the
//! same with Cranelift: one function per fused loop, each element's whole
//! body in vector registers, loads of each input once and stores of each
//! output once per vector of elements.
//!
//! The generated function is
//! `extern "C" fn(table: *const usize, lo: usize, hi: usize)` over elements
//! `[lo, hi)`, where `table` holds the address of every kernel input, then
//! of every instruction's prelude value, then of every output (see
//! [`Table`]), and after them a 16-byte vector of copies of every rank-0
//! float the body reads ([`NativeLoop::fill_table`]): each step loads such a
//! scalar as a whole vector, where splats held in registers across the loop
//! left Adam's body too few of the 16 vector registers and were spilled on
//! every iteration. It runs an unrolled vector loop, a one-step vector loop
//! and a scalar loop for the tail. A step covers 4 elements when the body has
//! `f32` values (one `f32x4` each; an `f64` value is two `f64x2`) and 2 in
//! an all-`f64` body: Cranelift's 128-bit vectors. Within one step, every
//! load happens before any store, so an output written over its donated
//! input (the same index) is correct.
//!
//! **Exactness.** Only ops whose native form rounds exactly like the shared
//! kernels are compiled: `+ - * /`, `sqrt`, `rsqrt` (correctly rounded, see
//! `Cx::rsqrt`), `neg`, `abs`, `floor`, `ceil`, `sign`, `max`/`min` (with
//! the kernels' NaN rules, built from compares), compares, `select`,
//! `and`/`or`/`not` of predicates and conversions between `f32` and `f64`.
//! Cranelift never contracts a multiply and an add into an FMA; the only
//! FMAs are those `rsqrt` is built from, checked bit for bit on every
//! input. A body with anything else
//! (transcendentals, integers, predicates read from or written to memory)
//! is left to the interpreter, with the reason.
//!
//! The module is in four parts: [`isa`] probes the host, [`analysis`]
//! decides what can go native, [`emit`] builds a loop's function and
//! [`ops`] emits each op of its body.

use std::sync::Arc;

use cranelift_codegen::ir::{AbiParam, UserFuncName};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, ModuleError, default_libcall_names};
use smallvec::SmallVec;

use crate::compiler::executable::LoweredKernel;
use crate::ir::{DType, Op, TensorType};

mod analysis;
mod emit;
mod isa;
mod ops;

use analysis::{Float, analyze};
use emit::build_loop;
use isa::host_isa;

/// A compiled loop: `f(table, lo, hi)` runs the body over elements
/// `[lo, hi)`.
pub(crate) type LoopFn = unsafe extern "C" fn(table: *const usize, lo: usize, hi: usize);

/// Where each address of a loop's table sits: kernel inputs first, then one
/// entry per kernel instruction (only prelude values are read), then the
/// outputs in `kernel.outputs` order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    inputs: usize,
    instrs: usize,
}

impl Table {
    pub(crate) fn of(kernel: &LoweredKernel) -> Table {
        Table {
            inputs: kernel.inputs.len(),
            instrs: kernel.instrs.len(),
        }
    }

    fn input(self, i: u32) -> usize {
        i as usize
    }

    fn prelude(self, l: u32) -> usize {
        self.inputs + l as usize
    }

    fn output(self, o: usize) -> usize {
        self.inputs + self.instrs + o
    }

    /// Entries in the table.
    pub(crate) fn len(self, outputs: usize) -> usize {
        self.inputs + self.instrs + outputs
    }

    /// Fills `table` from the kernel's input, prelude and output addresses.
    pub(crate) fn fill(
        self,
        table: &mut SmallVec<[usize; 96]>,
        inputs: &[usize],
        prelude: &[usize],
        outputs: &[usize],
    ) {
        table.clear();
        table.extend_from_slice(inputs);
        table.extend_from_slice(prelude);
        table.extend_from_slice(outputs);
    }
}

/// The code memory of one executable's native loops. Freed when the last
/// [`NativeLoop`] pointing into it is dropped.
pub(crate) struct NativeCode {
    module: Option<JITModule>,
}

impl std::fmt::Debug for NativeCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NativeCode")
    }
}

// SAFETY: after `finalize_definitions` the module is only kept alive (its
// code is immutable and read-only) and freed on drop; nothing mutates it
// through a shared reference.
unsafe impl Send for NativeCode {}
// SAFETY: as above.
unsafe impl Sync for NativeCode {}

impl Drop for NativeCode {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: every `NativeLoop` holds an `Arc` of this code, so no
            // function pointer into it outlives it.
            unsafe { module.free_memory() };
        }
    }
}

/// One fused loop compiled to native code.
#[derive(Debug, Clone)]
pub(crate) struct NativeLoop {
    entry: LoopFn,
    table: Table,
    /// Table entries of the rank-0 floats the body reads, with their float,
    /// in the order of their splats ([`NativeLoop::fill_table`]).
    scalars: Scalars,
    _code: Arc<NativeCode>,
}

impl NativeLoop {
    /// Runs the body over `[lo, hi)`.
    ///
    /// # Safety
    /// `table` must hold, at the [`Table`] positions, the address of every
    /// input, prelude value and output the body reads or writes: loop-shaped
    /// ones with at least `hi` elements of the body's float type, scalars
    /// with one; nothing else may write `[lo, hi)` of the outputs meanwhile.
    pub(crate) unsafe fn run(&self, table: &[usize], lo: usize, hi: usize) {
        debug_assert!(table.len() >= self.table.inputs + self.table.instrs);
        // SAFETY: the caller's contract; the code lives as long as `self`.
        unsafe { (self.entry)(table.as_ptr(), lo, hi) }
    }

    /// Fills `table` from the kernel's input, prelude and output addresses
    /// ([`Table::fill`]), then appends, for each scalar the body reads, a
    /// 16-byte vector of copies of its value: the loop loads it whole, so a
    /// scalar costs one load per step and no broadcast.
    ///
    /// # Safety
    /// Every scalar entry's address must point to a live value of its float.
    pub(crate) unsafe fn fill_table(
        &self,
        table: &mut SmallVec<[usize; 96]>,
        inputs: &[usize],
        prelude: &[usize],
        outputs: &[usize],
    ) {
        self.table.fill(table, inputs, prelude, outputs);
        let base = table.len();
        table.resize(base + 2 * self.scalars.len(), 0);
        let (addresses, splats) = table.split_at_mut(base);
        for (&(slot, f), splat) in self.scalars.iter().zip(splats.chunks_exact_mut(2)) {
            let at = addresses[slot];
            // SAFETY: the caller's contract.
            let word = unsafe {
                match f {
                    Float::F32 => {
                        let bits = u64::from((*(at as *const f32)).to_bits());
                        bits | bits << 32
                    }
                    Float::F64 => (*(at as *const f64)).to_bits(),
                }
            };
            splat.fill(word as usize);
        }
    }

    /// Entries of the table [`NativeLoop::fill_table`] builds.
    pub(crate) fn table_len(&self, outputs: usize) -> usize {
        self.table.len(outputs) + 2 * self.scalars.len()
    }
}

/// Why a fused loop has no native code (the chunk interpreter runs it), as
/// [`Runtime::native_loops`](crate::exec::runtime::Runtime::native_loops)
/// reports it.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NativeRefusal {
    /// Cranelift does not support this machine.
    #[error("no native code generator for this CPU")]
    NoCodeGenerator,
    /// The body reads values of a type the native set does not compute in.
    #[error("{0} values")]
    Values(DType),
    /// The body has an op outside the native set.
    #[error("{0} has no native form")]
    NoNativeForm(Op),
    /// An op of the native set on operands of types it has no form for.
    #[error("{0} on these operand types")]
    OperandTypes(Op),
    /// An op whose result type is not the float it computes in.
    #[error("{op} gives {dtype}")]
    Gives {
        /// The op.
        op: Op,
        /// Its declared result type.
        dtype: DType,
    },
    /// The loop writes a predicate to memory.
    #[error("a pred output")]
    PredOutput,
    /// The loop's function could not be declared.
    #[error(transparent)]
    Declare(Arc<ModuleError>),
    /// The loop's function could not be compiled.
    #[error("code generation: {0:?}")]
    Define(#[source] Arc<ModuleError>),
    /// The executable's native code could not be finalized.
    #[error("code generation: {0}")]
    Finalize(#[source] Arc<ModuleError>),
}
/// A loop's rank-0 float operands: (table entry, float), in splat order.
type Scalars = Vec<(usize, Float)>;

/// Per kernel: its compiled loop, why it has none (`Err`: the interpreter
/// runs it), or `None` for a kernel that is not a fused loop.
pub(crate) type NativeLoops = Vec<Option<Result<NativeLoop, NativeRefusal>>>;

/// Compiles the fused loops among `kernels` (each with its input types;
/// `None` for kernels that are not fused loops).
pub(crate) fn compile(kernels: &[Option<(&LoweredKernel, Vec<TensorType>)>]) -> NativeLoops {
    let mut out: NativeLoops = vec![None; kernels.len()];
    let Some(isa) = host_isa() else {
        for (k, kernel) in kernels.iter().enumerate() {
            if kernel.is_some() {
                out[k] = Some(Err(NativeRefusal::NoCodeGenerator));
            }
        }
        return out;
    };
    let mut module = JITModule::new(JITBuilder::with_isa(isa.clone(), default_libcall_names()));
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut defined: Vec<(usize, cranelift_module::FuncId, Table, Scalars)> = Vec::new();
    for (k, kernel) in kernels.iter().enumerate() {
        let Some((kernel, input_types)) = kernel else {
            continue;
        };
        let body = match analyze(kernel, input_types) {
            Ok(body) => body,
            Err(why) => {
                out[k] = Some(Err(why));
                continue;
            }
        };
        let mut sig = module.make_signature();
        let ptr = module.target_config().pointer_type();
        sig.params.extend([AbiParam::new(ptr); 3]);
        let id = match module.declare_function(&format!("loop{k}"), Linkage::Local, &sig) {
            Ok(id) => id,
            Err(e) => {
                out[k] = Some(Err(NativeRefusal::Declare(Arc::new(e))));
                continue;
            }
        };
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        let table = Table::of(kernel);
        let config = module.target_config();
        let scalars = build_loop(
            FunctionBuilder::new(&mut ctx.func, &mut fctx),
            kernel,
            input_types,
            &body,
            table,
            config,
        );
        match module.define_function(id, &mut ctx) {
            Ok(()) => defined.push((k, id, table, scalars)),
            Err(e) => out[k] = Some(Err(NativeRefusal::Define(Arc::new(e)))),
        }
        module.clear_context(&mut ctx);
    }
    if defined.is_empty() {
        // SAFETY: nothing was finalized, so nothing points into it.
        unsafe { module.free_memory() };
        return out;
    }
    if let Err(e) = module.finalize_definitions() {
        let e = Arc::new(e);
        for (k, ..) in defined {
            out[k] = Some(Err(NativeRefusal::Finalize(e.clone())));
        }
        // SAFETY: finalization failed; no function pointer was taken.
        unsafe { module.free_memory() };
        return out;
    }
    let entries: Vec<(usize, *const u8, Table, Scalars)> = defined
        .into_iter()
        .map(|(k, id, t, scalars)| (k, module.get_finalized_function(id), t, scalars))
        .collect();
    let code = Arc::new(NativeCode {
        module: Some(module),
    });
    for (k, entry, table, scalars) in entries {
        // SAFETY: the function was built with the `LoopFn` signature (three
        // pointer-sized arguments, no result) in the default call convention.
        let entry: LoopFn = unsafe { std::mem::transmute::<*const u8, LoopFn>(entry) };
        out[k] = Some(Ok(NativeLoop {
            entry,
            table,
            scalars,
            _code: code.clone(),
        }));
    }
    out
}
