//! The [`Optimizer`] trait and the vocabulary shared by every optimizer.
//!
//! An optimizer turns `(params, grads)` into new params and keeps its own
//! state (moments, accumulators, a step count). The numerics follow optax's
//! float32 semantics bit for bit (see `tests/golden_optimizers.rs`), which
//! fixes four things that are easy to get subtly wrong:
//!
//! * **Hyper-parameters are `f64`**, like Python floats in optax. Constants
//!   derived from them (`1 - b1`, `-lr`, `eps`) are computed in `f64` and
//!   rounded once to the element type with [`FloatElement::from_f64_rounded`].
//!   Only the learning rate is given in the element type, so that
//!   `SGD::new(0.01f32)` infers `f32`; its negation is exact.
//! * **`b^t` is correctly rounded** ([`FloatElement::pow_rounded`]) and the
//!   bias correction is `x * (1 / (1 - b^t))`, as XLA simplifies it.
//! * **`rsqrt` is correctly rounded** ([`FloatElement::rsqrt`]).
//! * **Every operation rounds separately, in optax's order**: `(1-b1)*g +
//!   b1*mu` is two products and a sum, never a fused multiply-add (Rust does
//!   not contract them; XLA's jit does, which is why jitted optax differs in
//!   the last bit and the golden tests compare with eager optax).
//!
//! As in optax, hyper-parameters are not range-checked: a negative learning
//! rate or a `b1` of 1 gives the numbers the formulas give.
//!
//! # State and shapes
//!
//! State is created lazily by the first `step`, with the shape of that
//! step's params, and is keyed by that shape from then on: a later step with
//! params of another shape is an [`OptimizerError::StateShapeMismatch`], never a
//! silent re-initialisation. [`Optimizer::reset`] drops the state, so the next
//! step starts over (count 0, fresh moments) with whatever shape it is given.
//! Optimizers without per-element state (SGD) accept any shape.
//!
//! # Describing an update
//!
//! Every built-in optimizer also implements [`UpdateRule`]: a stable
//! [`UpdateKind`], its hyper-parameters, and its state as named slots, which
//! is what a graph compiler needs to rebuild the same update from outside,
//! and an [`UpdateProgram`]: the step's float operations in order.

use std::fmt;

pub use crate::ir::FloatElement;

use ndarray::{Array, ArrayD, Dimension};

use super::error::{OptimizerError, Result};
pub use super::program::{ElementOp, Operand, UpdateProgram};

/// A first-order optimizer over `ndarray` tensors of element type `A` and
/// dimension `D`.
///
/// The built-in optimizers implement this for every `D`, so one optimizer
/// value serves any rank (its state is still keyed by the first shape it
/// sees; see the module docs). Because of that, calling a trait method that
/// does not mention `D` (`learning_rate`, `reset`) through the trait needs
/// the dimension spelled out; the built-in types also have inherent methods
/// of the same names, which is what `opt.learning_rate()` resolves to.
pub trait Optimizer<A, D: Dimension> {
    /// Applies one update and returns the new params. `params` and `grads`
    /// must have the same shape. The state advances only when this returns
    /// `Ok`.
    fn step(&mut self, params: &Array<A, D>, grads: &Array<A, D>) -> Result<Array<A, D>>;

    /// Applies one update, overwriting `params` (a donated buffer). Same
    /// numbers as [`Optimizer::step`]; the default implementation calls it.
    fn step_in_place(&mut self, params: &mut Array<A, D>, grads: &Array<A, D>) -> Result<()> {
        let updated = self.step(params, grads)?;
        *params = updated;
        Ok(())
    }

    /// The learning rate the next step will use.
    fn learning_rate(&self) -> A;

    /// Sets the learning rate for the following steps (schedules call this).
    fn set_learning_rate(&mut self, lr: A);

    /// A stable, lower-case name (`"adam"`), used in errors, logs and caches.
    fn name(&self) -> &str;

    /// Drops the state: the next step starts from step count 0 with fresh
    /// moments, for whatever shape it is given.
    fn reset(&mut self);

    /// The optimizer's update as a known element-wise rule, if it has one.
    /// A graph compiler (`TPUOptimizer`) compiles and fuses such optimizers;
    /// the default `None` makes it call [`Optimizer::step`] as an opaque
    /// custom call instead.
    fn update_rule(&self) -> Option<&dyn UpdateRule<A>> {
        None
    }
}

/// Boxed optimizers (`Box<dyn Optimizer<A, D>>`) are optimizers too, so a
/// wrapper can hold any of them.
impl<A, D: Dimension, O: Optimizer<A, D> + ?Sized> Optimizer<A, D> for Box<O> {
    fn step(&mut self, params: &Array<A, D>, grads: &Array<A, D>) -> Result<Array<A, D>> {
        (**self).step(params, grads)
    }

    fn step_in_place(&mut self, params: &mut Array<A, D>, grads: &Array<A, D>) -> Result<()> {
        (**self).step_in_place(params, grads)
    }

    fn learning_rate(&self) -> A {
        (**self).learning_rate()
    }

    fn set_learning_rate(&mut self, lr: A) {
        (**self).set_learning_rate(lr);
    }

    fn name(&self) -> &str {
        (**self).name()
    }

    fn reset(&mut self) {
        (**self).reset();
    }

    fn update_rule(&self) -> Option<&dyn UpdateRule<A>> {
        (**self).update_rule()
    }
}

/// Which update rule an optimizer applies. The string form is stable and is
/// what [`Optimizer::name`] returns for the built-in optimizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpdateKind {
    /// `p - lr * g`.
    Sgd,
    /// Heavy-ball momentum (optax `trace`).
    Momentum,
    /// Nesterov momentum (optax `trace(nesterov=True)`).
    Nesterov,
    /// Adam with bias correction.
    Adam,
    /// Adam with decoupled weight decay.
    AdamW,
    /// RMSProp, eps inside the square root, not centred.
    RmsProp,
    /// Adagrad.
    Adagrad,
}

impl UpdateKind {
    /// Every kind, in declaration order.
    pub const ALL: [UpdateKind; 7] = [
        UpdateKind::Sgd,
        UpdateKind::Momentum,
        UpdateKind::Nesterov,
        UpdateKind::Adam,
        UpdateKind::AdamW,
        UpdateKind::RmsProp,
        UpdateKind::Adagrad,
    ];

    /// The stable name: `sgd`, `momentum`, `nesterov`, `adam`, `adamw`,
    /// `rmsprop`, `adagrad` (optax's function names).
    pub const fn as_str(self) -> &'static str {
        match self {
            UpdateKind::Sgd => "sgd",
            UpdateKind::Momentum => "momentum",
            UpdateKind::Nesterov => "nesterov",
            UpdateKind::Adam => "adam",
            UpdateKind::AdamW => "adamw",
            UpdateKind::RmsProp => "rmsprop",
            UpdateKind::Adagrad => "adagrad",
        }
    }
}

impl fmt::Display for UpdateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One named hyper-parameter, as the user gave it (before rounding to the
/// element type). Names follow optax (`learning_rate`, `b1`, `eps`, ...).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HyperParameter {
    /// optax's name for it.
    pub name: &'static str,
    /// Its value in `f64`.
    pub value: f64,
}

/// An optimizer's hyper-parameters, inline: a cached step compares them
/// with its program's key every time, without allocating.
pub type HyperParameters = smallvec::SmallVec<[HyperParameter; 8]>;

impl HyperParameter {
    pub(crate) const fn new(name: &'static str, value: f64) -> Self {
        Self { name, value }
    }
}

/// One named per-element state tensor (optax's names: `trace`, `mu`, `nu`,
/// `sum_of_squares`).
#[derive(Debug, Clone, PartialEq)]
pub struct StateSlot<A> {
    /// optax's field name.
    pub name: &'static str,
    /// The tensor, always in standard (row-major) layout.
    pub value: ArrayD<A>,
}

/// An optimizer's complete state: the step count and its per-element slots.
///
/// The count is optax's `int32` counter: it starts at 0, is incremented
/// (saturating at `i32::MAX`) before the update uses it, and is kept by every
/// optimizer, even those whose update does not read it.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerState<A> {
    /// Number of steps taken.
    pub count: i32,
    /// Per-element tensors, in the optimizer's documented order.
    pub slots: Vec<StateSlot<A>>,
}

impl<A> OptimizerState<A> {
    /// The slot called `name`, if any.
    pub fn slot(&self, name: &str) -> Option<&ArrayD<A>> {
        self.slots.iter().find(|s| s.name == name).map(|s| &s.value)
    }

    /// The shape every slot has, or `None` for a state without slots.
    pub fn shape(&self) -> Option<&[usize]> {
        self.slots.first().map(|s| s.value.shape())
    }
}

/// An optimizer whose update is a known element-wise rule, described well
/// enough to rebuild it as a graph: its kind, hyper-parameters and state.
pub trait UpdateRule<A> {
    /// Which rule this is.
    fn update_kind(&self) -> UpdateKind;

    /// The hyper-parameters, learning rate first, as given (in `f64`).
    fn hyper_parameters(&self) -> HyperParameters;

    /// The exact element-wise operations of the step with `count` (the
    /// incremented count: 1 for the first step), with its scalars.
    fn update_program(&self, count: i32) -> UpdateProgram<A>;

    /// Names of the per-element state slots, in order (empty for SGD).
    fn slot_names(&self) -> &'static [&'static str];

    /// The value every element of each slot starts from, in slot order
    /// (Adagrad's initial accumulator, RMSProp's initial scale, else 0).
    fn initial_slot_values(&self) -> Vec<A>;

    /// The state, or `None` before the first step and after a reset.
    fn state(&self) -> Option<&OptimizerState<A>>;

    /// Moves the state out (no copy of the tensors), leaving the optimizer
    /// as if reset; hand it back with [`UpdateRule::set_state`].
    fn take_state(&mut self) -> Option<OptimizerState<A>>;

    /// Replaces the state (e.g. from a checkpoint). The slots must have the
    /// names of [`UpdateRule::slot_names`], in order, and one common shape.
    fn set_state(&mut self, state: OptimizerState<A>) -> Result<()>;
}

/// Errors unless `params` and `grads` have the same shape.
pub fn check_same_shape<A, D: Dimension>(params: &Array<A, D>, grads: &Array<A, D>) -> Result<()> {
    if params.shape() == grads.shape() {
        Ok(())
    } else {
        Err(OptimizerError::ShapeMismatch {
            params: params.shape().to_vec(),
            grads: grads.shape().to_vec(),
        }
        .into())
    }
}
