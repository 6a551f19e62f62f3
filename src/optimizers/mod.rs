//! The built-in optimizers, with optax's defaults and float32 numerics.
//!
//! | type | optax | state slots |
//! |---|---|---|
//! | [`SGD`] | `sgd(lr)` | — |
//! | [`Momentum`] | `sgd(lr, momentum=mu)` | `trace` |
//! | [`Nesterov`] | `sgd(lr, momentum=mu, nesterov=True)` | `trace` |
//! | [`Adam`] | `adam(lr)` | `mu`, `nu` |
//! | [`AdamW`] | `adamw(lr, weight_decay=wd)` | `mu`, `nu` |
//! | [`RMSProp`] | `rmsprop(lr)` | `nu` |
//! | [`Adagrad`] | `adagrad(lr)` | `sum_of_squares` |
//!
//! Each is generic over the element type ([`FloatElement`]: `f32`, `f64`)
//! and implements [`Optimizer`] for every dimension, plus [`UpdateRule`]. Each
//! also exposes `constants(count)`: the exact scalars (already rounded to the
//! element type) that the step with that count multiplies by, so a compiler
//! can rebuild the same update bit for bit.
//!
//! ```
//! use ndarray::array;
//! use optirs_tpu::optimizers::UpdateRule;
//! use optirs_tpu::optimizers::Adam;
//!
//! let mut adam = Adam::new(1e-3f32).with_betas(0.9, 0.95);
//! let params = array![1.0f32, -2.0];
//! let params = adam.step(&params, &array![0.5f32, -0.5])?;
//! // The first bias-corrected Adam step moves each element by about lr.
//! assert!((params[0] - 0.999).abs() < 1e-6 && (params[1] + 1.999).abs() < 1e-6);
//! assert_eq!(adam.state().map(|s| s.count), Some(1));
//! assert_eq!(adam.hyper_parameters()[2].value, 0.95); // b2
//! # Ok::<(), optirs_tpu::OptimError>(())
//! ```
//!
//! Every step is a single fused pass over the params, grads and state,
//! parallel over [`CHUNK`]-element chunks; `step_in_place` also skips the
//! output allocation. Measured against a hand-written loop in
//! `docs/benchmarks-optimizers.md`.
//!
//! [`FloatElement`]: crate::optimizers::FloatElement
//! [`Optimizer`]: crate::Optimizer
//! [`UpdateRule`]: crate::optimizers::UpdateRule

pub mod error;
pub(crate) mod kernel;
mod macros;
mod optimizer;
pub mod program;

mod adagrad;
mod adam;
mod adamw;
mod momentum;
mod rmsprop;
mod sgd;

pub use adagrad::{Adagrad, AdagradConstants};
pub use adam::{Adam, AdamConstants};
pub use adamw::{AdamW, AdamWConstants};
pub use error::{OptimizerError, Result};
pub use kernel::CHUNK;
pub use momentum::{
    Momentum, MomentumConstants, Nesterov, NesterovConstants, SgdMomentum, SgdMomentumConstants,
};
pub use optimizer::{
    ElementOp, FloatElement, HyperParameter, HyperParameters, Operand, Optimizer, OptimizerState,
    StateSlot, UpdateKind, UpdateProgram, UpdateRule, check_same_shape,
};
pub use rmsprop::{RMSProp, RMSPropConstants};
pub use sgd::{SGD, SgdConstants};

#[cfg(test)]
mod tests;

/// The seven built-in optimizers' names, as [`by_name`] takes them.
pub const NAMES: [&str; 7] = [
    "sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "adagrad",
];

/// The built-in update rule `name` names (case-insensitive).
pub fn kind_by_name(name: &str) -> Result<UpdateKind> {
    let kind = UpdateKind::ALL
        .into_iter()
        .find(|k| k.as_str() == name.to_ascii_lowercase())
        .ok_or_else(|| OptimizerError::Unknown {
            name: name.to_owned(),
            known: NAMES.join(", "),
        })?;
    Ok(kind)
}

/// A built-in optimizer by name (case-insensitive) with learning rate `lr`
/// and optax's default hyper-parameters otherwise (momentum and Nesterov
/// 0.9, AdamW weight decay 1e-4).
pub fn by_name<A: FloatElement>(
    name: &str,
    lr: A,
) -> Result<Box<dyn Optimizer<A, ndarray::IxDyn> + Send + Sync>> {
    Ok(of_kind(kind_by_name(name)?, lr))
}

/// What one element of a built-in optimizer's update costs: the state
/// slots it keeps, the floating-point operations of its update program
/// (each element-wise op one FLOP per element, as XLA's `HloCostAnalysis`
/// counts them) and the bytes it reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct UpdateCost {
    /// The optimizer (`adam`).
    pub name: &'static str,
    /// State slots per parameter.
    pub slots: usize,
    /// Operations per element of its update program (the step counted
    /// once its bias corrections are constants).
    pub flops_per_element: u64,
}

impl UpdateCost {
    /// The cost of `kind`'s update.
    pub fn of(kind: UpdateKind) -> UpdateCost {
        let optimizer = of_kind::<f32>(kind, 1e-3);
        let (slots, flops) = optimizer.update_rule().map_or((0, 0), |rule| {
            (
                rule.slot_names().len(),
                rule.update_program(1).ops.len() as u64,
            )
        });
        UpdateCost {
            name: kind.as_str(),
            slots,
            flops_per_element: flops,
        }
    }

    /// Bytes per element of `elem_bytes` the update moves: it reads the
    /// parameter, the gradient and every slot and writes the parameter and
    /// every slot.
    pub fn bytes_per_element(&self, elem_bytes: u64) -> u64 {
        (3 + 2 * self.slots as u64) * elem_bytes
    }
}

/// The built-in optimizer of `kind` with learning rate `lr` (see [`by_name`]).
fn of_kind<A: FloatElement>(
    kind: UpdateKind,
    lr: A,
) -> Box<dyn Optimizer<A, ndarray::IxDyn> + Send + Sync> {
    type Boxed<A> = Box<dyn Optimizer<A, ndarray::IxDyn> + Send + Sync>;
    let opt: Boxed<A> = match kind {
        UpdateKind::Sgd => Box::new(SGD::new(lr)),
        UpdateKind::Momentum => Box::new(Momentum::new(lr, 0.9)),
        UpdateKind::Nesterov => Box::new(Nesterov::new(lr, 0.9)),
        UpdateKind::Adam => Box::new(Adam::new(lr)),
        UpdateKind::AdamW => Box::new(AdamW::new(lr, 1e-4)),
        UpdateKind::RmsProp => Box::new(RMSProp::new(lr)),
        UpdateKind::Adagrad => Box::new(Adagrad::new(lr)),
    };
    opt
}
