//! The answers one connection owes, in the order of the packets that asked for them.
//!
//! Telemetry, by far the most frequent, costs no future here: its PUBACK waits on a ticket of
//! the connection's append lane (see [`crate::hub::lane_acks`]). Other work (twin requests,
//! C2D settlements, method answers) runs as futures, all driven at once, whose results wait
//! for their turn.
//!
//! # Invariants
//! - Answers leave in the order their requests were queued, whatever order they finish in.
//! - Telemetry entries are queued in the order of their lane tickets (the connection issues
//!   both from one task), so the lane's in-order results match them one to one.
//! - Every queued piece of work is polled whenever the connection polls for answers, so work
//!   behind a slow answer still makes progress.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::FuturesOrdered;
use futures::{Future, StreamExt};
use tokio::time::Instant;

use mqtt::packet::VariablePacket;

use super::twin;
use crate::hub::AppendLane;

/// Queued work of this connection: the packets to send when it completes, or why the
/// connection must end.
pub(super) type Pending = Pin<Box<dyn Future<Output = Result<twin::Packets, String>> + Send>>;

/// What a queued request asked for.
enum Entry {
    /// A telemetry message; its PUBACK (QoS 1) once its lane ticket is answered.
    Telemetry {
        pkid: Option<u16>,
        received: Instant,
        admitted: Instant,
    },
    /// The next result of `work`.
    Work,
}

/// One answer, ready to send.
pub(super) enum Answer {
    /// A telemetry message is durable (or failed).
    Telemetry {
        pkid: Option<u16>,
        received: Instant,
        admitted: Instant,
        result: Result<(), String>,
    },
    /// Work finished.
    Work(Result<twin::Packets, String>),
}

#[derive(Default)]
pub(super) struct Answers {
    order: VecDeque<Entry>,
    work: FuturesOrdered<Pending>,
    /// Work that finished before its turn.
    finished: VecDeque<Result<twin::Packets, String>>,
}

impl Answers {
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Queues the PUBACK of a telemetry message just appended with
    /// [`AppendLane::append_in_order`].
    pub(super) fn push_telemetry(
        &mut self,
        pkid: Option<u16>,
        received: Instant,
        admitted: Instant,
    ) {
        self.order.push_back(Entry::Telemetry {
            pkid,
            received,
            admitted,
        });
    }

    pub(super) fn push_work(&mut self, work: Pending) {
        self.order.push_back(Entry::Work);
        self.work.push_back(work);
    }

    /// The next answer in order, once it is ready; `None` when nothing is queued.
    pub(super) fn poll_next(
        &mut self,
        lane: &AppendLane,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Answer>> {
        while !self.work.is_empty() {
            match self.work.poll_next_unpin(cx) {
                Poll::Ready(Some(result)) => self.finished.push_back(result),
                _ => break,
            }
        }
        self.take_front(|| lane.acks().poll_next(cx))
    }

    /// The next answer if it is ready now, without registering for a wake-up.
    pub(super) fn try_next(&mut self, lane: &AppendLane) -> Option<Answer> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        while !self.work.is_empty() {
            match self.work.poll_next_unpin(&mut cx) {
                Poll::Ready(Some(result)) => self.finished.push_back(result),
                _ => break,
            }
        }
        match self.take_front(|| lane.acks().try_next().map_or(Poll::Pending, Poll::Ready)) {
            Poll::Ready(answer) => answer,
            Poll::Pending => None,
        }
    }

    fn take_front(
        &mut self,
        telemetry: impl FnOnce() -> Poll<Result<(), std::sync::Arc<ferrohub_engine::d2c::D2cError>>>,
    ) -> Poll<Option<Answer>> {
        let answer = match self.order.front() {
            None => return Poll::Ready(None),
            Some(Entry::Work) => match self.finished.pop_front() {
                Some(result) => Answer::Work(result),
                None => return Poll::Pending,
            },
            Some(&Entry::Telemetry {
                pkid,
                received,
                admitted,
            }) => match telemetry() {
                Poll::Ready(result) => Answer::Telemetry {
                    pkid,
                    received,
                    admitted,
                    result: result.map_err(|e| e.to_string()),
                },
                Poll::Pending => return Poll::Pending,
            },
        };
        self.order.pop_front();
        Poll::Ready(Some(answer))
    }

    /// Waits for the next answer in order; `None` when nothing is queued.
    pub(super) fn next<'a>(
        &'a mut self,
        lane: &'a AppendLane,
    ) -> impl Future<Output = Option<Answer>> + 'a {
        std::future::poll_fn(move |cx| self.poll_next(lane, cx))
    }

    /// Frees the queue's memory while nothing is queued (an idle connection).
    pub(super) fn release_if_empty(&mut self, lane: &AppendLane) {
        if self.order.is_empty() {
            self.order = VecDeque::new();
            self.finished = VecDeque::new();
            lane.acks().release_if_empty();
        }
    }
}

/// The packets of one answer: a telemetry message's PUBACK (none at QoS 0) without a vector.
pub(super) enum Packets {
    One(Option<VariablePacket>),
    Many(std::vec::IntoIter<VariablePacket>),
}

impl Iterator for Packets {
    type Item = VariablePacket;
    fn next(&mut self) -> Option<VariablePacket> {
        match self {
            Packets::One(p) => p.take(),
            Packets::Many(ps) => ps.next(),
        }
    }
}
