//! `lower`: build the [`Executable`] from kernels, their order and the memory plan.
//!
//! Reads [`ProgramKernels`] (in order), [`Kernel`], [`MemoryPlan`]/[`Buffer`],
//! ops, literals and types; writes [`CompiledExecutable`] on the program.
//! Constants become the executable's constant pool. "Changed" is always true
//! (an executable is produced). Refuses (an error naming the node) when a
//! kernel reads a value that has neither a buffer nor a literal.

use std::sync::Arc;

use bevy_ecs::entity::EntityHashMap;
use bevy_ecs::prelude::*;

use super::PassOutcome;
use super::fusion::{Kernel, ProgramKernels};
use super::memory_plan::{Buffer, MemoryPlan};
use crate::compiler::CompileError;
use crate::compiler::executable::{
    Arg, BufferSlot, Executable, Instr, LoweredKernel, Stage, ValueRef, stage_fused_loop,
};
use crate::compiler::graph::{
    Literal, Node, Operands, ProgramOutputs, ValueType, node_label, program_name, program_nodes,
};
use crate::ir::op::Op;

/// The pass name.
pub const NAME: &str = "lower";

/// The executable of a compiled program.
#[derive(Component, Debug, Clone)]
pub struct CompiledExecutable(pub Arc<Executable>);

struct Lowering<'w> {
    world: &'w World,
    buffer_of: EntityHashMap<u32>,
    constant_of: EntityHashMap<u32>,
    constants: Vec<crate::ir::Tensor>,
}

impl Lowering<'_> {
    fn value_ref(&mut self, e: Entity) -> Result<ValueRef, CompileError> {
        if let Some(&b) = self.buffer_of.get(&e) {
            return Ok(ValueRef::Buffer(b));
        }
        if let Some(&c) = self.constant_of.get(&e) {
            return Ok(ValueRef::Constant(c));
        }
        let lit = self
            .world
            .get::<Literal>(e)
            .ok_or_else(|| CompileError::Evaluate {
                node: node_label(self.world, e),
                message: "is read by a kernel but has no buffer and no literal".into(),
            })?;
        let c = self.constants.len() as u32;
        self.constants.push((*lit.0).clone());
        self.constant_of.insert(e, c);
        Ok(ValueRef::Constant(c))
    }
}

/// Builds the executable of `program`.
pub fn run(world: &mut World, program: Entity) -> Result<PassOutcome, CompileError> {
    let exe = build(world, program)?;
    world
        .entity_mut(program)
        .insert(CompiledExecutable(Arc::new(exe)));
    Ok(PassOutcome::changed(true))
}

fn build(world: &World, program: Entity) -> Result<Executable, CompileError> {
    let plan = world
        .get::<MemoryPlan>(program)
        .cloned()
        .unwrap_or_default();
    let mut lw = Lowering {
        world,
        buffer_of: EntityHashMap::default(),
        constant_of: EntityHashMap::default(),
        constants: Vec::new(),
    };
    let mut buffers = Vec::with_capacity(plan.buffers.len());
    for (i, &b) in plan.buffers.iter().enumerate() {
        let buf = world.get::<Buffer>(b).expect("planned buffer");
        lw.buffer_of.insert(buf.value, i as u32);
        buffers.push(BufferSlot {
            offset: buf.offset,
            size: buf.size,
            ty: world
                .get::<ValueType>(buf.value)
                .map_or_else(String::new, |t| t.0.to_string()),
        });
    }
    let mut params: Vec<(usize, Entity)> = program_nodes(world, program)
        .into_iter()
        .filter_map(|e| match world.get::<Node>(e).map(|n| &n.op) {
            Some(Op::Parameter { index }) => Some((*index, e)),
            _ => None,
        })
        .collect();
    params.sort();
    let parameters = params
        .iter()
        .map(|&(_, e)| {
            world
                .get::<ValueType>(e)
                .map(|t| t.0.clone())
                .expect("typed parameter")
        })
        .collect();
    let parameter_buffers = params.iter().map(|&(_, e)| lw.buffer_of[&e]).collect();
    let kernels_list = world
        .get::<ProgramKernels>(program)
        .map(|k| k.0.clone())
        .unwrap_or_default();
    let mut kernels = Vec::with_capacity(kernels_list.len());
    for (pos, &k) in kernels_list.iter().enumerate() {
        kernels.push(lower_kernel(
            &mut lw,
            world.get::<Kernel>(k).expect("kernel"),
            pos,
        )?);
    }
    let outputs = world
        .get::<ProgramOutputs>(program)
        .map(|o| o.0.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|o| lw.value_ref(o))
        .collect::<Result<_, _>>()?;
    Ok(Executable {
        name: program_name(world, program),
        parameters,
        parameter_buffers,
        constants: lw.constants,
        buffers,
        kernels,
        outputs,
        heap_bytes: plan.peak_bytes,
        loop_chunk: crate::compiler::executable::LOOP_CHUNK,
    })
}

fn lower_kernel(
    lw: &mut Lowering,
    kernel: &Kernel,
    pos: usize,
) -> Result<LoweredKernel, CompileError> {
    let world = lw.world;
    let mut input_index: EntityHashMap<u32> = EntityHashMap::default();
    let mut inputs = Vec::with_capacity(kernel.inputs.len());
    for (i, &x) in kernel.inputs.iter().enumerate() {
        input_index.insert(x, i as u32);
        inputs.push(lw.value_ref(x)?);
    }
    let mut local_index: EntityHashMap<u32> = EntityHashMap::default();
    let mut instrs = Vec::with_capacity(kernel.members.len());
    for (i, &m) in kernel.members.iter().enumerate() {
        let args = world
            .get::<Operands>(m)
            .map(|o| o.0.clone())
            .unwrap_or_default()
            .iter()
            .map(|o| match local_index.get(o) {
                Some(&l) => Arg::Local(l),
                None => Arg::Input(input_index[o]),
            })
            .collect();
        instrs.push(Instr {
            op: world.get::<Node>(m).expect("node").op.clone(),
            args,
            ty: world
                .get::<ValueType>(m)
                .map(|t| t.0.clone())
                .expect("typed node"),
            stage: Stage::Prelude,
        });
        local_index.insert(m, i as u32);
    }
    let outputs: Vec<(u32, u32)> = kernel
        .outputs
        .iter()
        .map(|o| (local_index[o], lw.buffer_of[o]))
        .collect();
    let input_dims: Vec<Vec<usize>> = kernel
        .inputs
        .iter()
        .map(|x| {
            world
                .get::<ValueType>(*x)
                .map(|t| t.0.dims.clone())
                .unwrap_or_default()
        })
        .collect();
    let loop_shape = if kernel.fused {
        stage_fused_loop(&mut instrs, &input_dims, &outputs)
    } else {
        None
    };
    let root = world
        .get::<Node>(*kernel.members.last().expect("non-empty kernel"))
        .expect("node");
    let name = if kernel.fused && kernel.members.len() > 1 {
        format!("fusion.{pos}")
    } else {
        format!("{}.{pos}", root.op.name())
    };
    Ok(LoweredKernel {
        name,
        fused: kernel.fused,
        inputs,
        instrs,
        outputs,
        loop_shape,
    })
}

#[cfg(test)]
mod tests {
    use crate::compiler::executable::ValueRef;
    use crate::compiler::{self, GraphBuilder};
    use crate::ir::Tensor;
    use crate::ir::{DType, TensorType, UnaryOp};

    #[test]
    fn outputs_may_be_parameters_or_constants() {
        let mut world = compiler::compiler_world();
        let mut b = GraphBuilder::new(&mut world, "l");
        let x = b.parameter(TensorType::new(DType::I32, [3]));
        let one = b.scalar(DType::I32, 1.0);
        let same = b.mul(x, one);
        let two = b.scalar(DType::I32, 2.0);
        let four = b.mul(two, two);
        b.output(same);
        b.output(four);
        let p = b.finish();
        let r = compiler::compile(&mut world, p).unwrap();
        let exe = &r.executable;
        assert_eq!(r.kernels, 0, "x * 1 is x and 2 * 2 folds");
        assert!(matches!(
            exe.outputs[..],
            [ValueRef::Buffer(_), ValueRef::Constant(_)]
        ));
        let arg = Tensor::from_f64s(&TensorType::new(DType::I32, [3]), &[1.0, -2.0, 3.0]).unwrap();
        let out = exe.run(std::slice::from_ref(&arg)).unwrap();
        assert_eq!(out[0], arg);
        assert_eq!(out[1].to_f64_vec(), vec![4.0]);
    }

    #[test]
    fn kernels_read_buffers_and_pooled_constants() {
        let mut world = compiler::compiler_world();
        let mut b = GraphBuilder::new(&mut world, "l");
        let x = b.parameter(TensorType::new(DType::F32, [2]));
        let c = b.scalar(DType::F32, 3.0);
        let y = b.mul(x, c);
        let z = b.unary(UnaryOp::Neg, y);
        b.output(z);
        let p = b.finish();
        let r = compiler::compile(&mut world, p).unwrap();
        let k = &r.executable.kernels[0];
        assert_eq!(k.instrs.len(), 2);
        assert!(k.inputs.contains(&ValueRef::Constant(0)));
        assert_eq!(r.executable.constants.len(), 1);
        let bad = r.executable.run(&[]).unwrap_err().to_string();
        assert_eq!(bad, "program `l` takes 1 arguments, got 0");
        let wrong = Tensor::from_f64s(&TensorType::new(DType::F32, [3]), &[0.0]).unwrap();
        let msg = r.executable.run(&[wrong]).unwrap_err().to_string();
        assert_eq!(msg, "argument 0 of `l` must be f32[2], got f32[3]");
    }
}
