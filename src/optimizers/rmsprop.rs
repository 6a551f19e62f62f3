//! RMSProp, optax's `rmsprop(learning_rate)`.

use super::error::Result;
use crate::optimizers::kernel::{Target, Written, wrong_slot_count};
use crate::optimizers::macros::impl_optimizer;
use crate::optimizers::program::{Operand, ProgramBuilder, UpdateProgram};
use crate::optimizers::{
    FloatElement, HyperParameter, HyperParameters, OptimizerState, UpdateKind,
};

/// RMSProp (Tieleman & Hinton), optax's default form: eps inside the
/// square root, no bias correction, not centred, no momentum.
///
/// ```text
/// nu = (1-decay) * (g*g) + decay * nu
/// d  = g * rsqrt(nu + eps)
/// p  = p + (-lr) * d
/// ```
///
/// State: `nu` (initially `initial_scale`). Defaults: `decay` 0.9, `eps`
/// 1e-8, `initial_scale` 0 — so the first step is about `3.16 * lr` per
/// element whatever the gradient's magnitude.
#[derive(Debug, Clone)]
pub struct RMSProp<A> {
    learning_rate: A,
    decay: f64,
    eps: f64,
    initial_scale: f64,
    state: Option<OptimizerState<A>>,
}

/// The scalars one RMSProp step uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RMSPropConstants<A> {
    /// `-lr`.
    pub neg_lr: A,
    /// `decay`.
    pub decay: A,
    /// `1 - decay`, computed in `f64`.
    pub one_minus_decay: A,
    /// `eps`, added inside the square root.
    pub eps: A,
}

impl<A: FloatElement> RMSPropConstants<A> {
    /// The step as element-wise operations.
    pub fn program(self) -> UpdateProgram<A> {
        let mut b = ProgramBuilder::new();
        let one_minus_decay = b.constant("one_minus_decay", self.one_minus_decay);
        let decay = b.constant("decay", self.decay);
        let eps = b.constant("eps", self.eps);
        let g2 = b.mul(Operand::Grad, Operand::Grad);
        let new_g2 = b.mul(one_minus_decay, g2);
        let old_nu = b.mul(decay, Operand::Slot(0));
        let nu = b.add(new_g2, old_nu);
        let shifted = b.add(nu, eps);
        let scale = b.rsqrt(shifted);
        let d = b.mul(Operand::Grad, scale);
        let p = b.apply_step(self.neg_lr, d);
        b.finish(p, vec![nu])
    }

    pub(crate) fn apply(
        self,
        target: Target<'_, A>,
        g: &[A],
        slots: &mut [&mut [A]],
    ) -> Result<Written> {
        let [nu] = slots else {
            return Err(wrong_slot_count(
                UpdateKind::RmsProp.as_str(),
                1,
                slots.len(),
            ));
        };
        let RMSPropConstants {
            neg_lr,
            decay,
            one_minus_decay,
            eps,
        } = self;
        Ok(target.map1(g, nu, move |p, g, nu| {
            *nu = one_minus_decay * (g * g) + decay * *nu;
            let d = g * (*nu + eps).rsqrt();
            p + neg_lr * d
        }))
    }
}

impl<A: FloatElement> RMSProp<A> {
    /// The stable kind.
    pub const KIND: UpdateKind = UpdateKind::RmsProp;
    /// The state slots, optax's names.
    pub const SLOTS: &'static [&'static str] = &["nu"];

    /// RMSProp with learning rate `lr` and optax's defaults.
    pub fn new(lr: A) -> Self {
        Self {
            learning_rate: lr,
            decay: 0.9,
            eps: 1e-8,
            initial_scale: 0.0,
            state: None,
        }
    }

    /// Changes the decay rate of the squared-gradient average.
    #[must_use]
    pub fn with_decay(mut self, decay: f64) -> Self {
        self.decay = decay;
        self
    }

    /// Changes `eps`, added inside the square root.
    #[must_use]
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Changes the initial value of `nu`.
    #[must_use]
    pub fn with_initial_scale(mut self, initial_scale: f64) -> Self {
        self.initial_scale = initial_scale;
        self
    }

    /// The hyper-parameters: `learning_rate`, `decay`, `eps`, `initial_scale`.
    pub fn hyper_parameters(&self) -> HyperParameters {
        smallvec::smallvec![
            HyperParameter::new("learning_rate", self.learning_rate.as_f64()),
            HyperParameter::new("decay", self.decay),
            HyperParameter::new("eps", self.eps),
            HyperParameter::new("initial_scale", self.initial_scale),
        ]
    }

    /// The scalars the step with `count` uses (independent of the count).
    pub fn constants(&self, _count: i32) -> RMSPropConstants<A> {
        RMSPropConstants {
            neg_lr: -self.learning_rate,
            decay: A::from_f64_rounded(self.decay),
            one_minus_decay: A::from_f64_rounded(1.0 - self.decay),
            eps: A::from_f64_rounded(self.eps),
        }
    }

    pub(crate) fn initial_values(&self) -> Vec<A> {
        vec![A::from_f64_rounded(self.initial_scale)]
    }
}

impl_optimizer!(RMSProp);
