//! The ranks `mpirun` started, joined through the system's MPI (the `mpi`
//! feature; rsmpi over OpenMPI).
//!
//! Frames go point to point: a non-blocking send (`MPI_Isend`) whose buffer
//! is held until MPI reports it complete, and a receive that polls
//! `MPI_Improbe` until the frame is there or the deadline passes, so no wait
//! on a dead or hung rank is unbounded (a blocking `MPI_Recv` would be).
//! Alarms (a rank naming a lost one) travel under a tag of their own, and
//! every receive also probes it from any rank, so a rank waiting on a peer
//! that is stuck behind the lost rank hears the name at once.
//!
//! A collective's data does not travel in frames: [`Mailbox::exchange`]
//! posts an `MPI_Irecv` straight into the caller's buffer for every
//! receive and an `MPI_Isend` straight from the members' buffers for every
//! send, all at once, then polls them with `MPI_Testsome` to the deadline,
//! handing each receive to the caller the moment it completes. Each
//! crossing byte is moved once, by MPI's own transport (OpenMPI's shared
//! memory: one copy where the kernel allows reading the peer's memory).

mod window;

use super::cluster::{Exchange, Landed, Mailbox, SharedSegment};
use super::error::ClusterError;
use mpi::Threading;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::point_to_point::{Destination, Source};
use mpi::raw::AsRaw;
use mpi::request::{Request, StaticScope};
use mpi::topology::Communicator;
use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The tag of every frame.
const FRAME_TAG: i32 = 0x0071;

/// The tag of an alarm ([`Mailbox::send_alarm`]): a receive from any rank
/// takes it, whichever rank's frame it waits for.
const ALARM_TAG: i32 = 0x0072;

/// MPI tags of a collective's data: `DATA_TAGS` values from
/// `DATA_TAG_BASE`, all below the `MPI_TAG_UB` every MPI guarantees
/// (32767) and above [`FRAME_TAG`], so data and frames never match.
const DATA_TAG_BASE: i32 = 0x100;
const DATA_TAGS: u64 = 0x7E00;

/// The MPI tag of a collective's step `tag`: neighbouring steps differ,
/// so a rank out of step waits (and is named at the deadline) rather
/// than taking another step's bytes.
fn data_tag(tag: u64) -> i32 {
    let mixed = tag.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ tag;
    DATA_TAG_BASE + (mixed % DATA_TAGS) as i32
}

/// How long a wait for a frame spins before it yields the core.
const FRAME_SPIN: Duration = Duration::from_micros(50);

/// How long a collective's wait for data spins before it yields: a peer
/// is usually a piece behind (a 1 MiB piece is ~100 µs of copying), and
/// on a loaded machine a yielded core comes back a time slice later.
const DATA_SPIN: Duration = Duration::from_micros(300);

/// How long cancelled requests of a failed exchange get to complete
/// before the mailbox gives up on MPI altogether.
const CANCEL_BOUND: Duration = Duration::from_secs(1);

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
    /// A failed exchange left requests MPI may still complete into
    /// buffers that are gone: no MPI call may run here again (each would
    /// drive MPI's progress), so every later call is an error.
    poisoned: bool,
    /// Whether the ranks share a node's memory ([`Mailbox::share_memory`]).
    node: NodeSharing,
}

/// Whether every rank of the job shares this node's memory.
#[derive(Debug, Clone, Copy)]
enum NodeSharing {
    /// Not asked yet (the first shared segment asks, with every rank).
    Unknown,
    /// Yes: the node's ranks, every rank of the job in its own order.
    Shared(ffi::MPI_Comm),
    /// The ranks span several nodes.
    Apart,
    /// The host asked for messages only
    /// ([`MpiMailbox::without_shared_memory`]).
    Declined,
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
        // Errors come back as codes (a receive longer than its buffer is a
        // descriptive error of the exchange, not an abort of the job).
        // SAFETY: the world communicator of an initialized MPI.
        unsafe { ffi::MPI_Comm_set_errhandler(world.as_raw(), ffi::RSMPI_ERRORS_RETURN) };
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
            poisoned: false,
            node: NodeSharing::Unknown,
        };
        Some((mailbox, MpiSession(session)))
    }

    /// This rank moves every byte of a collective by messages, even when
    /// every rank is on its node (the data plane of ranks on several
    /// nodes). Every rank of the job must be told alike.
    pub fn without_shared_memory(mut self) -> MpiMailbox {
        self.node = NodeSharing::Declined;
        self
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

    /// Sends `frame` to `to` under `tag`, without waiting.
    fn send_tagged(&mut self, to: u32, frame: Vec<u8>, tag: i32) -> Result<(), ClusterError> {
        self.usable()?;
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
        let request =
            world
                .process_at_rank(to as i32)
                .immediate_send_with_tag(StaticScope, readable, tag);
        self.pending.push(PendingSend {
            request,
            buffer: frame,
        });
        Ok(())
    }

    /// Refuses every MPI call once a failed exchange poisoned the mailbox.
    fn usable(&self) -> Result<(), ClusterError> {
        if self.poisoned {
            return Err(ClusterError::Transport(
                "an exchange with a lost rank left MPI requests that did not complete".into(),
            ));
        }
        Ok(())
    }

    fn comm(&self) -> ffi::MPI_Comm {
        self.universe().world().as_raw()
    }

    fn check_peer(&self, peer: u32, len: usize) -> Result<(), ClusterError> {
        if peer >= self.ranks || peer == self.rank {
            return Err(ClusterError::NoSuchRank {
                rank: peer,
                ranks: self.ranks,
            });
        }
        if len > i32::MAX as usize {
            return Err(ClusterError::Transport(format!(
                "{len} bytes in one piece are over MPI's 2 GiB count limit"
            )));
        }
        Ok(())
    }

    /// Polls `requests` until all complete (`Ok(None)`) or `deadline`
    /// passes (`Ok(Some(index))` of the first still pending), calling
    /// `done` with each one's index as it completes.
    fn complete(
        &mut self,
        requests: &mut [ffi::MPI_Request],
        deadline: Instant,
        done: &mut dyn FnMut(usize, &ffi::MPI_Status) -> Result<(), ClusterError>,
    ) -> Result<Option<usize>, ClusterError> {
        let count = requests.len() as i32;
        let mut indices = vec![0i32; requests.len()];
        // SAFETY: `MPI_Status` is a plain C struct; all zeroes is valid.
        let mut statuses: Vec<ffi::MPI_Status> = (0..requests.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        let mut pending = requests.len();
        let mut idle_since = Instant::now();
        while pending > 0 {
            let mut completed = 0;
            // SAFETY: `requests` are live requests or MPI_REQUEST_NULL,
            // `indices` and `statuses` have room for all of them.
            let code = unsafe {
                ffi::MPI_Testsome(
                    count,
                    requests.as_mut_ptr(),
                    &mut completed,
                    indices.as_mut_ptr(),
                    statuses.as_mut_ptr(),
                )
            };
            if code != ffi::MPI_SUCCESS as i32 && code != ffi::MPI_ERR_IN_STATUS as i32 {
                return Err(ClusterError::Transport(format!(
                    "MPI_Testsome failed (MPI error {code})"
                )));
            }
            if completed == unsafe { ffi::RSMPI_UNDEFINED } {
                break;
            }
            if code == ffi::MPI_SUCCESS as i32 {
                // A status's error field is set only with MPI_ERR_IN_STATUS.
                for status in &mut statuses[..completed.max(0) as usize] {
                    status.MPI_ERROR = ffi::MPI_SUCCESS as i32;
                }
            }
            for (k, &index) in indices[..completed.max(0) as usize].iter().enumerate() {
                pending -= 1;
                done(index as usize, &statuses[k])?;
            }
            if completed > 0 {
                idle_since = Instant::now();
                continue;
            }
            if Instant::now() >= deadline {
                let null = unsafe { ffi::RSMPI_REQUEST_NULL };
                return Ok(requests.iter().position(|&r| r != null));
            }
            back_off(idle_since.elapsed(), DATA_SPIN);
        }
        Ok(None)
    }

    /// Cancels what a failed exchange left pending and waits (bounded)
    /// for it; if MPI does not let go of every buffer, no MPI call runs
    /// here again.
    fn cancel(&mut self, requests: &mut [ffi::MPI_Request]) {
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        for request in requests.iter_mut().filter(|r| **r != null) {
            // SAFETY: a live request of this exchange.
            unsafe { ffi::MPI_Cancel(request) };
        }
        let deadline = Instant::now() + CANCEL_BOUND;
        let finished = self.complete(requests, deadline, &mut |_, _| Ok(()));
        if !matches!(finished, Ok(None)) {
            self.poisoned = true;
        }
        self.abandon();
    }
}

impl Drop for MpiMailbox {
    fn drop(&mut self) {
        if self.poisoned {
            return;
        }
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
        self.send_tagged(to, frame, FRAME_TAG)
    }

    fn send_alarm(&mut self, to: u32, frame: Vec<u8>) -> Result<(), ClusterError> {
        self.send_tagged(to, frame, ALARM_TAG)
    }

    fn receive(&mut self, from: u32, deadline: Instant) -> Result<Option<Vec<u8>>, ClusterError> {
        self.usable()?;
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
            let matched = source
                .immediate_matched_probe_with_tag(FRAME_TAG)
                .or_else(|| {
                    world
                        .any_process()
                        .immediate_matched_probe_with_tag(ALARM_TAG)
                });
            if let Some((message, status)) = matched {
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
            back_off(started.elapsed(), FRAME_SPIN);
        }
    }

    fn share_memory(
        &mut self,
        bytes: usize,
        deadline: Instant,
    ) -> Result<Option<SharedSegment>, ClusterError> {
        self.usable()?;
        let node = match self.node {
            NodeSharing::Shared(node) => node,
            NodeSharing::Apart | NodeSharing::Declined => return Ok(None),
            NodeSharing::Unknown => {
                match window::node_of(self.comm(), self.rank, self.ranks, deadline)? {
                    Some(node) => {
                        self.node = NodeSharing::Shared(node);
                        node
                    }
                    None => {
                        self.node = NodeSharing::Apart;
                        return Ok(None);
                    }
                }
            }
        };
        let memory = window::MpiWindow::allocate(
            node,
            crate::transport::cluster::PART_HEADER + bytes,
            deadline,
            Arc::clone(&self.session),
        )?;
        SharedSegment::new(Box::new(memory), self.rank, self.ranks).map(Some)
    }

    fn exchange<'r>(
        &mut self,
        exchange: Exchange<'_, 'r>,
        deadline: Instant,
        landed: &mut Landed<'r, '_>,
    ) -> Result<Option<u32>, ClusterError> {
        self.usable()?;
        let tag = data_tag(exchange.tag);
        let peers: Vec<u32> = exchange
            .receives
            .iter()
            .map(|(from, _)| *from)
            .chain(exchange.sends.iter().map(|(to, _)| *to))
            .collect();
        for (&peer, len) in peers.iter().zip(
            exchange
                .receives
                .iter()
                .map(|(_, b)| b.len())
                .chain(exchange.sends.iter().map(|(_, b)| b.len())),
        ) {
            self.check_peer(peer, len)?;
        }
        let receives = exchange.receives.len();
        let mut requests = Vec::with_capacity(peers.len());
        let mut landing: Vec<Option<&'r mut [u8]>> = Vec::with_capacity(receives);
        for (from, buffer) in exchange.receives {
            // SAFETY: the buffer is borrowed for 'r, past this call; MPI
            // writes it only until its request completes, and a request
            // that does not is cancelled and waited for, or the mailbox
            // makes no MPI call again (`poisoned`).
            requests.push(unsafe { post_receive(buffer, from, tag, self.comm()) });
            landing.push(Some(buffer));
        }
        for (to, bytes) in exchange.sends {
            // SAFETY: as above; MPI only reads the bytes.
            requests.push(unsafe { post_send(bytes, to, tag, self.comm()) });
        }
        let peers_of = &peers;
        let outcome = self.complete(&mut requests, deadline, &mut |index, status| {
            let Some(buffer) = landing.get_mut(index).and_then(Option::take) else {
                return Ok(());
            };
            let from = peers_of[index];
            let mismatch = |what: String| ClusterError::Protocol { rank: from, what };
            if status.MPI_ERROR != ffi::MPI_SUCCESS as i32 {
                return Err(mismatch(format!(
                    "a piece of a collective's data that does not fit the {} bytes due (MPI \
                     error {}): the ranks' buffers differ in length",
                    buffer.len(),
                    status.MPI_ERROR
                )));
            }
            let mut got = 0;
            // SAFETY: `status` is the completed receive's.
            unsafe { ffi::MPI_Get_count(status, ffi::RSMPI_UINT8_T, &mut got) };
            if got as usize != buffer.len() {
                return Err(mismatch(format!(
                    "{got} bytes of a collective's data where {} were due: the ranks' buffers \
                     differ in length",
                    buffer.len()
                )));
            }
            landed(index, buffer)
        });
        let silent = match outcome {
            Ok(None) => return Ok(None),
            Ok(Some(index)) => Ok(Some(peers[index])),
            Err(error) => Err(error),
        };
        self.cancel(&mut requests);
        silent
    }
}

/// Posts a nonblocking receive of `buffer.len()` bytes from `from`.
///
/// # Safety
/// `buffer` must stay valid and untouched until the request completes
/// or is cancelled and completed.
unsafe fn post_receive(
    buffer: &mut [u8],
    from: u32,
    tag: i32,
    comm: ffi::MPI_Comm,
) -> ffi::MPI_Request {
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    unsafe {
        ffi::MPI_Irecv(
            buffer.as_mut_ptr().cast(),
            buffer.len() as i32,
            ffi::RSMPI_UINT8_T,
            from as i32,
            tag,
            comm,
            &mut request,
        );
    }
    request
}

/// Posts a nonblocking send of `bytes` to `to`.
///
/// # Safety
/// `bytes` must stay valid until the request completes.
unsafe fn post_send(bytes: &[u8], to: u32, tag: i32, comm: ffi::MPI_Comm) -> ffi::MPI_Request {
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    unsafe {
        ffi::MPI_Isend(
            bytes.as_ptr().cast(),
            bytes.len() as i32,
            ffi::RSMPI_UINT8_T,
            to as i32,
            tag,
            comm,
            &mut request,
        );
    }
    request
}

/// Waiting on another rank: spin for `spin` (a peer microseconds behind),
/// yield while the other ranks are likely mid-step (on an oversubscribed
/// core that hands it to them), then sleep, longer the longer the wait.
fn back_off(waited: Duration, spin: Duration) {
    if waited < spin {
        std::hint::spin_loop();
    } else if waited < Duration::from_millis(5) {
        std::thread::yield_now();
    } else {
        let micros = (waited.as_micros() as u64 / 10).clamp(50, 1_000);
        std::thread::sleep(Duration::from_micros(micros));
    }
}
