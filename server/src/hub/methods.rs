//! Direct method calls in flight (MTH-1, MTH-2): the REST caller waits on a one-shot channel
//! keyed by the connection's client id and the request id it sent; the device's answer
//! completes it. An answer with an unknown or late request id finds nothing and is dropped.
//!
//! Invariant: an entry exists only while its caller waits; the caller removes it on timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::connections::{Connections, MethodRequestOut, Outbound};
use crate::ids::ClientId;

/// A device's answer: its status code and raw payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodAnswer {
    pub status: i32,
    pub payload: Vec<u8>,
}

#[derive(Default)]
pub struct PendingCalls {
    waiting: Mutex<HashMap<(ClientId, String), oneshot::Sender<MethodAnswer>>>,
    next_rid: AtomicU64,
}

impl PendingCalls {
    /// Registers a call to `client_id`; returns its request id and the answer's receiver.
    pub fn start(&self, client_id: &ClientId) -> (String, oneshot::Receiver<MethodAnswer>) {
        let rid = self.next_rid.fetch_add(1, Ordering::Relaxed).to_string();
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .insert((client_id.clone(), rid.clone()), tx);
        (rid, rx)
    }

    /// Delivers a device's answer; false if no caller waits for it (unknown or late).
    pub fn complete(&self, client_id: &ClientId, rid: &str, answer: MethodAnswer) -> bool {
        match self
            .waiting
            .lock()
            .remove(&(client_id.clone(), rid.to_string()))
        {
            Some(tx) => tx.send(answer).is_ok(),
            None => false,
        }
    }

    /// Forgets a call whose caller stopped waiting.
    pub fn abandon(&self, client_id: &ClientId, rid: &str) {
        self.waiting
            .lock()
            .remove(&(client_id.clone(), rid.to_string()));
    }
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

/// Hands a method call to a connection of this node (its outbound queue `target`) and waits
/// up to `response_timeout` for the device's answer.
///
/// # Errors
/// [`CallFailure::Disconnected`] when the connection went first, [`CallFailure::Timeout`].
pub async fn call_connection(
    connections: &Connections,
    methods: &PendingCalls,
    client_id: &ClientId,
    target: mpsc::Sender<Outbound>,
    method: String,
    payload: Vec<u8>,
    response_timeout: Duration,
) -> Result<MethodAnswer, CallFailure> {
    let (rid, answer) = methods.start(client_id);
    let sent = target
        .send(Outbound::MethodRequest(Box::new(MethodRequestOut {
            rid: rid.clone(),
            method,
            payload,
        })))
        .await;
    connections.note_depth(&target);
    metrics::counter!("ferrohub_method_calls_total").increment(1);
    if sent.is_err() {
        methods.abandon(client_id, &rid);
        return Err(CallFailure::Disconnected);
    }
    match tokio::time::timeout(response_timeout, answer).await {
        Ok(Ok(a)) => Ok(a),
        _ => {
            methods.abandon(client_id, &rid);
            Err(CallFailure::Timeout)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_reach_only_their_caller() {
        let p = PendingCalls::default();
        let (d, other) = (ClientId::new("d"), ClientId::new("other"));
        let (rid, mut rx) = p.start(&d);
        assert!(!p.complete(
            &other,
            &rid,
            MethodAnswer {
                status: 200,
                payload: vec![]
            }
        ));
        assert!(!p.complete(
            &d,
            "nope",
            MethodAnswer {
                status: 200,
                payload: vec![]
            }
        ));
        assert!(p.complete(
            &d,
            &rid,
            MethodAnswer {
                status: 201,
                payload: b"1".to_vec()
            }
        ));
        assert_eq!(rx.try_recv().unwrap().status, 201);
        assert!(
            !p.complete(
                &d,
                &rid,
                MethodAnswer {
                    status: 200,
                    payload: vec![]
                }
            ),
            "late answers are dropped"
        );
        let (rid2, _rx2) = p.start(&d);
        p.abandon(&d, &rid2);
        assert!(!p.complete(
            &d,
            &rid2,
            MethodAnswer {
                status: 200,
                payload: vec![]
            }
        ));
    }
}
