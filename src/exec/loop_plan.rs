//! Fused-loop planning: turns a lowered fused kernel into the plan the chunk
//! interpreter (`exec::interpreter`) runs: body instructions with typed
//! operand sources, scratch register allocation, in-place and direct
//! outputs, and multiplies folded into the add or subtract that reads them.

use smallvec::SmallVec;

use crate::xla::executable::{Arg as InstrArg, Executable, LoweredKernel, Stage, ValueRef};
use crate::xla::{BinaryOp, DType, Op, TensorType};

/// Where a loop-body operand comes from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Src {
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
pub(super) struct BodyInstr {
    pub(super) op: Op,
    pub(super) args: SmallVec<[Src; 4]>,
    pub(super) arg_types: SmallVec<[DType; 4]>,
    pub(super) reg: u16,
    /// Writes straight into this loop output instead of a register.
    pub(super) direct: Option<u32>,
    /// A multiply folded into this add or subtract: its two operands are
    /// `args[0]` and `args[1]`, the other operand is `args[2]`, and the
    /// flag says whether the product is the op's first operand.
    pub(super) product_first: Option<bool>,
}

impl BodyInstr {
    /// `Some(true)` when operand 0 is the destination, `Some(false)` when
    /// operand 1 is.
    pub(super) fn reads_dest(&self) -> Option<bool> {
        match self.args[..] {
            [Src::Dest(_), _] => Some(true),
            [_, Src::Dest(_)] => Some(false),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct FusedOutput {
    /// The instruction, when it is a prelude value.
    pub(super) prelude: Option<u32>,
    /// The register holding the loop value.
    pub(super) reg: u16,
    pub(super) buffer: u32,
    /// The kernel input whose buffer the output may take over.
    pub(super) donor: Option<u32>,
    /// Whether the donor is the parameter this output is aliased to.
    pub(super) aliased: bool,
    /// Whether its instruction writes it directly (no register copy).
    pub(super) direct: bool,
}

#[derive(Debug, Clone)]
pub(super) struct FusedPlan {
    pub(super) len: usize,
    /// Loop-shaped inputs and fresh outputs to prefetch, with their element
    /// sizes: `(true, input)` or `(false, output)`.
    pub(super) streams: Vec<(bool, u32, usize)>,
    pub(super) prelude: Vec<u32>,
    pub(super) body: Vec<BodyInstr>,
    pub(super) regs: Vec<DType>,
    pub(super) outputs: Vec<FusedOutput>,
}

/// Builds the fused plan of kernel `k`, or `None` when it runs whole.
pub(super) fn plan_fused(
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
