//! The boilerplate every built-in optimizer shares: inherent methods, the
//! [`UpdateRule`](crate::optimizers::UpdateRule) and
//! [`Optimizer`](crate::Optimizer) impls, all delegating to the kernel
//! driver in `kernel.rs`.

/// Implements the shared inherent methods, [`crate::optimizers::UpdateRule`]
/// and [`crate::Optimizer`] for an optimizer type that has the fields
/// `learning_rate` and `state`, the associated consts `KIND` and `SLOTS`,
/// and the methods `initial_values`, `hyper_parameters` and
/// `constants(count)` whose result has `apply(target, grads, slots)`.
macro_rules! impl_optimizer {
    ($ty:ident) => {
        impl<A: $crate::optimizers::FloatElement> $ty<A> {
            /// The learning rate the next step will use.
            pub fn learning_rate(&self) -> A {
                self.learning_rate
            }

            /// Sets the learning rate for the following steps.
            pub fn set_learning_rate(&mut self, lr: A) {
                self.learning_rate = lr;
            }

            /// The stable name (optax's function name).
            pub fn name(&self) -> &'static str {
                Self::KIND.as_str()
            }

            /// Drops the state; the next step starts over at count 0.
            pub fn reset(&mut self) {
                self.state = None;
            }

            /// One update; returns the new params. See [`crate::Optimizer::step`].
            pub fn step<D: ::ndarray::Dimension>(
                &mut self,
                params: &::ndarray::Array<A, D>,
                grads: &::ndarray::Array<A, D>,
            ) -> $crate::optimizers::Result<::ndarray::Array<A, D>> {
                let c = self.constants($crate::optimizers::kernel::next_count(&self.state));
                let initial = self.initial_values();
                $crate::optimizers::kernel::run_step(
                    Self::KIND.as_str(),
                    &mut self.state,
                    Self::SLOTS,
                    &initial,
                    params,
                    grads,
                    |target, g, slots| c.apply(target, g, slots),
                )
            }

            /// One update that overwrites `params`. See
            /// [`crate::Optimizer::step_in_place`].
            pub fn step_in_place<D: ::ndarray::Dimension>(
                &mut self,
                params: &mut ::ndarray::Array<A, D>,
                grads: &::ndarray::Array<A, D>,
            ) -> $crate::optimizers::Result<()> {
                let c = self.constants($crate::optimizers::kernel::next_count(&self.state));
                let initial = self.initial_values();
                $crate::optimizers::kernel::run_step_in_place(
                    Self::KIND.as_str(),
                    &mut self.state,
                    Self::SLOTS,
                    &initial,
                    params,
                    grads,
                    |target, g, slots| c.apply(target, g, slots),
                )
            }
        }

        impl<A: $crate::optimizers::FloatElement> $crate::optimizers::UpdateRule<A> for $ty<A> {
            fn update_kind(&self) -> $crate::optimizers::UpdateKind {
                Self::KIND
            }

            fn hyper_parameters(&self) -> $crate::optimizers::HyperParameters {
                $ty::hyper_parameters(self)
            }

            fn update_program(&self, count: i32) -> $crate::optimizers::UpdateProgram<A> {
                self.constants(count).program()
            }

            fn slot_names(&self) -> &'static [&'static str] {
                Self::SLOTS
            }

            fn initial_slot_values(&self) -> Vec<A> {
                self.initial_values()
            }

            fn state(&self) -> Option<&$crate::optimizers::OptimizerState<A>> {
                self.state.as_ref()
            }

            fn take_state(&mut self) -> Option<$crate::optimizers::OptimizerState<A>> {
                self.state.take()
            }

            fn set_state(
                &mut self,
                state: $crate::optimizers::OptimizerState<A>,
            ) -> $crate::optimizers::Result<()> {
                self.state = Some($crate::optimizers::kernel::validate_state(
                    Self::KIND.as_str(),
                    Self::SLOTS,
                    state,
                )?);
                Ok(())
            }
        }

        impl<A: $crate::optimizers::FloatElement, D: ::ndarray::Dimension> $crate::Optimizer<A, D>
            for $ty<A>
        {
            fn step(
                &mut self,
                params: &::ndarray::Array<A, D>,
                grads: &::ndarray::Array<A, D>,
            ) -> $crate::optimizers::Result<::ndarray::Array<A, D>> {
                $ty::step(self, params, grads)
            }

            fn step_in_place(
                &mut self,
                params: &mut ::ndarray::Array<A, D>,
                grads: &::ndarray::Array<A, D>,
            ) -> $crate::optimizers::Result<()> {
                $ty::step_in_place(self, params, grads)
            }

            fn learning_rate(&self) -> A {
                self.learning_rate
            }

            fn set_learning_rate(&mut self, lr: A) {
                self.learning_rate = lr;
            }

            fn name(&self) -> &str {
                Self::KIND.as_str()
            }

            fn reset(&mut self) {
                self.state = None;
            }

            fn update_rule(&self) -> Option<&dyn $crate::optimizers::UpdateRule<A>> {
                Some(self)
            }
        }
    };
}

pub(crate) use impl_optimizer;
