//! Receiver links on `/messages/serviceBound/feedback` (AMQ-3): the hub locks the next
//! feedback message, sends it, and settles it by the client's outcome: `accepted` completes it,
//! `released` and `modified` abandon it (it comes back), `rejected` dead-letters it. A message
//! sent when the link or connection drops is abandoned, so it comes back at once.
//!
//! `/messages/serviceBound/filenotifications` attaches the same way; the hub has no file
//! uploads yet, so it delivers nothing.
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

/// Serves a link on the file-notification node: nothing to deliver until file uploads exist,
/// so it stays attached until the client detaches it.
pub async fn serve_file_notifications(mut link: Sender, ctx: HubContext, claims: Claims) {
    if let Err(reason) = claims.check(Permission::ServiceConnect, ctx.auth.now_secs()) {
        let _ = link.close_with_error(errors::unauthorized(&reason)).await;
        return;
    }
    let _ = link.on_detach().await;
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
