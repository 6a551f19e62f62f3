//! The rules of each planned output, 22 to 31 of the list in `super`, run
//! by `check_output` in that order.

use super::{Verifier, Walk};
use crate::compiler::executable::{Stage, ValueRef};
use crate::exec::loop_plan::{BodyInstr, FusedOutput, LoopPlanError, Src};

/// A planned output and its kernel output.
struct OutputAt<'a> {
    o: usize,
    out: &'a FusedOutput,
    /// The kernel instruction computing it.
    i: u32,
    /// Its buffer.
    b: u32,
}

impl Verifier<'_> {
    fn at_output(&self, out: &OutputAt<'_>, message: String) -> LoopPlanError {
        self.fail(format!("output {}", out.o), message)
    }
}

/// The rules of output `o`; `donors` are the inputs earlier outputs take.
pub(super) fn check_output(
    v: &Verifier<'_>,
    walk: &Walk,
    donors: &mut Vec<u32>,
    o: usize,
) -> Result<(), LoopPlanError> {
    let (i, b) = v.kernel.outputs[o];
    let at = OutputAt {
        o,
        out: &v.plan.outputs[o],
        i,
        b,
    };
    check_output_buffer(v, &at)?;
    if check_output_stage(v, &at)? == Stage::Prelude {
        return Ok(());
    }
    check_loop_output_written(v, walk, &at)?;
    let Some(d) = at.out.donor else {
        return check_aliased_output_has_donor(v, &at);
    };
    let ib = check_donor_is_buffer_input(v, &at, d)?;
    check_donor_donates_once(v, &at, d, donors)?;
    donors.push(d);
    check_donor_read_last_here(v, &at, d, ib)?;
    check_donor_type(v, &at, d, ib)?;
    check_donor_placement(v, &at, d, ib)?;
    check_donor_not_read_after_direct_write(v, walk, &at, d)
}

fn check_output_buffer(v: &Verifier<'_>, at: &OutputAt<'_>) -> Result<(), LoopPlanError> {
    if at.out.buffer != at.b {
        return Err(v.at_output(
            at,
            format!("goes to buffer {}, not {}", at.out.buffer, at.b),
        ));
    }
    Ok(())
}

/// The stage of the output's instruction, as planned.
fn check_output_stage(v: &Verifier<'_>, at: &OutputAt<'_>) -> Result<Stage, LoopPlanError> {
    let (out, i) = (at.out, at.i);
    if v.instr_of(i).is_some_and(|x| x.stage == Stage::Prelude) {
        if out.prelude != Some(i) || out.donor.is_some() || out.direct {
            return Err(v.at_output(
                at,
                format!("is prelude instruction {i}, planned as {out:?}"),
            ));
        }
        return Ok(Stage::Prelude);
    }
    if out.prelude.is_some() {
        return Err(v.at_output(
            at,
            format!("is loop instruction {i}, planned as a prelude value"),
        ));
    }
    Ok(Stage::Loop)
}

fn check_loop_output_written(
    v: &Verifier<'_>,
    walk: &Walk,
    at: &OutputAt<'_>,
) -> Result<(), LoopPlanError> {
    let (out, i) = (at.out, at.i);
    match (out.direct, walk.written[at.o]) {
        (true, None) => Err(v.at_output(at, "is direct, but no instruction writes it".into())),
        (false, Some(w)) => Err(v.at_output(
            at,
            format!("is copied from a register, but body instruction {w} writes it directly"),
        )),
        (false, None) if walk.holds.get(out.reg as usize) != Some(&Some(i)) => Err(v.at_output(
            at,
            format!(
                "is copied from register {}, which holds {:?} after the body, not \
                 kernel instruction {i}",
                out.reg,
                walk.holds.get(out.reg as usize).copied().flatten()
            ),
        )),
        _ => Ok(()),
    }
}

/// Run for an output without a donor.
fn check_aliased_output_has_donor(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
) -> Result<(), LoopPlanError> {
    if at.out.aliased {
        return Err(v.at_output(at, "is aliased without a donor input".into()));
    }
    Ok(())
}

/// The donor's buffer.
fn check_donor_is_buffer_input(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
) -> Result<u32, LoopPlanError> {
    let Some(&ValueRef::Buffer(ib)) = v.kernel.inputs.get(d as usize) else {
        return Err(v.at_output(
            at,
            format!("is placed over input {d}, which is not a buffer"),
        ));
    };
    Ok(ib)
}

fn check_donor_donates_once(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    donors: &[u32],
) -> Result<(), LoopPlanError> {
    if donors.contains(&d) {
        return Err(v.at_output(
            at,
            format!("is placed over input {d}, which another output takes"),
        ));
    }
    Ok(())
}

fn check_donor_read_last_here(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    ib: u32,
) -> Result<(), LoopPlanError> {
    if v.last_use.get(ib as usize) != Some(&v.k) {
        return Err(v.at_output(
            at,
            format!("is placed over input {d} (buffer {ib}), which is read after this kernel"),
        ));
    }
    Ok(())
}

fn check_donor_type(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    ib: u32,
) -> Result<(), LoopPlanError> {
    let (from, to) = (&v.exe.buffers[ib as usize], &v.exe.buffers[at.b as usize]);
    if from.ty != to.ty {
        return Err(v.at_output(
            at,
            format!("is {}, placed over input {d} of type {}", to.ty, from.ty),
        ));
    }
    Ok(())
}

fn check_donor_placement(
    v: &Verifier<'_>,
    at: &OutputAt<'_>,
    d: u32,
    ib: u32,
) -> Result<(), LoopPlanError> {
    let (exe, b) = (v.exe, at.b);
    let (from, to) = (&exe.buffers[ib as usize], &exe.buffers[b as usize]);
    let allowed = if at.out.aliased {
        v.aliases.iter().any(|&(ao, p)| {
            exe.outputs.get(ao) == Some(&ValueRef::Buffer(b))
                && exe.parameter_buffers.get(p) == Some(&ib)
        })
    } else {
        from.offset == to.offset
    };
    if !allowed {
        return Err(v.at_output(
            at,
            format!(
                "is placed over input {d} (buffer {ib}), which {}",
                if at.out.aliased {
                    "is not the parameter it is aliased to"
                } else {
                    "the memory plan puts elsewhere"
                }
            ),
        ));
    }
    Ok(())
}

/// Written during the body: no later instruction may read the input it
/// overwrites (its own instruction reads each element before it writes
/// it).
fn check_donor_not_read_after_direct_write(
    v: &Verifier<'_>,
    walk: &Walk,
    at: &OutputAt<'_>,
    d: u32,
) -> Result<(), LoopPlanError> {
    let Some(w) = walk.written[at.o] else {
        return Ok(());
    };
    let reads = |x: &BodyInstr| {
        x.args
            .iter()
            .any(|a| matches!(*a, Src::Input(y) | Src::InputScalar(y) | Src::Dest(y) if y == d))
    };
    let body = &v.plan.body;
    if let Some(r) = (w + 1..body.len()).find(|&r| reads(&body[r])) {
        return Err(v.at_output(
            at,
            format!(
                "is written over input {d} by body instruction {w}, but body \
                 instruction {r} reads that input afterwards"
            ),
        ));
    }
    Ok(())
}
