//! An optimizer's update as a compiler graph.
//!
//! [`build_update_graph`] turns [`UpdateRule::update_program`] into a
//! program op for op, in optax's order and with the program's own rounded
//! scalars, so the compiled step is the same float operations as
//! `Optimizer::step` and matches it bit for bit:
//!
//! * parameters: `0` params, `1` grads, `2..2+k` the state slots, then the
//!   step count as an `i32` scalar (the incremented count, 1 on the first
//!   step), so one compiled program serves every step, then — for every
//!   rule that applies its step as `params + neg_lr * direction` — the
//!   negated learning rate ([`LEARNING_RATE_SCALAR`]) as a scalar of the
//!   element type, so changing the learning rate (a schedule) reuses the
//!   compiled program, as a jitted optax update takes it as an argument;
//! * outputs: the new params, then the new slots (the memory plan updates
//!   each slot in place over its input);
//! * scalars that depend on the count (Adam's `1 / (1 - b^t)`) are rebuilt
//!   from the count parameter in the kernel's prelude as `1 / (1 - round(b^t))`
//!   with `b^t` computed in `f64` and rounded once, like
//!   [`FloatElement::pow_rounded`]; every other scalar must be the same for
//!   every count, and the builder checks both against the program before it
//!   accepts the rule (otherwise the optimizer runs as a custom call);
//! * `rsqrt` is the graph's own `rsqrt`, correctly rounded like
//!   [`FloatElement::rsqrt`]; `select(test > 0, ..)` is a compare and a
//!   select.
//!
//! [`build_custom_call_graph`] wraps an optimizer that has no rule:
//! `custom_call("optirs.step", params, grads)`, run by the optimizer's own
//! `step`.

use bevy_ecs::prelude::*;

use crate::compiler::GraphBuilder;
use crate::exec::runtime::Element;
use crate::ir::{BinaryOp, CompareDir, DType, TensorType, UnaryOp};
use crate::optimizers::{ElementOp, FloatElement, Operand, UpdateProgram, UpdateRule};

/// The custom-call target of an opaque optimizer's step.
pub const STEP_TARGET: &str = "optirs.step";

/// The rule scalar passed at run time instead of compiled in: the negated
/// learning rate every rule's step applies.
pub const LEARNING_RATE_SCALAR: &str = "neg_lr";

/// The value of [`LEARNING_RATE_SCALAR`] the rule uses now, if it has one
/// (then its compiled program takes it as its last parameter).
pub fn learning_rate_scalar<A: FloatElement>(rule: &dyn UpdateRule<A>) -> Option<A> {
    rule.update_program(1)
        .constants
        .iter()
        .find(|(name, _)| *name == LEARNING_RATE_SCALAR)
        .map(|&(_, v)| v)
}

/// Counts at which the scalars of a rule are checked against the rebuilt ones.
const CHECK_COUNTS: [i32; 5] = [1, 2, 7, 1000, i32::MAX];

/// Why a rule could not be compiled as a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAGraph(pub String);

/// A count-dependent scalar, rebuilt from the count parameter.
#[derive(Debug, Clone, Copy)]
enum Scalar<A> {
    /// The same value at every count.
    Fixed(A),
    /// The same value at every count, passed at run time (the learning rate).
    Argument,
    /// `1 / (1 - round(base^t))`.
    InverseBiasCorrection { base: A },
}

fn inverse_bias_correction<A: FloatElement>(base: A, count: i32) -> A {
    A::one() / (A::one() - base.pow_rounded(count))
}

/// Classifies each scalar of the rule as fixed or rebuilt from the count.
fn scalars<A: FloatElement>(rule: &dyn UpdateRule<A>) -> Result<Vec<Scalar<A>>, NotAGraph> {
    let first = rule.update_program(1);
    let programs: Vec<UpdateProgram<A>> = CHECK_COUNTS
        .iter()
        .map(|&t| rule.update_program(t))
        .collect();
    let mut out = Vec::with_capacity(first.constants.len());
    for (i, &(name, value)) in first.constants.iter().enumerate() {
        let same = programs.iter().all(|p| {
            p.constants
                .get(i)
                .is_some_and(|&(_, v)| v.to_bits_eq(value))
        });
        if same {
            out.push(if name == LEARNING_RATE_SCALAR {
                Scalar::Argument
            } else {
                Scalar::Fixed(value)
            });
            continue;
        }
        // The bias corrections of Adam and AdamW name their base `b1`/`b2`.
        let base_name = match name {
            "inv_bias_correction1" => "b1",
            "inv_bias_correction2" => "b2",
            other => {
                return Err(NotAGraph(format!(
                    "scalar `{other}` changes with the step count in a way the graph cannot rebuild"
                )));
            }
        };
        let base = first
            .constants
            .iter()
            .find(|(n, _)| *n == base_name)
            .map(|&(_, v)| v)
            .ok_or_else(|| NotAGraph(format!("`{name}` has no `{base_name}` scalar")))?;
        let rebuilt = CHECK_COUNTS.iter().zip(&programs).all(|(&t, p)| {
            p.constants
                .get(i)
                .is_some_and(|&(_, v)| v.to_bits_eq(inverse_bias_correction(base, t)))
        });
        if !rebuilt {
            return Err(NotAGraph(format!(
                "`{name}` is not 1 / (1 - {base_name}^t) at every count"
            )));
        }
        out.push(Scalar::InverseBiasCorrection { base });
    }
    Ok(out)
}

/// Bit equality for the two float element types.
trait BitsEq {
    fn to_bits_eq(self, other: Self) -> bool;
}

impl<A: FloatElement> BitsEq for A {
    fn to_bits_eq(self, other: Self) -> bool {
        self.as_f64().to_bits() == other.as_f64().to_bits()
    }
}

/// The graph's node for each of the rule's scalars: a constant, the one
/// scalar argument (every `Argument` shares it), or `1 / (1 - base^t)`
/// computed in f64 from the step count `count`.
fn scalar_nodes<A: FloatElement>(
    b: &mut GraphBuilder<'_>,
    scalars: &[Scalar<A>],
    dtype: DType,
    count: Entity,
) -> Vec<Entity> {
    let one = b.scalar(dtype, 1.0);
    let mut t64 = None;
    let mut argument = None;
    let mut consts = Vec::with_capacity(scalars.len());
    for s in scalars {
        consts.push(match *s {
            Scalar::Fixed(v) => b.scalar(dtype, v.as_f64()),
            Scalar::Argument => {
                *argument.get_or_insert_with(|| b.parameter(TensorType::scalar(dtype)))
            }
            Scalar::InverseBiasCorrection { base } => {
                let t = *t64
                    .get_or_insert_with(|| b.node(crate::ir::Op::Convert(DType::F64), &[count]));
                let base = b.scalar(DType::F64, base.as_f64());
                let pow = b.binary(BinaryOp::Pow, base, t);
                let pow = if dtype == DType::F64 {
                    pow
                } else {
                    b.node(crate::ir::Op::Convert(dtype), &[pow])
                };
                let denominator = b.sub(one, pow);
                b.div(one, denominator)
            }
        });
    }
    consts
}

/// Spawns the update graph of `rule` for params of `shape` into `world` and
/// returns the program entity (pending compilation).
pub fn build_update_graph<A: FloatElement + Element>(
    world: &mut World,
    rule: &dyn UpdateRule<A>,
    shape: &[usize],
) -> Result<Entity, NotAGraph> {
    let scalars = scalars(rule)?;
    let program = rule.update_program(1);
    let dtype = <A as Element>::DTYPE;
    let ty = TensorType::new(dtype, shape.to_vec());
    let name = format!("{}-{}{:?}", rule.update_kind(), dtype, shape);
    let mut b = GraphBuilder::new(world, &name);
    let param = b.parameter(ty.clone());
    let grad = b.parameter(ty.clone());
    let slots: Vec<Entity> = rule
        .slot_names()
        .iter()
        .map(|_| b.parameter(ty.clone()))
        .collect();
    let count = b.parameter(TensorType::scalar(DType::I32));
    let consts = scalar_nodes(&mut b, &scalars, dtype, count);
    let mut values: Vec<Entity> = Vec::with_capacity(program.ops.len());
    let read = |values: &[Entity], o: Operand| -> Result<Entity, NotAGraph> {
        let bad = || NotAGraph(format!("operand {o:?} refers to nothing"));
        Ok(match o {
            Operand::Param => param,
            Operand::Grad => grad,
            Operand::Slot(i) => *slots.get(i).ok_or_else(bad)?,
            Operand::Constant(i) => *consts.get(i).ok_or_else(bad)?,
            Operand::Value(i) => *values.get(i).ok_or_else(bad)?,
        })
    };
    let mut zero = None;
    for op in &program.ops {
        let v = match *op {
            ElementOp::Add(x, y) => {
                let (x, y) = (read(&values, x)?, read(&values, y)?);
                b.add(x, y)
            }
            ElementOp::Mul(x, y) => {
                let (x, y) = (read(&values, x)?, read(&values, y)?);
                b.mul(x, y)
            }
            ElementOp::Div(x, y) => {
                let (x, y) = (read(&values, x)?, read(&values, y)?);
                b.div(x, y)
            }
            ElementOp::Sqrt(x) => {
                let x = read(&values, x)?;
                b.unary(UnaryOp::Sqrt, x)
            }
            ElementOp::Rsqrt(x) => {
                let x = read(&values, x)?;
                b.unary(UnaryOp::Rsqrt, x)
            }
            ElementOp::SelectPositive {
                test,
                then,
                otherwise,
            } => {
                let z = *zero.get_or_insert_with(|| b.scalar(dtype, 0.0));
                let (test, then, otherwise) = (
                    read(&values, test)?,
                    read(&values, then)?,
                    read(&values, otherwise)?,
                );
                let positive = b.compare(CompareDir::Gt, test, z);
                b.select(positive, then, otherwise)
            }
        };
        values.push(v);
    }
    let new_param = read(&values, program.new_param)?;
    b.output(new_param);
    for &s in &program.new_slots {
        let s = read(&values, s)?;
        b.output(s);
    }
    if program.new_slots.len() != slots.len() {
        return Err(NotAGraph(format!(
            "the program updates {} slots, the rule has {}",
            program.new_slots.len(),
            slots.len()
        )));
    }
    Ok(b.finish())
}

/// Spawns `custom_call("optirs.step", params, grads)` for params of `ty`.
pub fn build_custom_call_graph(world: &mut World, name: &str, ty: &TensorType) -> Entity {
    let mut b = GraphBuilder::new(world, &format!("{name}-opaque"));
    let param = b.parameter(ty.clone());
    let grad = b.parameter(ty.clone());
    let out = b.custom_call(STEP_TARGET, &[param, grad], ty.clone());
    b.output(out);
    b.finish()
}
