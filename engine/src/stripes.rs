//! Per-device lock striping for read-modify-write operations.
//!
//! Two writers of the same device serialise here, so an etag check and the write it guards
//! are one step; writers of different devices (almost always) take different stripes and so
//! reach the group committer together, sharing its sync.
//!
//! IMPORTANT: a multi-device operation takes its stripes in ascending index order (see
//! [`Stripes::lock_many`]), the only order anyone takes more than one, so it cannot deadlock.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use parking_lot::{Mutex, MutexGuard};

const STRIPES: usize = 256;

pub(crate) struct Stripes {
    locks: Vec<Mutex<()>>,
}

impl Stripes {
    pub(crate) fn new() -> Self {
        Stripes {
            locks: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn index(device_id: &str) -> usize {
        let mut h = DefaultHasher::new();
        device_id.hash(&mut h);
        (h.finish() % STRIPES as u64) as usize
    }

    pub(crate) fn lock(&self, device_id: &str) -> MutexGuard<'_, ()> {
        self.locks[Self::index(device_id)].lock()
    }

    pub(crate) fn lock_many<'a, I: IntoIterator<Item = &'a str>>(
        &self,
        device_ids: I,
    ) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = device_ids.into_iter().map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.locks[i].lock()).collect()
    }
}
