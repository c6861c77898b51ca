//! One MQTT connection, from CONNECT to close (MQT-2..MQT-8, MQT-13).
//!
//! # Invariants
//! - Nothing but CONNECT is accepted until authentication succeeded, and CONNECT must arrive
//!   within `timeouts.mqtt_connect` of the transport being ready, however slowly it is sent.
//! - A packet the client leaves unread for `timeouts.write_stall` ends the connection; the
//!   hub holds at most one packet being written per connection beyond its bounded queues.
//! - A QoS 1 telemetry PUBACK is sent only after the event is durable. Appends are queued in
//!   arrival order from this task, so a device's events keep their order, while the connection
//!   keeps reading (at most [`MAX_INFLIGHT`] appends outstanding); PUBACKs leave in order.
//! - A SUBACK for a persistent session (CleanSession=0) is sent only after the session record
//!   holding the subscription is durable.
//! - The Will is published when the connection ends without DISCONNECT (and the hub is not
//!   shutting down).
//! - Connection state is set to Disconnected only by the client id's current connection, so a
//!   superseded connection never overwrites its successor's state.
//! - C2D messages are fetched (locked) only while the session subscribes to them, at most
//!   [`super::c2d::WINDOW`] at a time; see [`super::c2d`] for completion and settlement.

use crate::latency::{self, Tally};
use std::task::Poll;
use std::time::Duration;

use ferrohub_engine::sessions::SessionRecord;
use futures::{Future, FutureExt, SinkExt, StreamExt};
use mqtt::packet::*;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::answers::{Answer, Answers, Packets};
use super::authenticate::Authenticated;
use super::burst::TelemetryBurst;
use super::c2d::{Delivery, SettleMode};
use super::codec::{CodecError, MqttCodec};
use super::lifecycle::{mark_retained, publish_will};
use super::property_bag;
use super::stop_signal::{Stop, StopSignal};
use super::topics::{self, Feature, Inbound};
use super::twin;
use crate::hub::connection_state::finish;
use crate::hub::connections::{MethodRequestOut, Outbound, Registration};
use crate::hub::methods::MethodAnswer;
use crate::hub::{AppendLane, HubContext};
use crate::telemetry::{self, DeviceMessage};

mod open;
mod subscriptions;

use open::{open, Opened};

/// What a method name escapes in a request topic: what would end or break the topic segment
/// (`/`, `?`, `#`, `+`, `%`, `&`, `=`, space, controls) and, by `utf8_percent_encode`, non-ASCII.
/// Everything else goes as it is, as IoT Hub sends it: Node's device SDK does not decode the
/// name, and Plug and Play component commands are named `component*command`.
const METHOD_NAME_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'/')
    .add(b'?')
    .add(b'#')
    .add(b'+')
    .add(b'%')
    .add(b'&')
    .add(b'=');

/// Largest MQTT packet: a 256 KB message plus its topic and property bag.
pub const MAX_PACKET: usize = 256 * 1024 + 64 * 1024;
/// Initial read and write buffer of a connection.
const BUFFER_START: usize = 512;
/// An empty buffer larger than this is replaced by a small one.
const SHRINK_ABOVE: usize = 16 * 1024;
/// A connection that has read no packet for this long gives back its empty read and write
/// buffers: an idle device then holds none (the next packet allocates them again).
const IDLE_RELEASE: Duration = Duration::from_secs(1);
/// Bytes of queued packets that make a write flush (tokio-util's default).
const WRITE_BATCH: usize = 8 * 1024;
/// Telemetry appends a connection may have outstanding before it stops reading.
pub const MAX_INFLIGHT: usize = 64;
/// Keep-alive timeouts are capped here (1.5 × IoT Hub's maximum keep-alive of 1177 s).
pub const MAX_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(1767);

/// How a connection was reached, for logs and authentication.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub addr: std::net::SocketAddr,
    pub transport: &'static str,
    /// The TLS client certificate chain, leaf first; empty when none was presented.
    pub client_chain: Vec<CertificateDer<'static>>,
}

impl PeerInfo {
    /// The TLS client certificate, if one was presented.
    pub fn client_cert(&self) -> Option<&CertificateDer<'static>> {
        self.client_chain.first()
    }
}

/// Why a connection ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Disconnect,
    Closed,
    KeepAlive,
    Kicked,
    Shutdown,
    Violation(String),
    StoreFailed(String),
    /// D2C throttle, fair share or daily quota: MQTT 3.1.1 has no refusal for a PUBLISH.
    Throttled(String),
    /// The client read nothing for this long while the hub had a packet to write to it.
    WriteStalled(Duration),
}

struct Connection<IO> {
    framed: Framed<IO, MqttCodec>,
    ctx: HubContext,
    auth: Authenticated,
    session: SessionRecord,
    persistent: bool,
    /// Answers owed, in the order of the requests.
    pending: Answers,
    /// Telemetry of the current read burst, not yet appended.
    burst: TelemetryBurst,
    outbound: mpsc::Receiver<Outbound>,
    /// Published to `Connections` so method callers see whether this session takes methods.
    methods_flag: std::sync::Arc<std::sync::atomic::AtomicBool>,
    c2d: Delivery,
    /// This connection's ordered path for telemetry (see [`AppendLane`]).
    lane: AppendLane,
    /// How long this device has been held to its D2C fair share lately, and when last.
    held: Duration,
    last_held: Option<Instant>,
    sender_mark: crate::hub::fair_share::SenderMark,
    d2c_bytes: metrics::Counter,
    /// When this connection's traffic last moved the device's `lastActivityTime`.
    activity: crate::hub::activity::ActivityGate,
}

/// Serves one connection until it ends.
///
/// Shaped for idle memory: a task's future is as large as its largest await plus its
/// arguments, kept for the connection's life. So the CONNECT phase (authentication, session
/// loading) runs in a boxed future of its own that owns the stream until it hands it to the
/// [`Connection`], and rare steps run boxed too; an idle connection's task keeps only the
/// connection and its serving loop (about 8 KB less than before).
pub fn run<IO>(
    io: IO,
    peer: PeerInfo,
    ctx: HubContext,
    shutdown: CancellationToken,
) -> impl Future<Output = ()> + Send
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let opening = Box::pin(open(io, peer, ctx));
    async move {
        let Some(opened) = opening.await else {
            return;
        };
        // Moved out through a function so the box is freed now: `let .. = *opened` would
        // keep the emptied box (the size of a whole connection) until the task ends.
        let Opened {
            mut conn,
            registration,
            will,
            keep_alive,
            open,
        } = unbox(opened);
        let end = conn.serve(&registration, keep_alive, &shutdown).await;
        if matches!(end, End::Throttled(_)) {
            // What was admitted before the refusal is acknowledged before the connection closes.
            Box::pin(conn.flush_pending()).await;
        }
        tracing::info!(client_id = %conn.auth.who.client_id(), reason = ?end, "connection ended");
        open.decrement(1.0);
        Box::pin(conn.c2d.close(&conn.ctx, &mut conn.outbound)).await;
        if !matches!(end, End::Disconnect | End::Shutdown) {
            if let Some((topic, payload, retain)) = will {
                Box::pin(publish_will(&conn.ctx, &conn.auth, &topic, payload, retain)).await;
            }
        }
        Box::pin(finish(&conn.ctx, &conn.auth.who, &registration)).await;
    }
}

/// Takes a value out of its box and frees the box.
fn unbox<T>(boxed: Box<T>) -> T {
    *boxed
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Connection<IO> {
    async fn serve(
        &mut self,
        registration: &Registration,
        keep_alive: Option<Duration>,
        shutdown: &CancellationToken,
    ) -> End {
        let far = Duration::from_secs(86_400 * 365);
        let mut deadline = Instant::now() + keep_alive.unwrap_or(far);
        // Made once, not per loop turn: registering and dropping a timer and two cancellation
        // waiters for every packet was measurable CPU per message. A packet only moves
        // `deadline`; the timer is re-armed when it fires early.
        // The same timer also marks when the connection has been quiet for `IDLE_RELEASE`.
        let mut last_packet = Instant::now();
        let mut released = false;
        let keep_alive_timer = tokio::time::sleep_until(deadline.min(last_packet + IDLE_RELEASE));
        let kicked = registration.kicked.cancelled();
        let shutting_down = shutdown.cancelled();
        let c2d_signal = std::sync::Arc::clone(self.c2d.signal());
        let c2d_woken = c2d_signal.wake.notified();
        tokio::pin!(keep_alive_timer, kicked, shutting_down, c2d_woken);
        let mut stop = StopSignal::new(kicked, shutting_down);
        loop {
            let can_read = self.pending.len() < MAX_INFLIGHT;
            let c2d_qos = self.c2d_subscription();
            self.c2d.publish_receiving(c2d_qos.is_some());
            if c2d_qos.is_some() {
                self.c2d.maybe_fetch(&self.ctx);
            }
            let reopen = self.c2d.window_reopens();
            tokio::select! {
                biased;
                stopped = stop.stopped() => return match stopped {
                    Stop::Kicked => End::Kicked,
                    Stop::Shutdown => End::Shutdown,
                },
                Some(answer) = self.pending.next(&self.lane), if !self.pending.is_empty() => {
                    if let Some(end) = Box::pin(self.answer_ready(answer)).await { return end; }
                }
                _ = &mut c2d_woken => {
                    self.c2d.want = true;
                    c2d_woken.set(c2d_signal.wake.notified());
                }
                // In a block so the timer is made only when the branch is polled: select!
                // builds every branch's future on every turn, disabled or not.
                _ = async move { tokio::time::sleep_until(reopen.unwrap_or_else(Instant::now)).await }, if reopen.is_some() => {
                    self.c2d.want = true;
                }
                // Before a fetch's answer: a message handed over locked on send is older than
                // anything a fetch that finishes with it can bring.
                Some(message) = self.outbound.recv() => {
                    if let Some(end) = Box::pin(self.on_outbound(message)).await { return end; }
                }
                fetched = async { self.c2d.fetch.as_mut().expect("checked").await }, if self.c2d.fetch.is_some() => {
                    self.c2d.fetch = None;
                    let fetched = match fetched {
                        Ok(f) => f,
                        Err(e) => return End::StoreFailed(e),
                    };
                    let qos1 = c2d_qos.unwrap_or(1) >= 1;
                    for out in self.c2d.deliver(&self.ctx, fetched, qos1) {
                        if let Some(end) = self.publish_c2d(out).await {
                            return end;
                        }
                    }
                }
                packet = self.framed.next(), if can_read => {
                    last_packet = Instant::now();
                    deadline = last_packet + keep_alive.unwrap_or(far);
                    if std::mem::take(&mut released) {
                        // The timer waits for the keep-alive deadline alone while released.
                        keep_alive_timer.as_mut().reset(deadline.min(last_packet + IDLE_RELEASE));
                    }
                    match packet {
                        None => return End::Closed,
                        Some(Err(CodecError::Io(_))) => return End::Closed,
                        Some(Err(e)) => return End::Violation(e.to_string()),
                        Some(Ok(p)) => {
                            self.shrink_buffers();
                            if let Some(end) = Box::pin(self.on_burst(p)).await { return end; }
                        }
                    }
                }
                _ = &mut keep_alive_timer => {
                    let now = Instant::now();
                    if now >= deadline {
                        return End::KeepAlive;
                    }
                    if !released && now >= last_packet + IDLE_RELEASE {
                        released = self.release_buffers();
                    }
                    let next = if released { deadline } else { deadline.min(last_packet + IDLE_RELEASE) };
                    keep_alive_timer.as_mut().reset(next);
                }
            }
        }
    }

    /// Writes `first` and every other answer that is already ready, then flushes once: a
    /// group commit that completes many messages of this connection costs one write to the
    /// socket, not one per PUBACK (and the client wakes once). The clock is read once for all
    /// of them.
    async fn answer_ready(&mut self, first: Answer) -> Option<End> {
        let now = Instant::now();
        let mut tallies = Tallies::default();
        let mut next = Some(first);
        let ended = loop {
            let Some(answer) = next else { break None };
            let packets = match self.packets_of(answer, now, &mut tallies) {
                Ok(packets) => packets,
                Err(e) => break Some(End::StoreFailed(e)),
            };
            let mut fed = None;
            for p in packets {
                fed = self.stalling(|f| f.feed(p)).await;
                if fed.is_some() {
                    break;
                }
            }
            if fed.is_some() {
                break fed;
            }
            next = self.pending.try_next(&self.lane);
        };
        tallies.add_to_metrics(&self.lane);
        match ended {
            Some(end) => Some(end),
            None => self.stalling(|f| SinkExt::<VariablePacket>::flush(f)).await,
        }
    }

    /// The packets an answer sends; a durable telemetry message is counted here.
    fn packets_of(
        &self,
        answer: Answer,
        now: Instant,
        tallies: &mut Tallies,
    ) -> Result<Packets, String> {
        let packets = match answer {
            Answer::Telemetry {
                pkid,
                received,
                admitted,
                result,
            } => {
                result?;
                tallies
                    .puback
                    .record(now.saturating_duration_since(received));
                tallies
                    .admission_to_durable
                    .record(now.saturating_duration_since(admitted));
                Packets::One(pkid.map(|id| PubackPacket::new(id).into()))
            }
            Answer::Work(result) => Packets::Many(result?.into_iter()),
        };
        Ok(packets)
    }

    /// Runs one write step on the framed connection under the write-stall limit.
    async fn stalling<'a, F, W>(&'a mut self, step: F) -> Option<End>
    where
        F: FnOnce(&'a mut Framed<IO, MqttCodec>) -> W,
        W: Future<Output = Result<(), CodecError>> + 'a,
    {
        let stall = self.ctx.timeouts.write_stall;
        write_within(stall, step(&mut self.framed)).await
    }

    /// Sends one packet. A client that leaves it unread for `timeouts.write_stall` ends the
    /// connection, so what waits for a client that stopped reading (C2D in its window, twin
    /// notifications and method requests in its bounded outbound queue) never grows.
    async fn send<P: mqtt::Encodable>(&mut self, packet: P) -> Option<End> {
        let stall = self.ctx.timeouts.write_stall;
        write_within(stall, self.framed.send(packet)).await
    }

    /// Gives back a buffer that a large packet grew, once it is empty: a device that sent one
    /// 256 KB message must not hold 256 KB while it idles.
    /// A buffer released while idle comes back at its starting size, so reads under load
    /// again take several packets at a time.
    fn shrink_buffers(&mut self) {
        fn shrink(buf: &mut bytes::BytesMut) {
            if buf.is_empty() && buf.capacity() > SHRINK_ABOVE {
                *buf = bytes::BytesMut::with_capacity(BUFFER_START);
            } else if buf.capacity() < BUFFER_START {
                buf.reserve(BUFFER_START - buf.len());
            }
        }
        shrink(self.framed.read_buffer_mut());
        shrink(self.framed.write_buffer_mut());
    }

    /// Frees the read and write buffers if both are empty; whether it did. Called once a
    /// connection has been quiet for `IDLE_RELEASE`.
    fn release_buffers(&mut self) -> bool {
        if !self.framed.read_buffer().is_empty() || !self.framed.write_buffer().is_empty() {
            return false;
        }
        *self.framed.read_buffer_mut() = bytes::BytesMut::new();
        *self.framed.write_buffer_mut() = bytes::BytesMut::new();
        self.pending.release_if_empty(&self.lane);
        self.burst.release();
        metrics::counter!("ferrohub_mqtt_idle_buffer_releases_total").increment(1);
        true
    }

    /// Handles `first` and the packets already read behind it, then appends their telemetry
    /// as one write (see [`TelemetryBurst`]). Whatever ends the connection, the telemetry
    /// admitted before it is appended.
    async fn on_burst(&mut self, first: VariablePacket) -> Option<End> {
        let mut packet = first;
        let end = loop {
            if let Some(end) = self.on_packet(packet).await {
                break Some(end);
            }
            if self.pending.len() + self.burst.len() >= MAX_INFLIGHT {
                break None;
            }
            // Polled with this task's waker: when nothing is buffered, the socket is left
            // registered for the serving loop's next poll, as that poll would have.
            let next = std::future::poll_fn(|cx| Poll::Ready(self.framed.poll_next_unpin(cx)));
            packet = match next.await {
                Poll::Ready(Some(Ok(p))) => p,
                Poll::Pending => break None,
                Poll::Ready(None | Some(Err(CodecError::Io(_)))) => break Some(End::Closed),
                Poll::Ready(Some(Err(e))) => break Some(End::Violation(e.to_string())),
            };
        };
        self.append_burst().await;
        end
    }

    /// Appends the burst's telemetry and queues a PUBACK for each message.
    async fn append_burst(&mut self) {
        let Some(taken) = self.burst.take() else {
            return;
        };
        self.d2c_bytes.increment(taken.bytes);
        // Waits here, suspending only this connection, while the hub admits no more writes
        // (a stalled disk); then the append proceeds behind the seam.
        let module_id = self.auth.who.module_id.clone();
        let waited = self
            .ctx
            .append_telemetry_in_order(&self.lane, taken.events, module_id, taken.now)
            .await;
        let admitted = if waited {
            Instant::now()
        } else {
            taken.received
        };
        for pkid in self.burst.owed() {
            self.pending.push_telemetry(pkid, taken.received, admitted);
        }
    }

    async fn on_packet(&mut self, packet: VariablePacket) -> Option<End> {
        if !matches!(packet, VariablePacket::PublishPacket(_)) {
            self.append_burst().await;
        }
        if matches!(
            packet,
            VariablePacket::PublishPacket(_) | VariablePacket::PubackPacket(_)
        ) {
            self.ctx.note_activity(&self.auth.who, &mut self.activity);
        }
        match packet {
            VariablePacket::PublishPacket(p) => self.on_publish(p).await,
            // Rare packets run boxed, so their futures do not size every connection's task.
            VariablePacket::SubscribePacket(p) => Box::pin(self.on_subscribe(p)).await,
            VariablePacket::UnsubscribePacket(p) => Box::pin(self.on_unsubscribe(p)).await,
            VariablePacket::PingreqPacket(_) => self.send(PingrespPacket::new()).await,
            VariablePacket::DisconnectPacket(_) => Some(End::Disconnect),
            // A C2D PUBACK completes the message (standard mode); others need no answer.
            VariablePacket::PubackPacket(p) => {
                self.c2d.on_puback(&self.ctx, p.packet_identifier());
                None
            }
            other => Some(End::Violation(format!("unexpected packet {other:?}"))),
        }
    }

    async fn on_publish(&mut self, p: PublishPacket) -> Option<End> {
        let pkid = match p.qos() {
            QoSWithPacketIdentifier::Level0 => None,
            QoSWithPacketIdentifier::Level1(id) => Some(id),
            QoSWithPacketIdentifier::Level2(_) => {
                return Some(End::Violation("QoS 2 is not supported".into()))
            }
        };
        let inbound = match topics::parse_publish(p.topic_name(), &self.auth.who) {
            Ok(i) => i,
            Err(e) => return Some(End::Violation(e.to_string())),
        };
        if !matches!(inbound, Inbound::Telemetry { .. }) {
            self.append_burst().await;
        }
        match inbound {
            Inbound::Telemetry { bag } => {
                if let Some(end) = self.admit_telemetry(p.payload().len()).await {
                    return Some(end);
                }
                let properties = match property_bag::parse(bag) {
                    Ok(props) => props,
                    Err(e) => return Some(End::Violation(e.to_string())),
                };
                let mut msg = DeviceMessage {
                    properties,
                    body: p.payload().to_vec(),
                };
                if p.retain() {
                    mark_retained(&mut msg);
                }
                let event = match telemetry::to_event(&self.auth.record, self.auth.method, msg) {
                    Ok(e) => e,
                    Err(e) => return Some(End::Violation(e.to_string())),
                };
                let clock = &self.ctx.clock;
                self.burst
                    .push(pkid, event, p.payload().len(), || clock.now());
                None
            }
            Inbound::TwinGet { rid } => {
                let work = twin::get(self.ctx.clone(), self.auth.who.clone(), rid, pkid);
                self.pending
                    .push_work(Box::pin(async move { Ok(work.await) }));
                None
            }
            Inbound::TwinReportedPatch { rid } => {
                let work = twin::patch_reported(
                    self.ctx.clone(),
                    self.auth.who.clone(),
                    rid,
                    p.payload().to_vec(),
                    pkid,
                );
                self.pending
                    .push_work(Box::pin(async move { Ok(work.await) }));
                None
            }
            Inbound::C2dSettle { lock_token, action } => {
                let settled = self.c2d.on_settle(&self.ctx, lock_token, action);
                self.pending.push_work(Box::pin(async move {
                    settled.await?;
                    Ok(pkid
                        .map(|id| PubackPacket::new(id).into())
                        .into_iter()
                        .collect())
                }));
                None
            }
            Inbound::MethodResponse { status, rid } => {
                let answer = MethodAnswer {
                    status,
                    payload: p.payload().to_vec(),
                };
                if !self
                    .ctx
                    .methods
                    .complete(&self.auth.who.client_id(), &rid, answer)
                {
                    tracing::debug!(%rid, "method answer for no waiting call; dropped");
                }
                if let Some(id) = pkid {
                    self.pending.push_work(Box::pin(async move {
                        Ok(vec![PubackPacket::new(id).into()])
                    }));
                }
                None
            }
        }
    }

    /// Sends the answers of queued work, for at most a few seconds.
    async fn flush_pending(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let now = Instant::now();
        while let Ok(Some(answer)) =
            tokio::time::timeout_at(deadline, self.pending.next(&self.lane)).await
        {
            let mut tallies = Tallies::default();
            let packets = self.packets_of(answer, now, &mut tallies);
            tallies.add_to_metrics(&self.lane);
            let Ok(packets) = packets else {
                return;
            };
            for p in packets {
                if self.send(p).await.is_some() {
                    return;
                }
            }
        }
    }

    /// Counts a telemetry message against the daily quota and admits it under the D2C budget
    /// and this device's fair share; the end of the connection when it is refused.
    async fn admit_telemetry(&mut self, bytes: usize) -> Option<End> {
        let throttles = &self.ctx.throttles;
        if let Err(q) = throttles.quota.charge(self.ctx.clock.now(), bytes) {
            return Some(End::Throttled(format!(
                "IotHubQuotaExceeded (403002): the daily message quota is used up until {}",
                crate::clock::iso7(q.resets_at)
            )));
        }
        // Holds separated by a quiet spell as long as the hold limit are forgiven.
        if self
            .last_held
            .is_some_and(|at| at.elapsed() > throttles.d2c.hold_limit())
        {
            self.held = Duration::ZERO;
        }
        match throttles
            .d2c
            .admit(&self.auth.who.device_id, &mut self.sender_mark, self.held)
            .await
        {
            Ok(admitted) if admitted.held.is_zero() => {}
            Ok(admitted) => {
                self.held += admitted.held;
                self.last_held = Some(Instant::now());
            }
            Err(refusal) => {
                return Some(End::Throttled(format!(
                    "ThrottlingException (429001): {refusal:?}; retry after {:.1} s",
                    refusal.retry_after().as_secs_f64()
                )))
            }
        }
        None
    }

    /// Pushes a hub-initiated message, if the session subscribed to its feature.
    async fn on_outbound(&mut self, message: Outbound) -> Option<End> {
        match message {
            Outbound::DesiredPatch { version, body } => {
                let subscribed = self.session.subscriptions.iter().any(|s| {
                    topics::parse_filter(&s.filter, &self.auth.who) == Some(Feature::DesiredPatches)
                });
                if !subscribed {
                    return None;
                }
                let packet = twin::desired_notification(version, body)?;
                self.send(packet).await
            }
            Outbound::MethodRequest(call) => {
                let MethodRequestOut {
                    rid,
                    method,
                    payload,
                } = *call;
                let name = percent_encoding::utf8_percent_encode(&method, METHOD_NAME_ESCAPED);
                let topic =
                    mqtt::TopicName::new(format!("$iothub/methods/POST/{name}/?$rid={rid}"))
                        .ok()?;
                let packet = PublishPacket::new(topic, QoSWithPacketIdentifier::Level0, payload);
                self.send(packet).await
            }
            Outbound::C2d(message) => {
                let qos = self.c2d_subscription();
                let out = self.c2d.deliver_locked(&self.ctx, *message, qos)?;
                self.publish_c2d(out).await
            }
        }
    }

    /// Publishes one C2D message, with the packet id its delivery allocated (QoS 1).
    async fn publish_c2d(&mut self, out: super::c2d::Outgoing) -> Option<End> {
        let topic = mqtt::TopicName::new(out.topic).ok()?;
        let qos = match out.pkid {
            Some(id) => QoSWithPacketIdentifier::Level1(id),
            None => QoSWithPacketIdentifier::Level0,
        };
        self.send(PublishPacket::new(topic, qos, out.payload)).await
    }
}

/// Runs a write step under the write-stall limit. Most steps finish at once (the socket takes
/// the bytes), so the step is polled once before a timer is made: a timer per flush, with its
/// clock read and runtime handle, was measurable CPU per message.
async fn write_within<W>(stall: Duration, step: W) -> Option<End>
where
    W: Future<Output = Result<(), CodecError>>,
{
    let mut step = std::pin::pin!(step);
    let done = match step.as_mut().now_or_never() {
        Some(done) => done,
        None => match tokio::time::timeout(stall, step).await {
            Ok(done) => done,
            Err(_) => return Some(End::WriteStalled(stall)),
        },
    };
    match done {
        Ok(()) => None,
        Err(_) => Some(End::Closed),
    }
}

/// The latencies of the telemetry answered in one go, added to the metrics at its end (see
/// `latency`).
#[derive(Default)]
struct Tallies {
    /// PUBLISH read to PUBACK due.
    puback: Tally,
    admission_to_durable: Tally,
}

impl Tallies {
    fn add_to_metrics(&mut self, lane: &AppendLane) {
        self.puback.add_to(&latency::PUBACK);
        lane.durable(&mut self.admission_to_durable);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future a function returns, without calling it.
    fn future_size<A, B, C, D, F>(_: impl Fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What every connection's task carries for its whole life (see [`run`]): the connection
    /// and its serving loop, not the CONNECT phase. 3.5 KB in a release build when written;
    /// 8 KB more before the CONNECT phase was boxed. Debug builds lay futures out larger.
    #[test]
    #[cfg(not(debug_assertions))]
    fn a_connection_task_keeps_no_connect_phase_state() {
        type Tls = crate::transport::lean_tls::LeanTlsStream;
        let task = future_size(run::<Tls>);
        assert!(task <= 4096, "a connection's future is {task} bytes");
        assert!(
            std::mem::size_of::<Outbound>() <= 40,
            "a queued outbound message is {} bytes",
            std::mem::size_of::<Outbound>()
        );
    }
}
