//! Device 0's heap read directly, to check what the optimizer publishes as
//! `HbmUsage` against the allocator itself.

use optirs_tpu::exec::runtime::Element;
use optirs_tpu::optimizers::FloatElement;
use optirs_tpu::topology::Device;
use optirs_tpu::tpu::state::DeviceHeap;
use optirs_tpu::{Optimizer, TPUOptimizer};

/// Bytes in use in device 0's heap.
pub fn heap_used<O, A>(opt: &TPUOptimizer<O, A>) -> u64
where
    O: Optimizer<A, ndarray::IxDyn>,
    A: FloatElement + Element,
{
    let world = opt.world();
    let mut q = world.try_query::<(&Device, &DeviceHeap)>().unwrap();
    q.iter(world)
        .find(|(d, _)| d.id.0 == 0)
        .map(|(_, h)| h.0.used_bytes() as u64)
        .unwrap()
}
