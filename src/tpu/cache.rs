//! The program cache of a [`super::TPUOptimizer`]: compiled programs keyed by
//! what they depend on (shape, dtype, optimizer kind, compiled-in
//! hyper-parameters), bounded, least recently used evicted first, with the
//! hit, miss and eviction counts the profile reports.

use std::sync::Arc;

use crate::exec::runtime::Runtime;
use crate::ir::DType;
use crate::optimizers::{HyperParameter, UpdateRule};

use super::CacheStats;

/// The cache key: what a compiled program depends on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ProgramKey {
    shape: Vec<usize>,
    dtype: DType,
    optimizer: String,
    /// Hyper-parameter bits, in the rule's order (empty for opaque optimizers).
    hyper: Vec<(&'static str, u64)>,
}

impl ProgramKey {
    /// The key of the program for `shape` of the optimizer `optimizer`
    /// (with `rule`, if it has one); a learning rate passed at run time
    /// (`lr_at_run_time`) is not part of the program, so not of its key.
    pub(super) fn new<A>(
        shape: &[usize],
        dtype: DType,
        optimizer: &str,
        rule: Option<&dyn UpdateRule<A>>,
        lr_at_run_time: bool,
    ) -> Self {
        ProgramKey {
            shape: shape.to_vec(),
            dtype,
            optimizer: optimizer.to_owned(),
            hyper: rule.map_or_else(Vec::new, |r| {
                keyed(&r.hyper_parameters(), lr_at_run_time).collect()
            }),
        }
    }

    /// Whether this is [`ProgramKey::new`] of the same arguments, without
    /// building that key (a cached step looks its program up every time).
    pub(super) fn matches<A>(
        &self,
        shape: &[usize],
        dtype: DType,
        optimizer: &str,
        rule: Option<&dyn UpdateRule<A>>,
        lr_at_run_time: bool,
    ) -> bool {
        if self.shape != shape || self.dtype != dtype || self.optimizer != optimizer {
            return false;
        }
        match rule {
            Some(r) => keyed(&r.hyper_parameters(), lr_at_run_time).eq(self.hyper.iter().copied()),
            None => self.hyper.is_empty(),
        }
    }
}

/// The hyper-parameters a program depends on, as key entries: all but a
/// learning rate passed at run time.
fn keyed(
    hyper: &[HyperParameter],
    lr_at_run_time: bool,
) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    hyper
        .iter()
        .filter(move |h| !(lr_at_run_time && h.name == "learning_rate"))
        .map(|h| (h.name, h.value.to_bits()))
}

struct CacheEntry {
    key: ProgramKey,
    runtime: Arc<Runtime>,
    /// Bytes one run reads and writes (parameters plus results).
    bytes: u64,
    /// Whether the program is the optimizer's rule (else its `step` as a custom call).
    rule: bool,
    last_used: u64,
}

/// A bounded LRU cache of compiled programs.
pub(super) struct ProgramCache {
    capacity: usize,
    entries: Vec<CacheEntry>,
    clock: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl ProgramCache {
    /// An empty cache keeping at most `capacity` programs.
    pub(super) fn new(capacity: usize) -> Self {
        ProgramCache {
            capacity,
            entries: Vec::new(),
            clock: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// The program for `key`, if cached (a hit, which makes it the most
    /// recently used); counts a miss otherwise.
    pub(super) fn lookup(
        &mut self,
        matches: impl Fn(&ProgramKey) -> bool,
    ) -> Option<(Arc<Runtime>, u64, bool)> {
        self.clock += 1;
        let clock = self.clock;
        match self.entries.iter_mut().find(|e| matches(&e.key)) {
            Some(e) => {
                e.last_used = clock;
                self.hits += 1;
                Some((e.runtime.clone(), e.bytes, e.rule))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Adds a compiled program, evicting the least recently used one when full.
    pub(super) fn insert(
        &mut self,
        key: ProgramKey,
        runtime: Arc<Runtime>,
        bytes: u64,
        rule: bool,
    ) {
        if self.entries.len() >= self.capacity
            && let Some(lru) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
        {
            self.entries.swap_remove(lru);
            self.evictions += 1;
        }
        self.entries.push(CacheEntry {
            key,
            runtime,
            bytes,
            rule,
            last_used: self.clock,
        });
    }

    /// Hits, misses, evictions and occupancy so far.
    pub(super) fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            entries: self.entries.len(),
            capacity: self.capacity,
        }
    }
}
