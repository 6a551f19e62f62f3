//! Planning: operand sources and registers, donors, direct outputs, folded
//! multiply-adds and prefetch streams, in the order of the module doc
//! (`super`). `plan_fused` is the driver; each step is one function.

use smallvec::SmallVec;

use super::{BodyInstr, FusedOutput, FusedPlan, Src};
use crate::compiler::executable::{Arg as InstrArg, Executable, LoweredKernel, Stage, ValueRef};
use crate::ir::{BinaryOp, DType, Op, TensorType};

/// The last kernel reading each buffer (`usize::MAX`: a program output).
pub(super) fn last_uses(exe: &Executable) -> Vec<usize> {
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
    last_use
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
    let input_types = input_types(exe, kernel)?;
    let Allocated {
        prelude,
        mut body,
        regs,
        reg_of,
    } = allocate_registers(kernel, &input_types, len)?;
    let donors = Donors {
        exe,
        kernel,
        k,
        last_use,
        aliases,
    };
    let mut outputs = donors.place_outputs(&reg_of);
    mark_direct_outputs(kernel, &mut body, &mut outputs);
    let out_regs: Vec<u16> = outputs
        .iter()
        .filter(|o| !o.direct)
        .map(|o| o.reg)
        .collect();
    fold_multiplies(&mut body, &out_regs);
    let streams = prefetch_streams(&body, &outputs, &regs);
    Some(FusedPlan {
        len,
        streams,
        prelude,
        body,
        regs,
        outputs,
    })
}

/// The type of each kernel input, or `None` when one has none.
fn input_types(exe: &Executable, kernel: &LoweredKernel) -> Option<Vec<TensorType>> {
    let input_ty = |i: u32| -> Option<TensorType> {
        match kernel.inputs[i as usize] {
            ValueRef::Constant(c) => Some(exe.constants[c as usize].tensor_type()),
            ValueRef::Buffer(b) => TensorType::parse(&exe.buffers[b as usize].ty),
        }
    };
    (0..kernel.inputs.len() as u32)
        .map(input_ty)
        .collect::<Option<_>>()
}

/// The last kernel instruction reading each instruction's value
/// (`usize::MAX`: a kernel output, which keeps its register to the end).
fn last_reads(kernel: &LoweredKernel) -> Vec<usize> {
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
    last_read
}

/// The prelude and the body with their registers, before donors.
struct Allocated {
    prelude: Vec<u32>,
    body: Vec<BodyInstr>,
    regs: Vec<DType>,
    /// The register of each loop instruction (`u16::MAX` elsewhere).
    reg_of: Vec<u16>,
}

/// Register allocation over the body: a register is freed after the last
/// body instruction that reads it (outputs keep theirs to the end) and
/// reused by the next value of its dtype. `None` when an operand is
/// neither of the loop shape nor a scalar.
fn allocate_registers(
    kernel: &LoweredKernel,
    input_types: &[TensorType],
    len: usize,
) -> Option<Allocated> {
    let last_read = last_reads(kernel);
    let mut reg_of = vec![u16::MAX; kernel.instrs.len()];
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
            args.push(operand_source(kernel, input_types, len, &reg_of, *a)?);
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
    Some(Allocated {
        prelude,
        body,
        regs,
        reg_of,
    })
}

/// Where kernel operand `a` of a loop instruction comes from, or `None`
/// when it is neither of the loop shape nor a scalar.
fn operand_source(
    kernel: &LoweredKernel,
    input_types: &[TensorType],
    len: usize,
    reg_of: &[u16],
    a: InstrArg,
) -> Option<Src> {
    Some(match a {
        InstrArg::Input(i) if input_types[i as usize].dims.is_empty() => Src::InputScalar(i),
        InstrArg::Input(i) if input_types[i as usize].element_count() == len => Src::Input(i),
        InstrArg::Local(l) if kernel.instrs[l as usize].stage == Stage::Loop => {
            Src::Reg(reg_of[l as usize])
        }
        InstrArg::Local(l) if kernel.instrs[l as usize].ty.dims.is_empty() => Src::PreludeScalar(l),
        InstrArg::Local(l) if kernel.instrs[l as usize].ty.element_count() == len => {
            Src::Prelude(l)
        }
        _ => return None,
    })
}

/// What choosing donors reads: kernel `k` of `exe`, the last reader of
/// each buffer and the runtime's input-output aliases.
struct Donors<'a> {
    exe: &'a Executable,
    kernel: &'a LoweredKernel,
    k: usize,
    last_use: &'a [usize],
    aliases: &'a [(usize, usize)],
}

impl Donors<'_> {
    /// The kernel's outputs in order, each loop output with its register
    /// and its donor, if any: each input donates to one output.
    fn place_outputs(&self, reg_of: &[u16]) -> Vec<FusedOutput> {
        let mut outputs = Vec::new();
        let mut taken: Vec<u32> = Vec::new();
        for &(i, b) in &self.kernel.outputs {
            let instr = &self.kernel.instrs[i as usize];
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
            if let Some(j) = self.aliased_donor(b, &taken) {
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
            let donor = self.offset_donor(b, &taken);
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
        outputs
    }

    /// The parameter output buffer `b` is aliased to, when it is an input
    /// read last here and not `taken`.
    fn aliased_donor(&self, b: u32, taken: &[u32]) -> Option<u32> {
        let (exe, kernel) = (self.exe, self.kernel);
        self.aliases
            .iter()
            .filter(|&&(o, _)| exe.outputs.get(o) == Some(&ValueRef::Buffer(b)))
            .filter_map(|&(_, p)| exe.parameter_buffers.get(p).copied())
            .find_map(|pb| {
                kernel
                    .inputs
                    .iter()
                    .position(|r| *r == ValueRef::Buffer(pb))
                    .filter(|&j| {
                        self.last_use[pb as usize] == self.k && !taken.contains(&(j as u32))
                    })
            })
            .map(|j| j as u32)
    }

    /// An input the memory plan gives output buffer `b`'s offset and type,
    /// read last here and not `taken`.
    fn offset_donor(&self, b: u32, taken: &[u32]) -> Option<u32> {
        let exe = self.exe;
        let out_slot = &exe.buffers[b as usize];
        self.kernel
            .inputs
            .iter()
            .enumerate()
            .find(|&(j, r)| match *r {
                ValueRef::Buffer(ib) => {
                    let s = &exe.buffers[ib as usize];
                    s.offset == out_slot.offset
                        && s.ty == out_slot.ty
                        && self.last_use[ib as usize] == self.k
                        && !taken.contains(&(j as u32))
                }
                ValueRef::Constant(_) => false,
            })
            .map(|(j, _)| j as u32)
    }
}

/// The loop-shaped inputs the body reads, in first-read order, then the
/// loop outputs, with their element sizes.
fn prefetch_streams(
    body: &[BodyInstr],
    outputs: &[FusedOutput],
    regs: &[DType],
) -> Vec<(bool, u32, usize)> {
    let mut streams: Vec<(bool, u32, usize)> = Vec::new();
    for instr in body {
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
    streams
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
        // A rank-0 loop reads its rank-0 inputs as scalars, from memory,
        // whenever an instruction runs: the donor is read as such too.
        let reads_scalar = |b: &BodyInstr, d: u32| {
            b.args
                .iter()
                .any(|a| matches!(*a, Src::InputScalar(x) if x == d))
        };
        if let Some(d) = out.donor {
            if body[at + 1..]
                .iter()
                .any(|b| reads(b, d) > 0 || reads_scalar(b, d))
                || reads_scalar(&body[at], d)
            {
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
