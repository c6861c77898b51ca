//! Tail loss probes for QUIC connections that go quiet after a write (issue 17).
//!
//! A device on a lossy link waits for each PUBACK; when the packet carrying it is lost and
//! nothing follows it, only the probe timeout finds the loss. quinn (0.11.19) answers that
//! timeout with a PING or IMMEDIATE_ACK, not with the lost stream data, which is resent only
//! when the probe's acknowledgement shows the gap: one loss costs the probe timeout plus a
//! round trip and a half (about 140 ms at 50 ms RTT). A later ack-eliciting packet instead
//! lets quinn's time threshold declare the loss 9/8 of an RTT after the packet was sent,
//! rather than a probe timeout plus a round trip (over twice the RTT), as RFC 8985's tail loss
//! probe does for TCP. So, a short delay after the last write of a burst, one DATAGRAM frame
//! of one meaningless byte is sent, and its acknowledgement reveals a lost predecessor.
//!
//! # Invariants
//! - Probes go only to a peer that advertised DATAGRAM support (RFC 9221
//!   `max_datagram_frame_size`); a peer that did not gets none, and no task is spawned.
//! - At most one probe per quiet period: it is sent [`probe_delay`] after the last write when
//!   no write followed, and not again until something more is written. A busy connection,
//!   whose next write trails the last, sends none; nor does one nearer than [`MIN_RTT`].
//! - A probe's content means nothing; receivers ignore or drop it. The hub never reads the
//!   DATAGRAMs it receives (quinn drops the oldest beyond the receive window).
//! - The probe task ends when the wrapped writer is dropped.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Connections nearer than this are not probed: a probe saves about a round trip per loss
/// (plus the probe timeout's margins), under 15 ms here, and costs the hub a packet sent and
/// an ACK received (about 11 µs of CPU) per quiet period.
pub const MIN_RTT: Duration = Duration::from_millis(10);
/// How often a near connection that keeps writing has its RTT looked at again.
const NEAR_RECHECK: Duration = Duration::from_secs(1);

/// How long after the last write a connection with this RTT is probed, if at all: an eighth
/// of the RTT, the time threshold's margin (a probe acknowledged within 9/8 RTT of the lost
/// packet reveals it as early as quinn can declare it).
#[must_use]
pub fn probe_delay(rtt: Duration) -> Option<Duration> {
    (rtt >= MIN_RTT).then(|| rtt / 8)
}

/// Writes since the connection opened, and the wake-up for the first after a probe.
#[derive(Default)]
struct Writes {
    count: AtomicU64,
    wake: Notify,
}

impl Writes {
    fn touch(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
        // Stores a permit when the task is not waiting: a wake-up only for the first write
        // of a quiet period.
        self.wake.notify_one();
    }
}

/// A writer on a QUIC stream whose quiet periods end with a tail loss probe.
pub struct TailProbed<W> {
    inner: W,
    probe: Option<(Arc<Writes>, JoinHandle<()>)>,
}

impl<W> TailProbed<W> {
    /// Wraps `inner`, a stream of `conn`; spawns the probe task when the peer takes DATAGRAMs.
    #[must_use]
    pub fn new(conn: &quinn::Connection, inner: W) -> Self {
        let probe = conn
            .max_datagram_size()
            .is_some_and(|max| max > 0)
            .then(|| {
                let writes = Arc::new(Writes::default());
                let task = tokio::spawn(probe_quiet_periods(conn.clone(), Arc::clone(&writes)));
                (writes, task)
            });
        TailProbed { inner, probe }
    }

    /// Whether this connection's quiet periods are probed.
    #[must_use]
    pub fn probing(&self) -> bool {
        self.probe.is_some()
    }

    fn wrote(&self, n: usize) {
        if let (Some((writes, _)), true) = (&self.probe, n > 0) {
            writes.touch();
        }
    }
}

impl<W> Drop for TailProbed<W> {
    fn drop(&mut self) {
        if let Some((_, task)) = &self.probe {
            task.abort();
        }
    }
}

async fn probe_quiet_periods(conn: quinn::Connection, writes: Arc<Writes>) {
    let mut probed_after = 0;
    loop {
        writes.wake.notified().await;
        let mut seen = writes.count.load(Ordering::Relaxed);
        if seen == probed_after {
            // A permit left by writes that the last probe already followed.
            continue;
        }
        let Some(mut delay) = probe_delay(conn.rtt()) else {
            // Near: look again in a while, not at every write (each wake-up costs CPU).
            probed_after = seen;
            tokio::time::sleep(NEAR_RECHECK).await;
            continue;
        };
        loop {
            tokio::time::sleep(delay).await;
            let now = writes.count.load(Ordering::Relaxed);
            if now == seen {
                break;
            }
            seen = now;
            delay = probe_delay(conn.rtt()).unwrap_or(delay);
        }
        probed_after = seen;
        if conn.send_datagram(Bytes::from_static(&[0])).is_err() {
            // The connection closed, or the peer withdrew DATAGRAM support.
            return;
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for TailProbed<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.wrote(*n);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            self.wrote(*n);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_connections_are_probed_an_eighth_of_the_rtt_after_the_last_write() {
        assert_eq!(
            probe_delay(Duration::from_millis(50)),
            Some(Duration::from_micros(6_250))
        );
        assert_eq!(probe_delay(MIN_RTT), Some(MIN_RTT / 8));
        assert_eq!(probe_delay(Duration::from_micros(9_999)), None);
        assert_eq!(probe_delay(Duration::from_micros(200)), None);
    }
}
