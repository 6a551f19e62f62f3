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
//! [`Table`]). It runs a vector loop (4 `f32` or 2 `f64` lanes: Cranelift's
//! 128-bit vectors) and a scalar loop for the tail. Within one vector, every
//! load happens before any store, so an output written over its donated
//! input (the same index) is correct.
//!
//! **Exactness.** Only ops whose native form rounds exactly like the shared
//! kernels are compiled: `+ - * /`, `sqrt`, `rsqrt` (as `1 / sqrt`), `neg`,
//! `abs`, `floor`, `ceil`, `sign`, `max`/`min` (with the kernels' NaN
//! rules, built from compares), compares, `select`, `and`/`or`/`not` of
//! predicates and identity conversions, all in one float type. Cranelift
//! never contracts a multiply and an add into an FMA. A body with anything
//! else (transcendentals, integers, mixed types, predicates read from or
//! written to memory) is left to the interpreter, with the reason.

use std::sync::{Arc, OnceLock};

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, BlockArg, Endianness, InstBuilder, MemFlagsData, Type, UserFuncName, Value, types,
};
use cranelift_codegen::isa::{OwnedTargetIsa, TargetFrontendConfig};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};

use crate::xla::executable::{Arg as InstrArg, LoweredKernel, Stage};
use crate::xla::{BinaryOp, CompareDir, DType, Op, TensorType, UnaryOp};

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
        table: &mut Vec<usize>,
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

    pub(crate) fn table(&self) -> Table {
        self.table
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

/// Vectors per iteration of the main loop.
const UNROLL: i64 = 2;

/// The element type a native body computes in.
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

/// Checks that a fused loop's body is in the native set and returns its
/// float type, or why it is not.
fn native_type(kernel: &LoweredKernel, input_types: &[TensorType]) -> Result<Float, String> {
    let mut float: Option<Float> = None;
    let mut unify = |d: DType| -> Result<(), String> {
        let f = Float::of(d).ok_or_else(|| format!("{d} values"))?;
        match float {
            Some(g) if g != f => Err("mixed float types".into()),
            _ => {
                float = Some(f);
                Ok(())
            }
        }
    };
    let is_pred = |a: &InstrArg| match *a {
        InstrArg::Input(i) => input_types[i as usize].dtype == DType::Pred,
        InstrArg::Local(l) => kernel.instrs[l as usize].ty.dtype == DType::Pred,
    };
    for instr in kernel.instrs.iter().filter(|i| i.stage == Stage::Loop) {
        for a in &instr.args {
            let d = match *a {
                InstrArg::Input(i) => input_types[i as usize].dtype,
                InstrArg::Local(l) => {
                    let src = &kernel.instrs[l as usize];
                    if src.stage == Stage::Loop && src.ty.dtype == DType::Pred {
                        continue;
                    }
                    src.ty.dtype
                }
            };
            unify(d)?;
        }
        let pred_args = instr.args.iter().filter(|a| is_pred(a)).count();
        let ok = match &instr.op {
            Op::Unary(UnaryOp::Not) => pred_args == 1,
            Op::Unary(
                UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Sign,
            ) => pred_args == 0,
            Op::Binary(BinaryOp::And | BinaryOp::Or) => pred_args == 2,
            Op::Binary(
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Max
                | BinaryOp::Min,
            ) => pred_args == 0,
            Op::Compare(_) => pred_args == 0,
            Op::Select => pred_args == 1 && is_pred(&instr.args[0]),
            Op::Convert(d) => pred_args == 0 && Float::of(*d).is_some(),
            op => return Err(format!("{op} has no native form")),
        };
        if !ok {
            return Err(format!("{} on these operand types", instr.op));
        }
        if instr.ty.dtype != DType::Pred {
            unify(instr.ty.dtype)?;
        }
    }
    for &(i, _) in &kernel.outputs {
        let instr = &kernel.instrs[i as usize];
        if instr.stage == Stage::Loop && instr.ty.dtype == DType::Pred {
            return Err("a pred output".into());
        }
    }
    float.ok_or_else(|| "no float values".into())
}

/// Compiles every fused loop it can; `loops[k]` is `None` for kernels that
/// are not fused loops or not in the native set (see [`NativeLoops::reasons`]).
#[derive(Debug, Default)]
pub(crate) struct NativeLoops {
    pub(crate) loops: Vec<Option<NativeLoop>>,
    /// Per kernel: why its loop is interpreted (`None`: native or not a loop).
    pub(crate) reasons: Vec<Option<String>>,
}

/// Compiles the fused loops among `kernels` (each with its input types;
/// `None` for kernels that are not fused loops).
pub(crate) fn compile(kernels: &[Option<(&LoweredKernel, Vec<TensorType>)>]) -> NativeLoops {
    let mut out = NativeLoops {
        loops: vec![None; kernels.len()],
        reasons: vec![None; kernels.len()],
    };
    let Some(isa) = host_isa() else {
        for (k, kernel) in kernels.iter().enumerate() {
            if kernel.is_some() {
                out.reasons[k] = Some("no native code generator for this CPU".into());
            }
        }
        return out;
    };
    let mut module = JITModule::new(JITBuilder::with_isa(isa.clone(), default_libcall_names()));
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut defined: Vec<(usize, cranelift_module::FuncId, Table)> = Vec::new();
    for (k, kernel) in kernels.iter().enumerate() {
        let Some((kernel, input_types)) = kernel else {
            continue;
        };
        let float = match native_type(kernel, input_types) {
            Ok(f) => f,
            Err(why) => {
                out.reasons[k] = Some(why);
                continue;
            }
        };
        let mut sig = module.make_signature();
        let ptr = module.target_config().pointer_type();
        sig.params.extend([AbiParam::new(ptr); 3]);
        let id = match module.declare_function(&format!("loop{k}"), Linkage::Local, &sig) {
            Ok(id) => id,
            Err(e) => {
                out.reasons[k] = Some(e.to_string());
                continue;
            }
        };
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::user(0, id.as_u32());
        let table = Table::of(kernel);
        let config = module.target_config();
        build_loop(
            FunctionBuilder::new(&mut ctx.func, &mut fctx),
            kernel,
            input_types,
            float,
            table,
            config,
        );
        match module.define_function(id, &mut ctx) {
            Ok(()) => defined.push((k, id, table)),
            Err(e) => out.reasons[k] = Some(format!("code generation: {e:?}")),
        }
        module.clear_context(&mut ctx);
    }
    if defined.is_empty() {
        // SAFETY: nothing was finalized, so nothing points into it.
        unsafe { module.free_memory() };
        return out;
    }
    if let Err(e) = module.finalize_definitions() {
        for (k, _, _) in defined {
            out.reasons[k] = Some(format!("code generation: {e}"));
        }
        // SAFETY: finalization failed; no function pointer was taken.
        unsafe { module.free_memory() };
        return out;
    }
    let entries: Vec<(usize, *const u8, Table)> = defined
        .iter()
        .map(|&(k, id, t)| (k, module.get_finalized_function(id), t))
        .collect();
    let code = Arc::new(NativeCode {
        module: Some(module),
    });
    for (k, entry, table) in entries {
        // SAFETY: the function was built with the `LoopFn` signature (three
        // pointer-sized arguments, no result) in the default call convention.
        let entry: LoopFn = unsafe { std::mem::transmute::<*const u8, LoopFn>(entry) };
        out.loops[k] = Some(NativeLoop {
            entry,
            table,
            _code: code.clone(),
        });
    }
    out
}

/// A body value: a float (vector or scalar) or a predicate mask (lanes of
/// all ones / zeros for vectors, 0 / 1 in an `i8` for scalars).
#[derive(Clone, Copy)]
enum V {
    Float(Value),
    Mask(Value),
}

/// Hoisted operands: base addresses of streams and loaded scalars.
struct Hoisted {
    /// Per table entry: base address (streams) or the scalar and its splat.
    base: Vec<Option<Value>>,
    scalar: Vec<Option<(Value, Value)>>,
}

fn build_loop(
    mut fb: FunctionBuilder<'_>,
    kernel: &LoweredKernel,
    input_types: &[TensorType],
    float: Float,
    table: Table,
    config: TargetFrontendConfig,
) {
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
    for block in [uhead, ubody, vhead, vbody, thead, tbody] {
        b.append_block_param(block, ptr);
    }
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let (tab, lo, hi) = {
        let p = b.block_params(entry);
        (p[0], p[1], p[2])
    };
    // Hoist every address and scalar the body reads out of the loops.
    let entries = table.len(kernel.outputs.len());
    let mut hoisted = Hoisted {
        base: vec![None; entries],
        scalar: vec![None; entries],
    };
    let scalar_of = |a: &InstrArg| -> Option<(usize, bool)> {
        match *a {
            InstrArg::Input(i) => Some((table.input(i), input_types[i as usize].dims.is_empty())),
            InstrArg::Local(l) if kernel.instrs[l as usize].stage == Stage::Prelude => Some((
                table.prelude(l),
                kernel.instrs[l as usize].ty.dims.is_empty(),
            )),
            InstrArg::Local(_) => None,
        }
    };
    for instr in kernel.instrs.iter().filter(|i| i.stage == Stage::Loop) {
        for a in &instr.args {
            let Some((slot, scalar)) = scalar_of(a) else {
                continue;
            };
            if hoisted.base[slot].is_some() || hoisted.scalar[slot].is_some() {
                continue;
            }
            let addr = b.ins().load(ptr, flags, tab, (slot * 8) as i32);
            if scalar {
                let s = b.ins().load(float.scalar(), flags, addr, 0);
                let v = b.ins().splat(float.vector(), s);
                hoisted.scalar[slot] = Some((s, v));
            } else {
                hoisted.base[slot] = Some(addr);
            }
        }
    }
    for (o, &(i, _)) in kernel.outputs.iter().enumerate() {
        if kernel.instrs[i as usize].stage == Stage::Loop {
            let slot = table.output(o);
            hoisted.base[slot] = Some(b.ins().load(ptr, flags, tab, (slot * 8) as i32));
        }
    }
    b.ins().jump(uhead, &[BlockArg::Value(lo)]);

    // Unrolled vector loop: while i + UNROLL * lanes <= hi. Two vectors per
    // iteration halve the loop overhead, which a one-op body (SGD) feels.
    let step = float.lanes() * UNROLL;
    b.switch_to_block(uhead);
    let i = b.block_params(uhead)[0];
    let next = b.ins().iadd_imm_u(i, step);
    let more = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, hi);
    b.ins().brif(
        more,
        ubody,
        &[BlockArg::Value(i)],
        vhead,
        &[BlockArg::Value(i)],
    );
    b.switch_to_block(ubody);
    let i = b.block_params(ubody)[0];
    for u in 0..UNROLL {
        let at = if u == 0 {
            i
        } else {
            b.ins().iadd_imm_u(i, u * float.lanes())
        };
        emit_body(b, kernel, float, table, &hoisted, at, true, flags);
    }
    let next = b.ins().iadd_imm_u(i, step);
    b.ins().jump(uhead, &[BlockArg::Value(next)]);

    // Vector loop for what is left: while i + lanes <= hi.
    b.switch_to_block(vhead);
    let i = b.block_params(vhead)[0];
    let next = b.ins().iadd_imm_u(i, float.lanes());
    let more = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, hi);
    b.ins().brif(
        more,
        vbody,
        &[BlockArg::Value(i)],
        thead,
        &[BlockArg::Value(i)],
    );
    b.switch_to_block(vbody);
    let i = b.block_params(vbody)[0];
    emit_body(b, kernel, float, table, &hoisted, i, true, flags);
    let next = b.ins().iadd_imm_u(i, float.lanes());
    b.ins().jump(vhead, &[BlockArg::Value(next)]);

    // Scalar tail: while i < hi.
    b.switch_to_block(thead);
    let i = b.block_params(thead)[0];
    let more = b.ins().icmp(IntCC::UnsignedLessThan, i, hi);
    b.ins().brif(more, tbody, &[BlockArg::Value(i)], exit, &[]);
    b.switch_to_block(tbody);
    let i = b.block_params(tbody)[0];
    emit_body(b, kernel, float, table, &hoisted, i, false, flags);
    let next = b.ins().iadd_imm_u(i, 1);
    b.ins().jump(thead, &[BlockArg::Value(next)]);

    b.switch_to_block(exit);
    b.ins().return_(&[]);
    b.seal_all_blocks();
    fb.finalize(config);
}

/// Emits one iteration: every loop instruction at element `i` (a vector of
/// lanes from `i`, or the one element), then every output's store.
#[allow(clippy::too_many_arguments, reason = "one call site, all distinct")]
fn emit_body(
    b: &mut FunctionBuilder<'_>,
    kernel: &LoweredKernel,
    float: Float,
    table: Table,
    hoisted: &Hoisted,
    i: Value,
    vector: bool,
    flags: MemFlagsData,
) {
    let ty = if vector {
        float.vector()
    } else {
        float.scalar()
    };
    let off = b.ins().ishl_imm_u(i, float.shift());
    let mut values: Vec<Option<V>> = vec![None; kernel.instrs.len()];
    let mut loaded: Vec<Option<Value>> = vec![None; hoisted.base.len()];
    let mut operand = |b: &mut FunctionBuilder<'_>, values: &[Option<V>], a: &InstrArg| -> V {
        let slot = match *a {
            InstrArg::Input(i) => table.input(i),
            InstrArg::Local(l) => match values[l as usize] {
                Some(v) => return v,
                None => table.prelude(l),
            },
        };
        if let Some((s, v)) = hoisted.scalar[slot] {
            return V::Float(if vector { v } else { s });
        }
        if let Some(v) = loaded[slot] {
            return V::Float(v);
        }
        let base = hoisted.base[slot].expect("every operand's address is hoisted");
        let addr = b.ins().iadd(base, off);
        let v = b.ins().load(ty, flags, addr, 0);
        loaded[slot] = Some(v);
        V::Float(v)
    };
    for (j, instr) in kernel.instrs.iter().enumerate() {
        if instr.stage != Stage::Loop {
            continue;
        }
        let args: Vec<V> = instr.args.iter().map(|a| operand(b, &values, a)).collect();
        values[j] = Some(emit_op(b, &instr.op, &args, ty, vector));
    }
    for (o, &(i, _)) in kernel.outputs.iter().enumerate() {
        if let Some(V::Float(v)) = values[i as usize] {
            let base = hoisted.base[table.output(o)].expect("output address hoisted");
            let addr = b.ins().iadd(base, off);
            b.ins().store(flags, v, addr, 0);
        }
    }
}

fn float_of(v: V) -> Value {
    match v {
        V::Float(v) => v,
        V::Mask(_) => unreachable!("native_type admits masks only where masks are read"),
    }
}

fn mask_of(v: V) -> Value {
    match v {
        V::Mask(m) => m,
        V::Float(_) => unreachable!("native_type admits floats only where floats are read"),
    }
}

/// `mask ? x : y`, lane by lane.
fn choose(
    b: &mut FunctionBuilder<'_>,
    ty: Type,
    vector: bool,
    mask: Value,
    x: Value,
    y: Value,
) -> Value {
    if vector {
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

fn constant(b: &mut FunctionBuilder<'_>, ty: Type, vector: bool, x: f64) -> Value {
    let s = if ty.lane_type() == types::F32 {
        b.ins().f32const(x as f32)
    } else {
        b.ins().f64const(x)
    };
    if vector { b.ins().splat(ty, s) } else { s }
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

/// The kernels' `max`/`min`: a NaN `b` wins, then a NaN `a`, then the
/// comparison (`a` on ties, so `max(-0, +0)` is `-0` as in the kernels).
fn nan_extremum(
    b: &mut FunctionBuilder<'_>,
    ty: Type,
    vector: bool,
    x: Value,
    y: Value,
    cc: FloatCC,
) -> Value {
    let y_nan = b.ins().fcmp(FloatCC::Unordered, y, y);
    let x_nan = b.ins().fcmp(FloatCC::Unordered, x, x);
    let wins = b.ins().fcmp(cc, x, y);
    let pick_x = b.ins().bor(x_nan, wins);
    let r = choose(b, ty, vector, pick_x, x, y);
    choose(b, ty, vector, y_nan, y, r)
}

fn emit_op(b: &mut FunctionBuilder<'_>, op: &Op, args: &[V], ty: Type, vector: bool) -> V {
    let f = |k: usize| float_of(args[k]);
    match op {
        Op::Unary(u) => {
            if *u == UnaryOp::Not {
                let m = mask_of(args[0]);
                return V::Mask(if vector {
                    b.ins().bnot(m)
                } else {
                    b.ins().icmp_imm_u(IntCC::Equal, m, 0)
                });
            }
            let x = f(0);
            V::Float(match u {
                UnaryOp::Neg => b.ins().fneg(x),
                UnaryOp::Abs => b.ins().fabs(x),
                UnaryOp::Sqrt => b.ins().sqrt(x),
                UnaryOp::Rsqrt => {
                    let one = constant(b, ty, vector, 1.0);
                    let r = b.ins().sqrt(x);
                    b.ins().fdiv(one, r)
                }
                UnaryOp::Floor => b.ins().floor(x),
                UnaryOp::Ceil => b.ins().ceil(x),
                UnaryOp::Sign => {
                    let zero = constant(b, ty, vector, 0.0);
                    let is_zero = b.ins().fcmp(FloatCC::Equal, x, zero);
                    let is_nan = b.ins().fcmp(FloatCC::Unordered, x, x);
                    let keep = b.ins().bor(is_zero, is_nan);
                    let signum = copysign_one(b, ty, x);
                    choose(b, ty, vector, keep, x, signum)
                }
                _ => unreachable!("native_type admits only the unary ops above"),
            })
        }
        Op::Binary(BinaryOp::And) => V::Mask(b.ins().band(mask_of(args[0]), mask_of(args[1]))),
        Op::Binary(BinaryOp::Or) => V::Mask(b.ins().bor(mask_of(args[0]), mask_of(args[1]))),
        Op::Binary(op) => {
            let (x, y) = (f(0), f(1));
            V::Float(match op {
                BinaryOp::Add => b.ins().fadd(x, y),
                BinaryOp::Sub => b.ins().fsub(x, y),
                BinaryOp::Mul => b.ins().fmul(x, y),
                BinaryOp::Div => b.ins().fdiv(x, y),
                BinaryOp::Max => nan_extremum(b, ty, vector, x, y, FloatCC::GreaterThanOrEqual),
                BinaryOp::Min => nan_extremum(b, ty, vector, x, y, FloatCC::LessThanOrEqual),
                _ => unreachable!("native_type admits only the binary ops above"),
            })
        }
        Op::Compare(dir) => {
            let cc = match dir {
                CompareDir::Eq => FloatCC::Equal,
                CompareDir::Ne => FloatCC::NotEqual,
                CompareDir::Lt => FloatCC::LessThan,
                CompareDir::Le => FloatCC::LessThanOrEqual,
                CompareDir::Gt => FloatCC::GreaterThan,
                CompareDir::Ge => FloatCC::GreaterThanOrEqual,
            };
            V::Mask(b.ins().fcmp(cc, f(0), f(1)))
        }
        Op::Select => {
            let m = mask_of(args[0]);
            V::Float(choose(b, ty, vector, m, f(1), f(2)))
        }
        Op::Convert(_) => args[0],
        _ => unreachable!("native_type admits only the ops above"),
    }
}
