//! How the compiler's components are stored in a checkpoint.
//!
//! Graph edges (operands, a node's program, a kernel's members, a buffer's
//! value) become dense ids. Tensors — constants' [`Literal`]s and an
//! executable's constant pool — of more than [`crate::persist::INLINE_TENSOR_MAX_ELEMENTS`]
//! elements go to the checkpoint's tensor side channel (the safetensors
//! file) as little-endian row-major bytes; smaller ones stay inline in their
//! column. A [`CompiledExecutable`] is stored as the executable itself, not
//! recompiled on restore: a restored pod runs exactly the code it ran before.
//! A restored executable is checked for internal consistency (every buffer,
//! constant, input and instruction index in range) so a crafted checkpoint
//! cannot make it index out of bounds.
//!
//! Not stored: pass wall times ([`PassRecord::micros`] is restored as 0).
//! They are profiling data read from the wall clock; storing them would make
//! the world's bytes differ between two otherwise identical runs.

use std::sync::Arc;

use bevy_ecs::entity::Entity;
use serde::{Deserialize, Serialize};

use super::CompileError;
use super::cost::OpCost;
use super::executable::{Arg, BufferSlot, Executable, LoweredKernel, ValueRef};
use super::graph::{
    DeclaredType, InProgram, Literal, Node, NodeName, Operands, Output, PendingCompile, Program,
    ProgramNodes, ProgramOutputs, ValueType,
};
use super::passes::cost_analysis::{KernelCost, NodeCost, ProgramCost};
use super::passes::fusion::{FusionRefusals, InKernel, Kernel, ProgramKernels};
use super::passes::lower::CompiledExecutable;
use super::passes::memory_plan::{Buffer, MemoryPlan};
use super::passes::ordering::KernelPosition;
use super::passes::{
    CompileFailure, DisabledPasses, PassLog, PassRecord, constant_folding, cost_analysis, cse, dce,
    fusion, lower, memory_plan, ordering, shape_inference, simplify, verify,
};
use super::types::TensorType;
use crate::persist::persist_as_self;
use crate::persist::{LoadContext, Persist, SnapshotError, StoreContext};
use crate::persist::{
    StoredTensorValue, check_tensor, load_shared_tensor, load_tensor, store_shared_tensor,
    store_tensor,
};

/// Every pass name, to restore [`PassRecord::name`] as the pass's own `NAME`.
const PASS_NAMES: [&str; 11] = [
    verify::NAME,
    shape_inference::NAME,
    constant_folding::NAME,
    simplify::NAME,
    cse::NAME,
    dce::NAME,
    fusion::NAME,
    cost_analysis::NAME,
    ordering::NAME,
    memory_plan::NAME,
    lower::NAME,
];

persist_as_self!(
    Program,
    PendingCompile,
    Node,
    NodeName,
    DeclaredType,
    ValueType,
    Output,
    FusionRefusals,
    KernelPosition,
    DisabledPasses,
    NodeCost,
    KernelCost,
);

fn dense_ids(
    ctx: &StoreContext,
    entities: &[Entity],
    what: &'static str,
) -> Result<Vec<u32>, SnapshotError> {
    entities.iter().map(|&e| ctx.dense(e, what)).collect()
}

fn entities<C: FromIterator<Entity>>(
    ctx: &LoadContext,
    dense: &[u32],
    what: &'static str,
) -> Result<C, SnapshotError> {
    dense.iter().map(|&d| ctx.entity(d, what)).collect()
}

/// Implements [`Persist`] for a newtype over a list of entities.
macro_rules! persist_entity_list {
    ($($ty:ident => $what:literal),* $(,)?) => {$(
        impl Persist for $ty {
            type Stored = Vec<u32>;
            fn store(&self, ctx: &StoreContext) -> Result<Vec<u32>, SnapshotError> {
                dense_ids(ctx, &self.0, $what)
            }
            fn load(stored: Vec<u32>, ctx: &LoadContext) -> Result<$ty, SnapshotError> {
                Ok($ty(entities(ctx, &stored, $what)?))
            }
        }
    )*};
}

/// Implements [`Persist`] for a newtype over one entity.
macro_rules! persist_entity {
    ($($ty:ident => $what:literal),* $(,)?) => {$(
        impl Persist for $ty {
            type Stored = u32;
            fn store(&self, ctx: &StoreContext) -> Result<u32, SnapshotError> {
                ctx.dense(self.0, $what)
            }
            fn load(stored: u32, ctx: &LoadContext) -> Result<$ty, SnapshotError> {
                Ok($ty(ctx.entity(stored, $what)?))
            }
        }
    )*};
}

persist_entity_list!(
    ProgramNodes => "ProgramNodes",
    ProgramOutputs => "ProgramOutputs",
    Operands => "Operands",
    ProgramKernels => "ProgramKernels",
);
persist_entity!(InProgram => "InProgram", InKernel => "InKernel");

impl Persist for Literal {
    type Stored = StoredTensorValue;

    fn store(&self, ctx: &StoreContext) -> Result<StoredTensorValue, SnapshotError> {
        store_shared_tensor(&self.0, ctx)
    }

    fn load(stored: StoredTensorValue, ctx: &LoadContext) -> Result<Literal, SnapshotError> {
        load_shared_tensor(stored, ctx, "Literal").map(Literal)
    }

    fn check(stored: &StoredTensorValue, ctx: &LoadContext) -> Result<(), SnapshotError> {
        check_tensor(stored, ctx, "Literal")
    }
}

/// [`Kernel`] with entities as dense ids.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredKernel {
    program: u32,
    members: Vec<u32>,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    fused: bool,
}

impl Persist for Kernel {
    type Stored = StoredKernel;

    fn store(&self, ctx: &StoreContext) -> Result<StoredKernel, SnapshotError> {
        Ok(StoredKernel {
            program: ctx.dense(self.program, "Kernel.program")?,
            members: dense_ids(ctx, &self.members, "Kernel.members")?,
            inputs: dense_ids(ctx, &self.inputs, "Kernel.inputs")?,
            outputs: dense_ids(ctx, &self.outputs, "Kernel.outputs")?,
            fused: self.fused,
        })
    }

    fn load(s: StoredKernel, ctx: &LoadContext) -> Result<Kernel, SnapshotError> {
        Ok(Kernel {
            program: ctx.entity(s.program, "Kernel.program")?,
            members: entities(ctx, &s.members, "Kernel.members")?,
            inputs: entities(ctx, &s.inputs, "Kernel.inputs")?,
            outputs: entities(ctx, &s.outputs, "Kernel.outputs")?,
            fused: s.fused,
        })
    }
}

/// [`ProgramCost`] with kernels as dense ids.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredProgramCost {
    totals: OpCost,
    kernels: Vec<(u32, OpCost)>,
}

impl Persist for ProgramCost {
    type Stored = StoredProgramCost;

    fn store(&self, ctx: &StoreContext) -> Result<StoredProgramCost, SnapshotError> {
        Ok(StoredProgramCost {
            totals: self.totals,
            kernels: self
                .kernels
                .iter()
                .map(|&(k, c)| Ok((ctx.dense(k, "ProgramCost.kernels")?, c)))
                .collect::<Result<_, SnapshotError>>()?,
        })
    }

    fn load(s: StoredProgramCost, ctx: &LoadContext) -> Result<ProgramCost, SnapshotError> {
        Ok(ProgramCost {
            totals: s.totals,
            kernels: s
                .kernels
                .into_iter()
                .map(|(k, c)| Ok((ctx.entity(k, "ProgramCost.kernels")?, c)))
                .collect::<Result<_, SnapshotError>>()?,
        })
    }
}

/// [`Buffer`] with entities as dense ids.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredBuffer {
    program: u32,
    value: u32,
    size: usize,
    offset: usize,
    start: u32,
    end: u32,
    in_place: bool,
}

impl Persist for Buffer {
    type Stored = StoredBuffer;

    fn store(&self, ctx: &StoreContext) -> Result<StoredBuffer, SnapshotError> {
        Ok(StoredBuffer {
            program: ctx.dense(self.program, "Buffer.program")?,
            value: ctx.dense(self.value, "Buffer.value")?,
            size: self.size,
            offset: self.offset,
            start: self.start,
            end: self.end,
            in_place: self.in_place,
        })
    }

    fn load(s: StoredBuffer, ctx: &LoadContext) -> Result<Buffer, SnapshotError> {
        Ok(Buffer {
            program: ctx.entity(s.program, "Buffer.program")?,
            value: ctx.entity(s.value, "Buffer.value")?,
            size: s.size,
            offset: s.offset,
            start: s.start,
            end: s.end,
            in_place: s.in_place,
        })
    }
}

/// [`MemoryPlan`] with its buffer entities as dense ids.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredMemoryPlan {
    peak_bytes: usize,
    lower_bound_bytes: usize,
    fragmentation_bytes: usize,
    in_place: usize,
    buffers: Vec<u32>,
}

impl Persist for MemoryPlan {
    type Stored = StoredMemoryPlan;

    fn store(&self, ctx: &StoreContext) -> Result<StoredMemoryPlan, SnapshotError> {
        Ok(StoredMemoryPlan {
            peak_bytes: self.peak_bytes,
            lower_bound_bytes: self.lower_bound_bytes,
            fragmentation_bytes: self.fragmentation_bytes,
            in_place: self.in_place,
            buffers: dense_ids(ctx, &self.buffers, "MemoryPlan.buffers")?,
        })
    }

    fn load(s: StoredMemoryPlan, ctx: &LoadContext) -> Result<MemoryPlan, SnapshotError> {
        Ok(MemoryPlan {
            peak_bytes: s.peak_bytes,
            lower_bound_bytes: s.lower_bound_bytes,
            fragmentation_bytes: s.fragmentation_bytes,
            in_place: s.in_place,
            buffers: entities(ctx, &s.buffers, "MemoryPlan.buffers")?,
        })
    }
}

/// [`PassRecord`] without its wall time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredPassRecord {
    name: String,
    changed: bool,
    nodes_before: usize,
    nodes_after: usize,
    runs: usize,
    note: Option<String>,
}

impl Persist for PassLog {
    type Stored = Vec<StoredPassRecord>;

    fn store(&self, _: &StoreContext) -> Result<Self::Stored, SnapshotError> {
        Ok(self
            .0
            .iter()
            .map(|r| StoredPassRecord {
                name: r.name.to_string(),
                changed: r.changed,
                nodes_before: r.nodes_before,
                nodes_after: r.nodes_after,
                runs: r.runs,
                note: r.note.clone(),
            })
            .collect())
    }

    fn load(stored: Self::Stored, _: &LoadContext) -> Result<PassLog, SnapshotError> {
        stored
            .into_iter()
            .map(|r| {
                let name = PASS_NAMES.iter().find(|&&n| n == r.name).ok_or_else(|| {
                    SnapshotError::Corrupt {
                        column: "xla.PassLog".into(),
                        reason: format!("unknown pass `{}`", r.name),
                    }
                })?;
                Ok(PassRecord {
                    name,
                    changed: r.changed,
                    nodes_before: r.nodes_before,
                    nodes_after: r.nodes_after,
                    micros: 0,
                    runs: r.runs,
                    note: r.note,
                })
            })
            .collect::<Result<_, _>>()
            .map(PassLog)
    }
}

impl Persist for CompileFailure {
    type Stored = String;

    fn store(&self, _: &StoreContext) -> Result<String, SnapshotError> {
        Ok(self.0.to_string())
    }

    fn load(message: String, _: &LoadContext) -> Result<CompileFailure, SnapshotError> {
        Ok(CompileFailure(CompileError::Restored(message)))
    }
}

/// [`Executable`] with its constant pool through [`store_tensor`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredExecutable {
    name: String,
    parameters: Vec<TensorType>,
    parameter_buffers: Vec<u32>,
    constants: Vec<StoredTensorValue>,
    buffers: Vec<BufferSlot>,
    kernels: Vec<LoweredKernel>,
    outputs: Vec<ValueRef>,
    heap_bytes: usize,
    loop_chunk: usize,
}

impl Persist for CompiledExecutable {
    type Stored = StoredExecutable;

    fn store(&self, ctx: &StoreContext) -> Result<StoredExecutable, SnapshotError> {
        let e = &*self.0;
        Ok(StoredExecutable {
            name: e.name.clone(),
            parameters: e.parameters.clone(),
            parameter_buffers: e.parameter_buffers.clone(),
            constants: e
                .constants
                .iter()
                .map(|c| store_tensor(c, ctx))
                .collect::<Result<_, _>>()?,
            buffers: e.buffers.clone(),
            kernels: e.kernels.clone(),
            outputs: e.outputs.clone(),
            heap_bytes: e.heap_bytes,
            loop_chunk: e.loop_chunk,
        })
    }

    fn load(s: StoredExecutable, ctx: &LoadContext) -> Result<CompiledExecutable, SnapshotError> {
        check_executable(&s)?;
        let constants = s
            .constants
            .into_iter()
            .map(|c| load_tensor(c, ctx, "CompiledExecutable.constants"))
            .collect::<Result<_, _>>()?;
        Ok(CompiledExecutable(Arc::new(Executable {
            name: s.name,
            parameters: s.parameters,
            parameter_buffers: s.parameter_buffers,
            constants,
            buffers: s.buffers,
            kernels: s.kernels,
            outputs: s.outputs,
            heap_bytes: s.heap_bytes,
            loop_chunk: s.loop_chunk,
        })))
    }

    fn check(s: &StoredExecutable, ctx: &LoadContext) -> Result<(), SnapshotError> {
        check_executable(s)?;
        s.constants
            .iter()
            .try_for_each(|c| check_tensor(c, ctx, "CompiledExecutable.constants"))
    }
}

/// Every index inside an executable is in range, so running it cannot
/// index out of bounds.
fn check_executable(s: &StoredExecutable) -> Result<(), SnapshotError> {
    let bad = |reason: String| {
        Err(SnapshotError::Corrupt {
            column: "xla.CompiledExecutable".into(),
            reason: format!("executable `{}`: {reason}", s.name),
        })
    };
    let buffers = s.buffers.len() as u32;
    let value_ok = |r: &ValueRef| match *r {
        ValueRef::Buffer(b) => b < buffers,
        ValueRef::Constant(c) => (c as usize) < s.constants.len(),
    };
    if s.parameter_buffers.len() != s.parameters.len()
        || s.parameter_buffers.iter().any(|&b| b >= buffers)
    {
        return bad("parameter buffers do not match the parameters".into());
    }
    if s.loop_chunk == 0 {
        return bad("loop chunk is 0".into());
    }
    if !s.outputs.iter().all(value_ok) {
        return bad("an output refers to no buffer or constant".into());
    }
    for k in &s.kernels {
        let inputs = k.inputs.len() as u32;
        let args_ok = k.instrs.iter().enumerate().all(|(i, instr)| {
            instr.args.iter().all(|a| match *a {
                Arg::Input(n) => n < inputs,
                Arg::Local(l) => (l as usize) < i,
            })
        });
        let outputs_ok = k
            .outputs
            .iter()
            .all(|&(i, b)| (i as usize) < k.instrs.len() && b < buffers);
        if !k.inputs.iter().all(value_ok) || !args_ok || !outputs_ok {
            return bad(format!(
                "kernel `{}` refers to a value out of range",
                k.name
            ));
        }
    }
    Ok(())
}
