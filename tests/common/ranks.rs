//! Ranks of a split pod as threads of the test process.

use optirs_tpu::Result;
use optirs_tpu::transport::cluster::{Mailbox, ThreadSharing, thread_mailboxes_sharing};

/// Runs every rank on its own thread; rank `r`'s result at index `r`. The
/// ranks share memory, as MPI ranks on one node do.
pub fn on_ranks<T: Send>(
    ranks: u32,
    rank_main: impl Fn(Box<dyn Mailbox>) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    on_ranks_sharing(ranks, ThreadSharing::Memory, rank_main)
}

/// [`on_ranks`], the ranks sharing memory or moving every byte as frames
/// (as MPI ranks on several nodes do).
#[allow(dead_code)]
pub fn on_ranks_sharing<T: Send>(
    ranks: u32,
    sharing: ThreadSharing,
    rank_main: impl Fn(Box<dyn Mailbox>) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = thread_mailboxes_sharing(ranks, sharing)
            .into_iter()
            .map(|mailbox| {
                let rank_main = &rank_main;
                s.spawn(move || rank_main(Box::new(mailbox)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
