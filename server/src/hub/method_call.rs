//! Calling a direct method on a connected device or module (MTH-1, MTH-2): the one path REST
//! calls and scheduled method jobs share.
//!
//! # Invariants
//! - A device that is not connected, or not subscribed to methods, is waited for up to the
//!   connect timeout; the request goes out once, and an answer after the response timeout is
//!   dropped (its pending entry is removed).
//! - The identity's existence is the caller's check: this layer only knows connections.

use std::time::Duration;

use super::connections::{MethodRequestOut, Outbound};
use super::methods::MethodAnswer;
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

/// Why a call got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure {
    /// Not connected (or not subscribed to methods) within the connect timeout.
    NotOnline,
    /// Connected, but gone before the request could be handed over.
    Disconnected,
    /// No answer within the response timeout.
    Timeout,
}

impl CallFailure {
    /// IoT Hub's error number, name and message for the failure.
    pub fn iot_hub_error(self) -> (u32, &'static str, &'static str) {
        match self {
            CallFailure::NotOnline => (
                404103,
                "DeviceNotOnline",
                "Timed out waiting for device to connect.",
            ),
            CallFailure::Disconnected => (404103, "DeviceNotOnline", "The device disconnected."),
            CallFailure::Timeout => (
                504101,
                "GatewayTimeout",
                "Timed out waiting for the response from device.",
            ),
        }
    }
}

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
        let target = loop {
            if let Some(tx) = self.connections.method_target(&client_id) {
                break tx;
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(CallFailure::NotOnline);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (rid, answer) = self.methods.start(&client_id);
        let sent = target
            .send(Outbound::MethodRequest(Box::new(MethodRequestOut {
                rid: rid.clone(),
                method: request.method,
                payload: request.payload,
            })))
            .await;
        self.connections.note_depth(&target);
        metrics::counter!("ferrohub_method_calls_total").increment(1);
        if sent.is_err() {
            self.methods.abandon(&client_id, &rid);
            return Err(CallFailure::Disconnected);
        }
        match tokio::time::timeout(request.response_timeout, answer).await {
            Ok(Ok(a)) => Ok(a),
            _ => {
                self.methods.abandon(&client_id, &rid);
                Err(CallFailure::Timeout)
            }
        }
    }
}
