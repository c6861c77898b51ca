//! Core NATS between a cluster's hub nodes (docs/cluster.md, "Serving from every node"): the
//! calls followers forward to the writer, and the live traffic that reaches the node holding a
//! device's connection. Bytes in, bytes out: what the bytes mean is the hub's.
//!
//! # Subjects
//! - [`CALLS`]: a follower's engine calls (writes) for the writer; only the writer subscribes.
//! - [`APPENDS`]: a follower's telemetry for the writer, in batches, each answered once all
//!   its messages are durable.
//! - `ferrohub.dev.{device}.{target}.{kind}`: live traffic for a device (`target` `-`) or one
//!   of its modules (`target` its id), ids base64url-encoded (they may hold `.`, `*` and `>`).
//!   Each node subscribes for the connections it holds ([`Bus::subscribe_identity`]).
//! - `ferrohub.replies.{node}.{n}`: where this node's requests are answered.
//!
//! # Invariants
//! - [`Bus::send`] publishes before it returns, so sends made one after another by one task
//!   reach a subscriber in that order (NATS keeps one connection's order per subscriber).
//! - A request nobody subscribes to is answered at once by the server ("no responders"), so
//!   the caller knows it was not delivered: [`BusError::NoResponders`], safe to send again.
//!   Any other failure ([`BusError::Unanswered`]) leaves unknown whether it was delivered.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, Message, StatusCode, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Engine calls forwarded to the writer.
pub const CALLS: &str = "ferrohub.writer.calls";
/// Batches of telemetry forwarded to the writer (a subject of its own per wire format, so
/// nodes of different versions do not misread each other: the batch is the second).
pub const APPENDS: &str = "ferrohub.writer.append-batches";
/// Every serving node answers: its name, incarnation and how many devices are connected to it.
pub const ROLL_CALL: &str = "ferrohub.nodes.roll-call";
/// Event Hubs readers about to be admitted on a node (`hub::readers_everywhere`).
pub const READER_CLAIMS: &str = "ferrohub.nodes.reader-claims";

#[derive(Debug, Clone, thiserror::Error)]
pub enum BusError {
    /// Nobody subscribes (no writer now, the device connected nowhere): not delivered.
    #[error("nobody answers on {0}")]
    NoResponders(String),
    /// Sent, but no answer in time (or NATS unreachable): it may have been delivered.
    #[error("no answer: {0}")]
    Unanswered(String),
}

type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Message>>>>;

/// This node's core NATS connection for hub traffic.
#[derive(Clone)]
pub struct Bus {
    client: Client,
    node: Arc<str>,
    replies: Arc<str>,
    waiting: Waiting,
    next: Arc<AtomicU64>,
}

/// A request's answer, to come.
pub struct Pending {
    id: u64,
    subject: String,
    answer: oneshot::Receiver<Message>,
    waiting: Waiting,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.waiting.lock().remove(&self.id);
    }
}

impl Pending {
    /// Waits up to `timeout` for the answer.
    ///
    /// # Errors
    /// [`BusError::NoResponders`] when nobody subscribed, [`BusError::Unanswered`] when the
    /// answer did not come in time.
    pub async fn answer(mut self, timeout: Duration) -> Result<Bytes, BusError> {
        match tokio::time::timeout(timeout, &mut self.answer).await {
            Ok(Ok(m)) if m.status == Some(StatusCode::NO_RESPONDERS) => {
                Err(BusError::NoResponders(self.subject.clone()))
            }
            Ok(Ok(m)) => Ok(m.payload),
            Ok(Err(_)) => Err(BusError::Unanswered("the bus closed".into())),
            Err(_) => Err(BusError::Unanswered(format!(
                "{} gave no answer within {timeout:?}",
                self.subject
            ))),
        }
    }
}

/// One subject token of an id, in unpadded URL-safe base64 (ids may hold `.`, `*`, `>` and
/// spaces; the token never is `-`, the device's target, which is one character).
fn token(id: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes())
}

/// The subject prefix of an identity's live traffic: a device's (`module` `None`) or a
/// module's.
pub fn identity_subject(device: &str, module: Option<&str>) -> String {
    match module {
        Some(m) => format!("ferrohub.dev.{}.{}", token(device), token(m)),
        None => format!("ferrohub.dev.{}.-", token(device)),
    }
}

impl Bus {
    /// Starts the reply listener of node `node` on `client`.
    ///
    /// # Errors
    /// NATS refusing the subscription.
    pub async fn start(client: Client, node: &str) -> Result<Bus, super::ClusterError> {
        let replies: Arc<str> = format!("ferrohub.replies.{}", token(node)).into();
        let mut answers = client
            .subscribe(format!("{replies}.*"))
            .await
            .map_err(|e| super::ClusterError::nats("the reply subscription", e))?;
        let waiting: Waiting = Arc::default();
        let routed = Arc::downgrade(&waiting);
        tokio::spawn(async move {
            while let Some(m) = answers.next().await {
                let Some(waiting) = routed.upgrade() else {
                    return;
                };
                let id = m
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok());
                if let Some(tx) = id.and_then(|id| waiting.lock().remove(&id)) {
                    let _ = tx.send(m);
                }
            }
        });
        Ok(Bus {
            client,
            node: node.into(),
            replies,
            waiting,
            next: Arc::default(),
        })
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Publishes a request to `subject` now and returns its answer to come.
    ///
    /// # Errors
    /// [`BusError::Unanswered`] when the publish itself failed.
    pub async fn send(&self, subject: &str, payload: Bytes) -> Result<Pending, BusError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, answer) = oneshot::channel();
        self.waiting.lock().insert(id, tx);
        let pending = Pending {
            id,
            subject: subject.to_owned(),
            answer,
            waiting: Arc::clone(&self.waiting),
        };
        self.client
            .publish_with_reply(
                subject.to_owned(),
                format!("{}.{id}", self.replies),
                payload,
            )
            .await
            .map_err(|e| BusError::Unanswered(e.to_string()))?;
        Ok(pending)
    }

    /// [`Bus::send`], then [`Pending::answer`].
    ///
    /// # Errors
    /// As those.
    pub async fn request(
        &self,
        subject: &str,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, BusError> {
        self.send(subject, payload).await?.answer(timeout).await
    }

    /// Publishes without asking for an answer; a failure is logged (live traffic a node that
    /// cannot reach NATS cannot deliver either way).
    pub async fn publish(&self, subject: String, payload: Bytes) {
        if let Err(e) = self.client.publish(subject, payload).await {
            tracing::debug!(error = %e, "cannot publish to the cluster");
        }
    }

    /// Answers a request received on a subscription.
    pub async fn respond(&self, to: &Message, payload: Bytes) {
        if let Some(reply) = &to.reply {
            if let Err(e) = self.client.publish(reply.clone(), payload).await {
                tracing::debug!(error = %e, "cannot answer a cluster request");
            }
        }
    }

    /// Subscribes to `subject`; dropping the subscriber ends it.
    ///
    /// # Errors
    /// NATS refusing the subscription.
    pub async fn subscribe(&self, subject: String) -> Result<Subscriber, BusError> {
        self.client
            .subscribe(subject)
            .await
            .map_err(|e| BusError::Unanswered(e.to_string()))
    }

    /// Asks every subscriber of `subject` and gathers the answers that come within `window`
    /// (each node answers once; a node that does not answer in time is left out).
    ///
    /// # Errors
    /// NATS refusing the subscription or the publish.
    pub async fn gather(
        &self,
        subject: &str,
        payload: Bytes,
        window: Duration,
    ) -> Result<Vec<Bytes>, BusError> {
        let inbox = self.client.new_inbox();
        let mut answers = self.subscribe(inbox.clone()).await?;
        self.client
            .publish_with_reply(subject.to_owned(), inbox, payload)
            .await
            .map_err(|e| BusError::Unanswered(e.to_string()))?;
        let mut got = Vec::new();
        let until = tokio::time::Instant::now() + window;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, answers.next()).await {
            if m.status.is_none() {
                got.push(m.payload);
            }
        }
        Ok(got)
    }

    /// Subscribes to `subject` in queue group `group`: each message goes to one member.
    ///
    /// # Errors
    /// NATS refusing the subscription.
    pub async fn queue_subscribe(
        &self,
        subject: &str,
        group: &str,
    ) -> Result<Subscriber, BusError> {
        self.client
            .queue_subscribe(subject.to_owned(), group.to_owned())
            .await
            .map_err(|e| BusError::Unanswered(e.to_string()))
    }

    /// The live traffic of one identity: its own subject's kinds, and for a module also the
    /// kicks of its whole device (published on the device's subject).
    ///
    /// # Errors
    /// NATS refusing the subscription.
    pub async fn subscribe_identity(
        &self,
        device: &str,
        module: Option<&str>,
    ) -> Result<futures::stream::SelectAll<Subscriber>, BusError> {
        let mut all = futures::stream::SelectAll::new();
        all.push(
            self.subscribe(format!("{}.*", identity_subject(device, module)))
                .await?,
        );
        if module.is_some() {
            all.push(
                self.subscribe(format!("{}.kick-device", identity_subject(device, None)))
                    .await?,
            );
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_single_tokens() {
        assert_eq!(identity_subject("a.b", None), "ferrohub.dev.YS5i.-");
        assert_eq!(identity_subject("d", Some("m*>")), "ferrohub.dev.ZA.bSo-");
        assert_ne!(token("?"), "-");
    }
}
