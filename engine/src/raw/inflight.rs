//! Twin and identity records written by batches that are queued for the group committer but
//! not yet durable, so the next read-modify-write of the same record builds on them instead of
//! waiting for their sync (issue 19: reported patches and connection state pipelined like
//! telemetry).
//!
//! # Invariants
//! - Only batches staged through [`super::Raw::stage_pipelined`] are tracked, and only
//!   their writes to [`TRACKED`] column families. Their writers hold the device's stripe lock
//!   from the read to the submit, so for one key entries are made in commit order.
//! - A key holds the entries of every queued batch that wrote it, newest last, and reads see the
//!   newest. An entry leaves when the batch that made it is durable, has failed, or was never
//!   queued (withdrawn: a call made without waiting that was refused); the entries of other
//!   batches stay. So a withdrawn batch uncovers the queued one it followed instead of the
//!   durable state behind both. A failed write poisons the committer, so nothing written after
//!   it commits either; the entries then only held what will never be stored, and are dropped.
//! - Read-modify-writes read through [`Inflight::get`]; so do identity reads (a connection
//!   state is shown once queued), while twin readers (twin reads, queries, exports) read
//!   RocksDB and so see only durable twins.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ferrohub_migrations::cf;
use parking_lot::Mutex;

use super::{Batch, Op};

/// The column families whose pipelined writes later read-modify-writes must see.
const TRACKED: [&str; 3] = [cf::TWINS, cf::DEVICES, cf::MODULES];

/// What a queued batch leaves under a key: `None` when it deletes it.
type Staged = Option<Arc<[u8]>>;

#[derive(Default)]
pub(crate) struct Inflight {
    /// Per key, the queued batches' entries by generation, newest last.
    entries: Mutex<HashMap<(&'static str, Vec<u8>), Vec<(u64, Staged)>>>,
    next_generation: AtomicU64,
}

/// Removes a batch's entries when dropped: after its commit callback, or when it was never
/// queued. Only this batch's own entries go; those of batches before and after it stay.
pub(crate) struct Release {
    inflight: Arc<Inflight>,
    generation: u64,
    keys: Vec<(&'static str, Vec<u8>)>,
}

impl Drop for Release {
    fn drop(&mut self) {
        let mut entries = self.inflight.entries.lock();
        for key in self.keys.drain(..) {
            let Some(stack) = entries.get_mut(&key) else {
                continue;
            };
            stack.retain(|(g, _)| *g != self.generation);
            if stack.is_empty() {
                entries.remove(&key);
            }
        }
    }
}

impl Inflight {
    /// The staged value of a key, if a queued batch wrote it: `Some(None)` deleted.
    pub(crate) fn get(&self, cf_name: &'static str, key: &[u8]) -> Option<Staged> {
        if !TRACKED.contains(&cf_name) {
            return None;
        }
        let entries = self.entries.lock();
        if entries.is_empty() {
            return None;
        }
        entries
            .get(&(cf_name, key.to_vec()))
            .and_then(|stack| stack.last())
            .map(|(_, v)| v.clone())
    }

    /// Records the tracked writes of `batch`, last write of a key winning as in the batch.
    pub(crate) fn track(self: &Arc<Self>, batch: &Batch) -> Release {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let mut keys = Vec::new();
        let mut entries = self.entries.lock();
        for op in &batch.ops {
            let (cf, key, staged) = match op {
                Op::Put { cf, key, value } if TRACKED.contains(cf) => {
                    (*cf, key, Some(Arc::from(value.as_slice())))
                }
                Op::Delete { cf, key } if TRACKED.contains(cf) => (*cf, key, None),
                _ => continue,
            };
            let stack = entries.entry((cf, key.clone())).or_default();
            // A batch writing one key twice keeps its last value, as the batch does.
            match stack.last_mut() {
                Some((g, value)) if *g == generation => *value = staged,
                _ => {
                    stack.push((generation, staged));
                    keys.push((cf, key.clone()));
                }
            }
        }
        Release {
            inflight: Arc::clone(self),
            generation,
            keys,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &[u8], value: &[u8]) -> Op {
        Op::Put {
            cf: cf::TWINS,
            key: key.to_vec(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn a_later_batch_keeps_its_entry_when_an_earlier_one_completes() {
        let inflight = Arc::new(Inflight::default());
        let first = inflight.track(&Batch {
            ops: vec![put(b"d1", b"v1")],
            ..Batch::default()
        });
        let second = inflight.track(&Batch {
            ops: vec![
                put(b"d1", b"v2"),
                Op::Delete {
                    cf: cf::TWINS,
                    key: b"d2".to_vec(),
                },
            ],
            ..Batch::default()
        });
        drop(first);
        assert_eq!(
            inflight.get(cf::TWINS, b"d1"),
            Some(Some(Arc::from(&b"v2"[..])))
        );
        assert_eq!(inflight.get(cf::TWINS, b"d2"), Some(None));
        drop(second);
        assert_eq!(inflight.get(cf::TWINS, b"d1"), None);
        assert_eq!(inflight.len(), 0);
    }

    #[test]
    fn a_withdrawn_batch_uncovers_the_queued_one_it_followed() {
        let inflight = Arc::new(Inflight::default());
        let queued = inflight.track(&Batch {
            ops: vec![put(b"d1", b"v1")],
            ..Batch::default()
        });
        let withdrawn = inflight.track(&Batch {
            ops: vec![put(b"d1", b"v2"), put(b"d1", b"v3")],
            ..Batch::default()
        });
        assert_eq!(
            inflight.get(cf::TWINS, b"d1"),
            Some(Some(Arc::from(&b"v3"[..])))
        );
        drop(withdrawn);
        assert_eq!(
            inflight.get(cf::TWINS, b"d1"),
            Some(Some(Arc::from(&b"v1"[..]))),
            "the queued batch's value must show again"
        );
        drop(queued);
        assert_eq!(inflight.get(cf::TWINS, b"d1"), None);
        assert_eq!(inflight.len(), 0);
    }

    #[test]
    fn only_twin_and_identity_writes_are_tracked_each_under_its_column_family() {
        let inflight = Arc::new(Inflight::default());
        let release = inflight.track(&Batch {
            ops: vec![
                Op::Put {
                    cf: cf::DEVICES,
                    key: b"d1".to_vec(),
                    value: b"x".to_vec(),
                },
                Op::Put {
                    cf: cf::SESSIONS,
                    key: b"d1".to_vec(),
                    value: b"s".to_vec(),
                },
            ],
            ..Batch::default()
        });
        assert_eq!(
            inflight.get(cf::DEVICES, b"d1"),
            Some(Some(Arc::from(&b"x"[..])))
        );
        assert_eq!(inflight.get(cf::TWINS, b"d1"), None);
        assert_eq!(inflight.get(cf::SESSIONS, b"d1"), None);
        assert_eq!(inflight.len(), 1);
        drop(release);
        assert_eq!(inflight.len(), 0);
    }
}
