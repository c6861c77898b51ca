//! In-order answers for one lane's appends, without a future per message.
//!
//! A connection's telemetry is appended on one [`super::AppendLane`]; its PUBACKs leave in
//! the order the messages came. Instead of a one-shot channel and a future per message, each
//! in-order append takes a run of tickets (one per message it carries) in a window shared
//! with the engine's commit callbacks, which fill the run's places; the connection takes
//! finished places off the front.
//!
//! # Invariants
//! - Tickets are issued in append order, and places leave the window only from the front,
//!   so [`LaneAcks::poll_next`] yields the results in ticket order, whatever order the
//!   commits finish in.
//! - A run is filled at most once (the lane's completion runs once per append), all its
//!   places with the same result: an append is one atomic write.
//! - A waiting consumer is woken after every fill: the fill and the check for a waker happen
//!   under one lock, so no fill is missed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use ferrohub_engine::d2c::D2cError;
use parking_lot::Mutex;

/// A place in the window.
enum Place {
    Waiting,
    Done,
    /// Shared by every place of the failed run.
    Failed(Arc<D2cError>),
}

#[derive(Default)]
struct Window {
    /// The ticket of the front place.
    front: u64,
    places: VecDeque<Place>,
    waker: Option<Waker>,
}

/// Consecutive tickets of one append, one per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tickets {
    pub first: u64,
    pub count: u32,
}

/// The ticket window of one lane.
#[derive(Default)]
pub struct LaneAcks(Mutex<Window>);

impl LaneAcks {
    /// `count` new places at the back; their tickets.
    pub(super) fn issue(&self, count: u32) -> Tickets {
        let mut w = self.0.lock();
        let first = w.front + w.places.len() as u64;
        w.places
            .extend(std::iter::repeat_with(|| Place::Waiting).take(count as usize));
        Tickets { first, count }
    }

    /// Fills the places of `tickets` and wakes the consumer.
    pub(super) fn fill(&self, tickets: Tickets, result: Result<(), D2cError>) {
        let result = result.map_err(Arc::new);
        let waker = {
            let mut w = self.0.lock();
            // Places before the front have left already; they cannot be filled twice.
            let start = tickets.first.saturating_sub(w.front);
            let end = (tickets.first + u64::from(tickets.count)).saturating_sub(w.front);
            for index in start..end {
                if let Some(place) = w.places.get_mut(index as usize) {
                    *place = match &result {
                        Ok(()) => Place::Done,
                        Err(e) => Place::Failed(Arc::clone(e)),
                    };
                }
            }
            w.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The result of the front ticket once it is filled.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Result<(), Arc<D2cError>>> {
        let mut w = self.0.lock();
        match w.places.front() {
            Some(Place::Waiting) | None => {
                match &w.waker {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    _ => w.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Some(_) => Poll::Ready(Self::pop_front(&mut w)),
        }
    }

    /// The front result if it is filled, without registering a waker.
    pub fn try_next(&self) -> Option<Result<(), Arc<D2cError>>> {
        let mut w = self.0.lock();
        if matches!(w.places.front(), Some(Place::Waiting) | None) {
            return None;
        }
        Some(Self::pop_front(&mut w))
    }

    fn pop_front(w: &mut Window) -> Result<(), Arc<D2cError>> {
        w.front += 1;
        match w.places.pop_front() {
            Some(Place::Failed(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Frees the window's memory when no ticket is outstanding (an idle connection).
    pub fn release_if_empty(&self) {
        let mut w = self.0.lock();
        if w.places.is_empty() {
            w.places = VecDeque::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn results_leave_in_ticket_order_whatever_order_they_are_filled_in() {
        let acks = LaneAcks::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let (a, b, c) = (acks.issue(1), acks.issue(1), acks.issue(1));
        assert_eq!((a.first, b.first, c.first), (0, 1, 2));
        assert!(acks.poll_next(&mut cx).is_pending());
        acks.fill(c, Ok(()));
        acks.fill(b, Err(D2cError::NoSuchPartition(7)));
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken by the first fill");
        assert!(
            acks.poll_next(&mut cx).is_pending(),
            "the front is not filled"
        );
        acks.fill(a, Ok(()));
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(matches!(acks.poll_next(&mut cx), Poll::Ready(Ok(()))));
        assert!(matches!(
            acks.try_next().map(|r| r.map_err(|e| e.to_string())),
            Some(Err(e)) if e == D2cError::NoSuchPartition(7).to_string()
        ));
        assert!(matches!(acks.poll_next(&mut cx), Poll::Ready(Ok(()))));
        assert!(acks.try_next().is_none());
        // Tickets go on from where they were.
        let d = acks.issue(1);
        assert_eq!(d.first, 3);
        acks.fill(d, Ok(()));
        assert!(matches!(acks.try_next(), Some(Ok(()))));
        acks.release_if_empty();
        assert_eq!(acks.issue(1).first, 4);
    }

    #[test]
    fn a_run_of_tickets_is_filled_at_once_and_leaves_one_place_at_a_time() {
        let acks = LaneAcks::default();
        let single = acks.issue(1);
        let run = acks.issue(3);
        let after = acks.issue(2);
        assert_eq!(run, Tickets { first: 1, count: 3 });
        assert_eq!(after.first, 4);
        acks.fill(run, Err(D2cError::NoSuchPartition(2)));
        assert!(
            acks.try_next().is_none(),
            "the single ticket before the run is open"
        );
        acks.fill(after, Ok(()));
        acks.fill(single, Ok(()));
        let results: Vec<_> = std::iter::from_fn(|| acks.try_next())
            .map(|r| r.map_err(|e| e.to_string()))
            .collect();
        let failed = Err(D2cError::NoSuchPartition(2).to_string());
        assert_eq!(
            results,
            vec![
                Ok(()),
                failed.clone(),
                failed.clone(),
                failed,
                Ok(()),
                Ok(())
            ]
        );
        // A run filled again after it left changes nothing.
        acks.fill(run, Ok(()));
        assert!(acks.try_next().is_none());
        assert_eq!(acks.issue(1).first, 6);
    }
}
