//! The ranks' shared segment as an MPI-3 shared-memory window: when every
//! rank of the job is on one node (`MPI_Comm_split_type` with
//! `MPI_COMM_TYPE_SHARED` gives all of them), `MPI_Win_allocate_shared`
//! gives each rank a part that every rank maps, and `MPI_Win_shared_query`
//! where the others' parts are in this process. A collective then reads
//! the other ranks' members in place: no send, no receive, no copy.
//!
//! The window is under `MPI_Win_lock_all` (a passive-target epoch, with
//! `MPI_MODE_NOCHECK`: no rank ever locks it exclusively) for its whole
//! life, so loads and stores are MPI-3's unified model's, ordered by the
//! fence: `MPI_Win_sync`, a barrier, `MPI_Win_sync`. The barrier is an
//! `MPI_Ibarrier` polled with `MPI_Test` to a deadline, so a lost rank is
//! named within the rank timeout rather than waited for; the collective
//! calls that have no nonblocking form (the split, the allocation, the
//! free) are each entered only after such a barrier saw every rank there.

use super::{DATA_SPIN, Session, back_off};
use crate::transport::cluster::SharedMemory;
use crate::transport::error::ClusterError;
use mpi::ffi;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Each rank's part is a whole number of pages: the parts stay aligned
/// whether MPI lays them out one after another or apart.
const PART_ALIGN: usize = 4096;

/// An MPI call's code as a result.
fn check(code: i32, call: &str) -> Result<(), ClusterError> {
    if code == ffi::MPI_SUCCESS as i32 {
        Ok(())
    } else {
        Err(ClusterError::Transport(format!(
            "{call} failed (MPI error {code})"
        )))
    }
}

/// A barrier over `comm` polled until `deadline`: `Ok(false)` if not every
/// rank came by then (the barrier's request is left to MPI: the job is
/// ending, and the caller abandons the session).
pub(super) fn bounded_barrier(
    comm: ffi::MPI_Comm,
    deadline: Instant,
) -> Result<bool, ClusterError> {
    // SAFETY: a live communicator; the request is MPI's until it completes.
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    check(
        unsafe { ffi::MPI_Ibarrier(comm, &mut request) },
        "MPI_Ibarrier",
    )?;
    let started = Instant::now();
    loop {
        let mut done = 0;
        // SAFETY: `MPI_Status` is a plain C struct; all zeroes is valid.
        let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
        // SAFETY: the barrier's live request.
        check(
            unsafe { ffi::MPI_Test(&mut request, &mut done, &mut status) },
            "MPI_Test",
        )?;
        if done != 0 {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        back_off(started.elapsed(), DATA_SPIN);
    }
}

/// The node's ranks, if every rank of `world` is on this node (and keeps
/// its rank there), from `MPI_Comm_split_type`; `None` otherwise (the same
/// answer on every rank). A collective call over `world`.
pub(super) fn node_of(
    world: ffi::MPI_Comm,
    rank: u32,
    ranks: u32,
    deadline: Instant,
) -> Result<Option<ffi::MPI_Comm>, ClusterError> {
    if !bounded_barrier(world, deadline)? {
        return Err(ClusterError::Transport(
            "not every rank came to find which ranks share a node within the bound".into(),
        ));
    }
    // SAFETY: every rank is at this call (the barrier above); `node` is
    // written by MPI.
    let mut node = unsafe { ffi::RSMPI_COMM_NULL };
    check(
        unsafe {
            ffi::MPI_Comm_split_type(
                world,
                ffi::RSMPI_COMM_TYPE_SHARED,
                rank as i32,
                ffi::RSMPI_INFO_NULL,
                &mut node,
            )
        },
        "MPI_Comm_split_type",
    )?;
    let (mut size, mut node_rank) = (0, 0);
    // SAFETY: the communicator just made.
    unsafe {
        ffi::MPI_Comm_size(node, &mut size);
        ffi::MPI_Comm_rank(node, &mut node_rank);
    }
    if size == ranks as i32 && node_rank == rank as i32 {
        return Ok(Some(node));
    }
    // SAFETY: ours, and no longer used.
    unsafe { ffi::MPI_Comm_free(&mut node) };
    Ok(None)
}

/// This rank's view of a shared-memory window over the node's ranks.
pub(super) struct MpiWindow {
    win: ffi::MPI_Win,
    /// The node's ranks (the mailbox's; it outlives the window's use).
    comm: ffi::MPI_Comm,
    /// Every rank's part in this process: base and bytes.
    parts: Vec<(*mut u8, usize)>,
    session: Arc<Session>,
    /// How long the free's barrier waits for every rank.
    bound: Duration,
}

impl std::fmt::Debug for MpiWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiWindow")
            .field("parts", &self.parts.len())
            .finish()
    }
}

// SAFETY: MPI runs `Threading::Funneled` and the window is used only from
// the thread that steps the pod (as the mailbox is); the parts are shared
// memory whose accesses the segment's fences order.
unsafe impl Send for MpiWindow {}

impl MpiWindow {
    /// A window of `bytes` bytes a rank over `comm` (every rank of the
    /// job), with every rank: a collective call.
    pub(super) fn allocate(
        comm: ffi::MPI_Comm,
        bytes: usize,
        deadline: Instant,
        session: Arc<Session>,
    ) -> Result<MpiWindow, ClusterError> {
        let size = bytes.div_ceil(PART_ALIGN).max(1) * PART_ALIGN;
        if !bounded_barrier(comm, deadline)? {
            return Err(ClusterError::Transport(
                "not every rank came to allocate the shared window within the bound".into(),
            ));
        }
        let mut win = unsafe { ffi::RSMPI_WIN_NULL };
        let mut base: *mut u8 = std::ptr::null_mut();
        // SAFETY: every rank is at this call (the barrier above); MPI
        // writes `base` and `win`. "alloc_shared_noncontig" lets each part
        // be placed apart (in its own rank's memory).
        unsafe {
            let mut info = ffi::RSMPI_INFO_NULL;
            check(ffi::MPI_Info_create(&mut info), "MPI_Info_create")?;
            ffi::MPI_Info_set(info, c"alloc_shared_noncontig".as_ptr(), c"true".as_ptr());
            let code = ffi::MPI_Win_allocate_shared(
                size as ffi::MPI_Aint,
                1,
                info,
                comm,
                (&mut base as *mut *mut u8).cast::<c_void>(),
                &mut win,
            );
            ffi::MPI_Info_free(&mut info);
            check(code, "MPI_Win_allocate_shared")?;
            ffi::MPI_Win_set_errhandler(win, ffi::RSMPI_ERRORS_RETURN);
        }
        let mut ranks = 0;
        // SAFETY: a live communicator.
        unsafe { ffi::MPI_Comm_size(comm, &mut ranks) };
        let mut parts = Vec::with_capacity(ranks.max(0) as usize);
        for r in 0..ranks {
            let (mut len, mut unit) = (0 as ffi::MPI_Aint, 0);
            let mut at: *mut u8 = std::ptr::null_mut();
            // SAFETY: the window just allocated; MPI writes the three.
            check(
                unsafe {
                    ffi::MPI_Win_shared_query(
                        win,
                        r,
                        &mut len,
                        &mut unit,
                        (&mut at as *mut *mut u8).cast::<c_void>(),
                    )
                },
                "MPI_Win_shared_query",
            )?;
            parts.push((at, len.max(0) as usize));
        }
        // SAFETY: the window just allocated; no rank locks it otherwise.
        check(
            unsafe { ffi::MPI_Win_lock_all(ffi::MPI_MODE_NOCHECK as i32, win) },
            "MPI_Win_lock_all",
        )?;
        Ok(MpiWindow {
            win,
            comm,
            parts,
            bound: deadline.saturating_duration_since(Instant::now()),
            session,
        })
    }
}

impl SharedMemory for MpiWindow {
    fn part(&self, rank: u32) -> Option<(*mut u8, usize)> {
        self.parts.get(rank as usize).copied()
    }

    fn barrier(&mut self, deadline: Instant) -> Result<bool, ClusterError> {
        // SAFETY: the live window, in its lock_all epoch.
        check(unsafe { ffi::MPI_Win_sync(self.win) }, "MPI_Win_sync")?;
        if !bounded_barrier(self.comm, deadline)? {
            self.session.abandoned.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        check(unsafe { ffi::MPI_Win_sync(self.win) }, "MPI_Win_sync")?;
        Ok(true)
    }
}

impl Drop for MpiWindow {
    fn drop(&mut self) {
        // `MPI_Win_free` waits for every rank: entered only once a
        // bounded barrier saw all of them here, and never after a rank
        // was lost (the window is left to the ending process then).
        if self.session.abandoned.load(Ordering::Relaxed) {
            return;
        }
        let deadline = Instant::now() + self.bound;
        if !matches!(bounded_barrier(self.comm, deadline), Ok(true)) {
            self.session.abandoned.store(true, Ordering::Relaxed);
            return;
        }
        // SAFETY: the live window, every rank at its free.
        unsafe {
            ffi::MPI_Win_unlock_all(self.win);
            ffi::MPI_Win_free(&mut self.win);
        }
    }
}
