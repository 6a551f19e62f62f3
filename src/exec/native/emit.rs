//! Emission of one fused loop's function: the blocks of its three loops,
//! the hoisted stream addresses and each step's loads, body and stores.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{Block, BlockArg, InstBuilder, MemFlagsData, Type, Value};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_frontend::FunctionBuilder;
use smallvec::smallvec;

use super::analysis::{Body, Float};
use super::ops::{Cx, V};
use super::{Scalars, Table};
use crate::compiler::executable::{Arg as InstrArg, LoweredKernel, Stage};
use crate::ir::{DType, TensorType};

/// Vectors per iteration of the main loop.
const UNROLL: i64 = 2;

/// Hoisted operands: base addresses of streams and loaded scalars.
struct Hoisted {
    /// Per table entry: the base address of a stream.
    base: Vec<Option<Value>>,
    /// Per table entry: the float of a scalar and the table entry of its
    /// splat, a vector's worth of copies after the addresses
    /// ([`NativeLoop::fill_table`](super::NativeLoop::fill_table)).
    scalar: Vec<Option<(Float, usize)>>,
    /// The table's address.
    tab: Value,
    /// Per table entry: the float of a stream.
    float: Vec<Option<Float>>,
}

/// The blocks of a loop's function, created in this order: the entry, then
/// the head and body of the unrolled vector loop, of the one-step vector
/// loop and of the scalar tail, and the exit. Every block but the entry
/// takes the element index.
#[derive(Clone, Copy)]
struct LoopBlocks {
    entry: Block,
    uhead: Block,
    ubody: Block,
    vhead: Block,
    vbody: Block,
    thead: Block,
    tbody: Block,
    exit: Block,
}

impl LoopBlocks {
    fn create(b: &mut FunctionBuilder<'_>, ptr: Type) -> LoopBlocks {
        let blocks = LoopBlocks {
            entry: b.create_block(),
            uhead: b.create_block(),
            ubody: b.create_block(),
            vhead: b.create_block(),
            vbody: b.create_block(),
            thead: b.create_block(),
            tbody: b.create_block(),
            exit: b.create_block(),
        };
        for block in [
            blocks.uhead,
            blocks.ubody,
            blocks.vhead,
            blocks.vbody,
            blocks.thead,
            blocks.tbody,
            blocks.exit,
        ] {
            b.append_block_param(block, ptr);
        }
        b.append_block_params_for_function_params(blocks.entry);
        blocks
    }
}

/// Builds the function of one fused loop over `[lo, hi)` and returns the
/// rank-0 floats it reads, in the order of their splats in the table.
pub(super) fn build_loop(
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
    let blocks = LoopBlocks::create(b, ptr);
    let LoopBlocks {
        entry,
        uhead,
        ubody,
        vhead,
        vbody,
        thead,
        tbody,
        exit,
    } = blocks;
    b.switch_to_block(entry);
    let (tab, lo, hi) = {
        let p = b.block_params(entry);
        (p[0], p[1], p[2])
    };
    let (hoisted, scalars) = hoist(b, kernel, input_types, table, tab, ptr, flags);
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

/// Loads, in the entry block, every stream address the body reads or
/// writes, and assigns each rank-0 float operand its splat in the table.
///
/// Scalars are read from the table in every step instead: a
/// load-and-broadcast from L1 costs a load port, while a dozen splats kept
/// in registers across the loop leave too few of the 16 vector registers
/// for the body, and Cranelift spills them on every iteration.
fn hoist(
    b: &mut FunctionBuilder<'_>,
    kernel: &LoweredKernel,
    input_types: &[TensorType],
    table: Table,
    tab: Value,
    ptr: Type,
    flags: MemFlagsData,
) -> (Hoisted, Scalars) {
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
    (hoisted, scalars)
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
