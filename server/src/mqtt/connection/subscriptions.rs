//! SUBSCRIBE and UNSUBSCRIBE of one connection, and what the session's subscriptions tell
//! the rest of the hub: whether the connection takes direct methods (`methods_flag`) and C2D
//! messages ([`Connection::c2d_subscription`]).
//!
//! # Invariants
//! - A persistent session's subscriptions are durable before their SUBACK or UNSUBACK.

use ferrohub_engine::sessions::{SessionRecord, Subscription};
use mqtt::packet::suback::SubscribeReturnCode;
use mqtt::packet::*;
use mqtt::QualityOfService;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{Connection, End};
use crate::mqtt::topics::{self, Feature};

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Connection<IO> {
    pub(super) async fn on_subscribe(&mut self, p: SubscribePacket) -> Option<End> {
        if p.subscribes().is_empty() {
            return Some(End::Violation("SUBSCRIBE without topic filters".into()));
        }
        let mut codes = Vec::with_capacity(p.subscribes().len());
        let mut granted = Vec::new();
        for (filter, qos) in p.subscribes() {
            match topics::parse_filter(filter, &self.auth.who) {
                Some(_) => {
                    let qos = (*qos).min(QualityOfService::Level1);
                    codes.push(SubscribeReturnCode::from(qos));
                    granted.push(Subscription {
                        filter: filter.to_string(),
                        qos: qos as u8,
                    });
                }
                None => codes.push(SubscribeReturnCode::Failure),
            }
        }
        if granted.iter().any(|g| {
            topics::parse_filter(&g.filter, &self.auth.who) == Some(Feature::CloudToDevice)
        }) {
            self.c2d.want = true;
        }
        self.session.subscribe(granted);
        self.methods_flag.store(
            subscribes_methods(&self.session, &self.auth.who),
            std::sync::atomic::Ordering::Release,
        );
        if let Some(end) = self.save_session().await {
            return Some(end);
        }
        self.send(SubackPacket::new(p.packet_identifier(), codes))
            .await
    }

    pub(super) async fn on_unsubscribe(&mut self, p: UnsubscribePacket) -> Option<End> {
        self.session
            .unsubscribe(p.subscribes().iter().map(|f| &***f));
        self.methods_flag.store(
            subscribes_methods(&self.session, &self.auth.who),
            std::sync::atomic::Ordering::Release,
        );
        if let Some(end) = self.save_session().await {
            return Some(end);
        }
        self.send(UnsubackPacket::new(p.packet_identifier())).await
    }

    /// Makes the session durable before its acknowledgement (persistent sessions only).
    async fn save_session(&mut self) -> Option<End> {
        if !self.persistent {
            return None;
        }
        let call = crate::hub::calls::SaveSession {
            client_id: self.auth.who.client_id().to_string(),
            session: self.session.clone(),
        };
        self.ctx
            .write(call)
            .await
            .err()
            .map(|e| End::StoreFailed(e.to_string()))
    }
}

impl<IO> Connection<IO> {
    /// The granted QoS of the session's C2D subscription, if it has one.
    pub(super) fn c2d_subscription(&self) -> Option<u8> {
        self.session
            .subscriptions
            .iter()
            .find(|s| {
                topics::parse_filter(&s.filter, &self.auth.who) == Some(Feature::CloudToDevice)
            })
            .map(|s| s.qos)
    }
}

/// Whether a session holds the direct-methods subscription.
pub(super) fn subscribes_methods(session: &SessionRecord, who: &topics::Identity) -> bool {
    session
        .subscriptions
        .iter()
        .any(|s| topics::parse_filter(&s.filter, who) == Some(Feature::Methods))
}
