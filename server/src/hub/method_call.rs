//! Calling a direct method on a connected device or module (MTH-1, MTH-2): the one path REST
//! calls and scheduled method jobs share.
//!
//! # Invariants
//! - A device that is not connected, or not subscribed to methods, is waited for up to the
//!   connect timeout; the request goes out once, and an answer after the response timeout is
//!   dropped (its pending entry is removed).
//! - The identity's existence is the caller's check: this layer only knows connections.

use std::time::Duration;

use super::methods::{call_connection, MethodAnswer};
use super::HubContext;
use crate::ids::Identity;

/// A method call to make.
#[derive(Debug, Clone)]
pub struct MethodRequest {
    pub method: String,
    /// The JSON payload, serialized.
    pub payload: Vec<u8>,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
}

pub use super::methods::CallFailure;

impl HubContext {
    /// Calls a method on `who` and waits for its answer.
    ///
    /// # Errors
    /// [`CallFailure`] when the device is not online in time, leaves, or does not answer.
    pub async fn call_method(
        &self,
        who: &Identity,
        request: MethodRequest,
    ) -> Result<MethodAnswer, CallFailure> {
        let client_id = who.client_id();
        let deadline = tokio::time::Instant::now() + request.connect_timeout;
        loop {
            if let Some(target) = self.connections.method_target(&client_id) {
                return call_connection(
                    &self.connections,
                    &self.methods,
                    &client_id,
                    target,
                    request.method,
                    request.payload,
                    request.response_timeout,
                )
                .await;
            }
            // In a cluster the connection may be on another node.
            if let Some(live) = &self.live {
                let (method, payload) = (&request.method, &request.payload);
                if let Some(done) = live
                    .call_elsewhere(who, method, payload, request.response_timeout)
                    .await
                {
                    metrics::counter!("ferrohub_method_calls_total").increment(1);
                    return done;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(CallFailure::NotOnline);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
