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
//! The steps are in `plan`, the verifier in `verify`, one function per
//! rule below.
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

mod plan;
mod verify;

use smallvec::SmallVec;

use crate::compiler::executable::Executable;
use crate::ir::{DType, Op};
use plan::{last_uses, plan_fused};
pub(super) use verify::verify_plan;

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

#[cfg(test)]
mod tests;
#[cfg(test)]
mod verify_tests;
