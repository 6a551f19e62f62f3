//! Fresh output buffers for large element-wise results.
//!
//! A fresh 40 MB output otherwise costs ~10k page faults on first touch,
//! more than the update that fills it (`docs/benchmarks-optimizers.md`);
//! PyTorch's CPU allocator advises huge pages the same way.

/// Room for `n` elements, uninitialised. On Linux, a buffer spanning whole
/// 2 MiB pages is advised to use transparent huge pages before anything
/// touches it, which turns ~10k page faults per 40 MB into ~20.
pub fn output_buffer<A>(n: usize) -> Vec<A> {
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
