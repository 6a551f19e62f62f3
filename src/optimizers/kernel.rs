//! The fused element-wise loop that every built-in optimizer runs, and the
//! state bookkeeping around it.
//!
//! A step is one pass over zipped slices (params, grads, each state slot,
//! the output): every element is read once and written once, with no
//! full-size temporaries besides the returned params. Tensors larger than
//! [`CHUNK`] elements are split into chunks that rayon spreads over the
//! cores; smaller ones run on the calling thread, where rayon's fork-join
//! would cost more than the loop.
//!
//! The returned params are written straight into uninitialised memory (no
//! zero-fill pass), and on Linux a large output is marked for transparent
//! huge pages before it is first touched: page faults on a fresh 40 MB
//! buffer otherwise cost more than the update itself (measured in
//! `docs/benchmarks-optimizers.md`; PyTorch's CPU allocator does the same).

use std::mem::MaybeUninit;

use ndarray::{Array, ArrayD, Dimension, IxDyn};
use rayon::prelude::*;

use super::error::{OptimizerError, Result};
use crate::error::OptimError;
use crate::memory::output_buffer;
use crate::optimizers::{FloatElement, OptimizerState, StateSlot, check_same_shape};

/// Elements per parallel chunk: 64 Ki elements (256 KiB of f32 per stream),
/// large enough to amortize scheduling, small enough to balance two cores.
pub const CHUNK: usize = 1 << 16;

/// Where a step writes the new params.
pub(crate) enum Target<'a, A> {
    /// Read `params`, write every element of `out` (the returned array).
    Fresh {
        out: &'a mut [MaybeUninit<A>],
        params: &'a [A],
    },
    /// Overwrite the params (a donated buffer).
    InPlace(&'a mut [A]),
}

/// Proof that a `Target::map*` ran, which writes every output element; only
/// this module can make one.
pub(crate) struct Written(());

impl<A: FloatElement> Target<'_, A> {
    /// Runs `f(p, g) -> p'` over every element: [`Target::map1`] with a
    /// slot of `()`, which takes no memory and compiles away.
    pub(crate) fn map0(self, g: &[A], f: impl Fn(A, A) -> A + Sync) -> Written {
        let mut no_slot = vec![(); g.len()];
        self.map1(g, &mut no_slot, |p, g, _: &mut ()| f(p, g))
    }

    /// Runs `f(p, g, &mut s0) -> p'` over every element.
    pub(crate) fn map1<S: Send>(
        self,
        g: &[A],
        s0: &mut [S],
        f: impl Fn(A, A, &mut S) -> A + Sync,
    ) -> Written {
        match self {
            Target::Fresh { out, params } => {
                let run = |out: &mut [MaybeUninit<A>], p: &[A], g: &[A], s0: &mut [S]| {
                    for (((o, &p), &g), s0) in out.iter_mut().zip(p).zip(g).zip(s0) {
                        o.write(f(p, g, s0));
                    }
                };
                if out.len() <= CHUNK {
                    run(out, params, g, s0);
                } else {
                    (
                        out.par_chunks_mut(CHUNK),
                        params.par_chunks(CHUNK),
                        g.par_chunks(CHUNK),
                        s0.par_chunks_mut(CHUNK),
                    )
                        .into_par_iter()
                        .for_each(|(o, p, g, s0)| run(o, p, g, s0));
                }
            }
            Target::InPlace(params) => {
                let run = |p: &mut [A], g: &[A], s0: &mut [S]| {
                    for ((p, &g), s0) in p.iter_mut().zip(g).zip(s0) {
                        *p = f(*p, g, s0);
                    }
                };
                if params.len() <= CHUNK {
                    run(params, g, s0);
                } else {
                    (
                        params.par_chunks_mut(CHUNK),
                        g.par_chunks(CHUNK),
                        s0.par_chunks_mut(CHUNK),
                    )
                        .into_par_iter()
                        .for_each(|(p, g, s0)| run(p, g, s0));
                }
            }
        }
        Written(())
    }

    /// Runs `f(p, g, &mut s0, &mut s1) -> p'` over every element.
    pub(crate) fn map2(
        self,
        g: &[A],
        s0: &mut [A],
        s1: &mut [A],
        f: impl Fn(A, A, &mut A, &mut A) -> A + Sync,
    ) -> Written {
        match self {
            Target::Fresh { out, params } => {
                let run =
                    |out: &mut [MaybeUninit<A>], p: &[A], g: &[A], s0: &mut [A], s1: &mut [A]| {
                        for ((((o, &p), &g), s0), s1) in
                            out.iter_mut().zip(p).zip(g).zip(s0).zip(s1)
                        {
                            o.write(f(p, g, s0, s1));
                        }
                    };
                if out.len() <= CHUNK {
                    run(out, params, g, s0, s1);
                } else {
                    (
                        out.par_chunks_mut(CHUNK),
                        params.par_chunks(CHUNK),
                        g.par_chunks(CHUNK),
                        s0.par_chunks_mut(CHUNK),
                        s1.par_chunks_mut(CHUNK),
                    )
                        .into_par_iter()
                        .for_each(|(o, p, g, s0, s1)| run(o, p, g, s0, s1));
                }
            }
            Target::InPlace(params) => {
                let run = |p: &mut [A], g: &[A], s0: &mut [A], s1: &mut [A]| {
                    for (((p, &g), s0), s1) in p.iter_mut().zip(g).zip(s0).zip(s1) {
                        *p = f(*p, g, s0, s1);
                    }
                };
                if params.len() <= CHUNK {
                    run(params, g, s0, s1);
                } else {
                    (
                        params.par_chunks_mut(CHUNK),
                        g.par_chunks(CHUNK),
                        s0.par_chunks_mut(CHUNK),
                        s1.par_chunks_mut(CHUNK),
                    )
                        .into_par_iter()
                        .for_each(|(p, g, s0, s1)| run(p, g, s0, s1));
                }
            }
        }
        Written(())
    }
}

/// The step count the next step will use: optax increments before use and
/// saturates at `i32::MAX`; a missing state starts from 0.
pub(crate) fn next_count<A>(state: &Option<OptimizerState<A>>) -> i32 {
    state.as_ref().map_or(0, |s| s.count).saturating_add(1)
}

fn invalid_state(optimizer: &str, reason: impl Into<String>) -> OptimError {
    OptimizerError::InvalidState {
        optimizer: optimizer.to_string(),
        reason: reason.into(),
    }
    .into()
}

/// The state for params of `shape`: created with `initial` values on first
/// use, an error if it was built for another shape.
fn prepare_state<'s, A: FloatElement>(
    name: &str,
    state: &'s mut Option<OptimizerState<A>>,
    slot_names: &[&'static str],
    initial: &[A],
    shape: &[usize],
) -> Result<&'s mut OptimizerState<A>> {
    if let Some(existing) = state.as_ref().and_then(|s| s.shape())
        && existing != shape
    {
        return Err(OptimizerError::StateShapeMismatch {
            optimizer: name.to_string(),
            state: existing.to_vec(),
            params: shape.to_vec(),
        }
        .into());
    }
    Ok(state.get_or_insert_with(|| OptimizerState {
        count: 0,
        slots: slot_names
            .iter()
            .zip(initial)
            .map(|(&name, &v)| StateSlot {
                name,
                value: ArrayD::from_elem(IxDyn(shape), v),
            })
            .collect(),
    }))
}

fn slot_slices<'s, A: FloatElement>(
    name: &str,
    slots: &'s mut [StateSlot<A>],
) -> Result<Vec<&'s mut [A]>> {
    slots
        .iter_mut()
        .map(|s| {
            let slot = s.name;
            s.value
                .as_slice_mut()
                .ok_or_else(|| invalid_state(name, format!("slot {slot} is not contiguous")))
        })
        .collect()
}

/// One out-of-place step: validates shapes, prepares the state, runs
/// `kernel(target, grads, slots)` and commits the new count.
pub(crate) fn run_step<A, D, K>(
    name: &str,
    state: &mut Option<OptimizerState<A>>,
    slot_names: &[&'static str],
    initial: &[A],
    params: &Array<A, D>,
    grads: &Array<A, D>,
    kernel: K,
) -> Result<Array<A, D>>
where
    A: FloatElement,
    D: Dimension,
    K: FnOnce(Target<'_, A>, &[A], &mut [&mut [A]]) -> Result<Written>,
{
    check_same_shape(params, grads)?;
    let count = next_count(state);
    let st = prepare_state(name, state, slot_names, initial, params.shape())?;
    let p = params.as_standard_layout();
    let g = grads.as_standard_layout();
    let (Some(p), Some(g)) = (p.as_slice(), g.as_slice()) else {
        return Err(invalid_state(
            name,
            "params or grads could not be made contiguous",
        ));
    };
    let n = p.len();
    let mut slots = slot_slices(name, &mut st.slots)?;
    if g.len() != n || slots.iter().any(|s| s.len() != n) {
        return Err(invalid_state(
            name,
            "params, grads and state differ in length",
        ));
    }
    let mut out = output_buffer::<A>(n);
    let target = Target::Fresh {
        out: &mut out.spare_capacity_mut()[..n],
        params: p,
    };
    let Written(()) = kernel(target, g, &mut slots)?;
    // SAFETY: `Written` comes only from a `Target::map*`, which zips the
    // output with params, grads and slots, all of length `n` (checked
    // above), and writes every element; so `out[..n]` is initialised.
    unsafe { out.set_len(n) };
    st.count = count;
    Array::from_shape_vec(params.raw_dim(), out).map_err(|e| invalid_state(name, e.to_string()))
}

/// One in-place step; same contract as [`run_step`]. Params that are not in
/// standard layout are updated through a standard-layout copy.
pub(crate) fn run_step_in_place<A, D, K>(
    name: &str,
    state: &mut Option<OptimizerState<A>>,
    slot_names: &[&'static str],
    initial: &[A],
    params: &mut Array<A, D>,
    grads: &Array<A, D>,
    kernel: K,
) -> Result<()>
where
    A: FloatElement,
    D: Dimension,
    K: FnOnce(Target<'_, A>, &[A], &mut [&mut [A]]) -> Result<Written>,
{
    check_same_shape(params, grads)?;
    let count = next_count(state);
    let st = prepare_state(name, state, slot_names, initial, params.shape())?;
    let g = grads.as_standard_layout();
    let Some(g) = g.as_slice() else {
        return Err(invalid_state(name, "grads could not be made contiguous"));
    };
    let mut slots = slot_slices(name, &mut st.slots)?;
    if let Some(p) = params.as_slice_mut() {
        let Written(()) = kernel(Target::InPlace(p), g, &mut slots)?;
    } else {
        let mut p = params.as_standard_layout().into_owned();
        let Some(ps) = p.as_slice_mut() else {
            return Err(invalid_state(name, "params could not be made contiguous"));
        };
        let Written(()) = kernel(Target::InPlace(ps), g, &mut slots)?;
        params.assign(&p);
    }
    st.count = count;
    Ok(())
}

/// Checks a state handed to `set_state` and brings its slots to standard
/// layout.
pub(crate) fn validate_state<A: FloatElement>(
    name: &str,
    slot_names: &[&'static str],
    mut state: OptimizerState<A>,
) -> Result<OptimizerState<A>> {
    if state.count < 0 {
        return Err(invalid_state(
            name,
            format!("step count {} is negative", state.count),
        ));
    }
    let given: Vec<&str> = state.slots.iter().map(|s| s.name).collect();
    if given != slot_names {
        return Err(invalid_state(
            name,
            format!("expected slots {slot_names:?} in that order, got {given:?}"),
        ));
    }
    if let Some(first) = state.shape().map(<[usize]>::to_vec)
        && let Some(other) = state
            .slots
            .iter()
            .find(|s| s.value.shape() != first.as_slice())
    {
        return Err(invalid_state(
            name,
            format!(
                "slot {} has shape {:?} but slot {} has shape {:?}",
                other.name,
                other.value.shape(),
                state.slots[0].name,
                first
            ),
        ));
    }
    for slot in &mut state.slots {
        if !slot.value.is_standard_layout() {
            slot.value = slot.value.as_standard_layout().into_owned();
        }
    }
    Ok(state)
}

/// The error a kernel returns when it is handed the wrong number of slots
/// (unreachable through the public API, which validates states).
pub(crate) fn wrong_slot_count(name: &str, expected: usize, got: usize) -> OptimError {
    invalid_state(name, format!("expected {expected} state slots, got {got}"))
}
