//! MQTT 3.1.1 framing for tokio-util 0.7: we cut complete frames ourselves (with a size cap
//! checked *before* buffering the body) and let `mqtt-protocol` decode each whole frame.
//!
//! Invariant: the decoder never buffers more than `max_packet` bytes of one packet, and every
//! decode error means a malformed packet (frames are always complete when decoded).

use std::io::Cursor;

use bytes::{BufMut, BytesMut};
use mqtt::packet::VariablePacket;
use mqtt::{Decodable, Encodable};
use tokio_util::codec::{Decoder, Encoder};

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("packet of {size} bytes exceeds the limit of {max}")]
    TooLarge { size: usize, max: usize },
    #[error("malformed remaining length")]
    BadLength,
    #[error("malformed packet: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub struct MqttCodec {
    max_packet: usize,
}

impl MqttCodec {
    pub fn new(max_packet: usize) -> Self {
        MqttCodec { max_packet }
    }
}

/// `(header length, remaining length)` once the fixed header is complete.
fn fixed_header(src: &[u8]) -> Result<Option<(usize, usize)>, CodecError> {
    let mut remaining = 0usize;
    for i in 0..4 {
        let Some(&b) = src.get(1 + i) else {
            return Ok(None);
        };
        remaining |= ((b & 0x7f) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((2 + i, remaining)));
        }
    }
    if src.len() > 4 {
        Err(CodecError::BadLength)
    } else {
        Ok(None)
    }
}

impl Decoder for MqttCodec {
    type Item = VariablePacket;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<VariablePacket>, CodecError> {
        let Some((header, remaining)) = fixed_header(src)? else {
            return Ok(None);
        };
        let total = header + remaining;
        if total > self.max_packet {
            return Err(CodecError::TooLarge {
                size: total,
                max: self.max_packet,
            });
        }
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        let frame = src.split_to(total);
        let packet = VariablePacket::decode(&mut Cursor::new(&frame[..]))
            .map_err(|e| CodecError::Malformed(format!("{e:?}")))?;
        Ok(Some(packet))
    }
}

impl<T: Encodable> Encoder<T> for MqttCodec {
    type Error = CodecError;

    fn encode(&mut self, item: T, dst: &mut BytesMut) -> Result<(), CodecError> {
        dst.reserve(item.encoded_length() as usize + 5);
        item.encode(&mut dst.writer())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mqtt::packet::{PingreqPacket, PublishPacket, QoSWithPacketIdentifier};
    use mqtt::TopicName;

    #[test]
    fn round_trip_and_partial_input() {
        let mut codec = MqttCodec::new(1024);
        let mut buf = BytesMut::new();
        let publish = PublishPacket::new(
            TopicName::new("devices/d/messages/events/").unwrap(),
            QoSWithPacketIdentifier::Level1(7),
            b"hi".to_vec(),
        );
        codec.encode(publish.clone(), &mut buf).unwrap();
        codec.encode(PingreqPacket::new(), &mut buf).unwrap();
        let whole = buf.clone();
        let mut partial = BytesMut::from(&whole[..5]);
        assert!(codec.decode(&mut partial).unwrap().is_none());
        let first = codec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(first, VariablePacket::PublishPacket(publish));
        assert!(matches!(
            codec.decode(&mut buf).unwrap(),
            Some(VariablePacket::PingreqPacket(_))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_packets_are_refused_before_buffering() {
        let mut codec = MqttCodec::new(100);
        // PUBLISH with a remaining length of 1,000,000 and no body yet.
        let mut buf = BytesMut::from(&[0x30u8, 0xC0, 0x84, 0x3D][..]);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::TooLarge { .. })
        ));
    }

    #[test]
    fn malformed_length_and_body() {
        let mut codec = MqttCodec::new(1 << 20);
        let mut buf = BytesMut::from(&[0x30u8, 0xff, 0xff, 0xff, 0xff, 0x01][..]);
        assert!(matches!(codec.decode(&mut buf), Err(CodecError::BadLength)));
        // SUBSCRIBE with QoS 3 requested.
        let mut buf = BytesMut::from(&[0x82u8, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x03][..]);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::Malformed(_))
        ));
    }
}
