//! The RON program format (documented in `docs/programs.md`).
//!
//! ```ron
//! (
//!     name: "axpy",
//!     nodes: [
//!         (name: "x", op: "parameter", ty: "f32[4]"),
//!         (name: "y", op: "parameter", ty: "f32[4]"),
//!         (name: "a", op: "constant", ty: "f32[]", value: [2.0]),
//!         (name: "ax", op: "mul", operands: ["a", "x"]),
//!         (name: "out", op: "add", operands: ["ax", "y"]),
//!     ],
//!     outputs: ["out"],
//! )
//! ```
//!
//! Operands may name nodes defined later (the verifier rejects cycles).
//! Errors carry the file, line, column and field path (`nodes[3].shape`), or
//! name the node.

use bevy_ecs::prelude::*;
use serde::Deserialize;

use super::CompileError;
use super::builder::GraphBuilder;
use super::op::{BinaryOp, CompareDir, ConvAttrs, DotDims, Op, Padding, ReduceKind, UnaryOp};
use super::types::{DType, TensorType};
use crate::ir::Tensor;

/// A whole program file.
#[derive(Debug, Deserialize)]
#[serde(rename = "Program", deny_unknown_fields)]
pub struct ProgramDef {
    /// The program name.
    pub name: String,
    /// Nodes; names must be unique.
    pub nodes: Vec<NodeDef>,
    /// Names of the result nodes, in order (none: DCE keeps everything).
    #[serde(default)]
    pub outputs: Vec<String>,
}

/// One node. Only the attributes its op uses may be set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[allow(missing_docs, reason = "fields are documented in docs/programs.md")]
pub struct NodeDef {
    pub name: String,
    pub op: String,
    pub operands: Vec<String>,
    pub ty: Option<String>,
    pub value: Option<Vec<f64>>,
    pub index: Option<usize>,
    pub dim: Option<usize>,
    pub dims: Option<Vec<usize>>,
    pub shape: Option<Vec<i64>>,
    pub perm: Option<Vec<usize>>,
    pub start: Option<Vec<usize>>,
    pub limit: Option<Vec<usize>>,
    pub stride: Option<Vec<usize>>,
    pub to: Option<String>,
    pub lhs_contracting: Option<Vec<usize>>,
    pub rhs_contracting: Option<Vec<usize>>,
    pub lhs_batch: Option<Vec<usize>>,
    pub rhs_batch: Option<Vec<usize>>,
    pub window_strides: Option<Vec<usize>>,
    pub padding: Option<String>,
    pub pads: Option<Vec<(usize, usize)>>,
    pub dilation: Option<Vec<usize>>,
    pub feature_groups: Option<usize>,
    pub target: Option<String>,
}

/// The most elements a `constant` may spell out or splat (16 Mi).
pub const MAX_LITERAL_ELEMENTS: usize = 1 << 24;

/// Every op name a program may use.
pub const OP_NAMES: &[&str] = &[
    "parameter",
    "constant",
    "iota",
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "tanh",
    "logistic",
    "sin",
    "cos",
    "floor",
    "ceil",
    "sign",
    "not",
    "add",
    "sub",
    "mul",
    "div",
    "rem",
    "max",
    "min",
    "pow",
    "and",
    "or",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "select",
    "convert",
    "broadcast",
    "reshape",
    "transpose",
    "slice",
    "concatenate",
    "reduce_sum",
    "reduce_max",
    "reduce_min",
    "reduce_mean",
    "dot",
    "convolution",
    "custom_call",
];

/// Parses RON text into a [`ProgramDef`]; `file` names the source in errors.
pub fn parse_program(file: &str, text: &str) -> Result<ProgramDef, CompileError> {
    let options =
        ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
    let spanned = |e: ron::error::SpannedError, field: String| CompileError::Parse {
        file: file.to_owned(),
        line: e.position.line,
        column: e.position.col,
        field,
        source: Box::new(e.code),
    };
    let mut de = ron::Deserializer::from_str_with_options(text, &options)
        .map_err(|e| spanned(e, String::new()))?;
    let def: ProgramDef = match serde_path_to_error::deserialize(&mut de) {
        Ok(d) => d,
        Err(e) => {
            let field = e.path().to_string();
            let err = de.span_error(e.into_inner());
            return Err(spanned(err, field));
        }
    };
    if let Err(e) = de.end() {
        return Err(spanned(de.span_error(e), String::new()));
    }
    Ok(def)
}

fn invalid(node: &str, message: impl Into<String>) -> CompileError {
    CompileError::InvalidNode {
        node: format!("%{node}"),
        message: message.into(),
    }
}

fn need<T: Clone>(node: &NodeDef, field: &'static str, v: &Option<T>) -> Result<T, CompileError> {
    v.clone()
        .ok_or_else(|| invalid(&node.name, format!("{} needs `{field}`", node.op)))
}

/// A two-element spatial attribute, `[1, 1]` when absent.
fn pair(node: &NodeDef, field: &str, v: &Option<Vec<usize>>) -> Result<[usize; 2], CompileError> {
    match v.as_deref() {
        None => Ok([1, 1]),
        Some(&[a, b]) => Ok([a, b]),
        Some(other) => Err(invalid(
            &node.name,
            format!("`{field}` needs two values (height, width), got {other:?}"),
        )),
    }
}

fn parse_type(node: &NodeDef, text: &str) -> Result<TensorType, CompileError> {
    TensorType::parse(text).ok_or_else(|| {
        invalid(
            &node.name,
            format!("`{text}` is not a tensor type; write e.g. \"f32[8,128]\" or \"i32[]\""),
        )
    })
}

/// The op of a node definition and, for leaves, its declared type and literal.
fn node_op(
    n: &NodeDef,
    next_parameter: &mut usize,
) -> Result<(Op, Option<TensorType>, Option<Tensor>), CompileError> {
    let ty = n.ty.as_deref().map(|t| parse_type(n, t)).transpose()?;
    let need_ty = || {
        ty.clone()
            .ok_or_else(|| invalid(&n.name, format!("{} needs `ty`", n.op)))
    };
    match n.op.as_str() {
        "parameter" => {
            let index = n.index.unwrap_or(*next_parameter);
            *next_parameter = index + 1;
            Ok((Op::Parameter { index }, Some(need_ty()?), None))
        }
        "constant" => Ok((Op::Constant, None, Some(constant(n, need_ty()?)?))),
        "iota" => Ok((
            Op::Iota {
                dim: need(n, "dim", &n.dim)?,
            },
            Some(need_ty()?),
            None,
        )),
        "custom_call" => Ok((
            Op::CustomCall {
                target: need(n, "target", &n.target)?,
            },
            Some(need_ty()?),
            None,
        )),
        name => {
            let op = match elementwise_op(name) {
                Some(op) => op,
                None => attributed_op(n)?,
            };
            Ok((op, None, None))
        }
    }
}

/// A constant's literal, of its declared type `t`.
fn constant(n: &NodeDef, t: TensorType) -> Result<Tensor, CompileError> {
    if t.element_count() > MAX_LITERAL_ELEMENTS {
        return Err(invalid(
            &n.name,
            format!("constant {t} is larger than {MAX_LITERAL_ELEMENTS} elements"),
        ));
    }
    let values = need(n, "value", &n.value)?;
    Tensor::from_f64s(&t, &values).map_err(|source| CompileError::Kernel {
        node: format!("%{}", n.name),
        source,
    })
}

/// The elementwise op named `name`, if it is one: these take no attributes.
fn elementwise_op(name: &str) -> Option<Op> {
    use BinaryOp as B;
    use UnaryOp as U;
    let unary = |u| Some(Op::Unary(u));
    let binary = |b| Some(Op::Binary(b));
    let compare = |c| Some(Op::Compare(c));
    match name {
        "neg" => unary(U::Neg),
        "abs" => unary(U::Abs),
        "exp" => unary(U::Exp),
        "log" => unary(U::Log),
        "sqrt" => unary(U::Sqrt),
        "rsqrt" => unary(U::Rsqrt),
        "tanh" => unary(U::Tanh),
        "logistic" => unary(U::Logistic),
        "sin" => unary(U::Sin),
        "cos" => unary(U::Cos),
        "floor" => unary(U::Floor),
        "ceil" => unary(U::Ceil),
        "sign" => unary(U::Sign),
        "not" => unary(U::Not),
        "add" => binary(B::Add),
        "sub" => binary(B::Sub),
        "mul" => binary(B::Mul),
        "div" => binary(B::Div),
        "rem" => binary(B::Rem),
        "max" => binary(B::Max),
        "min" => binary(B::Min),
        "pow" => binary(B::Pow),
        "and" => binary(B::And),
        "or" => binary(B::Or),
        "eq" => compare(CompareDir::Eq),
        "ne" => compare(CompareDir::Ne),
        "lt" => compare(CompareDir::Lt),
        "le" => compare(CompareDir::Le),
        "gt" => compare(CompareDir::Gt),
        "ge" => compare(CompareDir::Ge),
        "select" => Some(Op::Select),
        _ => None,
    }
}

/// A non-leaf op read with its attributes (`dims`, `shape`, `perm`, ...),
/// or the error naming the unknown op.
fn attributed_op(n: &NodeDef) -> Result<Op, CompileError> {
    let reduce = |kind| {
        Ok(Op::Reduce {
            kind,
            dims: need(n, "dims", &n.dims)?,
        })
    };
    match n.op.as_str() {
        "convert" => {
            let to = need(n, "to", &n.to)?;
            let d = DType::parse(&to).ok_or_else(|| {
                invalid(
                    &n.name,
                    format!("`{to}` is not a dtype (pred, i32, f32, f64)"),
                )
            })?;
            Ok(Op::Convert(d))
        }
        "broadcast" => {
            let shape = need(n, "shape", &n.shape)?;
            let shape = shape
                .iter()
                .map(|&d| {
                    usize::try_from(d).map_err(|_| {
                        invalid(&n.name, format!("broadcast dimension {d} is negative"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Op::Broadcast {
                shape,
                dims: n.dims.clone(),
            })
        }
        "reshape" => Ok(Op::Reshape {
            shape: need(n, "shape", &n.shape)?,
        }),
        "transpose" => Ok(Op::Transpose {
            perm: need(n, "perm", &n.perm)?,
        }),
        "slice" => {
            let start = need(n, "start", &n.start)?;
            let limit = need(n, "limit", &n.limit)?;
            let stride = n.stride.clone().unwrap_or_else(|| vec![1; start.len()]);
            Ok(Op::Slice {
                start,
                limit,
                stride,
            })
        }
        "concatenate" => Ok(Op::Concatenate {
            dim: need(n, "dim", &n.dim)?,
        }),
        "reduce_sum" => reduce(ReduceKind::Sum),
        "reduce_max" => reduce(ReduceKind::Max),
        "reduce_min" => reduce(ReduceKind::Min),
        "reduce_mean" => reduce(ReduceKind::Mean),
        "dot" => Ok(Op::Dot(DotDims {
            lhs_contracting: n.lhs_contracting.clone().unwrap_or_else(|| vec![1]),
            rhs_contracting: n.rhs_contracting.clone().unwrap_or_else(|| vec![0]),
            lhs_batch: n.lhs_batch.clone().unwrap_or_default(),
            rhs_batch: n.rhs_batch.clone().unwrap_or_default(),
        })),
        "convolution" => Ok(Op::Convolution(conv_attrs(n)?)),
        other => Err(CompileError::UnknownOp {
            node: n.name.clone(),
            op: other.to_owned(),
            known: OP_NAMES.join(", "),
        }),
    }
}

/// A convolution's window strides, padding, dilation and feature groups.
fn conv_attrs(n: &NodeDef) -> Result<ConvAttrs, CompileError> {
    let padding = match (n.padding.as_deref(), &n.pads) {
        (_, Some(p)) => Padding::Explicit(p.clone()),
        (None | Some("valid"), None) => Padding::Valid,
        (Some("same"), None) => Padding::Same,
        (Some(other), None) => {
            return Err(invalid(
                &n.name,
                format!(
                    "padding `{other}` is not `same` or `valid` (use `pads` for explicit padding)"
                ),
            ));
        }
    };
    Ok(ConvAttrs {
        stride: pair(n, "window_strides", &n.window_strides)?,
        padding,
        dilation: pair(n, "dilation", &n.dilation)?,
        feature_groups: n.feature_groups.unwrap_or(1),
    })
}

/// Spawns the program described by `def` into `world` (marked for compilation).
pub fn spawn_program(world: &mut World, def: &ProgramDef) -> Result<Entity, CompileError> {
    let mut names = std::collections::HashMap::with_capacity(def.nodes.len());
    for n in &def.nodes {
        if n.name.is_empty() {
            return Err(invalid("?", format!("a `{}` node has no name", n.op)));
        }
        if names.insert(n.name.as_str(), ()).is_some() {
            return Err(invalid(&n.name, "the name is defined twice"));
        }
    }
    let mut parsed = Vec::with_capacity(def.nodes.len());
    let mut next_parameter = 0;
    for n in &def.nodes {
        parsed.push(node_op(n, &mut next_parameter)?);
    }
    let mut b = GraphBuilder::new(world, &def.name);
    let mut entity_of = std::collections::HashMap::with_capacity(def.nodes.len());
    let mut spawned = Vec::with_capacity(def.nodes.len());
    for (n, (op, ty, lit)) in def.nodes.iter().zip(parsed) {
        let e = b.node_named(Some(n.name.clone()), op, &[], ty, lit);
        entity_of.insert(n.name.as_str(), e);
        spawned.push(e);
    }
    let mut wiring = Vec::with_capacity(def.nodes.len());
    for (n, &e) in def.nodes.iter().zip(&spawned) {
        let operands = n
            .operands
            .iter()
            .map(|o| {
                entity_of.get(o.as_str()).copied().ok_or_else(|| {
                    invalid(
                        &n.name,
                        format!("operand `{o}` is not defined (dangling operand)"),
                    )
                })
            })
            .collect::<Result<smallvec::SmallVec<[Entity; 4]>, _>>();
        match operands {
            Ok(ops) => wiring.push((e, ops)),
            Err(err) => {
                let p = b.finish();
                despawn_program(world, p);
                return Err(err);
            }
        }
    }
    for o in &def.outputs {
        match entity_of.get(o.as_str()) {
            Some(&e) => b.output(e),
            None => {
                let p = b.finish();
                despawn_program(world, p);
                return Err(CompileError::InvalidNode {
                    node: format!("%{o}"),
                    message: "is listed in `outputs` but is not defined".into(),
                });
            }
        }
    }
    let p = b.finish();
    for (e, ops) in wiring {
        world.entity_mut(e).insert(super::graph::Operands(ops));
    }
    Ok(p)
}

/// Despawns a program and its nodes.
pub fn despawn_program(world: &mut World, program: Entity) {
    for e in super::graph::program_nodes(world, program) {
        world.despawn(e);
    }
    world.despawn(program);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_name_line_column_and_field() {
        let text =
            "(\n  name: \"p\",\n  nodes: [\n    (name: \"x\", op: \"parameter\", ty: 3),\n  ],\n)";
        let err = parse_program("p.ron", text).unwrap_err().to_string();
        assert!(err.starts_with("p.ron:4:"), "{err}");
        assert!(err.contains("nodes[0].ty"), "{err}");
    }

    #[test]
    fn unknown_op_and_dangling_operand_name_the_node() {
        let mut world = World::new();
        let def = parse_program(
            "t",
            r#"(name: "t", nodes: [(name: "a", op: "frobnicate")])"#,
        )
        .unwrap();
        let err = spawn_program(&mut world, &def).unwrap_err().to_string();
        assert!(err.starts_with("node %a: unknown op `frobnicate`"), "{err}");
        let def = parse_program(
            "t",
            r#"(name: "t", nodes: [(name: "a", op: "neg", operands: ["zz"])])"#,
        )
        .unwrap();
        let err = spawn_program(&mut world, &def).unwrap_err().to_string();
        assert_eq!(
            err,
            "node %a: operand `zz` is not defined (dangling operand)"
        );
    }
}
