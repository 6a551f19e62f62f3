//! The step path of a [`TPUOptimizer`]: the program from the cache or
//! compiled now, the step's HBM reserved beside the resident state, the
//! runtime run with params, grads, state slots, count and learning rate,
//! the outputs taken in place or fresh, the state written back and the
//! profile updated. Everything a step does after its entry point in the
//! module root, in the order it does it.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use bevy_ecs::prelude::*;
use ndarray::{Array, ArrayD, Dimension, IxDyn};
use smallvec::SmallVec;

use crate::compiler;
use crate::error::{OptimError, Result};
use crate::exec::runtime::{Arg, CustomCallError, CustomCallHandler, Element, RunOutput, Runtime};
use crate::ir::Tensor;
use crate::ir::TensorType;
use crate::memory::Block;
use crate::optimizers::OptimizerError;
use crate::optimizers::{FloatElement, Optimizer};
use crate::topology::Device;

use super::cache::ProgramKey;

/// A step's params shape, inline (a step at 1e3 elements is a few
/// microseconds; an allocation is a noticeable part of it).
type Shape = SmallVec<[usize; 4]>;
use super::{HbmSnapshot, MemoryEvent, MemoryEventKind, TPUOptimizer, graph};
use crate::memory::device as hbm;
use crate::memory::{DeviceHeap, OptimizerSlot};

/// Runs the opaque optimizer's `step` for the `optirs.step` custom call.
struct StepCall<'o, O, A> {
    base: &'o mut O,
    _element: PhantomData<fn() -> A>,
}

impl<O: Optimizer<A, IxDyn>, A: FloatElement + Element> CustomCallHandler for StepCall<'_, O, A> {
    fn call(
        &mut self,
        target: &str,
        args: &[&Tensor],
        _: &TensorType,
    ) -> Result<Tensor, CustomCallError> {
        if target != graph::STEP_TARGET {
            return Err(CustomCallError::Refused(format!(
                "unknown target (known: {})",
                graph::STEP_TARGET
            )));
        }
        let [p, g] = args else {
            return Err(CustomCallError::Refused(format!(
                "takes params and grads, got {} operands",
                args.len()
            )));
        };
        let as_array = |t: &Tensor| {
            A::from_tensor((*t).clone())
                .map_err(|t| CustomCallError::Refused(format!("operand is {}", t.tensor_type())))
        };
        let (p, g): (ArrayD<A>, ArrayD<A>) = (as_array(p)?, as_array(g)?);
        self.base
            .step(&p, &g)
            .map(A::into_tensor)
            .map_err(CustomCallError::failed)
    }
}

impl<O, A> TPUOptimizer<O, A>
where
    O: Optimizer<A, IxDyn>,
    A: FloatElement + Element,
{
    /// [`TPUOptimizer::tpu_step`]: the new params in a fresh array (the
    /// params are read, not written).
    pub(super) fn step_fresh<D: Dimension>(
        &mut self,
        params: &Array<A, D>,
        grads: &Array<A, D>,
    ) -> Result<Array<A, D>> {
        crate::optimizers::check_same_shape(params, grads)?;
        let shape: Shape = SmallVec::from_slice(params.shape());
        let out = self.execute(&shape, Arg::view(params), Arg::view(grads))?;
        let t = match out {
            RunOutput::Owned(t) => t,
            RunOutput::InArgument(_) => A::into_tensor(params.to_owned().into_dyn()),
        };
        into_array(t, params.raw_dim())
    }

    /// [`TPUOptimizer::tpu_step_in_place`]: `params` donated, the new params
    /// written over them (or moved in when the program returned a fresh
    /// tensor).
    pub(super) fn step_donated<D: Dimension>(
        &mut self,
        params: &mut Array<A, D>,
        grads: &Array<A, D>,
    ) -> Result<()> {
        crate::optimizers::check_same_shape(params, grads)?;
        let shape: Shape = SmallVec::from_slice(params.shape());
        let dim = params.raw_dim();
        let out = self.execute(&shape, Arg::donated(params), Arg::view(grads))?;
        if let RunOutput::Owned(t) = out {
            *params = into_array(t, dim)?;
        }
        Ok(())
    }

    /// The rule's run-time learning-rate scalar, recomputed only when the
    /// base's learning rate changes.
    fn learning_rate_scalar(&mut self) -> Option<A> {
        let bits = self.base.learning_rate().as_f64().to_bits();
        match self.learning_rate {
            Some((b, v)) if b == bits => v,
            _ => {
                let v = self
                    .base
                    .update_rule()
                    .and_then(|r| graph::learning_rate_scalar(r));
                self.learning_rate = Some((bits, v));
                v
            }
        }
    }

    /// The compiled program for `shape` (from the cache or compiled now);
    /// a learning rate passed at run time (`lr_at_run_time`) is not part of
    /// the program, so not of its key.
    fn program(
        &mut self,
        shape: &[usize],
        lr_at_run_time: bool,
    ) -> Result<(Arc<Runtime>, u64, bool)> {
        let rule = self.base.update_rule();
        let (dtype, name) = (<A as Element>::DTYPE, self.base.name());
        if let Some(found) = self
            .cache
            .lookup(|k| k.matches(shape, dtype, name, rule, lr_at_run_time))
        {
            return Ok(found);
        }
        let key = ProgramKey::new(shape, dtype, name, rule, lr_at_run_time);
        let started = Instant::now();
        let ty = TensorType::new(<A as Element>::DTYPE, shape.to_vec());
        let mut world = compiler::compiler_world();
        let (program, is_rule) = match rule.map(|r| graph::build_update_graph(&mut world, r, shape))
        {
            Some(Ok(p)) => (p, true),
            // No rule, or one the graph cannot express: the optimizer's own step.
            _ => {
                let mut fresh = compiler::compiler_world();
                let p = graph::build_custom_call_graph(&mut fresh, self.base.name(), &ty);
                world = fresh;
                (p, false)
            }
        };
        let report = compiler::compile(&mut world, program)?;
        // Output 0 (params) over parameter 0, output k (slot k - 1) over
        // parameter k + 1; the count and the grads are never written.
        let aliases: Vec<(usize, usize)> = if is_rule {
            (0..report.executable.outputs.len())
                .map(|o| (o, if o == 0 { 0 } else { o + 1 }))
                .collect()
        } else {
            vec![(0, 0)]
        };
        let runtime = Arc::new(Runtime::with_aliases(report.executable.clone(), &aliases));
        let exe = &report.executable;
        let param_bytes: usize = exe.parameters.iter().map(TensorType::byte_size).sum();
        let result_bytes: usize = exe
            .outputs
            .iter()
            .filter_map(|r| match r {
                compiler::executable::ValueRef::Buffer(b) => {
                    TensorType::parse(&exe.buffers[*b as usize].ty)
                }
                compiler::executable::ValueRef::Constant(_) => None,
            })
            .map(|t| t.byte_size())
            .sum();
        let bytes = (param_bytes + result_bytes) as u64;
        let seconds = started.elapsed().as_secs_f64();
        self.profile.compiles += 1;
        self.profile.compile_seconds += seconds;
        self.profile.last_compile_seconds = seconds;
        self.profile.last_program = exe.name.clone();
        self.profile.last_kernels = exe.kernels.len();
        self.cache.insert(key, runtime.clone(), bytes, is_rule);
        Ok((runtime, bytes, is_rule))
    }

    fn execute(&mut self, shape: &[usize], params: Arg<'_>, grads: Arg<'_>) -> Result<RunOutput> {
        // On a pod, a step runs on the optimizer's devices: none may be
        // declared failed or killed (in the pod's simulated time).
        crate::health::check_devices_up(self.place.world(), &self.devices)?;
        let neg_lr = self.learning_rate_scalar();
        let (runtime, bytes, compiled_rule) = self.program(shape, neg_lr.is_some())?;
        let mut next_count = 0;
        if compiled_rule {
            next_count = self.prepare_state(shape)?;
        }
        // The plan's heap holds the state slots too (they are parameters,
        // updated in place); they are resident already, so the step
        // reserves the rest for its duration.
        let mut heap_bytes = runtime.executable().heap_bytes;
        if compiled_rule {
            heap_bytes = heap_bytes.saturating_sub(hbm::resident_state_bytes(
                &mut self.resident_slots,
                self.place.world(),
            ));
        }
        let reservation = self.reserve(heap_bytes, &runtime.executable().name)?;
        let started = Instant::now();
        let result = self.run(&runtime, params, grads, compiled_rule, next_count, neg_lr);
        let seconds = started.elapsed().as_secs_f64();
        self.release(reservation)?;
        let out = result?;
        if compiled_rule
            && let Some((_, mut c)) = self.counts.iter_mut(self.place.world_mut()).next()
        {
            c.count = next_count;
        }
        self.profile.executions += 1;
        self.profile.execute_seconds += seconds;
        self.profile.last_execute_seconds = seconds;
        self.profile.bytes_moved += bytes;
        Ok(out)
    }

    fn run(
        &mut self,
        runtime: &Runtime,
        params: Arg<'_>,
        grads: Arg<'_>,
        compiled_rule: bool,
        next_count: i32,
        neg_lr: Option<A>,
    ) -> Result<RunOutput> {
        let TPUOptimizer {
            base,
            place,
            slots: slot_query,
            spare_outputs,
            ..
        } = self;
        let world = place.world_mut();
        let mut handler = StepCall::<O, A> {
            base,
            _element: PhantomData,
        };
        if !compiled_rule {
            let mut outs = crate::memory::buffers::with_spare_outputs(spare_outputs, || {
                runtime.run(vec![params, grads], &mut handler)
            })?;
            return Ok(outs.swap_remove(0));
        }
        let mut slots: SmallVec<[Mut<'_, OptimizerSlot>; 4]> = slot_query.iter_mut(world).collect();
        slots.sort_by_key(|s| s.index);
        let mut args: SmallVec<[Arg<'_>; 8]> = SmallVec::new();
        args.push(params);
        args.push(grads);
        if let Some(s) = slots
            .iter()
            .find(|s| s.tensor.dtype() != <A as Element>::DTYPE)
        {
            return Err(OptimError::from(OptimizerError::InvalidState {
                optimizer: base_name(handler.base),
                reason: format!("slot `{}` does not hold {}", s.name, <A as Element>::DTYPE),
            }));
        }
        for s in slots.iter_mut() {
            if let Some(a) = A::array_mut(&mut s.tensor) {
                args.push(Arg::donated(a));
            }
        }
        args.push(Arg::scalar(&next_count));
        if let Some(neg_lr) = &neg_lr {
            args.push(Arg::scalar(neg_lr));
        }
        let outs = crate::memory::buffers::with_spare_outputs(spare_outputs, || {
            runtime.run_args(args, &mut handler)
        })?;
        let mut outs = outs.into_iter();
        let first = outs.next().ok_or_else(|| {
            OptimError::from(OptimizerError::InvalidState {
                optimizer: "tpu".into(),
                reason: "the program returned no params".into(),
            })
        })?;
        for (slot, out) in slots.iter_mut().zip(outs) {
            if let RunOutput::Owned(t) = out {
                slot.tensor = t;
            }
        }
        Ok(first)
    }

    fn reserve(&mut self, bytes: usize, program: &str) -> Result<Option<(Entity, usize)>> {
        if bytes == 0 {
            return Ok(None);
        }
        let Some(&device) = self.devices.first() else {
            return Err(OptimError::invalid_config("the optimizer has no device"));
        };
        let world = self.place.world_mut();
        let block = hbm::reserve(
            world,
            device,
            bytes,
            format_args!("the program `{program}`"),
        )?;
        self.record_reserve(device, block, program);
        Ok(Some((device, block.offset)))
    }

    /// Adds a reservation to the memory profile; the peak is taken while it is held.
    pub(super) fn record_reserve(&mut self, device: Entity, block: Block, holder: &str) {
        let name = self.device_label(device);
        let world = self.place.world();
        let Some(heap) = world.get::<DeviceHeap>(device) else {
            return;
        };
        let used = heap.0.used_bytes() as u64;
        let peak = self
            .profile
            .memory
            .peak
            .as_ref()
            .is_none_or(|p| used > p.used_bytes);
        // The snapshot (two strings) only when it is the new peak: this
        // runs on every step.
        let snapshot = peak.then(|| HbmSnapshot {
            device: name.to_string(),
            program: holder.to_owned(),
            reserved_bytes: block.size as u64,
            used_bytes: used,
            free_bytes: heap.0.free_bytes() as u64,
            largest_free_bytes: heap.0.largest_free() as u64,
            capacity_bytes: heap.0.capacity() as u64,
        });
        self.profile.memory.record(MemoryEvent {
            kind: MemoryEventKind::Reserve,
            device: name,
            bytes: block.size as u64,
            offset: block.offset as u64,
            used_after: used,
        });
        if let Some(snapshot) = snapshot {
            self.profile.memory.peak = Some(snapshot);
        }
    }

    /// `device 0 (v4)`, formatted once per device (keyed by entity and
    /// device id, so a world restored under the optimizer cannot make a
    /// label stale).
    fn device_label(&mut self, device: Entity) -> Arc<str> {
        let id = self.place.world().get::<Device>(device).map(|d| d.id.0);
        if let Some((_, _, name)) = self
            .device_labels
            .iter()
            .find(|(e, i, _)| *e == device && *i == id)
        {
            return name.clone();
        }
        let name: Arc<str> = hbm::device_name(self.place.world(), device).into();
        self.device_labels.push((device, id, name.clone()));
        name
    }

    fn release(&mut self, reservation: Option<(Entity, usize)>) -> Result<()> {
        let Some((device, offset)) = reservation else {
            return Ok(());
        };
        let world = self.place.world_mut();
        let released = hbm::release(world, device, offset)?;
        let used_after = world
            .get::<DeviceHeap>(device)
            .map_or(0, |h| h.0.used_bytes() as u64);
        let device_name = self.device_label(device);
        self.profile.memory.record(MemoryEvent {
            kind: MemoryEventKind::Release,
            device: device_name,
            bytes: released as u64,
            offset: offset as u64,
            used_after,
        });
        Ok(())
    }
}

fn base_name<A, O: Optimizer<A, IxDyn>>(o: &O) -> String {
    o.name().to_owned()
}

fn into_array<A: Element, D: Dimension>(t: Tensor, dim: D) -> Result<Array<A, D>> {
    let ty = t.tensor_type();
    let a = A::from_tensor(t).map_err(|t| {
        OptimError::from(OptimizerError::InvalidState {
            optimizer: "tpu".into(),
            reason: format!(
                "the program returned {}, expected {}",
                t.tensor_type(),
                <A as Element>::DTYPE
            ),
        })
    })?;
    a.into_shape_with_order(dim).map_err(|e| {
        OptimError::from(OptimizerError::InvalidState {
            optimizer: "tpu".into(),
            reason: format!("the program returned {ty}: {e}"),
        })
    })
}
