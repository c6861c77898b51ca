//! ferrohub protocol layer: a thin shell of transports and protocols around the engine.
//!
//! # Layout
//! - [`node`]: data-directory initialisation, serving, shutdown.
//! - [`config`]: the TOML configuration and its defaults.
//! - [`tls`]: the hub's CA and server certificate, rustls configuration.
//! - [`https`]: the HTTPS listener (TLS accept, hyper, warp routes).
//! - [`transport`]: the shared accept loop, MQTT over TLS, WebSocket as a byte stream.
//! - [`mqtt`]: the MQTT device endpoint (framing, topics, property bags, sessions).
//! - [`c2d_message`]: C2D messages on the wire (ack names, times, device properties).
//! - [`telemetry`]: device messages into stored events, with anti-spoofing stamps.
//! - [`x509`]: client certificate checks (thumbprints, registered CAs).
//! - [`rest`]: the IoT Hub service REST API.
//! - [`error_codes`]: IoT Hub's status, error name and number for each engine error (REST, MQTT).
//! - [`routing`]: routes, conditions, enrichments and non-telemetry events.
//! - [`auth`]: SAS tokens, scopes and permissions.
//! - [`hub`]: the async seam to the engine.
//!
//! # What it is not
//! This crate never touches RocksDB: all state goes through `ferrohub_engine::Store`, reached
//! via [`hub::StoreHandle`].

pub mod auth;
pub mod c2d_message;
pub mod config;
pub mod error_codes;
pub mod https;
pub mod hub;
pub mod mqtt;
pub mod node;
pub mod rest;
pub mod routing;
pub mod telemetry;
pub mod tls;
pub mod transport;
pub mod x509;
