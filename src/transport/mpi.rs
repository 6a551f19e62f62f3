//! The ranks `mpirun` started, joined through the system's MPI (the `mpi`
//! feature; rsmpi over OpenMPI).
//!
//! Frames go point to point: a non-blocking send (`MPI_Isend`) whose buffer
//! is held until MPI reports it complete, and a receive that polls
//! `MPI_Improbe` until the frame is there or the deadline passes, so no wait
//! on a dead or hung rank is unbounded (a blocking `MPI_Recv` would be).

use super::cluster::Mailbox;
use super::error::ClusterError;
use mpi::Threading;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, StaticScope};
use mpi::topology::Communicator;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The tag of every frame (the job's only traffic on this communicator).
const FRAME_TAG: i32 = 0x0071;

/// A send in flight and the buffer MPI reads it from (owned here until
/// MPI reports the send complete; moving the `Vec` does not move its data).
struct PendingSend {
    request: Request<'static, [u8], StaticScope>,
    buffer: Vec<u8>,
}

/// Completed send buffers kept for the next frames: a collective's large
/// frames then land in memory already faulted in, not fresh pages.
const SPARE_BUFFERS: usize = 8;

/// MPI, initialized until the last holder is gone.
struct Session {
    universe: ManuallyDrop<Universe>,
    /// A rank was lost: `MPI_Finalize` (a fence over every rank) would
    /// wait for it, so it is skipped.
    abandoned: AtomicBool,
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.abandoned.load(Ordering::Relaxed) {
            // SAFETY: dropped once, here, and never used after.
            unsafe { ManuallyDrop::drop(&mut self.universe) };
        }
    }
}

/// The host's hold on MPI: `MPI_Finalize` runs when both it and the
/// mailbox are dropped (unless a rank was lost). A host keeps it past the
/// mailbox to report an error before the ranks' final fence, so every
/// rank's error is printed before the launcher ends the job.
pub struct MpiSession(Arc<Session>);

impl std::fmt::Debug for MpiSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiSession")
            .field("abandoned", &self.0.abandoned.load(Ordering::Relaxed))
            .finish()
    }
}

/// This process's rank in the job `mpirun` started.
pub struct MpiMailbox {
    rank: u32,
    ranks: u32,
    pending: Vec<PendingSend>,
    spares: Vec<Vec<u8>>,
    session: Arc<Session>,
}

// SAFETY: MPI is initialized with `Threading::Funneled` and the mailbox is
// only ever used from the thread that stepped the pod and initialized MPI
// (it sits behind a mutex, and the engine's schedules run on the calling
// thread); the raw request handles and send buffers are never shared.
unsafe impl Send for MpiMailbox {}

impl std::fmt::Debug for MpiMailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiMailbox")
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("pending_sends", &self.pending.len())
            .finish()
    }
}

impl MpiMailbox {
    /// Initializes MPI. `None` if it was initialized already in this process.
    pub fn initialize() -> Option<(MpiMailbox, MpiSession)> {
        let (universe, _) = mpi::initialize_with_threading(Threading::Funneled)?;
        let world = universe.world();
        let session = Arc::new(Session {
            universe: ManuallyDrop::new(universe),
            abandoned: AtomicBool::new(false),
        });
        let mailbox = MpiMailbox {
            rank: world.rank() as u32,
            ranks: world.size() as u32,
            pending: Vec::new(),
            spares: Vec::new(),
            session: Arc::clone(&session),
        };
        Some((mailbox, MpiSession(session)))
    }

    fn universe(&self) -> &Universe {
        &self.session.universe
    }

    /// Takes back the buffers of completed sends.
    fn reap(&mut self) {
        let mut still = Vec::with_capacity(self.pending.len());
        for send in std::mem::take(&mut self.pending) {
            match send.request.test() {
                // MPI no longer reads the buffer.
                Ok(_) => self.recycle(send.buffer),
                Err(request) => still.push(PendingSend {
                    request,
                    buffer: send.buffer,
                }),
            }
        }
        self.pending = still;
    }
}

impl Drop for MpiMailbox {
    fn drop(&mut self) {
        // Give sends a moment to finish; a send to a rank that is gone never
        // will, and dropping its request would abort: leak it instead.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.pending.is_empty() && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(Duration::from_micros(200));
        }
        for send in self.pending.drain(..) {
            std::mem::forget(send.request);
            std::mem::forget(send.buffer);
        }
    }
}

impl Mailbox for MpiMailbox {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn ranks(&self) -> u32 {
        self.ranks
    }

    fn spare_buffer(&mut self, capacity: usize) -> Vec<u8> {
        self.reap();
        // The smallest spare that holds `capacity` bytes.
        let best = self
            .spares
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let mut buffer = self.spares.swap_remove(i);
                buffer.clear();
                buffer
            }
            None => Vec::with_capacity(capacity),
        }
    }

    fn recycle(&mut self, buffer: Vec<u8>) {
        if self.spares.len() >= SPARE_BUFFERS {
            // Keep the largest: they are the ones worth not faulting again.
            if let Some((i, _)) = self
                .spares
                .iter()
                .enumerate()
                .min_by_key(|(_, b)| b.capacity())
                .filter(|(_, b)| b.capacity() < buffer.capacity())
            {
                self.spares[i] = buffer;
            }
            return;
        }
        self.spares.push(buffer);
    }

    fn abandon(&mut self) {
        self.session.abandoned.store(true, Ordering::Relaxed);
    }

    fn send(&mut self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError> {
        if to >= self.ranks {
            return Err(ClusterError::NoSuchRank {
                rank: to,
                ranks: self.ranks,
            });
        }
        if frame.len() > i32::MAX as usize {
            return Err(ClusterError::Transport(format!(
                "a frame of {} bytes is over MPI's 2 GiB count limit",
                frame.len()
            )));
        }
        self.reap();
        // SAFETY: the data lives in `frame`, held in `pending` until `reap`
        // sees the request complete (or leaked with it); a `Vec` that moves
        // keeps its heap data where it is.
        let readable: &'static [u8] =
            unsafe { std::slice::from_raw_parts(frame.as_ptr(), frame.len()) };
        let world = self.universe().world();
        let request = world.process_at_rank(to as i32).immediate_send_with_tag(
            StaticScope,
            readable,
            FRAME_TAG,
        );
        self.pending.push(PendingSend {
            request,
            buffer: frame,
        });
        Ok(())
    }

    fn receive(&mut self, from: u32, deadline: Instant) -> Result<Option<Vec<u8>>, ClusterError> {
        if from >= self.ranks {
            return Err(ClusterError::NoSuchRank {
                rank: from,
                ranks: self.ranks,
            });
        }
        let started = Instant::now();
        loop {
            self.reap();
            let world = self.universe().world();
            let source = world.process_at_rank(from as i32);
            if let Some((message, status)) = source.immediate_matched_probe_with_tag(FRAME_TAG) {
                let len = status.count(u8::equivalent_datatype()).max(0) as usize;
                let mut frame = self.spare_buffer(len);
                frame.resize(len, 0);
                message.matched_receive_into(&mut frame[..]);
                return Ok(Some(frame));
            }
            if Instant::now() >= deadline {
                self.abandon();
                return Ok(None);
            }
            // Spin for a moment (a frame in flight, a collective's peer
            // microseconds behind: MPI's own progress loop polls without
            // giving up the core), yield while the other ranks are likely
            // mid-tick (yielding hands an oversubscribed core to them),
            // then back off to sleeping.
            let waited = started.elapsed();
            if waited < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(5) {
                std::thread::yield_now();
            } else {
                let micros = (waited.as_micros() as u64 / 10).clamp(50, 1_000);
                std::thread::sleep(Duration::from_micros(micros));
            }
        }
    }
}
