//! Request/reply nodes (`$cbs`, `$management`): the client sends requests on its sender link
//! to the node and reads each reply on its receiver link from the same node in the same
//! session, matched by `correlation-id` = the request's `message-id`. Replies carry the status
//! as application properties `status-code` (an AMQP int) and `status-description`.

use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::link::Sender;
use fe2o3_amqp::types::messaging::{
    AmqpValue, ApplicationProperties, Body, Message, MessageId, Properties,
};
use fe2o3_amqp::types::primitives::{OrderedMap, SimpleValue, Value};
use tokio::sync::{mpsc, watch};

/// Replies waiting for the client's receiver link; bounded, since a client that never reads
/// them must not grow the hub's memory.
const REPLY_QUEUE: usize = 16;

/// How long an answer waits for the client's receiver link: a client may send its first
/// request before the hub has processed that link's attach.
const REPLY_LINK_WAIT: Duration = Duration::from_secs(10);

pub type Reply = Message<Body<Value>>;

/// Where one session's replies from one node go: the client's receiver link, once attached.
#[derive(Clone)]
pub struct Replies(Arc<watch::Sender<Option<mpsc::Sender<Reply>>>>);

impl Default for Replies {
    fn default() -> Self {
        Replies(Arc::new(watch::channel(None).0))
    }
}

impl Replies {
    /// Serves the client's receiver link from the node: sends each reply as it comes.
    pub fn attach(&self, mut link: Sender) -> tokio::task::JoinHandle<()> {
        let (tx, mut rx) = mpsc::channel(REPLY_QUEUE);
        self.0.send_replace(Some(tx));
        tokio::spawn(async move {
            while let Some(reply) = rx.recv().await {
                if let Err(e) = link.send(reply).await {
                    tracing::debug!(error = %e, "reply not delivered");
                    break;
                }
            }
            let _ = link.close().await;
        })
    }

    /// Sends a reply once the client's receiver link is there (dropped after a wait if not).
    pub async fn send(&self, reply: Reply) {
        let mut link = self.0.subscribe();
        let tx = match tokio::time::timeout(REPLY_LINK_WAIT, link.wait_for(Option::is_some)).await {
            Ok(Ok(tx)) => tx.clone(),
            _ => None,
        };
        match tx {
            Some(tx) => {
                let _ = tx.send(reply).await;
            }
            None => tracing::debug!("reply dropped: the client has no receiver link from the node"),
        }
    }
}

/// A request's application property as text (string or symbol).
pub fn application_property<'a>(message: &'a Message<Body<Value>>, name: &str) -> Option<&'a str> {
    match message.application_properties.as_ref()?.0.get(name)? {
        SimpleValue::String(s) => Some(s),
        SimpleValue::Symbol(s) => Some(&s.0),
        _ => None,
    }
}

/// The id a reply to `request` correlates with.
pub fn correlation_of(request: &Message<Body<Value>>) -> Option<MessageId> {
    request
        .properties
        .as_ref()
        .and_then(|p| p.message_id.clone())
}

/// A reply with a status and a body (`Value::Null` for none).
pub fn reply(
    correlation_id: Option<MessageId>,
    status: i32,
    description: &str,
    body: Value,
) -> Reply {
    let mut application = OrderedMap::new();
    // An AMQP int: the Python SDKs do not recognise a long here (`compat` §B5).
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
        body: Body::Value(AmqpValue(body)),
        footer: None,
    }
}
