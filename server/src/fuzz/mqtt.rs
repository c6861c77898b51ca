//! MQTT bytes as a connection reads them: cut into frames, decoded, and each packet's strings
//! read as the connection reads them.

use bytes::BytesMut;
use mqtt::packet::VariablePacket;
use tokio_util::codec::Decoder;

use super::HOST;
use crate::auth::sas::SasToken;
use crate::ids::Identity;
use crate::mqtt::authenticate::{check_username, parse_client_id};
use crate::mqtt::codec::MqttCodec;
use crate::mqtt::property_bag;
use crate::mqtt::topics::{parse_filter, parse_publish, Inbound};

/// The packet limit the targets use: small, so size checks are reached often.
const MAX_PACKET: usize = 4096;

/// What the connection does with one packet's fields.
fn read_fields(packet: &VariablePacket, me: &Identity) {
    match packet {
        VariablePacket::ConnectPacket(connect) => {
            if let Ok(who) = parse_client_id(connect.client_identifier()) {
                let _ = check_username(connect.user_name(), HOST, &who);
            }
            if let Some(password) = connect.password() {
                let _ = SasToken::parse(password);
            }
        }
        VariablePacket::PublishPacket(publish) => {
            if let Ok(Inbound::Telemetry { bag }) = parse_publish(publish.topic_name(), me) {
                let _ = property_bag::parse(bag);
            }
        }
        VariablePacket::SubscribePacket(subscribe) => {
            for (filter, _qos) in subscribe.subscribes() {
                let _ = parse_filter(filter.as_ref(), me);
            }
        }
        _ => {}
    }
}

/// The first byte sets the size of the reads the bytes after it arrive in (1 to 16 bytes,
/// like a slow TCP stream); every complete frame is decoded and read.
pub fn mqtt_stream(data: &[u8]) {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(first % 16) + 1;
    let me = Identity::for_module("dev-1", "mod-1");
    let mut codec = MqttCodec::new(MAX_PACKET);
    let mut buffer = BytesMut::new();
    for chunk in stream.chunks(piece) {
        buffer.extend_from_slice(chunk);
        loop {
            match codec.decode(&mut buffer) {
                Ok(Some(packet)) => read_fields(&packet, &me),
                Ok(None) => break,
                Err(_) => return,
            }
        }
        // The codec's promise: never more than one packet's limit waiting.
        assert!(
            buffer.len() < MAX_PACKET.max(5),
            "{} bytes buffered",
            buffer.len()
        );
    }
}
