//! Heavy-ball and Nesterov momentum, optax's `sgd(learning_rate,
//! momentum=mu)` and `sgd(learning_rate, momentum=mu, nesterov=True)`: one
//! rule, [`SgdMomentum`], whose `NESTEROV` parameter is the only difference
//! (the step along the new trace, or along the gradient plus the trace once
//! more), so the two cannot drift apart.

use std::fmt;

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
pub type Momentum<A> = SgdMomentum<A, false>;

/// Nesterov momentum (optax `trace(nesterov=True)`, the Sutskever/PyTorch
/// form): `m = g + mu * m; d = g + mu * m` (with the new `m`);
/// `p = p + (-lr) * d`.
///
/// State: `trace` (initially 0). Default `mu` is 0.9.
pub type Nesterov<A> = SgdMomentum<A, true>;

/// The scalars one momentum step uses.
pub type MomentumConstants<A> = SgdMomentumConstants<A, false>;

/// The scalars one Nesterov step uses.
pub type NesterovConstants<A> = SgdMomentumConstants<A, true>;

/// SGD with momentum: [`Momentum`] (`NESTEROV = false`) or [`Nesterov`]
/// (`NESTEROV = true`).
#[derive(Clone)]
pub struct SgdMomentum<A, const NESTEROV: bool> {
    learning_rate: A,
    momentum: f64,
    state: Option<OptimizerState<A>>,
}

/// The scalars one [`SgdMomentum`] step uses.
#[derive(Clone, Copy, PartialEq)]
pub struct SgdMomentumConstants<A, const NESTEROV: bool> {
    /// `-lr`.
    pub neg_lr: A,
    /// `mu`, rounded once.
    pub mu: A,
}

/// The type's own name, `Momentum` or `Nesterov`.
const fn type_name(nesterov: bool) -> &'static str {
    if nesterov { "Nesterov" } else { "Momentum" }
}

impl<A: fmt::Debug, const NESTEROV: bool> fmt::Debug for SgdMomentum<A, NESTEROV> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(type_name(NESTEROV))
            .field("learning_rate", &self.learning_rate)
            .field("momentum", &self.momentum)
            .field("state", &self.state)
            .finish()
    }
}

impl<A: fmt::Debug, const NESTEROV: bool> fmt::Debug for SgdMomentumConstants<A, NESTEROV> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if NESTEROV {
            "NesterovConstants"
        } else {
            "MomentumConstants"
        };
        f.debug_struct(name)
            .field("neg_lr", &self.neg_lr)
            .field("mu", &self.mu)
            .finish()
    }
}

impl<A: FloatElement, const NESTEROV: bool> SgdMomentum<A, NESTEROV> {
    /// The stable kind.
    pub const KIND: UpdateKind = if NESTEROV {
        UpdateKind::Nesterov
    } else {
        UpdateKind::Momentum
    };
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
    pub fn constants(&self, _count: i32) -> SgdMomentumConstants<A, NESTEROV> {
        SgdMomentumConstants {
            neg_lr: -self.learning_rate,
            mu: A::from_f64_rounded(self.momentum),
        }
    }

    pub(crate) fn initial_values(&self) -> Vec<A> {
        vec![A::zero()]
    }
}

impl<A: FloatElement, const NESTEROV: bool> SgdMomentumConstants<A, NESTEROV> {
    /// The step as element-wise operations.
    pub fn program(self) -> UpdateProgram<A> {
        let mut b = ProgramBuilder::new();
        let mu = b.constant("mu", self.mu);
        let decayed = b.mul(mu, Operand::Slot(0));
        let trace = b.add(Operand::Grad, decayed);
        let direction = if NESTEROV {
            let ahead = b.mul(mu, trace);
            b.add(Operand::Grad, ahead)
        } else {
            trace
        };
        let p = b.apply_step(self.neg_lr, direction);
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
                SgdMomentum::<A, NESTEROV>::KIND.as_str(),
                1,
                slots.len(),
            ));
        };
        let SgdMomentumConstants { neg_lr, mu } = self;
        Ok(target.map1(g, trace, move |p, g, m| {
            *m = g + mu * *m;
            let direction = if NESTEROV { g + mu * *m } else { *m };
            p + neg_lr * direction
        }))
    }
}

impl_optimizer!(Momentum);
impl_optimizer!(Nesterov);
