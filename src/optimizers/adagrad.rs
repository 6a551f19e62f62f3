//! Adagrad, optax's `adagrad(learning_rate)`.

use super::error::Result;
use crate::optimizers::kernel::{Target, Written, wrong_slot_count};
use crate::optimizers::macros::impl_optimizer;
use crate::optimizers::program::{Operand, ProgramBuilder, UpdateProgram};
use crate::optimizers::{
    FloatElement, HyperParameter, HyperParameters, OptimizerState, UpdateKind,
};

/// Adagrad (Duchi et al.), optax's form:
///
/// ```text
/// s = g*g + s
/// d = where(s > 0, rsqrt(s + eps), 0) * g
/// p = p + (-lr) * d
/// ```
///
/// State: `sum_of_squares` (initially `initial_accumulator_value`).
/// Defaults: `initial_accumulator_value` 0.1, `eps` 1e-7 (inside the square
/// root). As in optax, a NaN accumulator gives a zero scale (`NaN > 0` is
/// false), so `d` is `0 * g`.
#[derive(Debug, Clone)]
pub struct Adagrad<A> {
    learning_rate: A,
    initial_accumulator_value: f64,
    eps: f64,
    state: Option<OptimizerState<A>>,
}

/// The scalars one Adagrad step uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdagradConstants<A> {
    /// `-lr`.
    pub neg_lr: A,
    /// `eps`, added inside the square root.
    pub eps: A,
}

impl<A: FloatElement> AdagradConstants<A> {
    /// The step as element-wise operations.
    pub fn program(self) -> UpdateProgram<A> {
        let mut b = ProgramBuilder::new();
        let eps = b.constant("eps", self.eps);
        let zero = b.constant("zero", A::zero());
        let g2 = b.mul(Operand::Grad, Operand::Grad);
        let sum = b.add(g2, Operand::Slot(0));
        let shifted = b.add(sum, eps);
        let root = b.rsqrt(shifted);
        let scale = b.select_positive(sum, root, zero);
        let d = b.mul(scale, Operand::Grad);
        let p = b.apply_step(self.neg_lr, d);
        b.finish(p, vec![sum])
    }

    pub(crate) fn apply(
        self,
        target: Target<'_, A>,
        g: &[A],
        slots: &mut [&mut [A]],
    ) -> Result<Written> {
        let [sum_of_squares] = slots else {
            return Err(wrong_slot_count(
                UpdateKind::Adagrad.as_str(),
                1,
                slots.len(),
            ));
        };
        let AdagradConstants { neg_lr, eps } = self;
        Ok(target.map1(g, sum_of_squares, move |p, g, s| {
            *s = g * g + *s;
            let scale = if *s > A::zero() {
                (*s + eps).rsqrt()
            } else {
                A::zero()
            };
            p + neg_lr * (scale * g)
        }))
    }
}

impl<A: FloatElement> Adagrad<A> {
    /// The stable kind.
    pub const KIND: UpdateKind = UpdateKind::Adagrad;
    /// The state slots, optax's names.
    pub const SLOTS: &'static [&'static str] = &["sum_of_squares"];

    /// Adagrad with learning rate `lr` and optax's defaults.
    pub fn new(lr: A) -> Self {
        Self {
            learning_rate: lr,
            initial_accumulator_value: 0.1,
            eps: 1e-7,
            state: None,
        }
    }

    /// Changes the initial value of the accumulator.
    #[must_use]
    pub fn with_initial_accumulator_value(mut self, value: f64) -> Self {
        self.initial_accumulator_value = value;
        self
    }

    /// Changes `eps`, added inside the square root.
    #[must_use]
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// The hyper-parameters: `learning_rate`, `initial_accumulator_value`, `eps`.
    pub fn hyper_parameters(&self) -> HyperParameters {
        smallvec::smallvec![
            HyperParameter::new("learning_rate", self.learning_rate.as_f64()),
            HyperParameter::new("initial_accumulator_value", self.initial_accumulator_value),
            HyperParameter::new("eps", self.eps),
        ]
    }

    /// The scalars the step with `count` uses (independent of the count).
    pub fn constants(&self, _count: i32) -> AdagradConstants<A> {
        AdagradConstants {
            neg_lr: -self.learning_rate,
            eps: A::from_f64_rounded(self.eps),
        }
    }

    pub(crate) fn initial_values(&self) -> Vec<A> {
        vec![A::from_f64_rounded(self.initial_accumulator_value)]
    }
}

impl_optimizer!(Adagrad);
