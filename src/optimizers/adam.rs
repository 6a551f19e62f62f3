//! Adam, optax's `adam(learning_rate)`.

use super::error::Result;
use crate::optimizers::kernel::{Target, Written, wrong_slot_count};
use crate::optimizers::macros::impl_optimizer;
use crate::optimizers::program::{Operand, ProgramBuilder, UpdateProgram};
use crate::optimizers::{
    FloatElement, HyperParameter, HyperParameters, OptimizerState, UpdateKind,
};

/// Adam (Kingma & Ba) in optax's op order:
///
/// ```text
/// mu = (1-b1) * g + b1 * mu
/// nu = (1-b2) * (g*g) + b2 * nu
/// t  = t + 1                                  (int32, saturating)
/// mu_hat = mu * (1 / (1 - b1^t))
/// nu_hat = nu * (1 / (1 - b2^t))
/// d  = mu_hat / (sqrt(nu_hat + eps_root) + eps)
/// p  = p + (-lr) * d
/// ```
///
/// State: `mu`, `nu` (initially 0, stored without bias correction) and the
/// count. Defaults: `b1` 0.9, `b2` 0.999, `eps` 1e-8 (outside the square
/// root), `eps_root` 0.
#[derive(Debug, Clone)]
pub struct Adam<A> {
    learning_rate: A,
    b1: f64,
    b2: f64,
    eps: f64,
    eps_root: f64,
    state: Option<OptimizerState<A>>,
}

/// The scalars one Adam step uses, each rounded once from `f64` (the bias
/// corrections from the correctly rounded `b^t`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConstants<A> {
    /// `-lr`.
    pub neg_lr: A,
    /// `b1`.
    pub b1: A,
    /// `1 - b1`, computed in `f64`.
    pub one_minus_b1: A,
    /// `b2`.
    pub b2: A,
    /// `1 - b2`, computed in `f64`.
    pub one_minus_b2: A,
    /// `1 / (1 - b1^t)`, each operation in the element type.
    pub inv_bias_correction1: A,
    /// `1 / (1 - b2^t)`, each operation in the element type.
    pub inv_bias_correction2: A,
    /// `eps`, added outside the square root.
    pub eps: A,
    /// `eps_root`, added inside the square root.
    pub eps_root: A,
}

impl<A: FloatElement> AdamConstants<A> {
    /// The constants for step `count` of Adam with the given hyper-parameters.
    pub fn new(lr: A, b1: f64, b2: f64, eps: f64, eps_root: f64, count: i32) -> Self {
        let b1r = A::from_f64_rounded(b1);
        let b2r = A::from_f64_rounded(b2);
        Self {
            neg_lr: -lr,
            b1: b1r,
            one_minus_b1: A::from_f64_rounded(1.0 - b1),
            b2: b2r,
            one_minus_b2: A::from_f64_rounded(1.0 - b2),
            inv_bias_correction1: A::one() / (A::one() - b1r.pow_rounded(count)),
            inv_bias_correction2: A::one() / (A::one() - b2r.pow_rounded(count)),
            eps: A::from_f64_rounded(eps),
            eps_root: A::from_f64_rounded(eps_root),
        }
    }

    /// Appends the moment updates and the Adam direction to `b`; returns
    /// (new mu, new nu, direction).
    pub(crate) fn build_direction(&self, b: &mut ProgramBuilder<A>) -> (Operand, Operand, Operand) {
        let (one_minus_b1, b1) = (
            b.constant("one_minus_b1", self.one_minus_b1),
            b.constant("b1", self.b1),
        );
        let (one_minus_b2, b2) = (
            b.constant("one_minus_b2", self.one_minus_b2),
            b.constant("b2", self.b2),
        );
        let inv_bc1 = b.constant("inv_bias_correction1", self.inv_bias_correction1);
        let inv_bc2 = b.constant("inv_bias_correction2", self.inv_bias_correction2);
        let (eps, eps_root) = (
            b.constant("eps", self.eps),
            b.constant("eps_root", self.eps_root),
        );
        let new_g = b.mul(one_minus_b1, Operand::Grad);
        let old_mu = b.mul(b1, Operand::Slot(0));
        let mu = b.add(new_g, old_mu);
        let g2 = b.mul(Operand::Grad, Operand::Grad);
        let new_g2 = b.mul(one_minus_b2, g2);
        let old_nu = b.mul(b2, Operand::Slot(1));
        let nu = b.add(new_g2, old_nu);
        let mu_hat = b.mul(mu, inv_bc1);
        let nu_hat = b.mul(nu, inv_bc2);
        let shifted = b.add(nu_hat, eps_root);
        let root = b.sqrt(shifted);
        let denominator = b.add(root, eps);
        let d = b.div(mu_hat, denominator);
        (mu, nu, d)
    }

    /// The step as element-wise operations.
    pub fn program(self) -> UpdateProgram<A> {
        let mut b = ProgramBuilder::new();
        let (mu, nu, d) = self.build_direction(&mut b);
        let p = b.apply_step(self.neg_lr, d);
        b.finish(p, vec![mu, nu])
    }

    /// The moment updates and the Adam direction `d` for one element.
    #[inline(always)]
    pub(crate) fn direction(&self, g: A, mu: &mut A, nu: &mut A) -> A {
        *mu = self.one_minus_b1 * g + self.b1 * *mu;
        *nu = self.one_minus_b2 * (g * g) + self.b2 * *nu;
        let mu_hat = *mu * self.inv_bias_correction1;
        let nu_hat = *nu * self.inv_bias_correction2;
        mu_hat / ((nu_hat + self.eps_root).sqrt() + self.eps)
    }

    pub(crate) fn apply(
        self,
        target: Target<'_, A>,
        g: &[A],
        slots: &mut [&mut [A]],
    ) -> Result<Written> {
        let [mu, nu] = slots else {
            return Err(wrong_slot_count(UpdateKind::Adam.as_str(), 2, slots.len()));
        };
        Ok(target.map2(g, mu, nu, move |p, g, mu, nu| {
            let d = self.direction(g, mu, nu);
            p + self.neg_lr * d
        }))
    }
}

impl<A: FloatElement> Adam<A> {
    /// The stable kind.
    pub const KIND: UpdateKind = UpdateKind::Adam;
    /// The state slots, optax's names.
    pub const SLOTS: &'static [&'static str] = &["mu", "nu"];

    /// Adam with learning rate `lr` and optax's defaults.
    pub fn new(lr: A) -> Self {
        Self {
            learning_rate: lr,
            b1: 0.9,
            b2: 0.999,
            eps: 1e-8,
            eps_root: 0.0,
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

    /// The hyper-parameters: `learning_rate`, `b1`, `b2`, `eps`, `eps_root`.
    pub fn hyper_parameters(&self) -> HyperParameters {
        smallvec::smallvec![
            HyperParameter::new("learning_rate", self.learning_rate.as_f64()),
            HyperParameter::new("b1", self.b1),
            HyperParameter::new("b2", self.b2),
            HyperParameter::new("eps", self.eps),
            HyperParameter::new("eps_root", self.eps_root),
        ]
    }

    /// The scalars the step with `count` (the incremented count) uses.
    pub fn constants(&self, count: i32) -> AdamConstants<A> {
        AdamConstants::new(
            self.learning_rate,
            self.b1,
            self.b2,
            self.eps,
            self.eps_root,
            count,
        )
    }

    pub(crate) fn initial_values(&self) -> Vec<A> {
        vec![A::zero(), A::zero()]
    }
}

impl_optimizer!(Adam);
