//! Heavy-ball momentum, optax's `sgd(learning_rate, momentum=mu)`.

use super::error::Result;
use crate::optimizers::kernel::{Target, Written, wrong_slot_count};
use crate::optimizers::macros::impl_optimizer;
use crate::optimizers::program::{Operand, ProgramBuilder, UpdateProgram};
use crate::optimizers::{
    FloatElement, HyperParameter, HyperParameters, OptimizerState, UpdateKind,
};

/// Momentum (optax `trace`, no dampening):
/// `m = g + mu * m; p = p + (-lr) * m`.
///
/// State: `trace` (initially 0). Default `mu` is 0.9.
#[derive(Debug, Clone)]
pub struct Momentum<A> {
    learning_rate: A,
    momentum: f64,
    state: Option<OptimizerState<A>>,
}

/// The scalars one momentum step uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumConstants<A> {
    /// `-lr`.
    pub neg_lr: A,
    /// `mu`, rounded once.
    pub mu: A,
}

impl<A: FloatElement> Momentum<A> {
    /// The stable kind.
    pub const KIND: UpdateKind = UpdateKind::Momentum;
    /// The state slots, optax's names.
    pub const SLOTS: &'static [&'static str] = &["trace"];

    /// Momentum with learning rate `lr` and momentum `mu` (optax's default is 0.9).
    pub fn new(lr: A, mu: f64) -> Self {
        Self {
            learning_rate: lr,
            momentum: mu,
            state: None,
        }
    }

    /// Changes the momentum coefficient.
    #[must_use]
    pub fn with_momentum(mut self, mu: f64) -> Self {
        self.momentum = mu;
        self
    }

    /// The hyper-parameters: `learning_rate`, `momentum`.
    pub fn hyper_parameters(&self) -> HyperParameters {
        smallvec::smallvec![
            HyperParameter::new("learning_rate", self.learning_rate.as_f64()),
            HyperParameter::new("momentum", self.momentum),
        ]
    }

    /// The scalars the step with `count` uses (independent of the count).
    pub fn constants(&self, _count: i32) -> MomentumConstants<A> {
        MomentumConstants {
            neg_lr: -self.learning_rate,
            mu: A::from_f64_rounded(self.momentum),
        }
    }

    pub(crate) fn initial_values(&self) -> Vec<A> {
        vec![A::zero()]
    }
}

impl<A: FloatElement> MomentumConstants<A> {
    /// The step as element-wise operations.
    pub fn program(self) -> UpdateProgram<A> {
        let mut b = ProgramBuilder::new();
        let mu = b.constant("mu", self.mu);
        let decayed = b.mul(mu, Operand::Slot(0));
        let trace = b.add(Operand::Grad, decayed);
        let p = b.apply_step(self.neg_lr, trace);
        b.finish(p, vec![trace])
    }

    pub(crate) fn apply(
        self,
        target: Target<'_, A>,
        g: &[A],
        slots: &mut [&mut [A]],
    ) -> Result<Written> {
        let [trace] = slots else {
            return Err(wrong_slot_count(
                UpdateKind::Momentum.as_str(),
                1,
                slots.len(),
            ));
        };
        let MomentumConstants { neg_lr, mu } = self;
        Ok(target.map1(g, trace, move |p, g, m| {
            *m = g + mu * *m;
            p + neg_lr * *m
        }))
    }
}

impl_optimizer!(Momentum);
