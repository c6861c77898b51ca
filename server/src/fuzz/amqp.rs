//! AMQP bytes as the service endpoint reads them: the framing check, then `fe2o3-amqp`'s
//! frame decoders exactly as its transport cuts and calls them, then what the hub reads from
//! the frames (the node an attach names, device links included, a receiver's selector, a C2D
//! message's fields, a device's telemetry and twin requests).

use std::collections::HashMap;

use bytes::{Buf, BytesMut};
use fe2o3_amqp::frames::amqp::{FrameBody, FrameDecoder};
use fe2o3_amqp::frames::sasl;
use fe2o3_amqp::types::messaging::message::DecodeIntoMessage;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use serde_amqp::read::SliceReader;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use crate::amqp::address::Node;
use crate::amqp::frame_guard::FrameCheck;
use crate::amqp::message::c2d_from_amqp;
use crate::amqp::selector::start_position;

/// The largest frame the hub accepts (`connection::MAX_FRAME`), for the length codec.
const MAX_FRAME: usize = 65_536;

/// What unfinished deliveries may hold (`connection::MAX_HELD`).
const MAX_HELD: usize = 1 << 20;

/// fe2o3-amqp's frame cutter: a 4-byte size that counts itself.
fn frame_cutter() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .big_endian()
        .length_field_length(4)
        .max_frame_length(MAX_FRAME)
        .length_adjustment(-4)
        .new_codec()
}

/// Payloads of unfinished deliveries by (channel, handle), assembled as the library's receiver
/// assembles them: a message is decoded once its last frame (`more` false) arrives.
type Deliveries = HashMap<(u16, u32), Vec<u8>>;

fn read_frame(channel: u16, body: FrameBody, deliveries: &mut Deliveries) {
    match body {
        FrameBody::Attach(attach) => {
            let _ = Node::of(&attach);
            if let Some(source) = attach.source.as_deref() {
                let _ = start_position(source.filter.as_ref());
            }
        }
        FrameBody::Transfer {
            performative,
            payload,
        } => {
            let key = (channel, performative.handle.0);
            let mut message = deliveries.remove(&key).unwrap_or_default();
            message.extend_from_slice(&payload);
            if performative.aborted {
                return;
            }
            if performative.more {
                deliveries.insert(key, message);
                return;
            }
            if let Ok(message) = <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(
                SliceReader::new(&message),
            ) {
                let _ = c2d_from_amqp(&message);
                // What the device links read from a transfer: telemetry's properties, a twin
                // request's annotations, a method answer's correlation.
                let _ = crate::amqp::device::messages::telemetry(&message);
                let _ = crate::amqp::device::messages::annotation_text(&message, "operation");
                let _ = crate::amqp::device::messages::correlation(&message);
            }
        }
        _ => {}
    }
}

/// A connection's bytes after its opening header: SASL frames until the next protocol
/// header, then AMQP frames. Only what the framing check releases reaches the decoders, as in
/// the server (`FrameGuard` in front of the library's transport).
pub fn amqp_frames(data: &[u8]) {
    let mut check = FrameCheck::new(MAX_FRAME, MAX_HELD);
    let mut released = Vec::new();
    let fed = check
        .feed(b"AMQP\x03\x01\x00\x00", &mut released)
        .and_then(|()| check.feed(data, &mut released));
    let mut rest = BytesMut::from(&released[8..]);
    let mut cutter = frame_cutter();
    let mut sasl_phase = true;
    let mut deliveries = Deliveries::new();
    loop {
        if rest.starts_with(b"AMQP") {
            if rest.len() < 8 {
                break;
            }
            rest.advance(8);
            sasl_phase = false;
            continue;
        }
        let mut frame = match cutter.decode(&mut rest) {
            Ok(Some(frame)) => frame,
            Ok(None) | Err(_) => break,
        };
        if sasl_phase {
            if (sasl::FrameCodec {}).decode(&mut frame).is_err() {
                break;
            }
        } else {
            match (FrameDecoder {}).decode(&mut frame) {
                Ok(Some(decoded)) => {
                    read_frame(decoded.channel(), decoded.into_body(), &mut deliveries)
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
    }
    // Whatever the check refused stays refused, and nothing of it was released.
    if fed.is_err() {
        assert!(check.feed(b"", &mut Vec::new()).is_err());
    }
}
