//! Fresh output buffers for large element-wise results.
//!
//! A fresh 40 MB output otherwise costs ~10k page faults on first touch,
//! more than the update that fills it (`docs/benchmarks-optimizers.md`);
//! PyTorch's CPU allocator advises huge pages the same way.

use std::any::Any;
use std::cell::RefCell;

/// A buffer handed back for reuse (a `Vec<A>` of some element type).
pub type SpareBuffer = Box<dyn Any + Send>;

thread_local! {
    /// Buffers [`with_spare_outputs`] lends to the outputs made on this
    /// thread while it runs.
    static SPARE: RefCell<Vec<SpareBuffer>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `spares` lent to [`output_buffer`] on this thread: an
/// output of `n` elements of `A` takes a spare `Vec<A>` whose capacity is
/// between `n` and `2n` instead of new memory, so its pages are already
/// faulted in. The spares not taken are given back in `spares`.
pub fn with_spare_outputs<R>(spares: &mut Vec<SpareBuffer>, f: impl FnOnce() -> R) -> R {
    SPARE.with(|s| std::mem::swap(&mut *s.borrow_mut(), spares));
    let result = f();
    SPARE.with(|s| std::mem::swap(&mut *s.borrow_mut(), spares));
    result
}

/// A spare `Vec<A>` lent by [`with_spare_outputs`] with room for `n`.
fn take_spare<A: 'static>(n: usize) -> Option<Vec<A>> {
    SPARE.with(|s| {
        let mut spares = s.borrow_mut();
        let at = spares.iter().position(|b| {
            b.downcast_ref::<Vec<A>>()
                .is_some_and(|v| v.capacity() >= n && v.capacity() <= 2 * n.max(1))
        })?;
        let mut v = *spares.swap_remove(at).downcast::<Vec<A>>().ok()?;
        v.clear();
        Some(v)
    })
}

/// Room for `n` elements, uninitialised: a spare lent by
/// [`with_spare_outputs`] when one fits, else new memory. On Linux, new
/// memory spanning whole 2 MiB pages is advised to use transparent huge
/// pages before anything touches it, which turns ~10k page faults per
/// 40 MB into ~20.
pub fn output_buffer<A: 'static>(n: usize) -> Vec<A> {
    if let Some(spare) = take_spare::<A>(n) {
        return spare;
    }
    let buffer = Vec::<A>::with_capacity(n);
    #[cfg(target_os = "linux")]
    advise_huge_pages(buffer.as_ptr().cast::<u8>(), n * std::mem::size_of::<A>());
    buffer
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *const u8, len: usize) {
    const HUGE_PAGE: usize = 2 << 20;
    if len < 2 * HUGE_PAGE {
        return;
    }
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: [start, end) lies inside the allocation this function was
        // handed, which the caller owns; MADV_HUGEPAGE changes only how the
        // kernel backs those pages, never their contents. The advice may be
        // refused (THP disabled); that changes nothing, so the result is
        // ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}
