//! `fused-loop-planning`: the backend pass that turns a lowered fused
//! kernel into the plan the chunk interpreter (`exec::interpreter`)
//! runs, with a verifier for that plan.
//!
//! **Terms.** A fused kernel has a *loop shape*; its *prelude* instructions
//! are evaluated once over whole tensors, its *loop* instructions element
//! by element. The *plan* lists the loop instructions as *body
//! instructions*, each operand naming where its chunk comes from (`Src`):
//! a kernel input or prelude value (of the loop shape, or a scalar), a
//! scratch *register* (one chunk of one dtype per thread), an output
//! already written, or the instruction's own destination. An output's
//! *donor* is the kernel input whose buffer it may be written over (*in
//! place*, when the run may write that input); a *direct* output is written
//! by its instruction instead of being copied out of a register after the
//! body; a *folded multiply-add* is a multiply evaluated inside the add or
//! subtract that reads it.
//!
//! **Reads** the executable (kernels, buffer types and the memory plan's
//! offsets, parameter buffers, program outputs) and the runtime's
//! input-output aliases. **Writes** nothing: `run` returns, per kernel,
//! the plan and its [`LoopPlanStats`]. In order, it decides
//! 1. operand sources and registers: a register is freed after the last
//!    body instruction that reads it and reused by the next value of its
//!    dtype; outputs keep theirs to the end;
//! 2. donors: the parameter an output is aliased to, else an input the
//!    memory plan gives the output's offset and type; either only when this
//!    kernel reads it last, and each input donates to one output;
//! 3. direct outputs (`mark_direct_outputs`);
//! 4. folded multiply-adds (`fold_multiplies`);
//! 5. the input and output streams to prefetch.
//!
//! The runtime runs the pass when it is built and reports the outcome in
//! [`Runtime::loop_plans`](crate::exec::runtime::Runtime::loop_plans)
//! (printed by `optirs-tpu compile`).
//!
//! **Invariants**, checked by `verify_plan` after planning in debug builds
//! and tests (never in release):
//! * the prelude is the kernel's prelude instructions and the body its loop
//!   instructions, both in order; a folded multiply-add stands for a
//!   multiply and the add or subtract right after it, which reads the
//!   product as the same operand (the op order is kept) and is the only
//!   reader of the product;
//! * each operand stands for its kernel operand: an input or prelude value
//!   of the loop shape or a scalar; a register within the allocated count
//!   that an earlier instruction wrote with that value and no instruction
//!   has reused since, never the instruction's own destination register; or
//!   an output its instruction already wrote. Registers hold their value's
//!   dtype;
//! * each loop output is written exactly once: by its one direct
//!   instruction, or copied from the register that holds its value after
//!   the body;
//! * a donor is a buffer input of the output's type that no later kernel
//!   reads, at the output's offset or the parameter the output is aliased
//!   to, and donates to one output only. No instruction after the one
//!   writing a direct output reads its donor (that instruction reads each
//!   element before it writes it), and an instruction reads its destination
//!   only when it writes an output over that input, as the operand of a
//!   binary float op or the addend of a folded multiply-add.
//!
//! Non-goals: which kernels are fused and their loop shapes (`fusion`,
//! `lower`), the memory plan (`memory-plan`), and whether a donor may be
//! written in a given run (the runtime decides per run). The planner does
//! not optimize the body: it never reorders instructions or changes how a
//! value is rounded. The verifier checks the plan against its kernel, not
//! the kernel itself (the compiler's verifier does that).

use smallvec::SmallVec;

use crate::compiler::executable::{Arg as InstrArg, Executable, LoweredKernel, Stage, ValueRef};
use crate::ir::{BinaryOp, DType, Op, TensorType};

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

/// The pass name.
pub const NAME: &str = "fused-loop-planning";

/// What fused-loop planning decided for one fused loop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoopPlanStats {
    /// Elements of the loop shape.
    pub elements: usize,
    /// Instructions evaluated once, over whole tensors, before the loop.
    pub prelude_instrs: usize,
    /// Body instructions, each one pass over a chunk (after folding).
    pub body_instrs: usize,
    /// Scratch registers, each a chunk of its dtype per thread.
    pub registers: usize,
    /// Outputs computed by the loop (not by the prelude).
    pub loop_outputs: usize,
    /// Loop outputs the plan places over a kernel input: written in place
    /// when the run may write that input.
    pub in_place_outputs: usize,
    /// Of those, outputs placed over the parameter they are aliased to.
    pub aliased_outputs: usize,
    /// Loop outputs their instruction writes straight to memory, without a
    /// register and a copy.
    pub direct_outputs: usize,
    /// Instructions that read an operand from their own destination (an
    /// in-place `p + u` over `p`).
    pub destination_reads: usize,
    /// Multiplies folded into the add or subtract that reads them.
    pub folded_multiply_adds: usize,
}

impl LoopPlanStats {
    fn of(plan: &FusedPlan) -> LoopPlanStats {
        let loop_outputs = || plan.outputs.iter().filter(|o| o.prelude.is_none());
        LoopPlanStats {
            elements: plan.len,
            prelude_instrs: plan.prelude.len(),
            body_instrs: plan.body.len(),
            registers: plan.regs.len(),
            loop_outputs: loop_outputs().count(),
            in_place_outputs: loop_outputs().filter(|o| o.donor.is_some()).count(),
            aliased_outputs: loop_outputs().filter(|o| o.aliased).count(),
            direct_outputs: loop_outputs().filter(|o| o.direct).count(),
            destination_reads: plan
                .body
                .iter()
                .filter(|b| b.args.iter().any(|a| matches!(a, Src::Dest(_))))
                .count(),
            folded_multiply_adds: plan
                .body
                .iter()
                .filter(|b| b.product_first.is_some())
                .count(),
        }
    }
}

impl std::fmt::Display for LoopPlanStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} body instrs, {} registers, {}/{} outputs in place",
            self.body_instrs, self.registers, self.in_place_outputs, self.loop_outputs,
        )?;
        if self.aliased_outputs > 0 {
            write!(f, " ({} aliased)", self.aliased_outputs)?;
        }
        write!(
            f,
            ", {} direct, {} folded multiply-adds",
            self.direct_outputs, self.folded_multiply_adds
        )?;
        if self.prelude_instrs > 0 {
            write!(f, ", {} prelude instrs", self.prelude_instrs)?;
        }
        Ok(())
    }
}

/// A plan that breaks an invariant of the module doc: a planner bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{NAME}: kernel `{kernel}`, {place}: {message}")]
pub(super) struct LoopPlanError {
    /// The kernel's name.
    pub(super) kernel: String,
    /// `body instruction 3 (add)`, `output 1` or `plan`.
    pub(super) place: String,
    /// The broken invariant.
    pub(super) message: String,
}

/// A fused loop's plan and what planning decided for it.
pub(super) type PlannedLoop = (FusedPlan, LoopPlanStats);

/// Runs the pass over every kernel of `exe`: per kernel, its plan and what
/// it decided, or `None` for a kernel that runs whole. In debug builds each
/// plan is verified ([`verify_plan`]) and a violation panics: it is a
/// planner bug.
pub(super) fn run(exe: &Executable, aliases: &[(usize, usize)]) -> Vec<Option<PlannedLoop>> {
    let last_use = last_uses(exe);
    exe.kernels
        .iter()
        .enumerate()
        .map(|(k, kernel)| {
            let plan = plan_fused(exe, kernel, k, &last_use, aliases)?;
            if cfg!(debug_assertions)
                && let Err(e) = verify_plan(exe, k, &last_use, aliases, &plan)
            {
                panic!("{e}");
            }
            let stats = LoopPlanStats::of(&plan);
            Some((plan, stats))
        })
        .collect()
}

/// The last kernel reading each buffer (`usize::MAX`: a program output).
fn last_uses(exe: &Executable) -> Vec<usize> {
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

/// Checks `plan` against kernel `k` of `exe`, planned with `aliases` and
/// the last reader of each buffer `last_use`: the invariants of the module
/// doc. The error names the kernel and the instruction or output.
pub(super) fn verify_plan(
    exe: &Executable,
    k: usize,
    last_use: &[usize],
    aliases: &[(usize, usize)],
    plan: &FusedPlan,
) -> Result<(), LoopPlanError> {
    let Some(kernel) = exe.kernels.get(k) else {
        return Err(LoopPlanError {
            kernel: format!("#{k}"),
            place: "plan".into(),
            message: format!("the executable has {} kernels", exe.kernels.len()),
        });
    };
    let fail = |place: String, message: String| LoopPlanError {
        kernel: kernel.name.clone(),
        place,
        message,
    };
    let whole = |message: String| fail("plan".into(), message);
    let Some(shape) = kernel.loop_shape.as_ref() else {
        return Err(whole("the kernel has no loop shape".into()));
    };
    if plan.len != shape.iter().product::<usize>() {
        return Err(whole(format!(
            "{} elements for loop shape {shape:?}",
            plan.len
        )));
    }
    let mut input_types = Vec::with_capacity(kernel.inputs.len());
    for (i, &r) in kernel.inputs.iter().enumerate() {
        let ty = match r {
            ValueRef::Constant(c) => exe.constants.get(c as usize).map(|t| t.tensor_type()),
            ValueRef::Buffer(b) => exe
                .buffers
                .get(b as usize)
                .and_then(|s| TensorType::parse(&s.ty)),
        };
        input_types.push(ty.ok_or_else(|| whole(format!("input {i} has no type")))?);
    }
    let len = plan.len;
    let is_chunk = |t: &TensorType| !t.dims.is_empty() && t.element_count() == len;
    let instr_of = |l: u32| kernel.instrs.get(l as usize);
    let prelude: Vec<u32> = (0..kernel.instrs.len() as u32)
        .filter(|&j| kernel.instrs[j as usize].stage == Stage::Prelude)
        .collect();
    if plan.prelude != prelude {
        return Err(whole(format!(
            "prelude {:?}, but the kernel's prelude instructions are {prelude:?}",
            plan.prelude
        )));
    }
    let loop_instrs: Vec<u32> = (0..kernel.instrs.len() as u32)
        .filter(|&j| kernel.instrs[j as usize].stage == Stage::Loop)
        .collect();
    // The body, in order, against the kernel's loop instructions: which
    // kernel value each register holds, and which body instruction wrote
    // each direct output.
    let mut holds: Vec<Option<u32>> = vec![None; plan.regs.len()];
    let mut written: Vec<Option<usize>> = vec![None; plan.outputs.len()];
    let mut next = 0;
    for (at, instr) in plan.body.iter().enumerate() {
        let place = format!("body instruction {at} ({})", instr.op);
        let bad = |message: String| fail(place.clone(), message);
        let covers = if instr.product_first.is_some() { 2 } else { 1 };
        let Some(span) = loop_instrs.get(next..next + covers) else {
            return Err(bad(format!(
                "the kernel has only {} loop instructions",
                loop_instrs.len()
            )));
        };
        next += covers;
        let (first, j) = (span[0], span[covers - 1]);
        let ki = &kernel.instrs[j as usize];
        if instr.op != ki.op {
            return Err(bad(format!("kernel instruction {j} is {}", ki.op)));
        }
        match plan.regs.get(instr.reg as usize) {
            None => {
                return Err(bad(format!(
                    "writes register {}, but {} are allocated",
                    instr.reg,
                    plan.regs.len()
                )));
            }
            Some(&d) if d != ki.ty.dtype => {
                return Err(bad(format!(
                    "writes {d:?} register {}, but the value is {:?}",
                    instr.reg, ki.ty.dtype
                )));
            }
            Some(_) => {}
        }
        // The kernel operands the body operands stand for.
        let expected: SmallVec<[InstrArg; 4]> = match instr.product_first {
            None => ki.args.iter().copied().collect(),
            Some(product_first) => {
                let m = first;
                let mul = &kernel.instrs[m as usize];
                let pos = usize::from(!product_first);
                let fold_ok = mul.op == Op::Binary(BinaryOp::Mul)
                    && mul.args.len() == 2
                    && matches!(ki.op, Op::Binary(BinaryOp::Add | BinaryOp::Sub))
                    && ki.args.len() == 2
                    && ki.args[pos] == InstrArg::Local(m)
                    && ki.args[1 - pos] != InstrArg::Local(m)
                    && instr.arg_types.iter().all(|t| t.is_float())
                    && !instr
                        .args
                        .iter()
                        .take(2)
                        .all(|a| matches!(a, Src::InputScalar(_) | Src::PreludeScalar(_)));
                if !fold_ok {
                    return Err(bad(format!(
                        "folds kernel instruction {m} ({}) as operand {pos} of kernel \
                         instruction {j}, which reads {:?}",
                        mul.op, ki.args
                    )));
                }
                let elsewhere = kernel.outputs.iter().any(|&(o, _)| o == m)
                    || kernel.instrs.iter().enumerate().any(|(x, other)| {
                        x != j as usize && other.args.contains(&InstrArg::Local(m))
                    });
                if elsewhere {
                    return Err(bad(format!(
                        "folds kernel instruction {m}, whose value is also read elsewhere"
                    )));
                }
                [mul.args[0], mul.args[1], ki.args[1 - pos]]
                    .into_iter()
                    .collect()
            }
        };
        if instr.args.len() != expected.len() || instr.arg_types.len() != expected.len() {
            return Err(bad(format!(
                "{} operands and {} operand types for {} kernel operands",
                instr.args.len(),
                instr.arg_types.len(),
                expected.len()
            )));
        }
        for (p, (&src, &arg)) in instr.args.iter().zip(&expected).enumerate() {
            let want = match arg {
                InstrArg::Input(i) => input_types.get(i as usize).map(|t| t.dtype),
                InstrArg::Local(l) => instr_of(l).map(|x| x.ty.dtype),
            };
            if want != Some(instr.arg_types[p]) {
                return Err(bad(format!(
                    "operand {p} is typed {:?}, but {arg:?} is {want:?}",
                    instr.arg_types[p]
                )));
            }
            let ok = match (src, arg) {
                (Src::Input(i), InstrArg::Input(e)) => i == e && is_chunk(&input_types[i as usize]),
                (Src::InputScalar(i), InstrArg::Input(e)) => {
                    i == e && input_types[i as usize].dims.is_empty()
                }
                (Src::Dest(d), InstrArg::Input(e)) => {
                    let donor_of_own_output = instr.direct.is_some_and(|o| {
                        plan.outputs.get(o as usize).and_then(|o| o.donor) == Some(d)
                    });
                    let in_place_form = match instr.product_first {
                        Some(_) => p == 2,
                        None => {
                            matches!(instr.op, Op::Binary(_))
                                && instr.args.len() == 2
                                && instr.arg_types.iter().all(|t| t.is_float())
                        }
                    };
                    if !donor_of_own_output || !in_place_form {
                        return Err(bad(format!(
                            "operand {p} reads the destination as input {d}, but the \
                             instruction does not write an output over that input in place"
                        )));
                    }
                    d == e && is_chunk(&input_types[d as usize])
                }
                (Src::Prelude(l), InstrArg::Local(e)) => {
                    l == e
                        && instr_of(l).is_some_and(|x| x.stage == Stage::Prelude && is_chunk(&x.ty))
                }
                (Src::PreludeScalar(l), InstrArg::Local(e)) => {
                    l == e
                        && instr_of(l)
                            .is_some_and(|x| x.stage == Stage::Prelude && x.ty.dims.is_empty())
                }
                (Src::Reg(r), InstrArg::Local(e)) => {
                    if r == instr.reg {
                        return Err(bad(format!(
                            "operand {p} reads register {r}, the instruction's own destination"
                        )));
                    }
                    match holds.get(r as usize) {
                        None => {
                            return Err(bad(format!(
                                "operand {p} reads register {r}, but {} are allocated",
                                plan.regs.len()
                            )));
                        }
                        Some(None) => {
                            return Err(bad(format!(
                                "operand {p} reads register {r} before any instruction writes it"
                            )));
                        }
                        Some(&Some(h)) if h != e => {
                            return Err(bad(format!(
                                "operand {p} reads register {r} for kernel instruction {e}, \
                                 but it holds instruction {h}"
                            )));
                        }
                        Some(_) => true,
                    }
                }
                (Src::Output(o), InstrArg::Local(e)) => {
                    let (Some(Some(_)), Some(&(i, _))) =
                        (written.get(o as usize), kernel.outputs.get(o as usize))
                    else {
                        return Err(bad(format!(
                            "operand {p} reads output {o} before an instruction writes it"
                        )));
                    };
                    i == e
                }
                _ => false,
            };
            if !ok {
                return Err(bad(format!(
                    "operand {p} is {src:?}, but kernel instruction {j} reads {arg:?}"
                )));
            }
        }
        match instr.direct {
            None => holds[instr.reg as usize] = Some(j),
            Some(o) => {
                let (Some(out), Some(&(i, _))) =
                    (plan.outputs.get(o as usize), kernel.outputs.get(o as usize))
                else {
                    return Err(bad(format!(
                        "writes output {o}, but there are {}",
                        plan.outputs.len()
                    )));
                };
                if !out.direct {
                    return Err(bad(format!(
                        "writes output {o} directly, but the plan copies it from register {}",
                        out.reg
                    )));
                }
                if i != j {
                    return Err(bad(format!(
                        "writes output {o}, which is kernel instruction {i}, not {j}"
                    )));
                }
                if let Some(w) = written[o as usize] {
                    return Err(bad(format!(
                        "writes output {o}, already written by body instruction {w}"
                    )));
                }
                written[o as usize] = Some(at);
            }
        }
    }
    if next != loop_instrs.len() {
        return Err(whole(format!(
            "the body computes {next} of the kernel's {} loop instructions",
            loop_instrs.len()
        )));
    }
    if plan.outputs.len() != kernel.outputs.len() {
        return Err(whole(format!(
            "{} outputs for the kernel's {}",
            plan.outputs.len(),
            kernel.outputs.len()
        )));
    }
    let mut donors: Vec<u32> = Vec::new();
    for (o, (out, &(i, b))) in plan.outputs.iter().zip(&kernel.outputs).enumerate() {
        let bad = |message: String| fail(format!("output {o}"), message);
        if out.buffer != b {
            return Err(bad(format!("goes to buffer {}, not {b}", out.buffer)));
        }
        let in_prelude = instr_of(i).is_some_and(|x| x.stage == Stage::Prelude);
        if in_prelude {
            if out.prelude != Some(i) || out.donor.is_some() || out.direct {
                return Err(bad(format!(
                    "is prelude instruction {i}, planned as {out:?}"
                )));
            }
            continue;
        }
        if out.prelude.is_some() {
            return Err(bad(format!(
                "is loop instruction {i}, planned as a prelude value"
            )));
        }
        match (out.direct, written[o]) {
            (true, None) => return Err(bad("is direct, but no instruction writes it".into())),
            (false, Some(w)) => {
                return Err(bad(format!(
                    "is copied from a register, but body instruction {w} writes it directly"
                )));
            }
            (false, None) if holds.get(out.reg as usize) != Some(&Some(i)) => {
                return Err(bad(format!(
                    "is copied from register {}, which holds {:?} after the body, not \
                     kernel instruction {i}",
                    out.reg,
                    holds.get(out.reg as usize).copied().flatten()
                )));
            }
            _ => {}
        }
        let Some(d) = out.donor else {
            if out.aliased {
                return Err(bad("is aliased without a donor input".into()));
            }
            continue;
        };
        let Some(&ValueRef::Buffer(ib)) = kernel.inputs.get(d as usize) else {
            return Err(bad(format!(
                "is placed over input {d}, which is not a buffer"
            )));
        };
        if donors.contains(&d) {
            return Err(bad(format!(
                "is placed over input {d}, which another output takes"
            )));
        }
        donors.push(d);
        if last_use.get(ib as usize) != Some(&k) {
            return Err(bad(format!(
                "is placed over input {d} (buffer {ib}), which is read after this kernel"
            )));
        }
        let (from, to) = (&exe.buffers[ib as usize], &exe.buffers[b as usize]);
        if from.ty != to.ty {
            return Err(bad(format!(
                "is {}, placed over input {d} of type {}",
                to.ty, from.ty
            )));
        }
        let allowed = if out.aliased {
            aliases.iter().any(|&(ao, p)| {
                exe.outputs.get(ao) == Some(&ValueRef::Buffer(b))
                    && exe.parameter_buffers.get(p) == Some(&ib)
            })
        } else {
            from.offset == to.offset
        };
        if !allowed {
            return Err(bad(format!(
                "is placed over input {d} (buffer {ib}), which {}",
                if out.aliased {
                    "is not the parameter it is aliased to"
                } else {
                    "the memory plan puts elsewhere"
                }
            )));
        }
        // Written during the body: no later instruction may read the input
        // it overwrites (its own instruction reads each element before it
        // writes it).
        if let Some(w) = written[o] {
            let reads = |x: &BodyInstr| {
                x.args.iter().any(
                    |a| matches!(*a, Src::Input(y) | Src::InputScalar(y) | Src::Dest(y) if y == d),
                )
            };
            if let Some(r) = (w + 1..plan.body.len()).find(|&r| reads(&plan.body[r])) {
                return Err(bad(format!(
                    "is written over input {d} by body instruction {w}, but body \
                     instruction {r} reads that input afterwards"
                )));
            }
        }
    }
    for &(input, i, _) in &plan.streams {
        let ok = if input {
            (i as usize) < kernel.inputs.len()
        } else {
            plan.outputs
                .get(i as usize)
                .is_some_and(|o| o.prelude.is_none())
        };
        if !ok {
            return Err(whole(format!(
                "prefetches {} {i}, which is not a loop-shaped one",
                if input { "input" } else { "output" }
            )));
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler;
    use crate::ir::Element;
    use crate::optimizers::{Adagrad, Adam, AdamW, Momentum, Nesterov, RMSProp, SGD};
    use crate::optimizers::{FloatElement, UpdateRule};
    use crate::tpu::graph::build_update_graph;
    use std::sync::Arc;

    /// Each fused kernel of `exe` with its plan (verified by `run` in debug
    /// builds, and again here).
    fn plans(
        exe: &Executable,
        aliases: &[(usize, usize)],
    ) -> Vec<(usize, FusedPlan, LoopPlanStats)> {
        let planned: Vec<_> = run(exe, aliases)
            .into_iter()
            .enumerate()
            .filter_map(|(k, p)| p.map(|(plan, stats)| (k, plan, stats)))
            .collect();
        for (k, plan, stats) in &planned {
            verify_plan(exe, *k, &last_uses(exe), aliases, plan).unwrap();
            assert_eq!(*stats, LoopPlanStats::of(plan));
        }
        planned
    }

    /// The aliases the TPU optimizer gives an update: output 0 over
    /// parameter 0, output `o` over parameter `o + 1`.
    fn update_aliases(exe: &Executable) -> Vec<(usize, usize)> {
        (0..exe.outputs.len())
            .map(|o| (o, if o == 0 { 0 } else { o + 1 }))
            .collect()
    }

    fn update<A: FloatElement + Element>(rule: &dyn UpdateRule<A>) -> Arc<Executable> {
        let mut world = compiler::compiler_world();
        let program = build_update_graph(&mut world, rule, &[1000]).unwrap();
        compiler::compile(&mut world, program).unwrap().executable
    }

    #[test]
    fn the_bundled_programs_plan_verified_loops() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/programs");
        let mut fused = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "ron") {
                let exe = compiler::compile_program_file(&path).unwrap().executable;
                fused += plans(&exe, &[]).len();
            }
        }
        assert!(fused >= 1, "no bundled program has a fused loop");
    }

    #[test]
    fn every_optimizer_update_plans_a_verified_in_place_loop() {
        fn check<A: FloatElement + Element>(rules: Vec<Box<dyn UpdateRule<A>>>) {
            for rule in rules {
                let exe = update(rule.as_ref());
                let aliases = update_aliases(&exe);
                let planned = plans(&exe, &aliases);
                assert!(!planned.is_empty(), "{}", rule.update_kind());
                // Without aliases too (the plan then follows the memory plan).
                plans(&exe, &[]);
                for (_, _, stats) in &planned {
                    assert_eq!(
                        stats.aliased_outputs,
                        stats.loop_outputs,
                        "{}: every state is updated over its parameter: {stats:?}",
                        rule.update_kind()
                    );
                }
            }
        }
        check::<f32>(vec![
            Box::new(SGD::new(0.1)),
            Box::new(Momentum::new(0.1, 0.9)),
            Box::new(Nesterov::new(0.1, 0.9)),
            Box::new(Adam::new(0.1)),
            Box::new(AdamW::new(0.1, 0.01)),
            Box::new(RMSProp::new(0.1)),
            Box::new(Adagrad::new(0.1)),
        ]);
        check::<f64>(vec![Box::new(Adam::new(0.1)), Box::new(RMSProp::new(0.1))]);
    }

    /// Adam's update (aliased) and its one fused plan.
    fn adam() -> (Arc<Executable>, Vec<(usize, usize)>, usize, FusedPlan) {
        let exe = update::<f32>(&Adam::new(0.1));
        let aliases = update_aliases(&exe);
        let (k, plan, _) = plans(&exe, &aliases).remove(0);
        (exe, aliases, k, plan)
    }

    /// `corrupt(plan)` is rejected with a message naming the kernel and
    /// containing every part of `expected`.
    fn rejected(corrupt: impl FnOnce(&mut FusedPlan), expected: &[&str]) {
        let (exe, aliases, k, mut plan) = adam();
        corrupt(&mut plan);
        let err =
            verify_plan(&exe, k, &last_uses(&exe), &aliases, &plan).expect_err("a corrupted plan");
        let message = err.to_string();
        assert!(message.starts_with(NAME), "{message}");
        assert!(
            message.contains(&format!("kernel `{}`", exe.kernels[k].name)),
            "{message}"
        );
        for part in expected {
            assert!(message.contains(part), "`{part}` not in: {message}");
        }
    }

    /// The first body instruction reading a register, and that operand.
    fn first_register_read(plan: &FusedPlan) -> (usize, usize) {
        plan.body
            .iter()
            .enumerate()
            .find_map(|(at, b)| {
                let p = b.args.iter().position(|a| matches!(a, Src::Reg(_)))?;
                Some((at, p))
            })
            .expect("a register read")
    }

    #[test]
    fn a_register_read_before_it_is_written_is_rejected() {
        rejected(
            |plan| {
                let (at, p) = first_register_read(plan);
                let Src::Reg(r) = plan.body[at].args[p] else {
                    unreachable!()
                };
                // A fresh register of the same dtype that nothing writes.
                plan.regs.push(plan.regs[r as usize]);
                plan.body[at].args[p] = Src::Reg((plan.regs.len() - 1) as u16);
            },
            &["body instruction", "before any instruction writes it"],
        );
    }

    #[test]
    fn a_register_beyond_the_allocated_count_is_rejected() {
        rejected(
            |plan| {
                let (at, p) = first_register_read(plan);
                plan.body[at].args[p] = Src::Reg(999);
            },
            &["reads register 999", "are allocated"],
        );
    }

    #[test]
    fn an_output_written_by_the_wrong_instruction_is_rejected() {
        rejected(
            |plan| {
                let o = plan
                    .outputs
                    .iter()
                    .position(|o| o.direct)
                    .expect("a direct output");
                let writer = plan
                    .body
                    .iter()
                    .position(|b| b.direct == Some(o as u32))
                    .unwrap();
                let other = if writer == 0 { 1 } else { 0 };
                plan.body[writer].direct = None;
                plan.body[other].direct = Some(o as u32);
            },
            &["body instruction", "output"],
        );
    }

    #[test]
    fn an_output_over_an_input_it_may_not_write_is_rejected() {
        let (exe, _, k, plan) = adam();
        // An input no output may take over (the gradients, the step count).
        let d = (0..exe.kernels[k].inputs.len() as u32)
            .find(|&d| plan.outputs.iter().all(|o| o.donor != Some(d)))
            .expect("an input that is not a donor");
        rejected(
            |plan| {
                let out = plan.outputs.iter_mut().find(|o| o.donor.is_some()).unwrap();
                out.donor = Some(d);
            },
            &["output", &format!("over input {d}")],
        );
    }

    #[test]
    fn a_folded_multiply_add_with_its_operands_swapped_is_rejected() {
        rejected(
            |plan| {
                let b = plan
                    .body
                    .iter_mut()
                    .find(|b| b.product_first.is_some())
                    .expect("Adam folds a multiply-add");
                b.product_first = b.product_first.map(|f| !f);
            },
            &["body instruction", "folds kernel instruction"],
        );
    }
}
