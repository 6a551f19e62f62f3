//! One pod over several processes ("ranks"), each owning a contiguous block
//! of hosts, exchanging each tick's messages once per tick.
//!
//! The multi-controller model of JAX and of the TPU pod itself: one process
//! per block of hosts, each stepping only its own devices, with the
//! coordination service on rank 0 ([`SERVICE_RANK`]). Every rank runs the
//! same `Step` schedule in lockstep. A message stays with its sender's rank
//! until it is due; in [`StepSystems::Transport`] each rank hands the due
//! messages for other ranks' receivers to the [`ClusterBackend`], which
//! exchanges them (one frame from every rank to rank 0, one frame back to
//! every rank) before the tick's delivery. Because delivery happens only in
//! that set, and every message due by now has been handed over by then, a
//! rank's inbox holds exactly what one process's would, in the same order,
//! whatever the latency and however the hosts are split: the pod does not
//! depend on the rank count.
//!
//! The frames travel through a [`Mailbox`]: [`ThreadMailbox`] joins ranks
//! that are threads of one process (tests, and a host that wants the
//! split without MPI); with the `mpi` feature, `MpiMailbox` joins the
//! processes `mpirun` started. Every wait on another rank is bounded in
//! wall time ([`ClusterBackend::timeout`]): a rank that died or hung is
//! named with its hosts, never waited for forever. (The bound is machinery,
//! like the mailbox: it decides when to give up on a real process, never
//! what happens in simulated time.)
//!
//! [`StepSystems::Transport`]: crate::schedule::StepSystems::Transport

mod backend;
mod context;
mod exchange;
mod frame;
mod layout;
mod mailbox;
mod protocol;
mod shared;

pub use backend::ClusterBackend;
pub use context::{RankContext, ReusableBuffers, SegmentSlot};
pub use exchange::{Exchange, Landed, framed_exchange};
pub use frame::data_payload;
pub use layout::RankLayout;
pub use mailbox::{
    Mailbox, SharedMailbox, ThreadMailbox, thread_mailboxes, thread_mailboxes_messages_only,
    thread_mailboxes_sharing,
};
pub use protocol::{broadcast, finish, gather_parts, handshake};
pub use shared::{PART_HEADER, SharedMemory, SharedSegment, ThreadSharing};

use std::time::Duration;

/// The rank that runs the coordination service (heartbeat detection,
/// barriers, monitoring) and collects the others' frames.
pub const SERVICE_RANK: u32 = 0;

/// How long a rank waits for another before it names it lost, unless the
/// host sets another bound: long enough for a loaded machine to page in a
/// big world, short enough that a dead job ends within a minute.
pub const DEFAULT_RANK_TIMEOUT: Duration = Duration::from_secs(30);
