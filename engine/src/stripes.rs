//! Per-device lock striping for read-modify-write operations.
//!
//! Two writers of the same device serialise here, so an etag check and the write it guards
//! are one step; writers of different devices (almost always) take different stripes and so
//! reach the group committer together, sharing its sync.
//!
//! A held stripe is an owned [`StripeGuard`]: it may be sent to the commit thread and dropped
//! there once the write it guards is durable, so a writer that must not let the next writer
//! read around its queued write (C2D queues) holds the stripe until then without holding a
//! thread.
//!
//! IMPORTANT: a multi-device operation takes its stripes in ascending index order (see
//! [`Stripes::lock_many`]), the only order anyone takes more than one, so it cannot deadlock.
//! The commit thread only ever releases stripes, never waits for one.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::error::StorageError;
use crate::raw::no_wait;

const STRIPES: usize = 256;

#[derive(Default)]
struct Stripe {
    held: Mutex<bool>,
    released: Condvar,
}

pub(crate) struct Stripes {
    locks: Arc<[Stripe]>,
}

/// One held stripe; released when dropped, on whichever thread.
#[must_use = "the stripe is released when the guard is dropped"]
pub(crate) struct StripeGuard {
    locks: Arc<[Stripe]>,
    index: usize,
}

impl Drop for StripeGuard {
    fn drop(&mut self) {
        let stripe = &self.locks[self.index];
        *stripe.held.lock() = false;
        stripe.released.notify_one();
    }
}

impl Stripes {
    pub(crate) fn new() -> Self {
        Stripes {
            locks: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }
    }

    fn index(device_id: &str) -> usize {
        let mut h = DefaultHasher::new();
        device_id.hash(&mut h);
        (h.finish() % STRIPES as u64) as usize
    }

    fn acquire(&self, index: usize) -> StripeGuard {
        let stripe = &self.locks[index];
        let mut held = stripe.held.lock();
        while *held {
            stripe.released.wait(&mut held);
        }
        *held = true;
        StripeGuard {
            locks: Arc::clone(&self.locks),
            index,
        }
    }

    pub(crate) fn lock(&self, device_id: &str) -> StripeGuard {
        self.acquire(Self::index(device_id))
    }

    /// [`Stripes::lock`], but only tried in a call made without waiting: a stripe may be held
    /// until a queued write is durable.
    ///
    /// # Errors
    /// [`StorageError::WouldBlock`] when the stripe is held and this thread must not wait.
    pub(crate) fn lock_unless_waiting(&self, device_id: &str) -> Result<StripeGuard, StorageError> {
        let index = Self::index(device_id);
        if !no_wait::active() {
            return Ok(self.acquire(index));
        }
        let stripe = &self.locks[index];
        let mut held = stripe.held.try_lock().ok_or_else(no_wait::refuse)?;
        if *held {
            return Err(no_wait::refuse());
        }
        *held = true;
        Ok(StripeGuard {
            locks: Arc::clone(&self.locks),
            index,
        })
    }

    pub(crate) fn lock_many<'a, I: IntoIterator<Item = &'a str>>(
        &self,
        device_ids: I,
    ) -> Vec<StripeGuard> {
        let mut idx: Vec<usize> = device_ids.into_iter().map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.acquire(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripe_is_exclusive_until_its_guard_drops_on_another_thread() {
        let stripes = Arc::new(Stripes::new());
        let first = stripes.lock("d");
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let stripes = Arc::clone(&stripes);
            std::thread::spawn(move || {
                let _second = stripes.lock("d");
                tx.send(()).unwrap();
            })
        };
        assert!(rx
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err());
        std::thread::spawn(move || drop(first)).join().unwrap();
        rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        waiter.join().unwrap();
    }
}
