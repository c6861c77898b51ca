//! Message routing (EVT-5, EVT-6): which endpoints a device message or a non-telemetry event
//! goes to, and the enrichments it gets there.
//!
//! Pure: it compiles and evaluates routes and shapes events, and reads nothing from storage.
//! The hub feeds it (stored configuration, endpoint slots, twins through
//! [`view::TwinSource`]) from behind its store seam.
//!
//! # Layout
//! - [`query`]: the IoT Hub routing query language (conditions).
//! - [`table`]: the stored configuration compiled for evaluation, swapped atomically on change.
//! - [`view`]: what a condition sees of a stored event (properties, JSON body, twin).
//! - [`events`]: the engine's notification records shaped as seed 004's non-telemetry events.
//!
//! # Invariants
//! - Routing happens before the append, and the append of every copy is one atomic batch:
//!   a message acknowledged to a device is in every endpoint its routes name, or in none.
//! - Route changes replace the whole compiled table at once; a message is routed by exactly
//!   one version of the table.

pub mod events;
pub mod query;
pub mod table;
pub mod view;

pub use table::{RouteError, Router};
