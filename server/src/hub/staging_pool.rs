//! A few threads that stage writes in the engine's `*_then` form ([`super::StoreHandle::run_then`]):
//! twin reported patches, C2D sends, locks and settles.
//!
//! Such a call reads, stages and queues its batch, then returns; the commit thread answers it
//! later. Run on tokio's blocking pool, every call was a `spawn_blocking`: under load (10,000
//! reported patches in flight) the pool grew to hundreds of threads that contended on its one
//! queue lock and on each other, and a third of the hub's CPU went to futexes and context
//! switches. Here a fixed set of threads takes calls from one channel and stays busy while
//! there is work.
//!
//! # Invariants
//! - A call may block its thread only briefly: on a device's stripe (held until a queued write
//!   of that device is durable, which the commit thread completes without this pool), on a
//!   full commit queue, or while storage recovery holds the store. So a blocked thread always
//!   resumes, and the pool cannot deadlock on itself.
//! - A call that panics loses only itself: its reply is dropped (the caller sees an error) and
//!   its thread goes on.
//! - When the pool is dropped its threads finish the calls already queued, then exit.

use std::panic::AssertUnwindSafe;

type Call = Box<dyn FnOnce() + Send>;

/// Threads per pool. Staging is CPU work of microseconds; more threads than cores only help
/// while some wait on a stripe, and each extra one adds contention for the same locks.
const THREADS: usize = 4;

pub(super) struct StagingPool {
    calls: crossbeam_channel::Sender<Call>,
}

impl StagingPool {
    pub(super) fn start() -> StagingPool {
        let (calls, queue) = crossbeam_channel::unbounded::<Call>();
        for i in 0..THREADS {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("ferrohub-stage-{i}"))
                .spawn(move || {
                    for call in queue {
                        // The call's reply travels inside it: a panic drops it, which is the
                        // caller's error; the thread serves the next call.
                        let _ = std::panic::catch_unwind(AssertUnwindSafe(call));
                    }
                })
                .expect("spawning a staging thread");
        }
        StagingPool { calls }
    }

    /// Queues `call`; it runs on one of the pool's threads.
    pub(super) fn run(&self, call: impl FnOnce() + Send + 'static) {
        // The receivers live as long as their threads, which end only when this sender is
        // dropped, so the send cannot fail while `self` exists.
        let _ = self.calls.send(Box::new(call));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn calls_run_and_a_panic_loses_only_itself() {
        let pool = StagingPool::start();
        let (tx, rx) = mpsc::channel();
        let doomed = tx.clone();
        pool.run(move || {
            let _keep = doomed;
            panic!("a failing call");
        });
        for i in 0..(THREADS * 3) {
            let tx = tx.clone();
            pool.run(move || tx.send(i).unwrap());
        }
        drop(tx);
        let mut got: Vec<usize> = rx.iter().collect();
        got.sort_unstable();
        assert_eq!(got, (0..THREADS * 3).collect::<Vec<_>>());
    }

    #[test]
    fn a_call_blocked_on_one_thread_leaves_the_others_serving() {
        let pool = StagingPool::start();
        let (release, blocked) = mpsc::channel::<()>();
        pool.run(move || {
            let _ = blocked.recv();
        });
        let (tx, rx) = mpsc::channel();
        for i in 0..10 {
            let tx = tx.clone();
            pool.run(move || tx.send(i).unwrap());
        }
        let got: Vec<i32> = (0..10)
            .map(|_| rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(got.len(), 10);
        release.send(()).unwrap();
    }
}
