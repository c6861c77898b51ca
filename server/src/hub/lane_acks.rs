//! In-order answers for one lane's appends, without a future per message.
//!
//! A connection's telemetry is appended on one [`super::AppendLane`]; its PUBACKs leave in
//! the order the messages came. Instead of a one-shot channel and a future per message, each
//! in-order append takes a ticket in a window shared with the engine's commit callbacks,
//! which fill their message's place; the connection takes finished places off the front.
//!
//! # Invariants
//! - Tickets are issued in append order, and places leave the window only from the front,
//!   so [`LaneAcks::poll_next`] yields the results in ticket order, whatever order the
//!   commits finish in.
//! - A place is filled at most once (the lane's completion runs once per message).
//! - A waiting consumer is woken after every fill: the fill and the check for a waker happen
//!   under one lock, so no fill is missed.

use std::collections::VecDeque;
use std::task::{Context, Poll, Waker};

use ferrohub_engine::d2c::D2cError;
use parking_lot::Mutex;

/// A place in the window.
enum Place {
    Waiting,
    Done,
    Failed(D2cError),
}

#[derive(Default)]
struct Window {
    /// The ticket of the front place.
    front: u64,
    places: VecDeque<Place>,
    waker: Option<Waker>,
}

/// The ticket window of one lane.
#[derive(Default)]
pub struct LaneAcks(Mutex<Window>);

impl LaneAcks {
    /// A new place at the back; its ticket.
    pub(super) fn issue(&self) -> u64 {
        let mut w = self.0.lock();
        w.places.push_back(Place::Waiting);
        w.front + w.places.len() as u64 - 1
    }

    /// Fills the place of `ticket` and wakes the consumer.
    pub(super) fn fill(&self, ticket: u64, result: Result<(), D2cError>) {
        let waker = {
            let mut w = self.0.lock();
            let Some(index) = ticket.checked_sub(w.front) else {
                return;
            };
            if let Some(place) = w.places.get_mut(index as usize) {
                *place = match result {
                    Ok(()) => Place::Done,
                    Err(e) => Place::Failed(e),
                };
            }
            w.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The result of the front ticket once it is filled.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Result<(), D2cError>> {
        let mut w = self.0.lock();
        match w.places.front() {
            Some(Place::Waiting) | None => {
                match &w.waker {
                    Some(old) if old.will_wake(cx.waker()) => {}
                    _ => w.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            Some(_) => {
                w.front += 1;
                let result = match w.places.pop_front() {
                    Some(Place::Failed(e)) => Err(e),
                    _ => Ok(()),
                };
                Poll::Ready(result)
            }
        }
    }

    /// The front result if it is filled, without registering a waker.
    pub fn try_next(&self) -> Option<Result<(), D2cError>> {
        let mut w = self.0.lock();
        if matches!(w.places.front(), Some(Place::Waiting) | None) {
            return None;
        }
        w.front += 1;
        match w.places.pop_front() {
            Some(Place::Failed(e)) => Some(Err(e)),
            _ => Some(Ok(())),
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
        let (a, b, c) = (acks.issue(), acks.issue(), acks.issue());
        assert_eq!((a, b, c), (0, 1, 2));
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
            acks.try_next(),
            Some(Err(D2cError::NoSuchPartition(7)))
        ));
        assert!(matches!(acks.poll_next(&mut cx), Poll::Ready(Ok(()))));
        assert!(acks.try_next().is_none());
        // Tickets go on from where they were.
        assert_eq!(acks.issue(), 3);
        acks.fill(3, Ok(()));
        assert!(matches!(acks.try_next(), Some(Ok(()))));
        acks.release_if_empty();
        assert_eq!(acks.issue(), 4);
    }
}
