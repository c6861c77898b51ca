//! The AMQP 1.0 service endpoint (AMQ-1..AMQ-4): what the official service SDKs use to send
//! cloud-to-device messages and read feedback (`compat` §B5), and the Event Hubs-compatible
//! endpoint Event Hubs clients read device-to-cloud events from.
//!
//! The AMQP framing, SASL exchange and link state machines are `fe2o3-amqp`'s; this adapter
//! decides what each link means and maps messages to the hub and back. It reaches the engine
//! only through [`HubContext`], like the MQTT and REST adapters.
//!
//! # Layout
//! - [`connection`]: one connection: SASL, sessions, and which link serves which address.
//! - `header`: SASL or plain AMQP, from the client's protocol header.
//! - [`frame_guard`]: incoming frames, and whole deliveries, checked before the decoder reads them.
//! - [`value_check`]: the structural check of AMQP-encoded values that `frame_guard` applies.
//! - `full_fields`: outgoing performatives written with all their fields (for `pyamqp`).
//! - `sasl`: the mechanisms offered (`MSSBCBS`, `PLAIN`, `ANONYMOUS`).
//! - `claims`: what the connection is authorised for, and until when.
//! - `replies`: request/reply nodes' reply links and reply messages.
//! - `cbs`: the `$cbs` node (put-token requests).
//! - `management`: the `$management` node (entity and partition properties).
//! - `entity`: Event Hubs entity names to endpoints, partitions and consumer groups.
//! - `partition_link`: Event Hubs receivers on `{entity}/ConsumerGroups/{g}/Partitions/{p}`.
//! - `selector`: a receiver's starting position from its selector filter.
//! - `event_message`: stored D2C events as Event Hubs delivers them.
//! - `c2d_send`: sender links to `/messages/devicebound`.
//! - `feedback`: receiver links on `/messages/serviceBound/feedback` (and, delivering nothing
//!   until file uploads exist, `/messages/serviceBound/filenotifications`).
//! - `message`: AMQP messages to the hub's C2D message and feedback to AMQP.
//! - `errors`: AMQP error conditions for hub failures.
//!
//! # Invariants
//! - Every link but `$cbs` is served only while the connection holds a claim (a CBS token, or
//!   SASL PLAIN credentials) that has not expired and carries the permission the address needs
//!   (ServiceConnect); otherwise the link is detached with `amqp:unauthorized-access`.
//!   `$management` requests may instead carry their own token (`security_token`).
//! - A C2D message is `accepted` only after it is durable; a refused one is `rejected` with an
//!   `amqp:*` condition and nothing is stored.
//! - Every receiving link works through its credit one delivery at a time, so a client cannot
//!   make the hub buffer more than a link's credit per link.
//!
//! [`HubContext`]: crate::hub::HubContext

pub(crate) mod address;
mod c2d_send;
mod cbs;
mod claims;
pub mod connection;
pub(crate) mod device;
mod entity;
mod errors;
mod event_message;
mod feedback;
pub mod frame_guard;
mod full_fields;
mod header;
mod management;
pub(crate) mod message;
mod partition_link;
mod provisioning;
mod replies;
mod sasl;
pub(crate) mod selector;
pub mod value_check;

pub use connection::serve;
