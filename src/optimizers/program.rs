//! An optimizer's per-element update written out as straight-line code, so a
//! graph compiler can rebuild it op for op.
//!
//! Bit-exactness against optax depends on the order of operations (`(1-b1)*g
//! + b1*mu`, not a fused multiply-add; `mu * (1/(1-b1^t))`, not a division),
//! so the description is not "Adam with these hyper-parameters" but the exact
//! sequence of float operations the kernel performs, with the scalars it
//! uses. [`UpdateProgram::eval`] interprets it one element at a time; the
//! optimizer tests check it against `step` bit for bit.
//!
//! Non-goals: control flow, reductions, anything that is not element-wise.

use crate::optimizers::FloatElement;

/// A value an operation reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operand {
    /// The parameter element before the step.
    Param,
    /// The gradient element.
    Grad,
    /// State slot `i` before the step (in `UpdateRule::slot_names` order).
    Slot(usize),
    /// Scalar `i` of [`UpdateProgram::constants`].
    Constant(usize),
    /// The result of operation `i` of [`UpdateProgram::ops`].
    Value(usize),
}

/// One element-wise operation, rounded to the element type after each op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementOp {
    /// `a + b`.
    Add(Operand, Operand),
    /// `a * b`.
    Mul(Operand, Operand),
    /// `a / b`.
    Div(Operand, Operand),
    /// `sqrt(a)`.
    Sqrt(Operand),
    /// Correctly rounded `1 / sqrt(a)` ([`FloatElement::rsqrt`]).
    Rsqrt(Operand),
    /// `if test > 0 { then } else { otherwise }` (false for NaN).
    SelectPositive {
        /// Compared with zero.
        test: Operand,
        /// Taken when `test > 0`.
        then: Operand,
        /// Taken otherwise, including NaN.
        otherwise: Operand,
    },
}

/// The update of one element: new param and new state slots from the old
/// ones, the gradient and named scalars.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateProgram<A> {
    /// Named scalars, already rounded to the element type (for Adam they
    /// include the bias corrections of this step's count).
    pub constants: Vec<(&'static str, A)>,
    /// Operations in execution order; operation `i` defines `Value(i)`.
    pub ops: Vec<ElementOp>,
    /// The new parameter.
    pub new_param: Operand,
    /// The new value of each state slot, in slot order.
    pub new_slots: Vec<Operand>,
}

impl<A: FloatElement> UpdateProgram<A> {
    /// Interprets the program for one element. `slots` holds the old slot
    /// values in slot order; returns the new param and the new slot values.
    /// An operand that refers past the end of `slots`, the constants or the
    /// values defined so far reads as NaN.
    pub fn eval(&self, param: A, grad: A, slots: &[A]) -> (A, Vec<A>) {
        let mut values: Vec<A> = Vec::with_capacity(self.ops.len());
        let read = |values: &[A], operand: Operand| -> A {
            let found = match operand {
                Operand::Param => Some(param),
                Operand::Grad => Some(grad),
                Operand::Slot(i) => slots.get(i).copied(),
                Operand::Constant(i) => self.constants.get(i).map(|&(_, c)| c),
                Operand::Value(i) => values.get(i).copied(),
            };
            found.unwrap_or_else(A::nan)
        };
        for op in &self.ops {
            let v = match *op {
                ElementOp::Add(a, b) => read(&values, a) + read(&values, b),
                ElementOp::Mul(a, b) => read(&values, a) * read(&values, b),
                ElementOp::Div(a, b) => read(&values, a) / read(&values, b),
                ElementOp::Sqrt(a) => read(&values, a).sqrt(),
                ElementOp::Rsqrt(a) => read(&values, a).rsqrt(),
                ElementOp::SelectPositive {
                    test,
                    then,
                    otherwise,
                } => {
                    if read(&values, test) > A::zero() {
                        read(&values, then)
                    } else {
                        read(&values, otherwise)
                    }
                }
            };
            values.push(v);
        }
        let new_slots = self.new_slots.iter().map(|&o| read(&values, o)).collect();
        (read(&values, self.new_param), new_slots)
    }
}

/// Appends operations and constants; each call returns the operand that
/// names its result.
#[derive(Debug)]
pub(crate) struct ProgramBuilder<A> {
    constants: Vec<(&'static str, A)>,
    ops: Vec<ElementOp>,
}

impl<A: FloatElement> ProgramBuilder<A> {
    pub(crate) fn new() -> Self {
        Self {
            constants: Vec::new(),
            ops: Vec::new(),
        }
    }

    pub(crate) fn constant(&mut self, name: &'static str, value: A) -> Operand {
        self.constants.push((name, value));
        Operand::Constant(self.constants.len() - 1)
    }

    fn push(&mut self, op: ElementOp) -> Operand {
        self.ops.push(op);
        Operand::Value(self.ops.len() - 1)
    }

    pub(crate) fn add(&mut self, a: Operand, b: Operand) -> Operand {
        self.push(ElementOp::Add(a, b))
    }

    pub(crate) fn mul(&mut self, a: Operand, b: Operand) -> Operand {
        self.push(ElementOp::Mul(a, b))
    }

    pub(crate) fn div(&mut self, a: Operand, b: Operand) -> Operand {
        self.push(ElementOp::Div(a, b))
    }

    pub(crate) fn sqrt(&mut self, a: Operand) -> Operand {
        self.push(ElementOp::Sqrt(a))
    }

    pub(crate) fn rsqrt(&mut self, a: Operand) -> Operand {
        self.push(ElementOp::Rsqrt(a))
    }

    pub(crate) fn select_positive(
        &mut self,
        test: Operand,
        then: Operand,
        otherwise: Operand,
    ) -> Operand {
        self.push(ElementOp::SelectPositive {
            test,
            then,
            otherwise,
        })
    }

    /// `p + (-lr) * d`, the step every optimizer ends with.
    pub(crate) fn apply_step(&mut self, neg_lr: A, direction: Operand) -> Operand {
        let neg_lr = self.constant("neg_lr", neg_lr);
        let u = self.mul(neg_lr, direction);
        self.add(Operand::Param, u)
    }

    pub(crate) fn finish(self, new_param: Operand, new_slots: Vec<Operand>) -> UpdateProgram<A> {
        UpdateProgram {
            constants: self.constants,
            ops: self.ops,
            new_param,
            new_slots,
        }
    }
}
