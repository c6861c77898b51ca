//! C2D delivery over one MQTT connection (MQT-9) and explicit settlement (C2D-7).
//!
//! # Modes
//! - Standard (what IoT Hub does): a message is locked when published; the device's PUBACK
//!   completes it. A QoS 0 subscription completes it when sent.
//! - Explicit (beyond IoT Hub, opt-in with `ferrohub-c2d-settlement=explicit` in the CONNECT
//!   username's query): each message carries its lock token as `$.lt` in the property bag; the
//!   PUBACK only acknowledges receipt, and the device settles with a PUBLISH to
//!   `devices/{id}/messages/devicebound/{lockToken}/complete|reject|abandon`. Clients that do
//!   not opt in never see either.
//!
//! # Invariants
//! - At most [`WINDOW`] messages are locked for this connection at a time; a lock that has
//!   expired, or a message past its expiry, no longer counts (the sweepers have returned the
//!   message to the queue or killed it), and a full window is looked at again when its first
//!   place frees.
//! - One fetch from the queue runs at a time; a wake-up while it runs is remembered (`want`).
//!   A PUBACK that comes while `want` is set and no fetch runs (a backlog the window holds
//!   back) completes its message in that fetch's own commit.
//! - When the connection ends, its unsettled locks are abandoned so a reconnecting device gets
//!   the messages at once rather than after the lock timeout; the abandon counts a delivery.
//! - While the session has a C2D subscription, `receiving` is published to senders: a send to
//!   the device's empty queue then arrives already locked ([`Outbound::C2d`]) and joins the
//!   window like a fetched message (the queue held nothing else, so nothing of it is in
//!   flight). The flag is cleared and the outbound queue closed and drained before the
//!   unsettled locks are abandoned, so a handed-over message is either published, abandoned
//!   here, or given back to its sender, which abandons it.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::c2d::{Delivered, Settle, Settled};
use ferrohub_engine::UnixMillis;
use futures::Future;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::property_bag;
use crate::c2d_message;
use crate::clock::Clock;
use crate::hub::connections::{C2dSignal, Outbound};
use crate::hub::HubContext;
use crate::ids::{DeviceId, LockToken};

/// Messages locked for one connection at a time.
pub const WINDOW: usize = 16;

/// The CONNECT username query item that opts into explicit settlement.
pub const EXPLICIT_OPT_IN: &str = "ferrohub-c2d-settlement=explicit";

/// How this connection's device settles messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleMode {
    OnPuback,
    Explicit,
}

impl SettleMode {
    pub fn from_username(username: Option<&str>) -> Self {
        let explicit = username
            .and_then(|u| u.split_once('?'))
            .is_some_and(|(_, q)| q.split('&').any(|kv| kv == EXPLICIT_OPT_IN));
        if explicit {
            SettleMode::Explicit
        } else {
            SettleMode::OnPuback
        }
    }
}

struct InFlight {
    pkid: Option<u16>,
    lock_token: LockToken,
    /// When the message stops holding a place in the window (lock or message expiry).
    lock_until: Instant,
}

type Fetch = Pin<Box<dyn Future<Output = Result<Vec<Delivered>, String>> + Send>>;

/// Delivery state of one connection.
pub struct Delivery {
    pub mode: SettleMode,
    device_id: DeviceId,
    inflight: Vec<InFlight>,
    pub fetch: Option<Fetch>,
    /// The queue may have deliverable messages this connection has not fetched.
    pub want: bool,
    /// How many the running or last fetch asked for; a full answer means there may be more.
    requested: usize,
    next_pkid: u16,
    /// Shared with senders through `Connections`.
    signal: Arc<C2dSignal>,
    /// What `signal.receiving` was last set to.
    receiving: bool,
}

/// A message ready to publish.
pub struct Outgoing {
    pub topic: String,
    pub payload: Vec<u8>,
    pub pkid: Option<u16>,
}

impl Delivery {
    pub fn new(mode: SettleMode, device_id: DeviceId, signal: Arc<C2dSignal>) -> Self {
        Delivery {
            mode,
            device_id,
            inflight: Vec::new(),
            fetch: None,
            want: true,
            requested: 0,
            next_pkid: 0,
            signal,
            receiving: false,
        }
    }

    pub fn signal(&self) -> &Arc<C2dSignal> {
        &self.signal
    }

    /// Tells senders whether the session takes C2D messages now (stored only on a change).
    pub fn publish_receiving(&mut self, receiving: bool) {
        if receiving != self.receiving {
            self.receiving = receiving;
            self.signal.receiving.store(receiving, Ordering::Release);
        }
    }

    /// A message its send locked for this connection: what to publish, or `None` when the
    /// session no longer subscribes (`qos`), and the message is abandoned back to the queue.
    pub fn deliver_locked(
        &mut self,
        ctx: &HubContext,
        message: Delivered,
        qos: Option<u8>,
    ) -> Option<Outgoing> {
        let Some(qos) = qos else {
            ctx.abandon_c2d_in_background(
                self.device_id.clone(),
                LockToken::new(message.lock_token),
            );
            return None;
        };
        metrics::counter!("ferrohub_c2d_delivered_total").increment(1);
        let lock_for = Duration::from_millis(ctx.c2d.settings.lock_timeout_ms.max(0) as u64);
        Some(self.deliver_one(ctx, message, qos >= 1, lock_for))
    }

    /// Starts a fetch if one is wanted and the window has room.
    pub fn maybe_fetch(&mut self, ctx: &HubContext) {
        if !self.want || self.fetch.is_some() {
            return;
        }
        self.start_fetch(ctx, None);
    }

    /// A PUBACK while the queue may hold more than was fetched (a backlog): the completion
    /// and the next fetch are one commit, the fetch this connection waits for.
    fn complete_then_fetch(&mut self, ctx: &HubContext, lock_token: LockToken) {
        self.start_fetch(ctx, Some(lock_token));
    }

    /// Fetches for the window's free places, completing `completing` in the same commit.
    fn start_fetch(&mut self, ctx: &HubContext, completing: Option<LockToken>) {
        let now_instant = Instant::now();
        self.inflight.retain(|f| f.lock_until > now_instant);
        let room = WINDOW.saturating_sub(self.inflight.len());
        if room == 0 {
            if let Some(token) = completing {
                self.settle_in_background(ctx, token, Settle::Complete);
            }
            return;
        }
        self.want = false;
        self.requested = room;
        let (ctx, id) = (ctx.clone(), self.device_id.clone());
        let at = ctx.clock.now();
        self.fetch = Some(Box::pin(async move {
            match completing {
                Some(token) => complete_and_fetch(&ctx, id, token, room, at).await,
                None => fetch(&ctx, id, room, at).await,
            }
        }));
    }

    /// Records fetched messages as in flight and returns what to publish. `qos1` is whether
    /// the subscription was granted QoS 1.
    pub fn deliver(
        &mut self,
        ctx: &HubContext,
        fetched: Vec<Delivered>,
        qos1: bool,
    ) -> Vec<Outgoing> {
        let lock_for = Duration::from_millis(ctx.c2d.settings.lock_timeout_ms.max(0) as u64);
        let mut out = Vec::with_capacity(fetched.len());
        if fetched.len() >= self.requested {
            self.want = true;
        }
        metrics::counter!("ferrohub_c2d_delivered_total").increment(fetched.len() as u64);
        for d in fetched {
            out.push(self.deliver_one(ctx, d, qos1, lock_for));
        }
        out
    }

    /// Records one locked message as in flight (or completes it, QoS 0 in standard mode) and
    /// returns its PUBLISH.
    fn deliver_one(
        &mut self,
        ctx: &HubContext,
        d: Delivered,
        qos1: bool,
        lock_for: Duration,
    ) -> Outgoing {
        let mut props = c2d_message::device_properties(&self.device_id, &d);
        if self.mode == SettleMode::Explicit {
            props.push(("$.lt".into(), Some(d.lock_token.clone())));
        }
        let topic = format!(
            "devices/{}/messages/devicebound/{}",
            self.device_id,
            property_bag::encode(&props)
        );
        let pkid = qos1.then(|| self.allocate_pkid());
        if pkid.is_some() || self.mode == SettleMode::Explicit {
            self.inflight.push(InFlight {
                pkid,
                lock_token: LockToken::new(d.lock_token.clone()),
                lock_until: held_until(&d, lock_for, &ctx.clock),
            });
        } else {
            // QoS 0 in standard mode: delivered means completed.
            self.settle_in_background(ctx, LockToken::new(d.lock_token.clone()), Settle::Complete);
        }
        Outgoing {
            topic,
            payload: d.message.body,
            pkid,
        }
    }

    fn allocate_pkid(&mut self) -> u16 {
        loop {
            self.next_pkid = self.next_pkid.wrapping_add(1).max(1);
            let id = self.next_pkid;
            if !self.inflight.iter().any(|f| f.pkid == Some(id)) {
                return id;
            }
        }
    }

    /// A PUBACK from the device; true if it acknowledged a C2D message.
    pub fn on_puback(&mut self, ctx: &HubContext, pkid: u16) -> bool {
        let Some(i) = self.inflight.iter().position(|f| f.pkid == Some(pkid)) else {
            return false;
        };
        match self.mode {
            SettleMode::OnPuback => {
                let f = self.inflight.swap_remove(i);
                if self.want && self.fetch.is_none() {
                    self.complete_then_fetch(ctx, f.lock_token);
                } else {
                    self.settle_in_background(ctx, f.lock_token, Settle::Complete);
                }
            }
            SettleMode::Explicit => self.inflight[i].pkid = None,
        }
        true
    }

    /// An explicit settle from the device: the returned future finishes once it is durable
    /// (or refused: a lost lock is logged, the device has nothing to learn from it).
    pub fn on_settle(
        &mut self,
        ctx: &HubContext,
        lock_token: LockToken,
        action: Settle,
    ) -> impl Future<Output = Result<(), String>> + Send {
        self.inflight.retain(|f| f.lock_token != lock_token);
        let (ctx, device) = (ctx.clone(), self.device_id.clone());
        async move {
            match settle(&ctx, &device, lock_token, action).await {
                Ok(_) => Ok(()),
                Err(ferrohub_engine::c2d::C2dError::Storage(e)) => Err(e.to_string()),
                Err(e) => {
                    tracing::debug!(device = %device, error = %e, "c2d settle refused");
                    Ok(())
                }
            }
        }
    }

    fn settle_in_background(&self, ctx: &HubContext, lock_token: LockToken, action: Settle) {
        let (ctx, device) = (ctx.clone(), self.device_id.clone());
        tokio::spawn(async move {
            if let Err(e) = settle(&ctx, &device, lock_token, action).await {
                tracing::debug!(device = %device, error = %e, "c2d settle refused");
            }
        });
    }

    /// When the window is full: the earliest local lock expiry, when the connection must look
    /// at its queue again (the lock sweeper wakes it only for messages it returns to the queue,
    /// not for ones that died meanwhile).
    pub fn window_reopens(&self) -> Option<Instant> {
        if self.inflight.len() < WINDOW {
            return None;
        }
        self.inflight.iter().map(|f| f.lock_until).min()
    }

    /// The connection is ending: senders stop locking messages for it, messages already
    /// handed over and a fetch still running have locked messages nobody will get, so take
    /// them in, then abandon every unsettled, unexpired lock. `outbound` is closed: a sender
    /// whose hand-over comes later gets its message back and abandons it itself.
    pub async fn close(&mut self, ctx: &HubContext, outbound: &mut mpsc::Receiver<Outbound>) {
        self.publish_receiving(false);
        outbound.close();
        let lock_for = Duration::from_millis(ctx.c2d.settings.lock_timeout_ms.max(0) as u64);
        let mut orphans = Vec::new();
        while let Ok(message) = outbound.try_recv() {
            if let Outbound::C2d(d) = message {
                orphans.push(*d);
            }
        }
        if let Some(fetch) = self.fetch.take() {
            if let Ok(got) = fetch.await {
                orphans.extend(got);
            }
        }
        for d in orphans {
            self.inflight.push(InFlight {
                pkid: None,
                lock_until: held_until(&d, lock_for, &ctx.clock),
                lock_token: LockToken::new(d.lock_token),
            });
        }
        self.abandon_all(ctx);
    }

    /// Abandons every unsettled, unexpired lock.
    fn abandon_all(&mut self, ctx: &HubContext) {
        let now_instant = Instant::now();
        for f in self.inflight.drain(..) {
            if f.lock_until > now_instant {
                let (ctx, device) = (ctx.clone(), self.device_id.clone());
                tokio::spawn(async move {
                    let _ = settle(&ctx, &device, f.lock_token, Settle::Abandon).await;
                });
            }
        }
    }
}

/// Until when a delivered message occupies the window: its lock, or its expiry if sooner (an
/// expired message dies, locked or not).
fn held_until(d: &Delivered, lock_for: Duration, clock: &Clock) -> Instant {
    (Instant::now() + lock_for).min(clock.instant_at(d.expiry))
}

/// Locks up to `room` deliverable messages of the device's queue.
async fn fetch(
    ctx: &HubContext,
    id: DeviceId,
    room: usize,
    at: UnixMillis,
) -> Result<Vec<Delivered>, String> {
    let call = crate::hub::calls::ReceiveC2d {
        device_id: id.to_string(),
        max: room,
        now: at,
    };
    ctx.write(call).await.map_err(|e| e.to_string())
}

/// Completes a message and locks up to `room` more in one commit. A completion the engine
/// refuses (its lock expired meanwhile) is logged, and the fetch is made alone.
async fn complete_and_fetch(
    ctx: &HubContext,
    id: DeviceId,
    token: LockToken,
    room: usize,
    at: UnixMillis,
) -> Result<Vec<Delivered>, String> {
    let call = crate::hub::calls::CompleteAndReceiveC2d {
        device_id: id.to_string(),
        lock_token: token.to_string(),
        max: room,
        now: at,
    };
    let combined = ctx.write(call).await;
    match combined {
        Ok(got) => {
            metrics::counter!("ferrohub_c2d_completed_with_fetch_total").increment(1);
            Ok(got)
        }
        Err(ferrohub_engine::c2d::C2dError::Storage(e)) => Err(e.to_string()),
        Err(e) => {
            tracing::debug!(device = %id, error = %e, "c2d completion refused");
            fetch(ctx, id, room, at).await
        }
    }
}

/// Settles one message. An abandoned message is deliverable again, so the device's connection
/// is woken to fetch it. A completed or rejected one only freed a place in the window, and the
/// connection looks at its window again after every packet; messages sent meanwhile woke it
/// when they were queued. (Waking it anyway cost a fetch that found nothing, after nearly every
/// message: a staging call and a queue scan.)
async fn settle(
    ctx: &HubContext,
    device_id: &DeviceId,
    lock_token: LockToken,
    action: Settle,
) -> Result<Settled, ferrohub_engine::c2d::C2dError> {
    let call = crate::hub::calls::SettleC2d {
        device_id: device_id.to_string(),
        lock_token: lock_token.to_string(),
        action,
        now: ctx.clock.now(),
    };
    let result = ctx.write(call).await;
    if action == Settle::Abandon {
        ctx.connections.wake_c2d(device_id);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_mode_is_opt_in_through_the_username_query() {
        assert_eq!(
            SettleMode::from_username(Some(
                "h/d/?api-version=2021-04-12&ferrohub-c2d-settlement=explicit"
            )),
            SettleMode::Explicit
        );
        assert_eq!(
            SettleMode::from_username(Some("h/d/?api-version=2021-04-12&DeviceClientType=x")),
            SettleMode::OnPuback
        );
        assert_eq!(SettleMode::from_username(None), SettleMode::OnPuback);
    }
}
