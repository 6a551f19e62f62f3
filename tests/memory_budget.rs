//! The largest preset fits its memory budget: loading and spawning v4-8192
//! (4096 chips, 12,288 links) peaks under 100 MB of heap.
//!
//! A counting global allocator (this test binary only) tracks live and peak
//! heap bytes; unlike wall time, the figure is deterministic.

use optirs_tpu::Pod;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged to the system allocator.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn v4_4096_loads_in_under_100_mb() {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mut pod = Pod::from_preset("v4-8192").unwrap();
    pod.run(10);
    let peak = PEAK.load(Ordering::Relaxed) - before;
    let live = LIVE.load(Ordering::Relaxed) - before;
    println!("v4-8192: peak {peak} B, live {live} B after load");
    assert!(peak < 100_000_000, "peak heap {peak} B");
    assert!(live > 4096 * 32, "the pod holds its entities: {live} B");
    drop(pod);
}
