//! ferrohub protocol layer: a thin shell of transports and protocols around the engine.
//!
//! # Layers (each uses only the ones below it)
//! 1. [`node`] (and the binary, and [`offline`] over it): wires everything, owns start and
//!    shutdown.
//! 2. [`transport`]: sockets, TLS, HTTP, WebSocket; hands byte streams or requests to a protocol.
//! 3. Protocol adapters, [`mqtt`], [`rest`] and [`amqp`]: wire formats in, hub calls, wire
//!    formats out.
//! 4. [`hub`]: shared state (connections, outbound queues, method calls, C2D deadlines), the
//!    authenticator, the event router task, and the one seam to the engine.
//! 5. Pure building blocks: [`routing`], [`auth`], [`blob`], [`telemetry`], [`c2d_message`], [`x509`],
//!    [`clock`], [`ids`], [`latency`], [`config`], [`tls`].
//! 6. The engine (`ferrohub_engine`), reached only through [`hub::StoreHandle`].
//!
//! # Layout
//! - [`node`]: data-directory initialisation, serving, shutdown.
//! - [`offline`]: export, restore and backup of a stopped hub.
//! - [`config`]: the TOML configuration and its defaults.
//! - [`tls`]: the hub's CA and server certificate, rustls configuration.
//! - [`clock`]: the hub's wall clock (pausable in tests) and IoT Hub's time formats.
//! - [`ids`]: device, module, client and lock-token ids as types.
//! - [`latency`]: the per-message latency histograms, tallied per group of messages.
//! - [`transport`]: the accept loop, TLS, HTTPS (hyper + warp), MQTT over TLS and WebSocket.
//! - [`mqtt`]: the MQTT device endpoint (framing, topics, property bags, sessions).
//! - [`c2d_message`]: C2D messages on the wire (ack names, times, device properties).
//! - [`telemetry`]: device messages into stored events, with anti-spoofing stamps.
//! - [`x509`]: client certificate checks (thumbprints, registered CAs).
//! - [`rest`]: the IoT Hub service REST API.
//! - [`amqp`]: the AMQP 1.0 service endpoint (C2D sends, CBS).
//! - [`error_codes`]: IoT Hub's status, error name and number for each engine error (REST, MQTT).
//! - [`routing`]: routes, conditions, enrichments and event shapes (pure).
//! - [`auth`]: SAS tokens, scopes and permissions.
//! - [`blob`]: blob containers (local directories, Azure Blob Storage) and the upload account.
//! - [`hub`]: shared hub state, the authenticator and the async seam to the engine.
//! - [`cluster`]: cluster mode's NATS JetStream link: the commit log, the writer lease, the
//!   replica's apply loop and the shared TLS material.
//!
//! # What it is not
//! This crate never touches RocksDB: all state goes through `ferrohub_engine::Store`, reached
//! via [`hub::StoreHandle`].

pub mod amqp;
pub mod auth;
pub mod backup;
pub mod blob;
pub mod c2d_message;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod console;
pub mod control;
pub mod error_codes;
pub mod fuzz;
pub mod hub;
pub mod ids;
pub mod latency;
pub mod layout;
pub mod mqtt;
pub mod node;
pub mod offline;
pub mod rest;
pub mod routing;
pub mod telemetry;
pub mod tls;
pub mod transport;
pub mod x509;
