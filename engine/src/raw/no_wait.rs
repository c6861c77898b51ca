//! Calls made without waiting ([`crate::Store::without_waiting`]): on a thread that must not
//! block, an async runtime's worker, an engine call goes only as far as memory and free locks
//! take it, and reports where it would have had to wait.
//!
//! A connect and its disconnect read the identity and the session and queue the connection
//! state: microseconds of work each, which cost several times that when handed to a blocking
//! thread and back (issue 19: about a fifth of a resumed TLS connect went to those hand-offs).
//!
//! # Invariants
//! - The mode belongs to one thread and one call: [`run`] turns it on, and restores what was
//!   there before when the call ends, panicking or not.
//! - While it is on, every read through [`super::Raw`] reads memtables and the block cache
//!   only (RocksDB's `kBlockCacheTier`); a value that would need the disk is refused.
//! - While it is on, nothing waits for the commit queue or for a sync: a synchronous commit
//!   is refused, and a batch is queued only if the queue has room. Locks that a writer may
//!   hold across a sync (device stripes) or across a full queue (the notification sequence)
//!   are only tried.
//! - A refusal is [`StorageError::WouldBlock`] and also marks the call, so [`run`] reports it
//!   even where the code between swallowed the error. The refused step changed nothing.

use std::cell::Cell;

use rocksdb::{ReadOptions, ReadTier};

use crate::error::StorageError;

#[derive(Clone, Copy, Default)]
struct Mode {
    on: bool,
    refused: bool,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode { on: false, refused: false }) };
}

/// Whether this thread is inside a call made without waiting.
pub(crate) fn active() -> bool {
    MODE.with(|m| m.get().on)
}

/// Marks the current call as refused and returns the error to propagate.
pub(crate) fn refuse() -> StorageError {
    MODE.with(|m| {
        let mut mode = m.get();
        mode.refused = true;
        m.set(mode);
    });
    StorageError::WouldBlock
}

/// Read options for this thread's mode: memory only while it is on.
pub(crate) fn read_options() -> ReadOptions {
    let mut ro = ReadOptions::default();
    if active() {
        ro.set_read_tier(ReadTier::BlockCache);
    }
    ro
}

/// RocksDB's "incomplete" answer to a memory-only read, as a refusal; `None` for any other
/// error.
pub(crate) fn refused_read(e: &rocksdb::Error) -> Option<StorageError> {
    (active() && e.kind() == rocksdb::ErrorKind::Incomplete).then(refuse)
}

/// Restores the mode a thread had before [`run`], also when the call panics.
struct Restore(Mode);

impl Drop for Restore {
    fn drop(&mut self) {
        MODE.with(|m| m.set(self.0));
    }
}

/// Runs `f` with the mode on; returns its result and whether any step of it was refused.
pub(crate) fn run<T>(f: impl FnOnce() -> T) -> (T, bool) {
    let before = MODE.with(|m| {
        let before = m.get();
        m.set(Mode {
            on: true,
            refused: false,
        });
        before
    });
    let restore = Restore(before);
    let out = f();
    let refused = MODE.with(|m| m.get().refused);
    drop(restore);
    (out, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_reported_even_when_swallowed_and_the_mode_ends_with_the_call() {
        assert!(!active());
        let ((), refused) = run(|| {
            assert!(active());
            let _swallowed = refuse();
        });
        assert!(refused);
        assert!(!active());
        let (n, refused) = run(|| 7);
        assert_eq!((n, refused), (7, false));
    }

    #[test]
    fn a_nested_call_restores_the_outer_mode() {
        let ((), outer_refused) = run(|| {
            let ((), inner) = run(|| {
                let _ = refuse();
            });
            assert!(inner);
            assert!(active());
        });
        assert!(!outer_refused);
    }

    #[test]
    fn a_panicking_call_leaves_the_mode_off() {
        let caught = std::panic::catch_unwind(|| run(|| panic!("inside")));
        assert!(caught.is_err());
        assert!(!active());
    }
}
