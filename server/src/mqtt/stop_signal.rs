//! A connection's two stop signals, its kick and the hub's shutdown, as one future that costs
//! next to nothing to poll while neither has fired.
//!
//! `CancellationToken::cancelled()` locks the token's mutex on every poll, and the shutdown
//! token is one for all connections: polled on every turn of every connection's loop, it was a
//! lock shared by both runtime threads, taken for every message. [`StopSignal`] polls the two
//! futures only when their own waker was called (and on the first poll); otherwise a poll
//! reads one atomic flag.
//!
//! # Invariants
//! - No wake-up is lost: the inner futures are polled with a waker that sets the flag and then
//!   wakes the connection's task, whose waker is registered before the flag is read and
//!   cleared.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Why the connection must stop.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Stop {
    Kicked,
    Shutdown,
}

struct Gate {
    /// One of the inner futures asked to be polled.
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

pub(super) struct StopSignal<'a, K, S> {
    kicked: Pin<&'a mut K>,
    shutdown: Pin<&'a mut S>,
    gate: Arc<Gate>,
    waker: Waker,
}

impl<'a, K: Future<Output = ()>, S: Future<Output = ()>> StopSignal<'a, K, S> {
    pub(super) fn new(kicked: Pin<&'a mut K>, shutdown: Pin<&'a mut S>) -> Self {
        let gate = Arc::new(Gate {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&gate));
        StopSignal {
            kicked,
            shutdown,
            gate,
            waker,
        }
    }

    /// Ready once the connection is kicked (first) or the hub shuts down.
    pub(super) fn poll_stop(&mut self, cx: &mut Context<'_>) -> Poll<Stop> {
        self.gate.task.register(cx.waker());
        if !self.gate.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let mut inner = Context::from_waker(&self.waker);
        if self.kicked.as_mut().poll(&mut inner).is_ready() {
            return Poll::Ready(Stop::Kicked);
        }
        if self.shutdown.as_mut().poll(&mut inner).is_ready() {
            return Poll::Ready(Stop::Shutdown);
        }
        Poll::Pending
    }

    /// Waits for [`StopSignal::poll_stop`].
    pub(super) async fn stopped(&mut self) -> Stop {
        std::future::poll_fn(|cx| self.poll_stop(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn a_kick_or_a_shutdown_wakes_the_task_and_is_told_apart() {
        for (cancel_kick, expected) in [(true, Stop::Kicked), (false, Stop::Shutdown)] {
            let (kick, shutdown) = (CancellationToken::new(), CancellationToken::new());
            let (k, s) = (kick.cancelled(), shutdown.cancelled());
            tokio::pin!(k, s);
            let mut stop = StopSignal::new(k, s);
            // Nothing fired: a poll registers and stays pending, later polls read the flag only.
            let once = |stop: &mut StopSignal<'_, _, _>| {
                let waker = futures::task::noop_waker();
                stop.poll_stop(&mut Context::from_waker(&waker))
            };
            assert!(once(&mut stop).is_pending());
            assert!(once(&mut stop).is_pending());
            let fire = if cancel_kick {
                kick.clone()
            } else {
                shutdown.clone()
            };
            let waiter = async {
                tokio::time::timeout(std::time::Duration::from_secs(5), stop.stopped())
                    .await
                    .expect("the stop signal woke the task")
            };
            let (got, ()) = tokio::join!(waiter, async move {
                tokio::task::yield_now().await;
                fire.cancel();
            });
            assert_eq!(got, expected);
        }
    }

    #[tokio::test]
    async fn a_token_cancelled_before_the_first_poll_is_seen() {
        let (kick, shutdown) = (CancellationToken::new(), CancellationToken::new());
        shutdown.cancel();
        let (k, s) = (kick.cancelled(), shutdown.cancelled());
        tokio::pin!(k, s);
        let mut stop = StopSignal::new(k, s);
        assert_eq!(stop.stopped().await, Stop::Shutdown);
    }
}
