//! Checks every frame a client sends, and every message it delivers, before `fe2o3-amqp`
//! reads them.
//!
//! Three things in the AMQP library let a few bytes hurt the hub (seen with the `amqp_frames`
//! fuzz target and while writing it):
//! - its frame decoder reads the 8-byte frame header without checking that it is there, so a
//!   frame whose size says 4 to 7 bytes panics the connection's task;
//! - its value decoder trusts a string's or binary's 4-byte length and zero-fills a buffer of
//!   that size before reading, so a 50-byte SASL frame announcing a 3 GB string makes the hub
//!   touch 3 GB of memory;
//! - it decodes a message recursively without a depth bound, so one 64 KB transfer holding
//!   7,000 nested lists overflows a 2 MiB worker stack and aborts the process; `$cbs` takes
//!   messages before the client has authenticated.
//!
//! This layer holds each frame back until it is complete and releases it only when its header
//! is well formed (size at least 8 bytes and at most the frame limit, data offset at least 2
//! words and inside the frame) and its performative passes [`value_check`](super::value_check)
//! (lengths inside the frame, known format codes, bounded nesting). A transfer's payload is
//! kept, per link, until its delivery's last frame, and that frame is released only when the
//! whole message's sections pass the same check. A malformed frame or message ends the
//! connection with `InvalidData`, which the connection reports as a closed transport.
//!
//! # Invariants
//! - Bytes are released unchanged and in order; only whole protocol headers and whole checked
//!   frames are released, so the decoder never sees a frame this layer has not checked, nor
//!   the last frame of a delivery whose message has not been checked whole.
//! - Held back at most: one frame, plus `max_held` bytes of unfinished deliveries.
//! - After a framing error every later read fails too: nothing after it reaches the decoder.
//! - The first 8 bytes are a protocol header, whatever they hold (`header` answers one it does
//!   not speak). Later, at a frame boundary, a leading `A` starts a protocol header, as after
//!   the SASL exchange; a frame size cannot start with that byte within the frame limit.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::collections::HashMap;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::value_check::{
    bool_field, check_sections, described_list_fields, uint_field, value_end, Malformed,
};

/// The smallest legal frame: size, data offset, type and channel.
const FRAME_HEADER: usize = 8;

/// Room in the reader's buffer from which a read goes straight into it (below it, through
/// the guard's own buffer: many small reads cost more than one copy).
const IN_PLACE_FROM: usize = 1024;

/// The descriptor of a transfer performative, whose payload follows it in the frame.
const TRANSFER: u8 = 0x14;

/// A framing error a client made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("AMQP frame of {0} bytes is shorter than its 8-byte header")]
    TooShort(u32),
    #[error("AMQP frame of {size} bytes exceeds the limit of {max}")]
    TooLarge { size: u32, max: usize },
    #[error("AMQP frame data offset {doff} is below 2 or beyond the frame's {size} bytes")]
    BadDataOffset { doff: u8, size: u32 },
    #[error("{0}")]
    Malformed(#[from] Malformed),
    #[error("AMQP deliveries in progress exceed {0} bytes")]
    DeliveriesTooLarge(usize),
}

/// The framing state machine, fed the client's bytes in any pieces.
#[derive(Debug, Clone)]
pub struct FrameCheck {
    max_frame: usize,
    /// Most bytes of unfinished deliveries held for checking, over all links.
    max_held: usize,
    /// The payload so far of each link's unfinished delivery, by (channel, handle).
    deliveries: HashMap<(u16, u32), Vec<u8>>,
    held: usize,
    /// Bytes received and not yet released.
    pending: Vec<u8>,
    /// The next bytes are a protocol header.
    expect_header: bool,
    failed: Option<FramingError>,
}

impl FrameCheck {
    /// A check for a new connection whose frames may be up to `max_frame` bytes and whose
    /// unfinished deliveries may hold up to `max_held` bytes together.
    pub fn new(max_frame: usize, max_held: usize) -> Self {
        FrameCheck {
            max_frame,
            max_held,
            deliveries: HashMap::new(),
            held: 0,
            pending: Vec::new(),
            expect_header: true,
            failed: None,
        }
    }

    /// Takes `bytes`, the next ones the client sent, and appends to `released` every protocol
    /// header and frame they complete, once checked.
    ///
    /// # Errors
    /// The first [`FramingError`]; once failed, every call returns it again.
    pub fn feed(&mut self, bytes: &[u8], released: &mut Vec<u8>) -> Result<(), FramingError> {
        if self.holds_nothing() {
            let (n, result) = self.feed_in_place(bytes);
            released.extend_from_slice(&bytes[..n]);
            return result;
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.pending.extend_from_slice(bytes);
        let pending = std::mem::take(&mut self.pending);
        let (n, result) = self.release(&pending);
        released.extend_from_slice(&pending[..n]);
        self.pending = pending;
        self.pending.drain(..n);
        if let Err(e) = &result {
            self.failed = Some(e.clone());
            self.pending = Vec::new();
        }
        result
    }

    /// Whether no bytes are held back: the next ones start a protocol header or a frame.
    pub fn holds_nothing(&self) -> bool {
        self.pending.is_empty()
    }

    /// As [`FrameCheck::feed`] when [`FrameCheck::holds_nothing`], without copying what is
    /// released: the leading bytes of `bytes` it returns the count of are released, and the
    /// rest is held back. A caller that read into its reader's buffer leaves them there.
    ///
    /// # Errors
    /// As [`FrameCheck::feed`]; the count still says what was released before the error.
    pub fn feed_in_place(&mut self, bytes: &[u8]) -> (usize, Result<(), FramingError>) {
        debug_assert!(self.holds_nothing());
        if let Some(e) = &self.failed {
            return (0, Err(e.clone()));
        }
        let (n, result) = self.release(bytes);
        match &result {
            Ok(()) => self.pending.extend_from_slice(&bytes[n..]),
            Err(e) => self.failed = Some(e.clone()),
        }
        (n, result)
    }

    /// How many leading bytes of `bytes` are whole, checked protocol headers and frames.
    fn release(&mut self, bytes: &[u8]) -> (usize, Result<(), FramingError>) {
        let mut start = 0;
        let result = loop {
            let rest = &bytes[start..];
            let Some(&first) = rest.first() else {
                break Ok(());
            };
            let header = self.expect_header || first == b'A';
            let whole = if header {
                (rest.len() >= 8).then_some(8)
            } else {
                match self.frame_length(rest) {
                    Ok(n) => n,
                    Err(e) => break Err(e),
                }
            };
            let Some(n) = whole else { break Ok(()) };
            if !header {
                if let Err(e) = self.check_frame(&rest[..n]) {
                    break Err(e);
                }
            }
            self.expect_header = false;
            start += n;
        };
        (start, result)
    }

    /// The length of the frame `rest` starts with once it is all there, checking its header
    /// fields as soon as they arrive.
    fn frame_length(&self, rest: &[u8]) -> Result<Option<usize>, FramingError> {
        let Some(size) = rest.get(..4) else {
            return Ok(None);
        };
        let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]);
        if (size as usize) < FRAME_HEADER {
            return Err(FramingError::TooShort(size));
        }
        if size as usize > self.max_frame {
            return Err(FramingError::TooLarge {
                size,
                max: self.max_frame,
            });
        }
        if let Some(&doff) = rest.get(4) {
            if doff < 2 || u32::from(doff) * 4 > size {
                return Err(FramingError::BadDataOffset { doff, size });
            }
        }
        Ok((rest.len() >= size as usize).then_some(size as usize))
    }
}

impl FrameCheck {
    /// Checks a whole frame's body: its performative (or SASL frame) is one well-formed value,
    /// and a transfer's payload joins its delivery, checked whole once the delivery ends.
    fn check_frame(&mut self, frame: &[u8]) -> Result<(), FramingError> {
        let body = &frame[usize::from(frame[4]) * 4..];
        if body.is_empty() {
            return Ok(()); // An empty frame: a heartbeat.
        }
        let end = value_end(body, 0, 0)?;
        if frame[5] != 0 || !is_transfer(body) {
            if end < body.len() {
                return Err(Malformed("bytes after the performative").into());
            }
            return Ok(());
        }
        let channel = u16::from_be_bytes([frame[6], frame[7]]);
        self.transfer(channel, &body[..end], &body[end..])
    }

    /// One transfer frame: its payload is appended to the link's delivery; the delivery's
    /// sections are checked when its last frame (`more` false) arrives.
    fn transfer(
        &mut self,
        channel: u16,
        performative: &[u8],
        payload: &[u8],
    ) -> Result<(), FramingError> {
        let fields = described_list_fields(performative, 0)?;
        let handle = fields
            .first()
            .and_then(|f| uint_field(performative, *f))
            .ok_or(Malformed("a transfer without a handle"))?;
        let more = bool_field(performative, fields.get(5).copied());
        let aborted = bool_field(performative, fields.get(9).copied());
        let key = (channel, handle);
        if more && !aborted {
            self.held += payload.len();
            if self.held > self.max_held {
                return Err(FramingError::DeliveriesTooLarge(self.max_held));
            }
            self.deliveries
                .entry(key)
                .or_default()
                .extend_from_slice(payload);
            return Ok(());
        }
        let mut delivery = self.deliveries.remove(&key).unwrap_or_default();
        self.held -= delivery.len();
        if aborted {
            return Ok(());
        }
        let whole: &[u8] = if delivery.is_empty() {
            payload
        } else {
            delivery.extend_from_slice(payload);
            &delivery
        };
        if !whole.is_empty() {
            check_sections(whole)?;
        }
        Ok(())
    }
}

/// Whether the performative is a transfer, by numeric or symbolic descriptor.
fn is_transfer(body: &[u8]) -> bool {
    match body {
        [0x00, 0x53, code, ..] => *code == TRANSFER,
        [0x00, 0x80, code @ ..] => code.get(..8) == Some(&[0, 0, 0, 0, 0, 0, 0, TRANSFER]),
        [0x00, 0xa3, n, name @ ..] => name.get(..usize::from(*n)) == Some(b"amqp:transfer:list"),
        _ => false,
    }
}

/// A stream whose incoming bytes pass a [`FrameCheck`]; writes pass through.
#[derive(Debug)]
pub struct FrameGuard<Io> {
    inner: Io,
    check: FrameCheck,
    /// Checked bytes not yet read by the decoder, from `ready_at`.
    ready: Vec<u8>,
    ready_at: usize,
    scratch: Vec<u8>,
    /// A framing error to report once what was released before it has been read.
    error: Option<FramingError>,
}

impl<Io> FrameGuard<Io> {
    /// Guards `inner`, whose frames may be up to `max_frame` bytes and whose unfinished
    /// deliveries may hold up to `max_held` bytes together.
    pub fn new(inner: Io, max_frame: usize, max_held: usize) -> Self {
        FrameGuard {
            inner,
            check: FrameCheck::new(max_frame, max_held),
            ready: Vec::new(),
            ready_at: 0,
            scratch: vec![0; 4096],
            error: None,
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for FrameGuard<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_at < this.ready.len() {
                let n = (this.ready.len() - this.ready_at).min(buf.remaining());
                buf.put_slice(&this.ready[this.ready_at..this.ready_at + n]);
                this.ready_at += n;
                return Poll::Ready(Ok(()));
            }
            this.ready.clear();
            this.ready_at = 0;
            if let Some(e) = &this.error {
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e.clone())));
            }
            if this.check.holds_nothing() && buf.remaining() >= IN_PLACE_FROM {
                // Read straight into the decoder's buffer and keep there what is released:
                // the common case, a read that ends at a frame's end, copies nothing.
                let start = buf.filled().len();
                std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
                let end = buf.filled().len();
                if end == start {
                    return Poll::Ready(Ok(())); // End of stream.
                }
                let (n, result) = this.check.feed_in_place(&buf.filled()[start..end]);
                buf.set_filled(start + n);
                if let Err(e) = result {
                    this.error = Some(e);
                }
                if n > 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(())); // End of stream; an incomplete frame is dropped.
            }
            let received = &this.scratch[..n];
            if let Err(e) = this.check.feed(received, &mut this.ready) {
                // What came before the error is released first (e.g. a protocol header the
                // hub answers); the error follows on the next read.
                this.error = Some(e);
            }
        }
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for FrameGuard<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "frame_guard_tests.rs"]
mod tests;
