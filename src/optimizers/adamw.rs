//! AdamW, optax's `adamw(learning_rate, weight_decay=wd)`.

use super::error::Result;
use crate::optimizers::adam::AdamConstants;
use crate::optimizers::kernel::{Target, Written, wrong_slot_count};
use crate::optimizers::macros::impl_optimizer;
use crate::optimizers::program::{Operand, ProgramBuilder, UpdateProgram};
use crate::optimizers::{
    FloatElement, HyperParameter, HyperParameters, OptimizerState, UpdateKind,
};

/// Adam with decoupled weight decay (Loshchilov & Hutter), optax's order:
/// the Adam direction `d` as in [`Adam`](crate::optimizers::Adam), then
///
/// ```text
/// d = d + wd * p        (p before this step; every element, no mask)
/// p = p + (-lr) * d     (so the decay is scaled by lr, PyTorch's form)
/// ```
///
/// State: `mu`, `nu` and the count. Defaults as Adam; optax's default
/// `weight_decay` is 1e-4.
#[derive(Debug, Clone)]
pub struct AdamW<A> {
    learning_rate: A,
    b1: f64,
    b2: f64,
    eps: f64,
    eps_root: f64,
    weight_decay: f64,
    state: Option<OptimizerState<A>>,
}

/// The scalars one AdamW step uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConstants<A> {
    /// The Adam part.
    pub adam: AdamConstants<A>,
    /// `weight_decay`, rounded once.
    pub weight_decay: A,
}

impl<A: FloatElement> AdamWConstants<A> {
    /// The step as element-wise operations.
    pub fn program(self) -> UpdateProgram<A> {
        let mut b = ProgramBuilder::new();
        let (mu, nu, d) = self.adam.build_direction(&mut b);
        let wd = b.constant("weight_decay", self.weight_decay);
        let decay = b.mul(wd, Operand::Param);
        let d = b.add(d, decay);
        let p = b.apply_step(self.adam.neg_lr, d);
        b.finish(p, vec![mu, nu])
    }

    pub(crate) fn apply(
        self,
        target: Target<'_, A>,
        g: &[A],
        slots: &mut [&mut [A]],
    ) -> Result<Written> {
        let [mu, nu] = slots else {
            return Err(wrong_slot_count(UpdateKind::AdamW.as_str(), 2, slots.len()));
        };
        let AdamWConstants { adam, weight_decay } = self;
        Ok(target.map2(g, mu, nu, move |p, g, mu, nu| {
            let d = adam.direction(g, mu, nu) + weight_decay * p;
            p + adam.neg_lr * d
        }))
    }
}

impl<A: FloatElement> AdamW<A> {
    /// The stable kind.
    pub const KIND: UpdateKind = UpdateKind::AdamW;
    /// The state slots, optax's names.
    pub const SLOTS: &'static [&'static str] = &["mu", "nu"];

    /// AdamW with learning rate `lr`, decay `weight_decay`, Adam's defaults.
    pub fn new(lr: A, weight_decay: f64) -> Self {
        Self {
            learning_rate: lr,
            b1: 0.9,
            b2: 0.999,
            eps: 1e-8,
            eps_root: 0.0,
            weight_decay,
            state: None,
        }
    }

    /// Changes the decay rates of the first and second moments.
    #[must_use]
    pub fn with_betas(mut self, b1: f64, b2: f64) -> Self {
        self.b1 = b1;
        self.b2 = b2;
        self
    }

    /// Changes `eps`, added outside the square root.
    #[must_use]
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Changes `eps_root`, added inside the square root.
    #[must_use]
    pub fn with_eps_root(mut self, eps_root: f64) -> Self {
        self.eps_root = eps_root;
        self
    }

    /// Changes the weight decay.
    #[must_use]
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// The hyper-parameters: `learning_rate`, `b1`, `b2`, `eps`, `eps_root`,
    /// `weight_decay`.
    pub fn hyper_parameters(&self) -> HyperParameters {
        smallvec::smallvec![
            HyperParameter::new("learning_rate", self.learning_rate.as_f64()),
            HyperParameter::new("b1", self.b1),
            HyperParameter::new("b2", self.b2),
            HyperParameter::new("eps", self.eps),
            HyperParameter::new("eps_root", self.eps_root),
            HyperParameter::new("weight_decay", self.weight_decay),
        ]
    }

    /// The scalars the step with `count` (the incremented count) uses.
    pub fn constants(&self, count: i32) -> AdamWConstants<A> {
        AdamWConstants {
            adam: AdamConstants::new(
                self.learning_rate,
                self.b1,
                self.b2,
                self.eps,
                self.eps_root,
                count,
            ),
            weight_decay: A::from_f64_rounded(self.weight_decay),
        }
    }

    pub(crate) fn initial_values(&self) -> Vec<A> {
        vec![A::zero(), A::zero()]
    }
}

impl_optimizer!(AdamW);
