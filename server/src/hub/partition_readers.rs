//! Who reads each partition in each consumer group, with Event Hubs' owner-level (epoch)
//! rules, so that a reader taking over a partition pushes the previous one off.
//!
//! # Invariants
//! - Per (partition, group), either any number of plain readers (at most
//!   [`MAX_PLAIN_READERS`]) or owner-level readers only, never both.
//! - A new owner-level reader with level `e` is admitted when every owner-level reader there
//!   has a level `<= e`; those, and every plain reader, are pushed off (their [`Lease`]'s
//!   `lost` completes with the reason). A lower level, or a plain reader while an owner is
//!   present, is refused and pushes no one off.
//! - A lease removes its reader when dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

/// Event Hubs' limit of concurrent readers per partition and consumer group without owner level.
pub const MAX_PLAIN_READERS: usize = 5;

/// Why a reader may not read (or read any longer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReaderRefusal {
    /// Another reader with a higher (or, for the one pushed off, equal or higher) owner level
    /// holds the partition.
    #[error("{0}")]
    Stolen(String),
    /// Too many plain readers.
    #[error("at most {MAX_PLAIN_READERS} readers without owner level may read partition {partition} of consumer group {group}")]
    TooManyReaders { partition: String, group: String },
}

impl ReaderRefusal {
    /// The refusal of a reader with `owner_level` where an owner with level `top` (if any)
    /// holds the partition; `None` when it may read.
    pub fn held_by(top: Option<i64>, owner_level: Option<i64>, shown: &str) -> Option<Self> {
        let text = match (owner_level, top?) {
            (None, top) => format!(
                "a receiver with owner level {top} holds {shown}; a receiver without owner level cannot be created"
            ),
            (Some(level), top) if level < top => format!(
                "a receiver with a higher owner level {top} holds {shown}; a receiver with owner level {level} cannot be created"
            ),
            (Some(_), _) => return None,
        };
        Some(ReaderRefusal::Stolen(text))
    }

    pub fn too_many(shown: &str, group: &str) -> Self {
        ReaderRefusal::TooManyReaders {
            partition: shown.to_string(),
            group: group.to_string(),
        }
    }
}

/// What one node holds of a (partition, group): its highest owner level and how many plain
/// readers it has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub top: Option<i64>,
    pub plain: usize,
}

#[derive(Default)]
struct Readers {
    next_id: u64,
    /// (reader id, owner level, where to tell it that it lost the partition, the next
    /// sequence number it will send)
    held: Vec<(
        u64,
        Option<i64>,
        watch::Sender<Option<ReaderRefusal>>,
        Arc<AtomicU64>,
    )>,
}

impl Readers {
    fn top(&self) -> Option<i64> {
        self.held.iter().filter_map(|(_, level, ..)| *level).max()
    }

    /// A reader with owner level `level` takes the partition: every reader held here is told.
    fn push_off_all(&mut self, level: i64, shown: &str) {
        let reason = ReaderRefusal::Stolen(format!(
            "a new receiver with owner level {level} took {shown}; this receiver is disconnected"
        ));
        for (_, _, tx, _) in self.held.drain(..) {
            tx.send_replace(Some(reason.clone()));
        }
    }
}

/// The hub's registry of partition readers; one per hub, shared by every connection.
#[derive(Clone, Default)]
pub struct PartitionReaders(Arc<Mutex<HashMap<(u16, String), Readers>>>);

/// One admitted reader. Dropping it leaves the partition.
pub struct Lease {
    registry: PartitionReaders,
    key: (u16, String),
    id: u64,
    lost: watch::Receiver<Option<ReaderRefusal>>,
    next: Arc<AtomicU64>,
}

impl Lease {
    /// Records that everything before sequence number `next` has been sent.
    pub fn sent_up_to(&self, next: u64) {
        self.next.store(next, Ordering::Relaxed);
    }

    /// Completes when a reader with a higher or equal owner level has taken the partition.
    pub async fn lost(&mut self) -> ReaderRefusal {
        let reason = match self.lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            // The sender lives in the registry until this lease is dropped.
            None => std::future::pending().await,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut all = self.registry.0.lock();
        if let Some(readers) = all.get_mut(&self.key) {
            readers.held.retain(|(id, ..)| *id != self.id);
            if readers.held.is_empty() {
                all.remove(&self.key);
            }
        }
    }
}

impl PartitionReaders {
    /// Admits a reader of global partition `partition` in `group`; `shown` names the partition
    /// and group in refusals as the client knows them.
    ///
    /// # Errors
    /// [`ReaderRefusal`] when an owner with a higher level (or, for a plain reader, any owner)
    /// holds the partition, or when the plain readers are at their limit.
    pub fn admit(
        &self,
        partition: u16,
        group: &str,
        owner_level: Option<i64>,
        shown: &str,
    ) -> Result<Lease, ReaderRefusal> {
        let key = (partition, group.to_ascii_lowercase());
        let mut all = self.0.lock();
        let readers = all.entry(key.clone()).or_default();
        let top = readers.top();
        if let Some(refused) = ReaderRefusal::held_by(top, owner_level, shown) {
            return Err(refused);
        }
        match owner_level {
            None if readers.held.len() >= MAX_PLAIN_READERS => {
                return Err(ReaderRefusal::too_many(shown, group));
            }
            None => {}
            Some(level) => readers.push_off_all(level, shown),
        }
        readers.next_id += 1;
        let id = readers.next_id;
        let (tx, lost) = watch::channel(None);
        let next = Arc::new(AtomicU64::new(0));
        readers.held.push((id, owner_level, tx, Arc::clone(&next)));
        drop(all);
        Ok(Lease {
            registry: self.clone(),
            key,
            id,
            lost,
            next,
        })
    }

    /// What this node holds of `partition` in `group`.
    pub fn held(&self, partition: u16, group: &str) -> Held {
        let all = self.0.lock();
        all.get(&(partition, group.to_ascii_lowercase()))
            .map_or_else(Held::default, |r| Held {
                top: r.top(),
                plain: r
                    .held
                    .iter()
                    .filter(|(_, level, ..)| level.is_none())
                    .count(),
            })
    }

    /// Another node admitted a reader with owner level `level`: every reader here is pushed
    /// off, unless one here has a higher level (returned, and nobody is pushed off).
    pub fn taken_elsewhere(
        &self,
        partition: u16,
        group: &str,
        level: i64,
        shown: &str,
    ) -> Option<i64> {
        let mut all = self.0.lock();
        let readers = all.get_mut(&(partition, group.to_ascii_lowercase()))?;
        match readers.top() {
            Some(top) if top > level => Some(top),
            _ => {
                readers.push_off_all(level, shown);
                None
            }
        }
    }

    /// For each (partition, consumer group) being read, the furthest next sequence number
    /// any of its readers has reached; 0 until one has sent something.
    pub fn positions(&self) -> Vec<(u16, String, u64)> {
        self.0
            .lock()
            .iter()
            .map(|((partition, group), readers)| {
                let next = readers
                    .held
                    .iter()
                    .map(|(.., n)| n.load(Ordering::Relaxed))
                    .max()
                    .unwrap_or(0);
                (*partition, group.clone(), next)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_lost(lease: &Lease) -> bool {
        lease.lost.borrow().is_some()
    }

    #[test]
    fn a_higher_owner_level_pushes_off_lower_and_plain_readers() {
        let readers = PartitionReaders::default();
        let plain = readers.admit(0, "$Default", None, "p0").unwrap();
        let low = readers.admit(0, "$Default", Some(1), "p0").unwrap();
        assert!(is_lost(&plain));
        assert!(!is_lost(&low));
        let high = readers.admit(0, "$default", Some(5), "p0").unwrap();
        assert!(is_lost(&low));
        assert!(!is_lost(&high));
        // Lower level and plain readers are refused while the owner holds it.
        assert!(matches!(
            readers.admit(0, "$Default", Some(4), "p0"),
            Err(ReaderRefusal::Stolen(_))
        ));
        assert!(matches!(
            readers.admit(0, "$Default", None, "p0"),
            Err(ReaderRefusal::Stolen(_))
        ));
        assert!(!is_lost(&high));
        // Other partitions and groups are separate.
        assert!(readers.admit(1, "$Default", None, "p1").is_ok());
        assert!(readers.admit(0, "other", None, "p0").is_ok());
        // Equal level takes over (Event Hubs: e1 <= e2 disconnects e1).
        let same = readers.admit(0, "$Default", Some(5), "p0").unwrap();
        assert!(is_lost(&high));
        drop((plain, low, high));
        drop(same);
        assert!(readers.admit(0, "$Default", None, "p0").is_ok());
    }

    #[test]
    fn a_claim_elsewhere_pushes_off_lower_readers_and_is_refused_by_a_higher_one() {
        let readers = PartitionReaders::default();
        let plain = readers.admit(0, "$Default", None, "p0").unwrap();
        assert_eq!(
            readers.held(0, "$default"),
            Held {
                top: None,
                plain: 1
            }
        );
        assert_eq!(readers.taken_elsewhere(0, "$Default", 1, "p0"), None);
        assert!(is_lost(&plain));
        // A reader pushed off is no longer held, though its lease lives until dropped.
        let high = readers.admit(0, "$Default", Some(3), "p0").unwrap();
        assert_eq!(
            readers.held(0, "$Default"),
            Held {
                top: Some(3),
                plain: 0
            }
        );
        assert_eq!(readers.taken_elsewhere(0, "$Default", 2, "p0"), Some(3));
        assert!(!is_lost(&high));
        assert_eq!(readers.taken_elsewhere(0, "$Default", 3, "p0"), None);
        assert!(is_lost(&high));
        // Nothing held: nothing to push off, nothing to refuse.
        assert_eq!(readers.taken_elsewhere(7, "$Default", 1, "p7"), None);
        assert_eq!(ReaderRefusal::held_by(None, None, "p0"), None);
        assert_eq!(ReaderRefusal::held_by(Some(2), Some(2), "p0"), None);
        assert!(ReaderRefusal::held_by(Some(2), Some(1), "p0").is_some());
    }

    #[test]
    fn plain_readers_are_limited_and_leave_when_dropped() {
        let readers = PartitionReaders::default();
        let held: Vec<Lease> = (0..MAX_PLAIN_READERS)
            .map(|_| readers.admit(2, "g", None, "p2").unwrap())
            .collect();
        assert!(matches!(
            readers.admit(2, "g", None, "p2"),
            Err(ReaderRefusal::TooManyReaders { .. })
        ));
        drop(held);
        assert!(readers.admit(2, "g", None, "p2").is_ok());
        assert!(readers.0.lock().is_empty());
    }
}
