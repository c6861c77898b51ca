//! Device provisioning over MQTT (DPS-1): a connection whose user name is
//! `{idScope}/registrations/{registrationId}/api-version=...` talks to the provisioning
//! service, not the hub.
//!
//! - CONNECT: client id = registration id; the password is a SAS token, or there is none and
//!   the TLS client certificate is the credential. As DPS does, the CONNECT is accepted and a
//!   wrong credential is answered per request, `401` on the response topic.
//! - `$dps/registrations/PUT/iotdps-register/?$rid={rid}` registers (body
//!   `{"registrationId", "payload"}`); `$dps/registrations/GET/iotdps-get-operationstatus/
//!   ?$rid={rid}&operationId={op}` polls. Each is answered on
//!   `$dps/registrations/res/{status}/?$rid={rid}[&retry-after={s}]` at QoS 0, with a JSON body
//!   that is ASCII only.
//!
//! # Invariants
//! - Nothing of the hub's device session exists here: no identity, no connection state, no
//!   routing. The connection ends on DISCONNECT, on a keep-alive lapse, or on a malformed packet.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use mqtt::control::{ConnectReturnCode, ProtocolLevel};
use mqtt::packet::suback::SubscribeReturnCode;
use mqtt::packet::*;
use mqtt::{QualityOfService, TopicName};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

use super::codec::MqttCodec;
use crate::hub::provisioning::{
    parse_register_body, status_json, Credential, DpsFailure, Operation, OperationState,
    RegisterRequest, RETRY_AFTER_SECS,
};
use crate::hub::HubContext;

const RESPONSE_FILTER: &str = "$dps/registrations/res/#";
const REGISTER_PREFIX: &str = "$dps/registrations/PUT/iotdps-register/";
const POLL_PREFIX: &str = "$dps/registrations/GET/iotdps-get-operationstatus/";

/// `(idScope, registrationId)` when the user name is a provisioning one.
pub fn provisioning_user(username: Option<&str>) -> Option<(String, String)> {
    let path = username?.split('?').next()?;
    let mut parts = path.splitn(4, '/');
    let (scope, literal, rid) = (parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next()?;
    (literal == "registrations"
        && !scope.is_empty()
        && !rid.is_empty()
        && rest.starts_with("api-version="))
    .then(|| (scope.to_string(), rid.to_string()))
}

/// The query parameters of a topic's `?...` part, percent-decoded.
fn topic_params(topic: &str) -> Vec<(String, String)> {
    let Some((_, query)) = topic.split_once('?') else {
        return Vec::new();
    };
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| {
            let d = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (d(k), d(v))
        })
        .collect()
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Where a provisioning connection comes from: its address, transport name and TLS client
/// certificate chain (leaf first, empty when none).
pub struct Peer {
    pub addr: std::net::SocketAddr,
    pub transport: &'static str,
    pub client_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
}

/// Serves a provisioning connection from its CONNECT to its end.
pub async fn serve<IO>(
    mut framed: Framed<IO, MqttCodec>,
    connect: ConnectPacket,
    peer: Peer,
    ctx: HubContext,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let Some((id_scope, registration_id)) = provisioning_user(connect.user_name()) else {
        return;
    };
    let refusal = if connect.protocol_level() != ProtocolLevel::Version311 {
        Some(ConnectReturnCode::UnacceptableProtocolVersion)
    } else if connect.client_identifier() != registration_id {
        Some(ConnectReturnCode::IdentifierRejected)
    } else {
        None
    };
    if let Some(code) = refusal {
        tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), ?code, "provisioning CONNECT refused");
        let _ = framed.send(ConnackPacket::new(false, code)).await;
        return;
    }
    let credential = match connect.password() {
        Some(p) => Credential::Sas(p.to_string()),
        None => Credential::Certificate(peer.client_chain),
    };
    if framed
        .send(ConnackPacket::new(
            false,
            ConnectReturnCode::ConnectionAccepted,
        ))
        .await
        .is_err()
    {
        return;
    }
    metrics::counter!("ferrohub_provisioning_connections_total", "transport" => peer.transport)
        .increment(1);
    let keep_alive = match connect.keep_alive() {
        0 => Duration::from_secs(1767),
        s => Duration::from_millis(u64::from(s) * 1500),
    };
    let session = Session {
        ctx,
        id_scope,
        registration_id,
        credential,
        source: peer.addr.ip(),
    };
    loop {
        let packet = match tokio::time::timeout(keep_alive, framed.next()).await {
            Ok(Some(Ok(p))) => p,
            Ok(Some(Err(e))) => {
                tracing::debug!(peer = %peer.addr, error = %e, "malformed packet on a provisioning connection");
                return;
            }
            Ok(None) | Err(_) => return,
        };
        let replies = match packet {
            VariablePacket::SubscribePacket(p) => {
                let codes = p
                    .subscribes()
                    .iter()
                    .map(|(filter, qos)| {
                        if filter.to_string() == RESPONSE_FILTER {
                            SubscribeReturnCode::from(*qos.min(&QualityOfService::Level1))
                        } else {
                            SubscribeReturnCode::Failure
                        }
                    })
                    .collect();
                vec![SubackPacket::new(p.packet_identifier(), codes).into()]
            }
            VariablePacket::UnsubscribePacket(p) => {
                vec![UnsubackPacket::new(p.packet_identifier()).into()]
            }
            VariablePacket::PingreqPacket(_) => vec![PingrespPacket::new().into()],
            VariablePacket::DisconnectPacket(_) => return,
            VariablePacket::PublishPacket(p) => {
                let mut out: Vec<VariablePacket> = Vec::with_capacity(2);
                match p.qos() {
                    QoSWithPacketIdentifier::Level0 => {}
                    QoSWithPacketIdentifier::Level1(id) => out.push(PubackPacket::new(id).into()),
                    QoSWithPacketIdentifier::Level2(_) => return,
                }
                if let Some(answer) = session.answer(p.topic_name(), p.payload()).await {
                    out.push(answer.into());
                }
                out
            }
            other => {
                tracing::debug!(peer = %peer.addr, packet = ?other, "unexpected packet on a provisioning connection");
                return;
            }
        };
        for reply in replies {
            if framed.feed(reply).await.is_err() {
                return;
            }
        }
        if SinkExt::<VariablePacket>::flush(&mut framed).await.is_err() {
            return;
        }
    }
}

struct Session {
    ctx: HubContext,
    id_scope: String,
    registration_id: String,
    credential: Credential,
    source: std::net::IpAddr,
}

impl Session {
    fn request(&self, payload: Option<Value>) -> RegisterRequest {
        RegisterRequest {
            id_scope: self.id_scope.clone(),
            registration_id: self.registration_id.clone(),
            credential: self.credential.clone(),
            payload,
            source: self.source,
        }
    }

    /// The response to a request published on `topic`; `None` for a topic that is not a
    /// provisioning request (ignored, as DPS does) or one without a `$rid`.
    async fn answer(&self, topic: &str, body: &[u8]) -> Option<PublishPacket> {
        let params = topic_params(topic);
        let rid = param(&params, "$rid")?.to_string();
        let result: Result<Operation, DpsFailure> = if topic.starts_with(REGISTER_PREFIX) {
            match parse_register_body(body, &self.registration_id) {
                Ok(payload) => {
                    self.ctx
                        .provisioning
                        .register(&self.ctx, self.request(payload))
                        .await
                }
                Err(e) => Err(e),
            }
        } else if topic.starts_with(POLL_PREFIX) {
            match param(&params, "operationId") {
                Some(op) => {
                    self.ctx
                        .provisioning
                        .operation_status(self.request(None), op)
                        .await
                }
                None => Err(DpsFailure::BadRequest(
                    "the operation status request has no operationId".into(),
                )),
            }
        } else {
            return None;
        };
        let (status, body, retry_after) = match result {
            Ok(op) => match op.state {
                OperationState::Assigning => {
                    (202, status_json::operation(&op), Some(RETRY_AFTER_SECS))
                }
                _ => (200, status_json::operation(&op), None),
            },
            Err(f) => (
                f.status_and_code().0,
                status_json::failure(&f, self.ctx.clock.now()),
                f.retry_after_secs(),
            ),
        };
        let mut topic = format!("$dps/registrations/res/{status}/?$rid={rid}");
        if let Some(secs) = retry_after {
            topic.push_str(&format!("&retry-after={secs}"));
        }
        let payload = status_json::to_ascii_json(&body).into_bytes();
        Some(PublishPacket::new(
            TopicName::new(topic).ok()?,
            QoSWithPacketIdentifier::Level0,
            payload,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provisioning_user_names_from_either_sdk() {
        let py = "0ne0001/registrations/dev-1/api-version=2019-03-31&ClientVersion=azure-iot-device-provisioning-py%2F2.14.0";
        assert_eq!(
            provisioning_user(Some(py)),
            Some(("0ne0001".into(), "dev-1".into()))
        );
        let node = "0ne0001/registrations/d/api-version=2019-03-31&ClientVersion=azure-iot-provisioning-device%2F1.9.1";
        assert!(provisioning_user(Some(node)).is_some());
        assert!(provisioning_user(Some("localhost/dev1/?api-version=2021-04-12")).is_none());
        assert!(provisioning_user(Some("localhost/registrations/?api-version=1")).is_none());
        assert!(provisioning_user(None).is_none());
    }

    #[test]
    fn topics_carry_rid_and_operation() {
        let p = topic_params(
            "$dps/registrations/GET/iotdps-get-operationstatus/?$rid=a%2Db&operationId=5.x.y",
        );
        assert_eq!(param(&p, "$rid"), Some("a-b"));
        assert_eq!(param(&p, "operationId"), Some("5.x.y"));
    }
}
