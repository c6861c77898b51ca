//! Transports: each turns a socket into an authenticated-later byte stream plus [`PeerInfo`]
//! facts, and hands it to a protocol. The accept loop is shared.
//!
//! - [`accept`]: the accept loop, bounded by a semaphore taken before `accept`.
//! - [`https`]: TLS, then HTTP/1.1 (hyper) with a warp route table: the REST API, and the
//!   WebSocket upgrades of [`ws`].
//! - [`mqtt_tls`]: MQTT over TLS on 8883.
//! - [`mqtt_quic`]: MQTT over QUIC on UDP 14567, one bidirectional stream per connection.
//! - [`quic_tail_probe`]: a QUIC writer whose quiet periods end with a tail loss probe.
//! - [`amqp_tls`]: AMQP over TLS on 5671.
//! - [`ws`], [`ws_io`]: MQTT over WebSocket on 443, as a byte stream.
//!
//! Transports sit above the protocol adapters: they know which protocol a stream carries, the
//! protocols never know which transport carries them.
//!
//! [`PeerInfo`]: crate::mqtt::connection::PeerInfo

pub mod accept;
pub mod amqp_tls;
pub mod https;
pub mod lean_tls;
#[cfg(test)]
mod lean_tls_tests;
pub mod mqtt_quic;
pub mod mqtt_tls;
pub mod ops;
pub mod quic_tail_probe;
pub mod ws;
pub mod ws_io;
