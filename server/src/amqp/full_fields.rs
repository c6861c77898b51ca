//! Writes every performative the hub sends with all its fields.
//!
//! AMQP lets an encoder leave out trailing fields that are null or default, and `fe2o3-amqp`
//! does. The Python Event Hubs SDK's own AMQP stack (`pyamqp`) reads fields by fixed position
//! without checking the list's length: an `open` without `properties`, a `detach` without
//! `error`, a `transfer` whose payload then sits at the wrong index all fail inside the SDK.
//! Azure's brokers always send full lists, so this stream wrapper re-encodes each outgoing
//! AMQP and SASL performative with the missing trailing fields written as `null`, which means
//! the same to every reader.
//!
//! # Invariants
//! - Bytes pass through in order; only the performative's list header and the appended nulls
//!   change. Protocol headers, empty frames and payloads are untouched.
//! - At most one write's worth of bytes waits here: a new write is taken only once everything
//!   rewritten before it has reached the inner stream.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How many fields each performative has, by frame type and descriptor code.
fn full_count(frame_type: u8, code: u64) -> Option<usize> {
    match (frame_type, code) {
        // open, begin, attach, flow, transfer, disposition, detach, end, close
        (0, 0x10) => Some(10),
        (0, 0x11) => Some(8),
        (0, 0x12) => Some(14),
        (0, 0x13) => Some(11),
        (0, 0x14) => Some(11),
        (0, 0x15) => Some(6),
        (0, 0x16) => Some(3),
        (0, 0x17) => Some(1),
        (0, 0x18) => Some(1),
        // sasl-mechanisms, sasl-challenge, sasl-outcome
        (1, 0x40) => Some(1),
        (1, 0x42) => Some(1),
        (1, 0x44) => Some(2),
        _ => None,
    }
}

const UINT_MAX: &[u8] = &[0x70, 0xff, 0xff, 0xff, 0xff];

/// The encoded default of a field that has one in the specification, where a reader that
/// does not apply defaults would misread `null`: pyamqp compares `max-frame-size` and
/// `handle-max` as numbers and keeps the settle modes as given. Boolean defaults are left null,
/// which Python reads as false, so transfers pass unchanged once they carry all their fields.
fn default_of(frame_type: u8, code: u64, field: usize) -> Option<&'static [u8]> {
    if frame_type != 0 {
        return None;
    }
    match (code, field) {
        (0x10, 2) => Some(UINT_MAX),            // open.max-frame-size
        (0x10, 3) => Some(&[0x60, 0xff, 0xff]), // open.channel-max
        (0x11, 4) => Some(UINT_MAX),            // begin.handle-max
        (0x12, 3) => Some(&[0x50, 0x02]),       // attach.snd-settle-mode: mixed
        (0x12, 4) => Some(&[0x50, 0x00]),       // attach.rcv-settle-mode: first
        _ => None,
    }
}

/// Length of the encoded value at the start of `bytes` (AMQP 1.0 part 1, 1.6: the width is
/// given by the constructor's high nibble), or `None` if it is cut short or unknown.
fn value_len(bytes: &[u8]) -> Option<usize> {
    let constructor = *bytes.first()?;
    if constructor == 0x00 {
        let descriptor = value_len(&bytes[1..])?;
        let value = value_len(bytes.get(1 + descriptor..)?)?;
        return Some(1 + descriptor + value);
    }
    let sized = |width: usize| -> Option<usize> {
        let size = bytes.get(1..1 + width)?;
        let n = size.iter().fold(0usize, |n, b| n << 8 | *b as usize);
        Some(1 + width + n)
    };
    let len = match constructor >> 4 {
        0x4 => 1,
        0x5 => 2,
        0x6 => 3,
        0x7 => 5,
        0x8 => 9,
        0x9 => 17,
        0xa | 0xc | 0xe => sized(1)?,
        0xb | 0xd | 0xf => sized(4)?,
        _ => return None,
    };
    (bytes.len() >= len).then_some(len)
}

/// The encoded fields of a list body holding `count` of them.
fn split_fields(mut fields: &[u8], count: usize) -> Option<Vec<&[u8]>> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let n = value_len(fields)?;
        out.push(&fields[..n]);
        fields = &fields[n..];
    }
    fields.is_empty().then_some(out)
}

/// The frame with its performative's list written in full: missing trailing fields added,
/// and fields with a specified default written with it where they were left null. `None`
/// when nothing is missing, or when it is not a performative this module knows.
fn padded(frame: &[u8]) -> Option<Vec<u8>> {
    if frame.len() < 8 {
        return None;
    }
    let header_len = frame[4] as usize * 4;
    let frame_type = frame[5];
    if header_len < 8 || frame.len() < header_len + 4 {
        return None;
    }
    let body = &frame[header_len..];
    // Described: 0x00, then the code as smallulong (0x53) or ulong (0x80).
    let (code, list) = match body {
        [0x00, 0x53, code, rest @ ..] => (u64::from(*code), rest),
        [0x00, 0x80, rest @ ..] if rest.len() >= 8 => (
            u64::from_be_bytes(rest[..8].try_into().expect("8 bytes")),
            &rest[8..],
        ),
        _ => return None,
    };
    let Some(full) = full_count(frame_type, code) else {
        return None;
    };
    let (count, fields, rest) = match list {
        [0x45, rest @ ..] => (0, &[][..], rest),
        [0xc0, size, count, rest @ ..] if *size >= 1 && rest.len() >= *size as usize - 1 => {
            let n = *size as usize - 1;
            (*count as usize, &rest[..n], &rest[n..])
        }
        [0xd0, rest @ ..] if rest.len() >= 8 => {
            let size = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            let count = u32::from_be_bytes(rest[4..8].try_into().expect("4 bytes")) as usize;
            if size < 4 || rest.len() < 4 + size {
                return None;
            }
            (count, &rest[8..4 + size], &rest[4 + size..])
        }
        _ => return None,
    };
    let Some(present) = split_fields(fields, count) else {
        return None;
    };
    let mut changed = count < full;
    let mut written: Vec<&[u8]> = Vec::with_capacity(full.max(count));
    for i in 0..full.max(count) {
        let field = present.get(i).copied().unwrap_or(&[0x40]);
        match default_of(frame_type, code, i) {
            Some(default) if field == [0x40] => {
                changed = true;
                written.push(default);
            }
            _ => written.push(field),
        }
    }
    if !changed {
        return None;
    }
    let list_len: usize = written.iter().map(|f| f.len()).sum();
    let mut out = Vec::with_capacity(header_len + list_len + rest.len() + 16);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&frame[4..header_len]);
    out.extend_from_slice(&body[..body.len() - list.len()]);
    out.push(0xd0);
    out.extend_from_slice(&((4 + list_len) as u32).to_be_bytes());
    out.extend_from_slice(&(written.len() as u32).to_be_bytes());
    for f in written {
        out.extend_from_slice(f);
    }
    out.extend_from_slice(rest);
    let total = out.len() as u32;
    out[..4].copy_from_slice(&total.to_be_bytes());
    Some(out)
}

#[cfg(test)]
fn pad_frame(frame: &[u8]) -> Vec<u8> {
    padded(frame).unwrap_or_else(|| frame.to_vec())
}

/// Moves every complete protocol header and frame from `pending` to `out`, padded.
fn rewrite(pending: &mut Vec<u8>, out: &mut Vec<u8>) {
    let mut at = 0;
    loop {
        let rest = &pending[at..];
        if rest.len() >= 8 && rest.starts_with(b"AMQP") {
            out.extend_from_slice(&rest[..8]);
            at += 8;
            continue;
        }
        if rest.len() < 4 {
            break;
        }
        let size = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if size < 8 {
            // Not a frame this module understands: pass everything through as is.
            out.extend_from_slice(rest);
            at = pending.len();
            break;
        }
        if rest.len() < size {
            break;
        }
        match padded(&rest[..size]) {
            Some(frame) => out.extend_from_slice(&frame),
            None => out.extend_from_slice(&rest[..size]),
        }
        at += size;
    }
    pending.drain(..at);
}

/// A stream whose outgoing AMQP performatives carry all their fields.
#[derive(Debug)]
pub struct FullFields<Io> {
    inner: Io,
    /// Written by the AMQP stack, not yet a complete frame.
    pending: Vec<u8>,
    /// Rewritten, not yet taken by the inner stream.
    out: Vec<u8>,
}

impl<Io> FullFields<Io> {
    pub fn new(inner: Io) -> Self {
        FullFields {
            inner,
            pending: Vec::new(),
            out: Vec::new(),
        }
    }
}

impl<Io: AsyncWrite + Unpin> FullFields<Io> {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for FullFields<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for FullFields<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        this.pending.extend_from_slice(buf);
        rewrite(&mut this.pending, &mut this.out);
        // Start sending now; what the inner stream does not take waits for the next call.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Whatever is still incomplete is sent as it is.
        let rest = std::mem::take(&mut this.pending);
        this.out.extend_from_slice(&rest);
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(frame_type: u8, body: &[u8]) -> Vec<u8> {
        let mut f = vec![0, 0, 0, 0, 2, frame_type, 0, 0];
        f.extend_from_slice(body);
        let n = f.len() as u32;
        f[..4].copy_from_slice(&n.to_be_bytes());
        f
    }

    #[test]
    fn a_short_detach_gets_its_error_field() {
        // detach(handle = 0 as uint0, closed = true)
        let short = frame(0, &[0x00, 0x53, 0x16, 0xc0, 0x03, 0x02, 0x43, 0x41]);
        let padded = pad_frame(&short);
        // The uint0 handle and `true` stay as they are; error is null.
        let want = frame(
            0,
            &[
                0x00, 0x53, 0x16, 0xd0, 0, 0, 0, 7, 0, 0, 0, 3, 0x43, 0x41, 0x40,
            ],
        );
        assert_eq!(padded, want);
    }

    #[test]
    fn a_transfer_payload_stays_after_the_padded_list() {
        let mut body = vec![0x00, 0x53, 0x14, 0xc0, 0x02, 0x01, 0x43];
        body.extend_from_slice(b"payload");
        let padded = pad_frame(&frame(0, &body));
        let list_start = 8 + 3;
        assert_eq!(padded[list_start], 0xd0);
        let count = u32::from_be_bytes(padded[list_start + 5..list_start + 9].try_into().unwrap());
        assert_eq!(count, 11);
        // handle, then ten nulls.
        let fields = [
            0x43, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
        ];
        let mut want = fields.to_vec();
        want.extend_from_slice(b"payload");
        assert!(padded.ends_with(&want));
        let size = u32::from_be_bytes(padded[..4].try_into().unwrap()) as usize;
        assert_eq!(size, padded.len());
    }

    #[test]
    fn defaults_replace_nulls_in_the_middle_of_a_list() {
        // begin(remote-channel null, next-outgoing-id 1, incoming-window 2, outgoing-window 3,
        // handle-max null, offered-capabilities null, desired null, properties = empty map)
        let begin = frame(
            0,
            &[
                0x00, 0x53, 0x11, 0xc0, 0x0e, 0x08, 0x40, 0x52, 0x01, 0x52, 0x02, 0x52, 0x03, 0x40,
                0x40, 0x40, 0xc1, 0x01, 0x00,
            ],
        );
        let padded = pad_frame(&begin);
        let list = &padded[8 + 3..];
        assert_eq!(&list[5..9], &8u32.to_be_bytes());
        assert_eq!(
            &list[9..],
            &[
                0x40, 0x52, 0x01, 0x52, 0x02, 0x52, 0x03, 0x70, 0xff, 0xff, 0xff, 0xff, 0x40, 0x40,
                0xc1, 0x01, 0x00
            ]
        );
    }

    #[test]
    fn values_are_measured_by_their_constructor() {
        assert_eq!(value_len(&[0x40]), Some(1));
        assert_eq!(value_len(&[0xa1, 0x02, b'h', b'i', 0xff]), Some(4));
        assert_eq!(value_len(&[0xb0, 0, 0, 0, 1, 9]), Some(6));
        assert_eq!(value_len(&[0x00, 0x53, 0x70, 0xa1, 0x01, b'x']), Some(6));
        assert_eq!(value_len(&[0xa1, 0x05, b'h']), None);
        assert_eq!(value_len(&[0x30]), None);
    }

    #[test]
    fn full_lists_headers_and_empty_frames_pass_unchanged() {
        let end_with_error = frame(0, &[0x00, 0x53, 0x17, 0xc0, 0x02, 0x01, 0x40]);
        assert_eq!(pad_frame(&end_with_error), end_with_error);
        let empty = frame(0, &[]);
        assert_eq!(pad_frame(&empty), empty);
        let mut stream = b"AMQP\x00\x01\x00\x00".to_vec();
        stream.extend_from_slice(&empty);
        let close = frame(0, &[0x00, 0x53, 0x18, 0x45]);
        stream.extend_from_slice(&close[..5]);
        let mut out = Vec::new();
        rewrite(&mut stream, &mut out);
        assert_eq!(&out[..8], b"AMQP\x00\x01\x00\x00");
        assert_eq!(&out[8..], &empty[..]);
        assert_eq!(stream, close[..5].to_vec(), "the incomplete frame waits");
        stream.extend_from_slice(&close[5..]);
        let mut out = Vec::new();
        rewrite(&mut stream, &mut out);
        assert!(stream.is_empty());
        assert_eq!(
            out,
            frame(0, &[0x00, 0x53, 0x18, 0xd0, 0, 0, 0, 5, 0, 0, 0, 1, 0x40])
        );
    }
}

#[cfg(test)]
mod round_trip {
    use super::*;
    use fe2o3_amqp::types::definitions::{ReceiverSettleMode, Role, SenderSettleMode};
    use fe2o3_amqp::types::messaging::{Source, Target};
    use fe2o3_amqp::types::performatives::{Attach, Begin, Detach, Performative};
    use fe2o3_amqp::types::primitives::{Symbol, Value};
    use serde_amqp::described::Described;
    use serde_amqp::descriptor::Descriptor;

    fn through_padding(p: &Performative) -> Performative {
        let body = serde_amqp::to_vec(p).unwrap();
        let mut frame = vec![0, 0, 0, 0, 2, 0, 0, 0];
        frame.extend_from_slice(&body);
        let n = frame.len() as u32;
        frame[..4].copy_from_slice(&n.to_be_bytes());
        let padded = pad_frame(&frame);
        serde_amqp::from_slice(&padded[8..])
            .unwrap_or_else(|e| panic!("{e:?}\n{:02x?}\n{:02x?}", &frame[8..], &padded[8..]))
    }

    #[test]
    fn fe2o3_reads_back_what_was_padded() {
        let selector = Described {
            descriptor: Descriptor::Name(Symbol::from("apache.org:selector-filter:string")),
            value: Value::String("amqp.annotation.x-opt-offset > '-1'".into()),
        };
        let source = Source::builder()
            .address("hub/ConsumerGroups/$Default/Partitions/0")
            .add_to_filter("apache.org:selector-filter:string", selector)
            .build();
        let attach = Performative::Attach(Attach {
            name: "l".into(),
            handle: 0.into(),
            role: Role::Sender,
            snd_settle_mode: SenderSettleMode::Settled,
            rcv_settle_mode: ReceiverSettleMode::First,
            source: Some(Box::new(source)),
            target: Some(Box::new(Target::builder().build().into())),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: Some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        });
        assert_eq!(through_padding(&attach), attach);
        let begin = Performative::Begin(Begin {
            remote_channel: Some(0),
            next_outgoing_id: 0,
            incoming_window: 5000,
            outgoing_window: 5000,
            handle_max: u32::MAX.into(),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        });
        assert_eq!(through_padding(&begin), begin);
        let detach = Performative::Detach(Detach {
            handle: 3.into(),
            closed: true,
            error: None,
        });
        assert_eq!(through_padding(&detach), detach);
    }
}
