//! Stochastic gradient descent, optax's `sgd(learning_rate)`.

use super::error::Result;
use crate::optimizers::kernel::{Target, Written, wrong_slot_count};
use crate::optimizers::macros::impl_optimizer;
use crate::optimizers::program::{Operand, ProgramBuilder, UpdateProgram};
use crate::optimizers::{
    FloatElement, HyperParameter, HyperParameters, OptimizerState, UpdateKind,
};

/// Plain gradient descent: `u = (-lr) * g; p = p + u`.
///
/// No per-element state, so any shape is accepted on any step; the step
/// count is still kept.
#[derive(Debug, Clone)]
pub struct SGD<A> {
    learning_rate: A,
    state: Option<OptimizerState<A>>,
}

/// The scalars one SGD step uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConstants<A> {
    /// `-lr`.
    pub neg_lr: A,
}

impl<A: FloatElement> SGD<A> {
    /// The stable kind.
    pub const KIND: UpdateKind = UpdateKind::Sgd;
    /// No per-element state.
    pub const SLOTS: &'static [&'static str] = &[];

    /// SGD with learning rate `lr`.
    pub fn new(lr: A) -> Self {
        Self {
            learning_rate: lr,
            state: None,
        }
    }

    /// The hyper-parameters: `learning_rate`.
    pub fn hyper_parameters(&self) -> HyperParameters {
        smallvec::smallvec![HyperParameter::new(
            "learning_rate",
            self.learning_rate.as_f64(),
        )]
    }

    /// The scalars the step with `count` uses (independent of the count).
    pub fn constants(&self, _count: i32) -> SgdConstants<A> {
        SgdConstants {
            neg_lr: -self.learning_rate,
        }
    }

    pub(crate) fn initial_values(&self) -> Vec<A> {
        Vec::new()
    }
}

impl<A: FloatElement> SgdConstants<A> {
    /// The step as element-wise operations.
    pub fn program(self) -> UpdateProgram<A> {
        let mut b = ProgramBuilder::new();
        let p = b.apply_step(self.neg_lr, Operand::Grad);
        b.finish(p, Vec::new())
    }

    pub(crate) fn apply(
        self,
        target: Target<'_, A>,
        g: &[A],
        slots: &mut [&mut [A]],
    ) -> Result<Written> {
        if !slots.is_empty() {
            return Err(wrong_slot_count(UpdateKind::Sgd.as_str(), 0, slots.len()));
        }
        let SgdConstants { neg_lr } = self;
        Ok(target.map0(g, move |p, g| p + neg_lr * g))
    }
}

impl_optimizer!(SGD);
