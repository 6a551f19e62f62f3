//! SIGINT and SIGTERM during `train`: the run stops at the next step
//! boundary (a checkpoint write in progress finishes first, so no partial
//! checkpoint is left), returns an error naming what was done, and its
//! temporary checkpoint directory is removed on the way out. A second
//! signal ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

#[cfg(target_os = "linux")]
extern "C" fn on_signal(signal: libc::c_int) {
    // Only async-signal-safe calls here: an atomic swap, and `_exit`.
    if REQUESTED.swap(true, Ordering::SeqCst) {
        // SAFETY: `_exit` is async-signal-safe and never returns.
        unsafe { libc::_exit(128 + signal) };
    }
}

/// Routes SIGINT and SIGTERM to [`requested`] for the rest of the process.
pub(super) fn install() {
    #[cfg(target_os = "linux")]
    {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only touches an atomic and calls `_exit`.
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
    }
}

/// Whether SIGINT or SIGTERM arrived since [`install`].
pub(super) fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
