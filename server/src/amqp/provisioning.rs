//! Device provisioning over AMQP (DPS-1), as the Node provisioning transport speaks it.
//!
//! - Credentials: SASL PLAIN with user `{idScope}/registrations/{registrationId}` and a SAS
//!   token as password (accepted at SASL, checked per request, as over MQTT), or no SASL at all
//!   and the TLS client certificate.
//! - Links: the client attaches a receiver and a sender to
//!   `{idScope}/registrations/{registrationId}` (or `amqps://{host}/...`). Requests carry the
//!   application property `iotdps-operation-type` (`iotdps-register`, body a data section of
//!   `{"registrationId","payload"}`; `iotdps-get-operationstatus` with `iotdps-operation-id`)
//!   and a `correlation-id`. Each answer is a data section of the operation's JSON (or DPS's
//!   error body with `status: "failed"`, since the client reads nothing but the JSON), with
//!   the same correlation id and `retry-after` as an application property.

use std::sync::Arc;

use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Data, Message, MessageId, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue, Value};
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use serde_json::json;

use super::replies::{application_property, Replies, Reply};
use crate::hub::provisioning::{
    parse_register_body, status_json, Credential, DpsFailure, Operation, OperationState,
    RegisterRequest, RETRY_AFTER_SECS,
};
use crate::hub::HubContext;

/// One connection's provisioning credential: the SASL PLAIN token, else the client chain.
#[derive(Clone, Default)]
pub struct DeviceCredential(Arc<Mutex<Option<Credential>>>);

impl DeviceCredential {
    pub fn set_token(&self, token: &str) {
        *self.0.lock() = Some(Credential::Sas(token.to_string()));
    }

    pub fn set_chain_unless_token(&self, chain: &[CertificateDer<'static>]) {
        let mut current = self.0.lock();
        if current.is_none() && !chain.is_empty() {
            *current = Some(Credential::Certificate(chain.to_vec()));
        }
    }

    fn get(&self) -> Option<Credential> {
        self.0.lock().clone()
    }
}

/// Whether a SASL PLAIN user is a provisioning registration's.
pub fn is_registration_user(user: &str) -> bool {
    let parts: Vec<&str> = user.split('/').collect();
    matches!(parts.as_slice(), [scope, literal, rid] if !scope.is_empty() && *literal == "registrations" && !rid.is_empty())
}

/// Serves the client's request link of one registration until it detaches.
pub async fn serve_requests(
    mut link: Receiver,
    replies: Replies,
    ctx: HubContext,
    credential: DeviceCredential,
    id_scope: String,
    registration_id: String,
    source: std::net::IpAddr,
) {
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "provisioning request link ended");
                break;
            }
        };
        let request = delivery.message();
        let correlation = request
            .properties
            .as_ref()
            .and_then(|p| p.correlation_id.clone());
        let result = answer(
            request,
            &ctx,
            &credential,
            &id_scope,
            &registration_id,
            source,
        )
        .await;
        if link.accept(&delivery).await.is_err() {
            break;
        }
        replies.send(reply(correlation, result, &ctx)).await;
    }
    let _ = link.close().await;
}

fn body_text(message: &Message<Body<Value>>) -> Option<Vec<u8>> {
    match &message.body {
        Body::Data(sections) => Some(sections.iter().flat_map(|d| d.0.to_vec()).collect()),
        Body::Value(v) => match &v.0 {
            Value::String(s) => Some(s.clone().into_bytes()),
            Value::Null => Some(Vec::new()),
            _ => None,
        },
        Body::Empty => Some(Vec::new()),
        _ => None,
    }
}

async fn answer(
    message: &Message<Body<Value>>,
    ctx: &HubContext,
    credential: &DeviceCredential,
    id_scope: &str,
    registration_id: &str,
    source: std::net::IpAddr,
) -> Result<Operation, DpsFailure> {
    let credential = credential.get().ok_or_else(|| {
        DpsFailure::Unauthorized("no SAS token (SASL PLAIN) and no client certificate".into())
    })?;
    let request = |payload| RegisterRequest {
        id_scope: id_scope.to_string(),
        registration_id: registration_id.to_string(),
        credential: credential.clone(),
        payload,
        source,
    };
    match application_property(message, "iotdps-operation-type") {
        Some("iotdps-register") => {
            let body = body_text(message).ok_or_else(|| {
                DpsFailure::BadRequest("the register body is not JSON text".into())
            })?;
            let payload = parse_register_body(&body, registration_id)?;
            ctx.provisioning.register(&ctx, request(payload)).await
        }
        Some("iotdps-get-operationstatus") => {
            let op = application_property(message, "iotdps-operation-id").ok_or_else(|| {
                DpsFailure::BadRequest("the request has no iotdps-operation-id".into())
            })?;
            ctx.provisioning.operation_status(request(None), op).await
        }
        other => Err(DpsFailure::BadRequest(format!(
            "iotdps-operation-type {other:?} is not iotdps-register or iotdps-get-operationstatus"
        ))),
    }
}

fn reply(
    correlation: Option<MessageId>,
    result: Result<Operation, DpsFailure>,
    ctx: &HubContext,
) -> Reply {
    let (status, body) = match &result {
        Ok(op) => {
            let status = match op.state {
                OperationState::Assigning => "assigning",
                OperationState::Assigned(_) => "assigned",
                OperationState::Disabled => "disabled",
                OperationState::Failed { .. } => "failed",
            };
            (status, status_json::operation(op))
        }
        Err(f) => {
            let mut body = status_json::failure(f, ctx.clock.now());
            body["status"] = json!("failed");
            ("failed", body)
        }
    };
    let mut properties = ApplicationProperties::default();
    let retry_after = match &result {
        Err(f) => f.retry_after_secs().unwrap_or(RETRY_AFTER_SECS),
        Ok(_) => RETRY_AFTER_SECS,
    };
    properties.0.insert(
        "retry-after".into(),
        SimpleValue::String(retry_after.to_string()),
    );
    properties
        .0
        .insert("iotdps-status".into(), SimpleValue::String(status.into()));
    if let Ok(op) = &result {
        properties.0.insert(
            "iotdps-operation-id".into(),
            SimpleValue::String(op.operation_id.clone()),
        );
    }
    Message::builder()
        .properties(Properties {
            correlation_id: correlation,
            content_type: Some("application/json".into()),
            ..Default::default()
        })
        .application_properties(properties)
        .body(Body::Data(
            vec![Data(Binary::from(
                status_json::to_ascii_json(&body).into_bytes(),
            ))]
            .into(),
        ))
        .build()
}
