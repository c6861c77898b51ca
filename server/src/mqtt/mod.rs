//! The MQTT 3.1.1 device endpoint: framing ([`codec`]), the topic grammar ([`topics`]),
//! property bags ([`property_bag`]), CONNECT authentication ([`authenticate`]) and the
//! per-connection state machine ([`connection`]). `mqtt-protocol` types stay inside this module.

pub mod authenticate;
pub mod codec;
pub mod connection;
pub mod property_bag;
pub mod topics;
pub mod twin;
