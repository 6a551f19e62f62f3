//! Fused-loop execution: the prelude once per run, the destinations
//! (donated inputs taken over, or fresh buffers), the addresses the loop
//! reads and writes, then the loop over the pool, as native code or
//! through the chunk interpreter.

use smallvec::{SmallVec, smallvec};

use super::prelude::{eval_scalar_prelude, eval_tensor_prelude, kernel_error};
use super::tasks::run_tasks;
use super::value::{Slot, fresh, tensor_ptr, tensor_ptr_mut, unwritten};
use super::{ExecError, Runtime};
use crate::compiler::executable::{Executable, LoweredKernel, ValueRef};
use crate::exec::error::{KernelFailure, LoopError};
use crate::exec::interpreter::LoopCtx;
use crate::exec::loop_plan::FusedPlan;
use crate::exec::native::NativeLoop;
use crate::ir::Tensor;
use crate::kernels::scalar::{Scalar, ScalarCell};

/// Where a fused loop's outputs go.
struct Destinations {
    /// Per output: its buffer and the slot that holds it once the loop ran.
    dest: SmallVec<[(u32, Slot); 4]>,
    /// Per output: the address the loop writes (0 for a prelude value).
    ptr: SmallVec<[usize; 4]>,
    /// The kernel inputs taken over as destinations, with their addresses.
    donated_inputs: SmallVec<[(u32, usize); 4]>,
    /// Per output: whether it took its donor input over.
    donated: SmallVec<[bool; 4]>,
}

impl Runtime {
    /// Runs kernel `k`, a fused loop with plan `plan`.
    pub(super) fn run_fused(
        &self,
        k: usize,
        kernel: &LoweredKernel,
        plan: &FusedPlan,
        slots: &mut [Option<Slot>],
    ) -> Result<(), ExecError> {
        let exe = &*self.exe;
        // Prelude: once per run, over scalars (no allocation) when it is all
        // scalars, else over whole tensors.
        let scalar_prelude = self.scalar_prelude[k] && !plan.prelude.is_empty();
        let mut prelude: Vec<Option<Tensor>> = Vec::new();
        let mut scalars: SmallVec<[Option<Scalar>; 64]> = SmallVec::new();
        if scalar_prelude {
            eval_scalar_prelude(&self.constant_scalars, kernel, plan, slots, &mut scalars)?;
        } else if !plan.prelude.is_empty() {
            eval_tensor_prelude(exe, kernel, plan, slots, &mut prelude)?;
        }
        let Destinations {
            dest,
            ptr: dest_ptr,
            donated_inputs,
            donated,
        } = self.destinations(kernel, plan, slots, scalar_prelude, &scalars, &prelude)?;
        // Constants are read where the executable keeps them (a copy only
        // for one not in standard layout).
        let mut copies: SmallVec<[Tensor; 2]> = SmallVec::new();
        let in_ptr = input_addresses(exe, kernel, slots, &donated_inputs, &mut copies)?;
        // Scalars are read by address from cells that live until the loop
        // ends (`cells` is not moved after the addresses are taken).
        let cells: SmallVec<[ScalarCell; 64]> = scalars
            .iter()
            .map(|s| s.map_or(ScalarCell([0; 8]), Scalar::to_cell))
            .collect();
        let prelude_ptr = prelude_addresses(kernel, &scalars, &cells, &mut prelude);
        let native = match &self.native[k] {
            Some(Ok(native)) if self.use_native => Some(native),
            _ => None,
        };
        let ran = match native {
            Some(native) => run_native(native, plan, &in_ptr, &prelude_ptr, &dest_ptr),
            None => self.run_interpreted(plan, donated, &in_ptr, &prelude_ptr, &dest_ptr),
        };
        ran.map_err(|e| kernel_error(kernel, KernelFailure::Loop(e)))?;
        drop(copies);
        drop(cells);
        for (b, slot) in dest {
            slots[b as usize] = Some(slot);
        }
        Ok(())
    }

    /// The destination of each output: a prelude value as a new tensor, a
    /// donated input taken over, or a fresh buffer.
    fn destinations(
        &self,
        kernel: &LoweredKernel,
        plan: &FusedPlan,
        slots: &mut [Option<Slot>],
        scalar_prelude: bool,
        scalars: &[Option<Scalar>],
        prelude: &[Option<Tensor>],
    ) -> Result<Destinations, ExecError> {
        let exe = &*self.exe;
        let mut dest: SmallVec<[(u32, Slot); 4]> = SmallVec::with_capacity(plan.outputs.len());
        let mut dest_ptr: SmallVec<[usize; 4]> = SmallVec::with_capacity(plan.outputs.len());
        let mut donated_inputs: SmallVec<[(u32, usize); 4]> = SmallVec::new();
        let mut donated: SmallVec<[bool; 4]> = SmallVec::new();
        for out in &plan.outputs {
            donated.push(false);
            if let Some(p) = out.prelude {
                let t = if scalar_prelude {
                    scalars[p as usize].map(Scalar::to_tensor)
                } else {
                    prelude[p as usize].clone()
                }
                .ok_or_else(|| unwritten(out.buffer))?;
                dest.push((out.buffer, Slot::from_tensor(t)));
                dest_ptr.push(0);
                continue;
            }
            // A runtime-owned buffer may take any output the plan places
            // over it; a caller's donated borrow only its aliased output.
            let donor = out.donor.and_then(|i| match kernel.inputs[i as usize] {
                ValueRef::Buffer(b) => match &slots[b as usize] {
                    Some(s)
                        if s.writable
                            && (s.owned.is_some() || out.aliased)
                            && !donated_inputs.iter().any(|&(j, _)| j == i) =>
                    {
                        Some((i, b))
                    }
                    _ => None,
                },
                ValueRef::Constant(_) => None,
            });
            let slot = match donor {
                Some((i, b)) => {
                    let mut s = slots[b as usize].take().expect("checked above");
                    donated_inputs.push((i, s.ptr));
                    if let Some(last) = donated.last_mut() {
                        *last = true;
                    }
                    if s.owned.is_some() {
                        // The tensor now holds this output, not the argument.
                        s.arg = None;
                    }
                    s
                }
                None => {
                    let ty = self.buffer_types[out.buffer as usize]
                        .clone()
                        .ok_or_else(|| {
                            kernel_error(
                                kernel,
                                KernelFailure::BufferType(
                                    exe.buffers[out.buffer as usize].ty.clone(),
                                ),
                            )
                        })?;
                    let (t, ptr) = fresh(&ty);
                    Slot {
                        ty,
                        ptr,
                        writable: true,
                        owned: Some(Box::new(t)),
                        arg: None,
                    }
                }
            };
            dest_ptr.push(slot.ptr);
            dest.push((out.buffer, slot));
        }
        Ok(Destinations {
            dest,
            ptr: dest_ptr,
            donated_inputs,
            donated,
        })
    }

    /// Runs the loop through the chunk interpreter.
    fn run_interpreted(
        &self,
        plan: &FusedPlan,
        donated: SmallVec<[bool; 4]>,
        in_ptr: &[usize],
        prelude_ptr: &[usize],
        dest_ptr: &[usize],
    ) -> Result<(), LoopError> {
        // A one-pass body streams like a hand-written loop, which the
        // hardware prefetcher serves best; longer bodies read each
        // array in a different instruction and need the software
        // prefetch.
        let mut streams: SmallVec<[(usize, usize); 8]> = SmallVec::new();
        let prefetch = plan.body.len() > 1;
        for &(input, i, size) in plan.streams.iter().filter(|_| prefetch) {
            let base = if input {
                in_ptr[i as usize]
            } else {
                dest_ptr[i as usize]
            };
            if !streams.iter().any(|&(b, _)| b == base) {
                streams.push((base, size));
            }
        }
        let ctx = LoopCtx {
            plan,
            exec: self.exec,
            exec_in_place: self.exec_in_place,
            exec_product: self.exec_product,
            donated,
            streams,
            inputs: in_ptr,
            prelude: prelude_ptr,
            outputs: dest_ptr,
            chunk: self.chunk,
        };
        run_tasks(
            plan.len,
            || ctx.registers(),
            |regs, lo, hi| ctx.run_range(lo, hi, regs),
        )
    }
}

/// The address of each kernel input (donated inputs are read where they
/// are written); a constant not in standard layout is copied into `copies`.
fn input_addresses(
    exe: &Executable,
    kernel: &LoweredKernel,
    slots: &[Option<Slot>],
    donated_inputs: &[(u32, usize)],
    copies: &mut SmallVec<[Tensor; 2]>,
) -> Result<SmallVec<[usize; 32]>, ExecError> {
    let mut in_ptr: SmallVec<[usize; 32]> = SmallVec::with_capacity(kernel.inputs.len());
    for (i, &r) in kernel.inputs.iter().enumerate() {
        if let Some(&(_, p)) = donated_inputs.iter().find(|&&(j, _)| j as usize == i) {
            in_ptr.push(p);
            continue;
        }
        match r {
            ValueRef::Constant(c) => match tensor_ptr(&exe.constants[c as usize]) {
                Some(p) => in_ptr.push(p),
                None => {
                    let mut t = exe.constants[c as usize].clone();
                    in_ptr.push(tensor_ptr_mut(&mut t));
                    copies.push(t);
                }
            },
            ValueRef::Buffer(b) => {
                let s = slots[b as usize].as_ref().ok_or_else(|| unwritten(b))?;
                in_ptr.push(s.ptr);
            }
        }
    }
    Ok(in_ptr)
}

/// The address of each instruction's prelude value: a scalar's cell in
/// `cells`, or a tensor's data.
fn prelude_addresses(
    kernel: &LoweredKernel,
    scalars: &[Option<Scalar>],
    cells: &[ScalarCell],
    prelude: &mut [Option<Tensor>],
) -> SmallVec<[usize; 64]> {
    let mut prelude_ptr: SmallVec<[usize; 64]> = smallvec![0; kernel.instrs.len()];
    for (i, s) in scalars.iter().enumerate() {
        if s.is_some() {
            prelude_ptr[i] = cells[i].0.as_ptr() as usize;
        }
    }
    for (i, v) in prelude.iter_mut().enumerate() {
        if let Some(t) = v {
            prelude_ptr[i] = tensor_ptr_mut(t);
        }
    }
    prelude_ptr
}

/// Runs the loop as native code.
fn run_native(
    native: &NativeLoop,
    plan: &FusedPlan,
    in_ptr: &[usize],
    prelude_ptr: &[usize],
    dest_ptr: &[usize],
) -> Result<(), LoopError> {
    let mut table: SmallVec<[usize; 96]> =
        SmallVec::with_capacity(native.table_len(dest_ptr.len()));
    // SAFETY: a scalar's input or prelude address points to its
    // value (an argument, constant or cell held until the loop
    // ends).
    unsafe { native.fill_table(&mut table, in_ptr, prelude_ptr, dest_ptr) };
    run_tasks(
        plan.len,
        || (),
        |(), lo, hi| {
            // SAFETY: the table holds the kernel's input, prelude
            // and destination addresses, each with `plan.len`
            // elements of the loop's type (scalars one); each task
            // writes only its own `[lo, hi)` of the destinations,
            // and the buffers are held by `Runtime::run_fused` until the
            // loop ends.
            unsafe { native.run(&table, lo, hi) };
            Ok(())
        },
    )
}
