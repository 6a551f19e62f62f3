//! Ranks of a split pod as threads of the test process.

use optirs_tpu::Result;
use optirs_tpu::transport::cluster::{Mailbox, thread_mailboxes};

/// Runs every rank on its own thread; rank `r`'s result at index `r`.
pub fn on_ranks<T: Send>(
    ranks: u32,
    rank_main: impl Fn(Box<dyn Mailbox>) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = thread_mailboxes(ranks)
            .into_iter()
            .map(|mailbox| {
                let rank_main = &rank_main;
                s.spawn(move || rank_main(Box::new(mailbox)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
