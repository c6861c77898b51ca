//! The `$cbs` node: claims-based security (`compat` §B5). The client sends put-token requests
//! on its sender link to `$cbs`; each is answered on the client's receiver link from `$cbs`,
//! with `correlation-id` = the request's message id and application properties `status-code`
//! (an AMQP int: 200, 400, 401 or 500) and `status-description`.
//!
//! A token the authenticator accepts becomes the connection's claim, replacing the previous
//! one (renewal on the same link). What the claim allows is checked where a link is used.

use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::link::{Receiver, Sender};
use fe2o3_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message, Properties};
use fe2o3_amqp::types::primitives::{OrderedMap, SimpleValue, Value};
use tokio::sync::{mpsc, watch};

use super::claims::Claims;
use crate::hub::{AuthFailure, HubContext};

/// Replies waiting for the client's receiver link; bounded, since a client that never reads
/// them must not grow the hub's memory.
const REPLY_QUEUE: usize = 16;

type Reply = Message<Body<Value>>;

/// How long an answer waits for the client's receiver link from `$cbs`: a client may send its
/// first put-token before the hub has processed that link's attach.
const REPLY_LINK_WAIT: Duration = Duration::from_secs(10);

/// Where one session's `$cbs` replies go: the client's receiver link, once it is attached.
#[derive(Clone)]
pub struct CbsReplies(Arc<watch::Sender<Option<mpsc::Sender<Reply>>>>);

impl Default for CbsReplies {
    fn default() -> Self {
        CbsReplies(Arc::new(watch::channel(None).0))
    }
}

impl CbsReplies {
    /// Serves the client's receiver link from `$cbs`: sends each reply as it comes.
    pub fn attach(&self, mut link: Sender) -> tokio::task::JoinHandle<()> {
        let (tx, mut rx) = mpsc::channel(REPLY_QUEUE);
        self.0.send_replace(Some(tx));
        tokio::spawn(async move {
            while let Some(reply) = rx.recv().await {
                if let Err(e) = link.send(reply).await {
                    tracing::debug!(error = %e, "$cbs reply not delivered");
                    break;
                }
            }
            let _ = link.close().await;
        })
    }

    async fn send(&self, reply: Reply) {
        let mut link = self.0.subscribe();
        let tx = match tokio::time::timeout(REPLY_LINK_WAIT, link.wait_for(Option::is_some)).await {
            Ok(Ok(tx)) => tx.clone(),
            _ => None,
        };
        match tx {
            Some(tx) => {
                let _ = tx.send(reply).await;
            }
            None => tracing::debug!("$cbs reply dropped: no receiver link from $cbs"),
        }
    }
}

/// Serves the client's sender link to `$cbs` until it closes.
pub async fn serve_requests(
    mut link: Receiver,
    replies: CbsReplies,
    ctx: HubContext,
    claims: Claims,
) {
    loop {
        let delivery = match link.recv::<Body<Value>>().await {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(error = %e, "$cbs request link ended");
                break;
            }
        };
        let request = delivery.message();
        let (status, description) = put_token(request, &ctx, &claims).await;
        let correlation_id = request
            .properties
            .as_ref()
            .and_then(|p| p.message_id.clone());
        if link.accept(&delivery).await.is_err() {
            break;
        }
        replies
            .send(reply(correlation_id, status, &description))
            .await;
    }
    let _ = link.close().await;
}

fn application_property<'a>(message: &'a Message<Body<Value>>, name: &str) -> Option<&'a str> {
    match message.application_properties.as_ref()?.0.get(name)? {
        SimpleValue::String(s) => Some(s),
        SimpleValue::Symbol(s) => Some(&s.0),
        _ => None,
    }
}

/// Checks one put-token request and records its claim; the status and description to answer.
async fn put_token(
    request: &Message<Body<Value>>,
    ctx: &HubContext,
    claims: &Claims,
) -> (i32, String) {
    if application_property(request, "operation") != Some("put-token") {
        return (
            400,
            "the $cbs node supports the put-token operation only".into(),
        );
    }
    match application_property(request, "type") {
        Some("servicebus.windows.net:sastoken" | "azure-devices.net:sastoken") => {}
        other => {
            return (
                400,
                format!(
                    "token type {other:?} is not supported; use servicebus.windows.net:sastoken"
                ),
            )
        }
    }
    let token = match &request.body {
        Body::Value(AmqpValue(Value::String(s))) => s.clone(),
        Body::Data(sections) if sections.len() == 1 => {
            String::from_utf8_lossy(&sections[0].0).into_owned()
        }
        _ => return (400, "the put-token body is not a string".into()),
    };
    match ctx.auth.service_claim(&token).await {
        Ok(claim) => {
            claims.set(claim);
            (200, "OK".into())
        }
        Err(AuthFailure::Refused(reason)) => {
            tracing::debug!(%reason, "$cbs put-token refused");
            (401, reason.to_string())
        }
        Err(AuthFailure::Unavailable(e)) => (500, e.to_string()),
    }
}

fn reply(
    correlation_id: Option<fe2o3_amqp::types::messaging::MessageId>,
    status: i32,
    description: &str,
) -> Reply {
    let mut application = OrderedMap::new();
    // An AMQP int: the Python SDK does not recognise a long here (`compat` §B5).
    application.insert("status-code".to_string(), SimpleValue::Int(status));
    application.insert(
        "status-description".to_string(),
        SimpleValue::String(description.to_string()),
    );
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            correlation_id,
            ..Default::default()
        }),
        application_properties: Some(ApplicationProperties(application)),
        body: Body::Value(AmqpValue(Value::Null)),
        footer: None,
    }
}
