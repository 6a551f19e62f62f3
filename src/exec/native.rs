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

use std::sync::{Arc, OnceLock};

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, Block, BlockArg, ConstantData, Endianness, InstBuilder, MemFlagsData, Type,
    UserFuncName, Value, types,
};
use cranelift_codegen::isa::{OwnedTargetIsa, TargetFrontendConfig};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use smallvec::{SmallVec, smallvec};

use crate::compiler::executable::{Arg as InstrArg, LoweredKernel, Stage};
use crate::ir::{BinaryOp, CompareDir, DType, Op, TensorType, UnaryOp};

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

/// The host's instruction set, detected once (`None`: Cranelift does not
/// support this machine, and every loop is interpreted).
fn host_isa() -> Option<&'static OwnedTargetIsa> {
    static ISA: OnceLock<Option<OwnedTargetIsa>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").ok()?;
        flags.set("use_colocated_libcalls", "false").ok()?;
        flags.set("is_pic", "false").ok()?;
        cranelift_native::builder()
            .ok()?
            .finish(settings::Flags::new(flags))
            .ok()
    })
    .as_ref()
}

/// Whether the host has fused multiply-add (the fast `f32` `rsqrt`).
fn host_has_fma() -> bool {
    static FMA: OnceLock<bool> = OnceLock::new();
    *FMA.get_or_init(|| {
        host_isa().is_some_and(|isa| {
            isa.isa_flags()
                .iter()
                .any(|f| f.name == "has_fma" && f.as_bool() == Some(true))
        })
    })
}

/// The `f32` inputs of [`Cx::rsqrt_f32x4_fma`]: `[2^-64, 2^64]`, where none
/// of its intermediate values is subnormal or overflows. Far wider than an
/// optimizer's `nu + eps` or `s + eps` needs.
const RSQRT_F32_FMA_RANGE: (f64, f64) = (1.0 / TWO_TO_64, TWO_TO_64);
const TWO_TO_64: f64 = 18_446_744_073_709_551_616.0;

/// Vectors per iteration of the main loop.
const UNROLL: i64 = 2;

/// A float type a native body computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Float {
    F32,
    F64,
}

impl Float {
    fn of(d: DType) -> Option<Float> {
        match d {
            DType::F32 => Some(Float::F32),
            DType::F64 => Some(Float::F64),
            _ => None,
        }
    }

    fn scalar(self) -> Type {
        match self {
            Float::F32 => types::F32,
            Float::F64 => types::F64,
        }
    }

    /// The 128-bit vector of this float.
    fn vector(self) -> Type {
        match self {
            Float::F32 => types::F32X4,
            Float::F64 => types::F64X2,
        }
    }

    fn lanes(self) -> i64 {
        match self {
            Float::F32 => 4,
            Float::F64 => 2,
        }
    }

    /// log2 of the element size.
    fn shift(self) -> i64 {
        match self {
            Float::F32 => 2,
            Float::F64 => 3,
        }
    }
}

/// A fused loop's body as the code generator sees it.
struct Body {
    /// Elements per vector step: 4 when any value is `f32`, else 2; an
    /// `f64` value then spans two vectors ("parts").
    lanes: i64,
    /// Per instruction: the float of its value, or of the operands it
    /// compared (for predicate masks).
    floats: Vec<Option<Float>>,
}

impl Body {
    fn parts(&self, f: Float) -> usize {
        (self.lanes / f.lanes()) as usize
    }
}

/// Checks that a fused loop's body is in the native set and types every
/// value, or says why it is not.
fn analyze(kernel: &LoweredKernel, input_types: &[TensorType]) -> Result<Body, String> {
    let mut floats: Vec<Option<Float>> = vec![None; kernel.instrs.len()];
    let mut any_f32 = false;
    // The float and kind (`true`: mask) of an operand.
    let operand = |floats: &[Option<Float>], a: &InstrArg| -> Result<(Float, bool), String> {
        let (d, f) = match *a {
            InstrArg::Input(i) => (input_types[i as usize].dtype, None),
            InstrArg::Local(l) => {
                let src = &kernel.instrs[l as usize];
                let f = (src.stage == Stage::Loop)
                    .then(|| floats[l as usize])
                    .flatten();
                (src.ty.dtype, f)
            }
        };
        match (d, f) {
            (DType::Pred, Some(f)) => Ok((f, true)),
            _ => Float::of(d)
                .map(|f| (f, false))
                .ok_or_else(|| format!("{d} values")),
        }
    };
    for (j, instr) in kernel.instrs.iter().enumerate() {
        if instr.stage != Stage::Loop {
            continue;
        }
        let args = instr
            .args
            .iter()
            .map(|a| operand(&floats, a))
            .collect::<Result<Vec<_>, _>>()?;
        let float = |k: usize| match args.get(k) {
            Some(&(f, false)) => Some(f),
            _ => None,
        };
        let mask = |k: usize| match args.get(k) {
            Some(&(f, true)) => Some(f),
            _ => None,
        };
        let same = |a: Option<Float>, b: Option<Float>| a.filter(|_| a == b);
        let result = match &instr.op {
            Op::Unary(UnaryOp::Not) => mask(0),
            Op::Unary(
                UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Sign,
            ) => float(0),
            Op::Binary(BinaryOp::And | BinaryOp::Or) => same(mask(0), mask(1)),
            Op::Binary(
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Max
                | BinaryOp::Min,
            )
            | Op::Compare(_) => same(float(0), float(1)),
            Op::Select => same(mask(0), same(float(1), float(2))),
            Op::Convert(d) => float(0).and(Float::of(*d)),
            op => return Err(format!("{op} has no native form")),
        };
        let result = result.ok_or_else(|| format!("{} on these operand types", instr.op))?;
        let is_mask = matches!(
            instr.op,
            Op::Compare(_) | Op::Unary(UnaryOp::Not) | Op::Binary(BinaryOp::And | BinaryOp::Or)
        );
        if !is_mask && Float::of(instr.ty.dtype) != Some(result) {
            return Err(format!("{} gives {}", instr.op, instr.ty.dtype));
        }
        any_f32 |= result == Float::F32 || args.iter().any(|&(f, _)| f == Float::F32);
        floats[j] = Some(result);
    }
    for &(i, _) in &kernel.outputs {
        let instr = &kernel.instrs[i as usize];
        if instr.stage == Stage::Loop && instr.ty.dtype == DType::Pred {
            return Err("a pred output".into());
        }
    }
    Ok(Body {
        lanes: if any_f32 { 4 } else { 2 },
        floats,
    })
}

/// A loop's rank-0 float operands: (table entry, float), in splat order.
type Scalars = Vec<(usize, Float)>;

/// Per kernel: its compiled loop, why it has none (`Err`: the interpreter
/// runs it), or `None` for a kernel that is not a fused loop.
pub(crate) type NativeLoops = Vec<Option<Result<NativeLoop, String>>>;

/// Compiles the fused loops among `kernels` (each with its input types;
/// `None` for kernels that are not fused loops).
pub(crate) fn compile(kernels: &[Option<(&LoweredKernel, Vec<TensorType>)>]) -> NativeLoops {
    let mut out: NativeLoops = vec![None; kernels.len()];
    let Some(isa) = host_isa() else {
        for (k, kernel) in kernels.iter().enumerate() {
            if kernel.is_some() {
                out[k] = Some(Err("no native code generator for this CPU".into()));
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
                out[k] = Some(Err(e.to_string()));
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
            Err(e) => out[k] = Some(Err(format!("code generation: {e:?}"))),
        }
        module.clear_context(&mut ctx);
    }
    if defined.is_empty() {
        // SAFETY: nothing was finalized, so nothing points into it.
        unsafe { module.free_memory() };
        return out;
    }
    if let Err(e) = module.finalize_definitions() {
        for (k, ..) in defined {
            out[k] = Some(Err(format!("code generation: {e}")));
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

/// A body value over one step: a float (one vector per part, or one
/// scalar in the tail) or a predicate mask of a float's width (lanes of all
/// ones / zeros for vectors, 0 / 1 in an `i8` for scalars).
#[derive(Clone)]
enum V {
    Float(Float, SmallVec<[Value; 2]>),
    Mask(SmallVec<[Value; 2]>),
}

/// Hoisted operands: base addresses of streams and loaded scalars.
struct Hoisted {
    /// Per table entry: the base address of a stream.
    base: Vec<Option<Value>>,
    /// Per table entry: the float of a scalar and the table entry of its
    /// splat, a vector's worth of copies after the addresses
    /// ([`NativeLoop::fill_table`]).
    scalar: Vec<Option<(Float, usize)>>,
    /// The table's address.
    tab: Value,
    /// Per table entry: the float of a stream.
    float: Vec<Option<Float>>,
}

fn build_loop(
    mut fb: FunctionBuilder<'_>,
    kernel: &LoweredKernel,
    input_types: &[TensorType],
    body: &Body,
    table: Table,
    config: TargetFrontendConfig,
) -> Scalars {
    let b = &mut fb;
    let ptr = config.pointer_type();
    let flags = MemFlagsData::new().with_notrap();
    let entry = b.create_block();
    let uhead = b.create_block();
    let ubody = b.create_block();
    let vhead = b.create_block();
    let vbody = b.create_block();
    let thead = b.create_block();
    let tbody = b.create_block();
    let exit = b.create_block();
    for block in [uhead, ubody, vhead, vbody, thead, tbody, exit] {
        b.append_block_param(block, ptr);
    }
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let (tab, lo, hi) = {
        let p = b.block_params(entry);
        (p[0], p[1], p[2])
    };
    // Hoist every stream address the body reads out of the loops. Scalars
    // are read from the table in every step instead: a load-and-broadcast
    // from L1 costs a load port, while a dozen splats kept in registers
    // across the loop leave too few of the 16 vector registers for the
    // body, and Cranelift spills them on every iteration.
    let entries = table.len(kernel.outputs.len());
    let mut hoisted = Hoisted {
        base: vec![None; entries],
        scalar: vec![None; entries],
        tab,
        float: vec![None; entries],
    };
    let mut scalars = Scalars::new();
    // (table entry, whether it is a scalar, its dtype) of a non-body operand.
    let source = |a: &InstrArg| -> Option<(usize, bool, DType)> {
        match *a {
            InstrArg::Input(i) => {
                let t = &input_types[i as usize];
                Some((table.input(i), t.dims.is_empty(), t.dtype))
            }
            InstrArg::Local(l) if kernel.instrs[l as usize].stage == Stage::Prelude => {
                let t = &kernel.instrs[l as usize].ty;
                Some((table.prelude(l), t.dims.is_empty(), t.dtype))
            }
            InstrArg::Local(_) => None,
        }
    };
    for instr in kernel.instrs.iter().filter(|i| i.stage == Stage::Loop) {
        for a in &instr.args {
            let Some((slot, scalar, dtype)) = source(a) else {
                continue;
            };
            let Some(float) = Float::of(dtype) else {
                continue;
            };
            if hoisted.base[slot].is_some() || hoisted.scalar[slot].is_some() {
                continue;
            }
            if scalar {
                let splat = entries + 2 * scalars.len();
                hoisted.scalar[slot] = Some((float, splat));
                scalars.push((slot, float));
            } else {
                hoisted.base[slot] = Some(b.ins().load(ptr, flags, tab, (slot * 8) as i32));
                hoisted.float[slot] = Some(float);
            }
        }
    }
    for (o, &(i, _)) in kernel.outputs.iter().enumerate() {
        let instr = &kernel.instrs[i as usize];
        if instr.stage == Stage::Loop {
            let slot = table.output(o);
            hoisted.base[slot] = Some(b.ins().load(ptr, flags, tab, (slot * 8) as i32));
            hoisted.float[slot] = Float::of(instr.ty.dtype);
        }
    }
    b.ins().jump(uhead, &[BlockArg::Value(lo)]);
    let step = |b: &mut FunctionBuilder<'_>, at: Value, vector: bool| {
        emit_step(b, kernel, body, table, &hoisted, at, vector, flags);
    };
    // Unrolled: two vector steps per iteration halve the loop overhead,
    // which a one-op body (SGD) feels; then one vector step at a time; then
    // the scalar tail.
    counted_loop(
        b,
        (uhead, ubody, vhead),
        hi,
        UNROLL,
        body.lanes,
        &mut |b, at| step(b, at, true),
    );
    counted_loop(b, (vhead, vbody, thead), hi, 1, body.lanes, &mut |b, at| {
        step(b, at, true)
    });
    counted_loop(b, (thead, tbody, exit), hi, 1, 1, &mut |b, at| {
        step(b, at, false)
    });

    b.switch_to_block(exit);
    b.ins().return_(&[]);
    b.seal_all_blocks();
    fb.finalize(config);
    scalars
}

/// Emits `while i + steps * stride <= hi { emit(i), emit(i + stride), …;
/// i += steps * stride }` with `i` the parameter of `head` and of `body`,
/// then continues at `after` with the final `i`.
fn counted_loop(
    b: &mut FunctionBuilder<'_>,
    (head, body, after): (Block, Block, Block),
    hi: Value,
    steps: i64,
    stride: i64,
    emit: &mut dyn FnMut(&mut FunctionBuilder<'_>, Value),
) {
    let width = steps * stride;
    b.switch_to_block(head);
    let i = b.block_params(head)[0];
    let next = b.ins().iadd_imm_u(i, width);
    let more = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, hi);
    b.ins().brif(
        more,
        body,
        &[BlockArg::Value(i)],
        after,
        &[BlockArg::Value(i)],
    );
    b.switch_to_block(body);
    let i = b.block_params(body)[0];
    for s in 0..steps {
        let at = if s == 0 {
            i
        } else {
            b.ins().iadd_imm_u(i, s * stride)
        };
        emit(b, at);
    }
    let next = b.ins().iadd_imm_u(i, width);
    b.ins().jump(head, &[BlockArg::Value(next)]);
}

/// Emits one step at element `i` (`body.lanes` elements, or the one element
/// of the tail): every loop instruction, then every output's stores. Each
/// operand is loaded once, before any store.
#[allow(clippy::too_many_arguments, reason = "one call site, all distinct")]
fn emit_step(
    b: &mut FunctionBuilder<'_>,
    kernel: &LoweredKernel,
    body: &Body,
    table: Table,
    hoisted: &Hoisted,
    i: Value,
    vector: bool,
    flags: MemFlagsData,
) {
    let cx = Cx { vector };
    // Byte offset of element `i` in an array of each float.
    let off32 = b.ins().ishl_imm_u(i, Float::F32.shift());
    let off64 = b.ins().ishl_imm_u(i, Float::F64.shift());
    let offset = |f: Float| match f {
        Float::F32 => off32,
        Float::F64 => off64,
    };
    let mut values: Vec<Option<V>> = vec![None; kernel.instrs.len()];
    let mut loaded: Vec<Option<V>> = vec![None; hoisted.base.len()];
    let mut operand = |b: &mut FunctionBuilder<'_>, values: &[Option<V>], a: &InstrArg| -> V {
        let slot = match *a {
            InstrArg::Input(i) => table.input(i),
            InstrArg::Local(l) => match &values[l as usize] {
                Some(v) => return v.clone(),
                None => table.prelude(l),
            },
        };
        if let Some(v) = &loaded[slot] {
            return v.clone();
        }
        if let Some((f, splat)) = hoisted.scalar[slot] {
            let at = (splat * 8) as i32;
            let v = if vector {
                let v = b.ins().load(f.vector(), flags, hoisted.tab, at);
                V::Float(f, smallvec![v; body.parts(f)])
            } else {
                V::Float(
                    f,
                    smallvec![b.ins().load(f.scalar(), flags, hoisted.tab, at)],
                )
            };
            loaded[slot] = Some(v.clone());
            return v;
        }
        let base = hoisted.base[slot].expect("every operand's address is hoisted");
        let f = hoisted.float[slot].expect("every stream has a float");
        let addr = b.ins().iadd(base, offset(f));
        let v = if vector {
            (0..body.parts(f))
                .map(|p| b.ins().load(f.vector(), flags, addr, (p * 16) as i32))
                .collect()
        } else {
            smallvec![b.ins().load(f.scalar(), flags, addr, 0)]
        };
        let v = V::Float(f, v);
        loaded[slot] = Some(v.clone());
        v
    };
    for (j, instr) in kernel.instrs.iter().enumerate() {
        if instr.stage != Stage::Loop {
            continue;
        }
        let args: Vec<V> = instr.args.iter().map(|a| operand(b, &values, a)).collect();
        let f = body.floats[j].expect("analyze typed every body value");
        values[j] = Some(cx.op(b, &instr.op, &args, f));
    }
    for (o, &(i, _)) in kernel.outputs.iter().enumerate() {
        if let Some(V::Float(f, parts)) = &values[i as usize] {
            let base = hoisted.base[table.output(o)].expect("output address hoisted");
            let addr = b.ins().iadd(base, offset(*f));
            for (p, &v) in parts.iter().enumerate() {
                b.ins().store(flags, v, addr, (p * 16) as i32);
            }
        }
    }
}

/// Emission context of one step: vector or scalar.
struct Cx {
    vector: bool,
}

fn floats_of(v: &V) -> &[Value] {
    match v {
        V::Float(_, parts) => parts,
        V::Mask(_) => unreachable!("analyze admits masks only where masks are read"),
    }
}

fn masks_of(v: &V) -> &[Value] {
    match v {
        V::Mask(parts) => parts,
        V::Float(..) => unreachable!("analyze admits floats only where floats are read"),
    }
}

impl Cx {
    /// The type of one part of a value of float `f`.
    fn ty(&self, f: Float) -> Type {
        if self.vector { f.vector() } else { f.scalar() }
    }

    /// `mask ? x : y`, lane by lane.
    fn choose(
        &self,
        b: &mut FunctionBuilder<'_>,
        ty: Type,
        mask: Value,
        x: Value,
        y: Value,
    ) -> Value {
        if self.vector {
            let m = b.ins().bitcast(
                ty,
                MemFlagsData::new().with_endianness(Endianness::Little),
                mask,
            );
            b.ins().bitselect(m, x, y)
        } else {
            b.ins().select(mask, x, y)
        }
    }

    fn constant(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: f64) -> Value {
        let s = if ty.lane_type() == types::F32 {
            b.ins().f32const(x as f32)
        } else {
            b.ins().f64const(x)
        };
        if self.vector { b.ins().splat(ty, s) } else { s }
    }

    /// [`float_max`](crate::kernels::elementwise::float_max) and
    /// `float_min` from compares: a NaN `y` wins, then a NaN `x`, then the
    /// comparison (`x` on ties, so `max(-0, +0)` is `-0` as in the kernels).
    fn nan_extremum(
        &self,
        b: &mut FunctionBuilder<'_>,
        ty: Type,
        x: Value,
        y: Value,
        cc: FloatCC,
    ) -> Value {
        let y_nan = b.ins().fcmp(FloatCC::Unordered, y, y);
        let x_nan = b.ins().fcmp(FloatCC::Unordered, x, x);
        let wins = b.ins().fcmp(cc, x, y);
        let pick_x = b.ins().bor(x_nan, wins);
        let r = self.choose(b, ty, pick_x, x, y);
        self.choose(b, ty, y_nan, y, r)
    }

    fn unary(&self, b: &mut FunctionBuilder<'_>, u: UnaryOp, ty: Type, x: Value) -> Value {
        match u {
            UnaryOp::Neg => b.ins().fneg(x),
            UnaryOp::Abs => b.ins().fabs(x),
            UnaryOp::Sqrt => b.ins().sqrt(x),
            UnaryOp::Rsqrt => self.rsqrt(b, ty, x),
            UnaryOp::Floor => b.ins().floor(x),
            UnaryOp::Ceil => b.ins().ceil(x),
            UnaryOp::Sign => {
                let zero = self.constant(b, ty, 0.0);
                let is_zero = b.ins().fcmp(FloatCC::Equal, x, zero);
                let is_nan = b.ins().fcmp(FloatCC::Unordered, x, x);
                let keep = b.ins().bor(is_zero, is_nan);
                let signum = copysign_one(b, ty, x);
                self.choose(b, ty, keep, x, signum)
            }
            _ => unreachable!("analyze admits only the unary ops above"),
        }
    }

    /// The correctly rounded `1 / sqrt(x)` of
    /// [`FloatElement::rsqrt`](crate::ir::FloatElement::rsqrt).
    ///
    /// `f64` is `1 / sqrt`. `f32` is, by definition, that in `f64` rounded
    /// once ([`Cx::rsqrt_via_f64`]); for an `f32x4` this is two `f64x2`
    /// square roots and two divisions per four lanes, and twice RMSProp's
    /// and Adagrad's streaming floor. Where the CPU has FMA, a vector whose
    /// four lanes all lie in [2^-64, 2^64] takes [`Cx::rsqrt_f32x4_fma`]
    /// instead, all in `f32` with the same bits; any other vector (a zero,
    /// an infinity, a NaN, a negative, a value out of that range) branches
    /// to the `f64` route.
    fn rsqrt(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
        if ty.lane_type() == types::F64 {
            let one = self.constant(b, ty, 1.0);
            let root = b.ins().sqrt(x);
            return b.ins().fdiv(one, root);
        }
        if !self.vector || !host_has_fma() {
            return self.rsqrt_via_f64(b, ty, x);
        }
        let low = self.constant(b, ty, RSQRT_F32_FMA_RANGE.0);
        let high = self.constant(b, ty, RSQRT_F32_FMA_RANGE.1);
        // Unordered compares: a NaN lane is outside.
        let under = b.ins().fcmp(FloatCC::UnorderedOrLessThan, x, low);
        let over = b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, high);
        let outside = b.ins().bor(under, over);
        let any_outside = b.ins().vany_true(outside);
        let (fast, slow, merge) = (b.create_block(), b.create_block(), b.create_block());
        b.append_block_param(merge, ty);
        b.ins().brif(any_outside, slow, &[], fast, &[]);
        b.switch_to_block(fast);
        let y = self.rsqrt_f32x4_fma(b, ty, x);
        b.ins().jump(merge, &[BlockArg::Value(y)]);
        b.switch_to_block(slow);
        let y = self.rsqrt_via_f64(b, ty, x);
        b.ins().jump(merge, &[BlockArg::Value(y)]);
        b.switch_to_block(merge);
        b.block_params(merge)[0]
    }

    /// `f32` `rsqrt` as its definition: `1 / sqrt` in `f64`, rounded once
    /// (scalar, or each `f32x4` as two `f64x2`).
    fn rsqrt_via_f64(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
        let wide = self.convert(b, Float::F32, Float::F64, &[x]);
        let one = self.constant(b, self.ty(Float::F64), 1.0);
        let inverse: SmallVec<[Value; 2]> = wide
            .iter()
            .map(|&w| {
                let root = b.ins().sqrt(w);
                b.ins().fdiv(one, root)
            })
            .collect();
        debug_assert_eq!(ty.lane_type(), types::F32);
        self.convert(b, Float::F64, Float::F32, &inverse)[0]
    }

    /// Correctly rounded `f32x4` `rsqrt` for lanes in
    /// [`RSQRT_F32_FMA_RANGE`], in `f32` with FMA:
    ///
    /// ```text
    /// r = 1 / sqrt(x)                 // rounded twice: within one ulp
    /// h = r·r;  l = fma(r, r, -h)     // r² = h + l exactly
    /// e = fma(-l, x, fma(-h, x, 1))   // 1 - r²x
    /// y = fma(r·e, fma(e, 3/8, 1/2), r)   // r·(1 + e/2 + 3e²/8), rounded once
    /// ```
    ///
    /// Every rounding in it scales by exact powers of two across that
    /// range (nothing is subnormal or overflows), so the `f32`s in [1, 4)
    /// decide it: there, and over the whole range, it gives the bits of
    /// the `f64` route for every input (`tests/native_loops.rs` checks
    /// [1, 4) and, ignored, all 2^32 inputs; the sequence first differs at
    /// 2^105 and below 2^-127). It is four lanes per divider op where the
    /// `f64` route is two, and 9 vector ops against 13.
    fn rsqrt_f32x4_fma(&self, b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
        let one = self.constant(b, ty, 1.0);
        let half = self.constant(b, ty, 0.5);
        let three_eighths = self.constant(b, ty, 0.375);
        let root = b.ins().sqrt(x);
        let r = b.ins().fdiv(one, root);
        let h = b.ins().fmul(r, r);
        let minus_h = b.ins().fneg(h);
        let l = b.ins().fma(r, r, minus_h);
        let minus_x = b.ins().fneg(x);
        let e = b.ins().fma(h, minus_x, one);
        let e = b.ins().fma(l, minus_x, e);
        let re = b.ins().fmul(r, e);
        let series = b.ins().fma(e, three_eighths, half);
        b.ins().fma(re, series, r)
    }

    fn binary(
        &self,
        b: &mut FunctionBuilder<'_>,
        op: BinaryOp,
        ty: Type,
        x: Value,
        y: Value,
    ) -> Value {
        match op {
            BinaryOp::Add => b.ins().fadd(x, y),
            BinaryOp::Sub => b.ins().fsub(x, y),
            BinaryOp::Mul => b.ins().fmul(x, y),
            BinaryOp::Div => b.ins().fdiv(x, y),
            BinaryOp::Max => self.nan_extremum(b, ty, x, y, FloatCC::GreaterThanOrEqual),
            BinaryOp::Min => self.nan_extremum(b, ty, x, y, FloatCC::LessThanOrEqual),
            _ => unreachable!("analyze admits only the binary ops above"),
        }
    }

    /// One instruction over all parts; `f` is its result's float (or the
    /// compared float, for masks).
    fn op(&self, b: &mut FunctionBuilder<'_>, op: &Op, args: &[V], f: Float) -> V {
        let ty = self.ty(f);
        let zip2 = |b: &mut FunctionBuilder<'_>,
                    x: &[Value],
                    y: &[Value],
                    g: &dyn Fn(&mut FunctionBuilder<'_>, Value, Value) -> Value|
         -> SmallVec<[Value; 2]> {
            x.iter().zip(y).map(|(&x, &y)| g(b, x, y)).collect()
        };
        match op {
            Op::Unary(UnaryOp::Not) => V::Mask(
                masks_of(&args[0])
                    .iter()
                    .map(|&m| {
                        if self.vector {
                            b.ins().bnot(m)
                        } else {
                            b.ins().icmp_imm_u(IntCC::Equal, m, 0)
                        }
                    })
                    .collect(),
            ),
            Op::Unary(u) => V::Float(
                f,
                floats_of(&args[0])
                    .iter()
                    .map(|&x| self.unary(b, *u, ty, x))
                    .collect(),
            ),
            Op::Binary(BinaryOp::And) => V::Mask(zip2(
                b,
                masks_of(&args[0]),
                masks_of(&args[1]),
                &|b, x, y| b.ins().band(x, y),
            )),
            Op::Binary(BinaryOp::Or) => V::Mask(zip2(
                b,
                masks_of(&args[0]),
                masks_of(&args[1]),
                &|b, x, y| b.ins().bor(x, y),
            )),
            Op::Binary(op) => V::Float(
                f,
                zip2(b, floats_of(&args[0]), floats_of(&args[1]), &|b, x, y| {
                    self.binary(b, *op, ty, x, y)
                }),
            ),
            Op::Compare(dir) => {
                let cc = match dir {
                    CompareDir::Eq => FloatCC::Equal,
                    CompareDir::Ne => FloatCC::NotEqual,
                    CompareDir::Lt => FloatCC::LessThan,
                    CompareDir::Le => FloatCC::LessThanOrEqual,
                    CompareDir::Gt => FloatCC::GreaterThan,
                    CompareDir::Ge => FloatCC::GreaterThanOrEqual,
                };
                V::Mask(zip2(
                    b,
                    floats_of(&args[0]),
                    floats_of(&args[1]),
                    &|b, x, y| b.ins().fcmp(cc, x, y),
                ))
            }
            Op::Select => {
                let (m, t, e) = (masks_of(&args[0]), floats_of(&args[1]), floats_of(&args[2]));
                V::Float(
                    f,
                    m.iter()
                        .zip(t)
                        .zip(e)
                        .map(|((&m, &t), &e)| self.choose(b, ty, m, t, e))
                        .collect(),
                )
            }
            Op::Convert(_) => {
                let V::Float(from, parts) = &args[0] else {
                    unreachable!("analyze admits conversions of floats only")
                };
                V::Float(f, self.convert(b, *from, f, parts))
            }
            _ => unreachable!("analyze admits only the ops above"),
        }
    }

    /// Converts between `f32` and `f64`: one `f32x4` is two `f64x2`.
    fn convert(
        &self,
        b: &mut FunctionBuilder<'_>,
        from: Float,
        to: Float,
        x: &[Value],
    ) -> SmallVec<[Value; 2]> {
        let le = MemFlagsData::new().with_endianness(Endianness::Little);
        match (from, to, self.vector) {
            (a, b2, _) if a == b2 => x.into(),
            (Float::F32, Float::F64, false) => smallvec![b.ins().fpromote(types::F64, x[0])],
            (Float::F64, Float::F32, false) => smallvec![b.ins().fdemote(types::F32, x[0])],
            (Float::F32, Float::F64, true) => {
                let low = b.ins().fvpromote_low(x[0]);
                // Lanes 2 and 3 moved down to 0 and 1.
                let bytes = b.ins().bitcast(types::I8X16, le, x[0]);
                let mask: Vec<u8> = (8..16).chain(8..16).collect();
                let mask = b.func.dfg.immediates.push(ConstantData::from(mask));
                let high = b.ins().shuffle(bytes, bytes, mask);
                let high = b.ins().bitcast(types::F32X4, le, high);
                let high = b.ins().fvpromote_low(high);
                smallvec![low, high]
            }
            (Float::F64, Float::F32, true) => {
                // Each demotion fills lanes 0 and 1; join the two halves.
                let low = b.ins().fvdemote(x[0]);
                let high = b.ins().fvdemote(x[1]);
                let low = b.ins().bitcast(types::I8X16, le, low);
                let high = b.ins().bitcast(types::I8X16, le, high);
                let mask: Vec<u8> = (0..8).chain(16..24).collect();
                let mask = b.func.dfg.immediates.push(ConstantData::from(mask));
                let joined = b.ins().shuffle(low, high, mask);
                smallvec![b.ins().bitcast(types::F32X4, le, joined)]
            }
            _ => unreachable!("f32 and f64 are the only floats"),
        }
    }
}

/// `1.0` with the sign of `x`, through the bits (Cranelift's x86-64
/// backend has no vector `fcopysign`).
fn copysign_one(b: &mut FunctionBuilder<'_>, ty: Type, x: Value) -> Value {
    let (int, sign, one) = if ty.lane_type() == types::F32 {
        (types::I32, i64::from(i32::MIN), i64::from(1.0f32.to_bits()))
    } else {
        (types::I64, i64::MIN, 1.0f64.to_bits() as i64)
    };
    let ity = ty.as_int();
    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
    let splat = |b: &mut FunctionBuilder<'_>, v: i64| {
        let s = b.ins().iconst(int, v);
        if ity.is_vector() {
            b.ins().splat(ity, s)
        } else {
            s
        }
    };
    let (sign, one) = (splat(b, sign), splat(b, one));
    let bits = b.ins().bitcast(ity, flags, x);
    let bits = b.ins().band(bits, sign);
    let bits = b.ins().bor(bits, one);
    b.ins().bitcast(ty, flags, bits)
}
