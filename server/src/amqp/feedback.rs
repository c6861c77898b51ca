//! Receiver links on `/messages/serviceBound/feedback` (AMQ-3): the hub locks the next
//! feedback message, sends it, and settles it by the client's outcome: `accepted` completes it,
//! `released` and `modified` abandon it (it comes back), `rejected` dead-letters it. A message
//! sent when the link or connection drops is abandoned, so it comes back at once.
//!
//! `/messages/serviceBound/filenotifications` works the same way with file-upload
//! notifications (one upload per message).
//!
//! # Invariants
//! - At most one feedback message per link is locked and unsettled at a time: the next is
//!   taken only once the previous one is settled, so a slow client holds one lock.
//! - With nothing to deliver the link waits, polling the queue every [`POLL`]; the claim is
//!   checked before each message.

use std::time::Duration;

use fe2o3_amqp::link::Sender;
use fe2o3_amqp::types::messaging::{Body, Data, Message, Outcome, Properties};
use fe2o3_amqp::types::primitives::{Binary, Symbol};
use ferrohub_engine::c2d::file_notifications::LockedFileNotification;
use ferrohub_engine::c2d::{FeedbackMessage, Settle};

use super::claims::Claims;
use super::errors;
use crate::auth::Permission;
use crate::c2d_message;
use crate::hub::HubContext;
use crate::ids::LockToken;

/// How often an idle feedback link looks for new feedback.
const POLL: Duration = Duration::from_millis(500);

/// Serves one feedback link until the client detaches it or its claim stops allowing it.
pub async fn serve(mut link: Sender, ctx: HubContext, claims: Claims) {
    loop {
        if let Err(reason) = claims.check(Permission::ServiceConnect, ctx.auth.now_secs()) {
            let _ = link.close_with_error(errors::unauthorized(&reason)).await;
            return;
        }
        let next = match ctx.receive_feedback().await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %e, "feedback could not be read");
                let _ = link
                    .close_with_error(errors::internal(&e.to_string()))
                    .await;
                return;
            }
        };
        let Some(feedback) = next else {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => continue,
                _ = link.on_detach() => return,
            }
        };
        let token = LockToken::new(feedback.lock_token.clone());
        let sent = link.send(message(&feedback, &ctx.settings.hub_name)).await;
        let (action, link_ok) = match sent {
            Ok(Outcome::Accepted(_)) => (Settle::Complete, true),
            Ok(Outcome::Rejected(_)) => (Settle::Reject, true),
            Ok(_) => (Settle::Abandon, true),
            Err(e) => {
                tracing::debug!(error = %e, "feedback link ended with a message unsettled");
                (Settle::Abandon, false)
            }
        };
        if let Err(e) = ctx.settle_feedback(token, action).await {
            tracing::debug!(error = %e, ?action, "feedback settle refused");
        }
        if !link_ok {
            return;
        }
    }
}

/// Serves a link on the file-notification node: each queued upload notification is sent as
/// one message and settled by the client's outcome, like feedback. A hub without file upload
/// configured has nothing to send; the link stays attached until the client detaches it.
pub async fn serve_file_notifications(mut link: Sender, ctx: HubContext, claims: Claims) {
    if ctx.uploads.is_none() {
        if let Err(reason) = claims.check(Permission::ServiceConnect, ctx.auth.now_secs()) {
            let _ = link.close_with_error(errors::unauthorized(&reason)).await;
            return;
        }
        let _ = link.on_detach().await;
        return;
    }
    loop {
        if let Err(reason) = claims.check(Permission::ServiceConnect, ctx.auth.now_secs()) {
            let _ = link.close_with_error(errors::unauthorized(&reason)).await;
            return;
        }
        let now = ctx.clock.now();
        let next = ctx
            .write(crate::hub::calls::ReceiveFileNotification { now })
            .await;
        let locked = match next {
            Ok(Some(n)) => n,
            Ok(None) => {
                tokio::select! {
                    _ = tokio::time::sleep(POLL) => continue,
                    _ = link.on_detach() => return,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "file notifications could not be read");
                let _ = link
                    .close_with_error(errors::internal(&e.to_string()))
                    .await;
                return;
            }
        };
        let sent = link
            .send(file_notification_message(&locked, &ctx.settings.hub_name))
            .await;
        let (action, link_ok) = match sent {
            Ok(Outcome::Accepted(_)) => (Settle::Complete, true),
            Ok(Outcome::Rejected(_)) => (Settle::Reject, true),
            Ok(_) => (Settle::Abandon, true),
            Err(e) => {
                tracing::debug!(error = %e, "file notification link ended with a message unsettled");
                (Settle::Abandon, false)
            }
        };
        let call = crate::hub::calls::SettleFileNotification {
            lock_token: locked.lock_token.clone(),
            action,
            now: ctx.clock.now(),
        };
        if let Err(e) = ctx.write(call).await {
            tracing::debug!(error = %e, ?action, "file notification settle refused");
        }
        if !link_ok {
            return;
        }
    }
}

/// A file notification as IoT Hub sends it: its JSON in a data section.
fn file_notification_message(
    n: &LockedFileNotification,
    hub_name: &str,
) -> Message<Body<fe2o3_amqp::types::primitives::Value>> {
    let f = &n.notification;
    let body = serde_json::json!({
        "deviceId": f.device_id,
        "blobUri": f.blob_uri,
        "blobName": f.blob_name,
        "lastUpdatedTime": crate::clock::iso7(f.last_updated),
        "blobSizeInBytes": f.blob_size,
        "enqueuedTimeUtc": crate::clock::iso7(n.enqueued),
    });
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            message_id: Some(n.lock_token.clone().into()),
            user_id: Some(Binary::from(hub_name.as_bytes().to_vec())),
            content_type: Some(Symbol::from("application/json")),
            ..Default::default()
        }),
        application_properties: None,
        body: Body::Data(vec![Data(Binary::from(body.to_string().into_bytes()))].into()),
        footer: None,
    }
}

/// The AMQP form of a feedback message: its records as JSON in a data section.
fn message(
    f: &FeedbackMessage,
    hub_name: &str,
) -> Message<Body<fe2o3_amqp::types::primitives::Value>> {
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            message_id: Some(f.lock_token.clone().into()),
            user_id: Some(Binary::from(hub_name.as_bytes().to_vec())),
            content_type: Some(Symbol::from(c2d_message::FEEDBACK_CONTENT_TYPE)),
            ..Default::default()
        }),
        application_properties: None,
        body: Body::Data(vec![Data(Binary::from(c2d_message::feedback_body(f)))].into()),
        footer: None,
    }
}
