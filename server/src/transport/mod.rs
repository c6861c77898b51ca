//! Transports: each turns a socket into an authenticated-later byte stream plus [`PeerInfo`]
//! facts, and hands it to a protocol. The accept loop is shared.
//!
//! [`PeerInfo`]: crate::mqtt::connection::PeerInfo

pub mod accept;
pub mod mqtt_tls;
pub mod ws_io;
