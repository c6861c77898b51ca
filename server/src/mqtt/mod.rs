//! The MQTT 3.1.1 device endpoint: framing ([`codec`]), the topic grammar ([`topics`]),
//! property bags ([`property_bag`]), CONNECT authentication ([`authenticate`]) and the
//! per-connection state machine ([`connection`]), with C2D delivery in [`c2d`] and what a
//! connection records when it opens and ends in [`lifecycle`]; device provisioning
//! connections in [`provisioning`]. `mqtt-protocol` types stay inside this module.

mod answers;
pub mod authenticate;
mod burst;
pub mod c2d;
pub mod codec;
pub mod connection;
mod lifecycle;
pub mod property_bag;
pub mod provisioning;
mod stop_signal;
pub mod topics;
pub mod twin;
