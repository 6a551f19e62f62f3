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
//! Every step is a single fused pass over the params, grads and state (see
//! [`kernel`]); `step_in_place` additionally skips the output allocation.
//!
//! [`FloatElement`]: crate::optimizer::FloatElement
//! [`Optimizer`]: crate::Optimizer
//! [`UpdateRule`]: crate::optimizer::UpdateRule

pub(crate) mod kernel;

mod adagrad;
mod adam;
mod adamw;
mod momentum;
mod nesterov;
mod rmsprop;
mod sgd;

pub use adagrad::{Adagrad, AdagradConstants};
pub use adam::{Adam, AdamConstants};
pub use adamw::{AdamW, AdamWConstants};
pub use kernel::CHUNK;
pub use momentum::{Momentum, MomentumConstants};
pub use nesterov::{Nesterov, NesterovConstants};
pub use rmsprop::{RMSProp, RMSPropConstants};
pub use sgd::{SGD, SgdConstants};

#[cfg(test)]
mod tests;
