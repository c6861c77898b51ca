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

use std::time::Duration;

use ferrohub_engine::sessions::SessionRecord;
use futures::{Future, FutureExt, SinkExt, StreamExt};
use mqtt::control::{ConnectReturnCode, ProtocolLevel};
use mqtt::packet::*;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::answers::{Answer, Answers, Packets};
use super::authenticate::{authenticate, Authenticated};
use super::c2d::{Delivery, SettleMode};
use super::codec::{CodecError, MqttCodec};
use super::lifecycle::{finish, mark_retained, publish_will, stage_connection};
use super::property_bag;
use super::stop_signal::{Stop, StopSignal};
use super::topics::{self, Feature, Inbound};
use super::twin;
use crate::hub::connections::{MethodRequestOut, Outbound, Registration, OUTBOUND_QUEUE};
use crate::hub::methods::MethodAnswer;
use crate::hub::{AppendLane, HubContext};
use crate::telemetry::{self, DeviceMessage};
use subscriptions::subscribes_methods;

mod subscriptions;

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
    /// The TLS client certificate, if one was presented.
    pub client_cert: Option<CertificateDer<'static>>,
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
    /// Metric handles, looked up once per connection rather than once per message.
    puback_seconds: metrics::Histogram,
    d2c_bytes: metrics::Counter,
}

fn keep_alive_timeout(keep_alive: u16) -> Option<Duration> {
    (keep_alive > 0)
        .then(|| Duration::from_millis(keep_alive as u64 * 1500).min(MAX_KEEP_ALIVE_TIMEOUT))
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
        Box::pin(finish(&conn.ctx, &conn.auth, &registration)).await;
    }
}

/// Takes a value out of its box and frees the box.
fn unbox<T>(boxed: Box<T>) -> T {
    *boxed
}

/// What an accepted CONNECT leaves for the rest of the connection.
struct Opened<IO> {
    conn: Connection<IO>,
    registration: Registration,
    /// The Will: topic, payload and retain flag.
    will: Option<(String, Vec<u8>, bool)>,
    keep_alive: Option<Duration>,
    /// The open-connections gauge of this transport.
    open: metrics::Gauge,
}

/// Reads and answers the CONNECT: throttle, authentication, session; `None` when the
/// connection ends here (refused, or the client went away).
async fn open<IO>(io: IO, peer: PeerInfo, ctx: HubContext) -> Option<Box<Opened<IO>>>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Buffers start small and grow with the traffic, so an idle device costs little; writes
    // are still flushed in batches of up to WRITE_BATCH bytes.
    let mut framed = Framed::with_capacity(io, MqttCodec::new(MAX_PACKET), BUFFER_START);
    framed.set_backpressure_boundary(WRITE_BATCH);
    let connect = match tokio::time::timeout(ctx.timeouts.mqtt_connect, framed.next()).await {
        Ok(Some(Ok(VariablePacket::ConnectPacket(c)))) => c,
        Ok(Some(Ok(other))) => {
            tracing::debug!(peer = %peer.addr, packet = ?other, "first packet was not CONNECT");
            return None;
        }
        Ok(Some(Err(e))) => {
            tracing::debug!(peer = %peer.addr, error = %e, "malformed first packet");
            return None;
        }
        Ok(None) => return None,
        Err(_) => {
            tracing::info!(peer = %peer.addr, transport = peer.transport, "no complete CONNECT within {:?}: closed", ctx.timeouts.mqtt_connect);
            return None;
        }
    };
    // A wrong protocol version, or the device-connection throttle (THR-1): a throttled CONNECT
    // is CONNACK 3, which the SDKs retry with back-off.
    let refusal = if connect.protocol_level() != ProtocolLevel::Version311
        || connect.protocol_name() != "MQTT"
    {
        Some(ConnectReturnCode::UnacceptableProtocolVersion)
    } else if let Err(t) = ctx
        .throttles
        .admit(crate::hub::throttle::Operation::DeviceConnection)
        .await
    {
        tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), retry_after = ?t.retry_after, "CONNECT throttled");
        Some(ConnectReturnCode::ServiceUnavailable)
    } else {
        None
    };
    if let Some(code) = refusal {
        let _ = framed.send(ConnackPacket::new(false, code)).await;
        return None;
    }
    let auth = match authenticate(
        &ctx,
        connect.client_identifier(),
        connect.user_name(),
        connect.password(),
        peer.client_cert.as_ref(),
    )
    .await
    {
        Ok(a) => a,
        Err(refusal) => {
            tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), %refusal, "CONNECT refused");
            let _ = framed.send(ConnackPacket::new(false, refusal.code())).await;
            return None;
        }
    };
    // A device refused for D2C excess stays away for its retry-after (THR-2).
    if let Some(wait) = ctx.throttles.d2c.penalty(&auth.who.device_id) {
        tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), retry_after = ?wait, "CONNECT refused: the device is held back for D2C excess");
        let _ = framed
            .send(ConnackPacket::new(
                false,
                ConnectReturnCode::ServiceUnavailable,
            ))
            .await;
        return None;
    }
    let client_id = auth.who.client_id();
    let (outbound_tx, outbound) = mpsc::channel(OUTBOUND_QUEUE);
    let registration = ctx.connections.register(&auth.who, outbound_tx);

    let persistent = !connect.clean_session();
    // The session and the "connected" state in one trip to the store: each trip is two thread
    // wake-ups, which cost a connect more than the engine work itself (issue 19).
    let stored = {
        let id = client_id.clone();
        let who = auth.who.clone();
        let now = ctx.clock.now();
        ctx.store
            .run(move |s| {
                let session = if persistent {
                    s.load_session(&id)?
                } else {
                    s.delete_session(&id)?;
                    None
                };
                stage_connection(s, &who, true, now);
                Ok::<_, ferrohub_engine::StorageError>(session)
            })
            .await
    };
    let (session, present) = match stored {
        Ok(Some(s)) => (s, true),
        Ok(None) => (SessionRecord::default(), false),
        Err(e) => {
            tracing::error!(%client_id, error = %e, "cannot load session");
            let _ = framed
                .send(ConnackPacket::new(
                    false,
                    ConnectReturnCode::ServiceUnavailable,
                ))
                .await;
            return None;
        }
    };
    let settle_mode = SettleMode::from_username(connect.user_name());
    let will = connect
        .will()
        .map(|(topic, payload)| (topic.to_string(), payload.to_vec(), connect.will_retain()));
    if framed
        .send(ConnackPacket::new(
            present,
            ConnectReturnCode::ConnectionAccepted,
        ))
        .await
        .is_err()
    {
        finish(&ctx, &auth, &registration).await;
        return None;
    }
    tracing::info!(%client_id, peer = %peer.addr, transport = peer.transport, persistent, "connected");
    let open = metrics::gauge!("ferrohub_connections", "protocol" => "mqtt", "transport" => peer.transport);
    open.increment(1.0);

    registration.methods.store(
        subscribes_methods(&session, &auth.who),
        std::sync::atomic::Ordering::Release,
    );
    let lane = ctx.telemetry_lane();
    let conn = Connection {
        framed,
        ctx,
        auth: auth.clone(),
        session,
        persistent,
        pending: Answers::default(),
        outbound,
        methods_flag: std::sync::Arc::clone(&registration.methods),
        c2d: Delivery::new(
            settle_mode,
            auth.who.device_id.clone(),
            std::sync::Arc::clone(&registration.c2d),
        ),
        lane,
        held: Duration::ZERO,
        last_held: None,
        sender_mark: Default::default(),
        puback_seconds: metrics::histogram!("ferrohub_mqtt_puback_seconds"),
        d2c_bytes: metrics::counter!("ferrohub_d2c_bytes_total"),
    };
    Some(Box::new(Opened {
        conn,
        registration,
        will,
        keep_alive: keep_alive_timeout(connect.keep_alive()),
        open,
    }))
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
                            if let Some(end) = Box::pin(self.on_packet(p)).await { return end; }
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
        let mut next = Some(first);
        while let Some(answer) = next {
            let packets = match self.packets_of(answer, now) {
                Ok(packets) => packets,
                Err(e) => return Some(End::StoreFailed(e)),
            };
            for p in packets {
                if let Some(end) = self.stalling(|f| f.feed(p)).await {
                    return Some(end);
                }
            }
            next = self.pending.try_next(&self.lane);
        }
        self.stalling(|f| SinkExt::<VariablePacket>::flush(f)).await
    }

    /// The packets an answer sends; a durable telemetry message is counted here.
    fn packets_of(&self, answer: Answer, now: Instant) -> Result<Packets, String> {
        let packets = match answer {
            Answer::Telemetry {
                pkid,
                received,
                admitted,
                result,
            } => {
                result?;
                self.puback_seconds
                    .record(now.saturating_duration_since(received).as_secs_f64());
                self.lane.durable(now.saturating_duration_since(admitted));
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
        metrics::counter!("ferrohub_mqtt_idle_buffer_releases_total").increment(1);
        true
    }

    async fn on_packet(&mut self, packet: VariablePacket) -> Option<End> {
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
        match inbound {
            Inbound::Telemetry { bag } => {
                if let Some(end) = self.admit_telemetry(p.payload().len()).await {
                    return Some(end);
                }
                let received = Instant::now();
                let now = self.ctx.clock.now();
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
                // Waits here, suspending only this connection, while the hub admits no more
                // writes (a stalled disk); then the append proceeds behind the seam.
                let module_id = self.auth.who.module_id.clone();
                let waited = self
                    .ctx
                    .append_telemetry_in_order(&self.lane, vec![event], module_id, now)
                    .await;
                let admitted = if waited { Instant::now() } else { received };
                self.pending.push_telemetry(pkid, received, admitted);
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
            let Ok(packets) = self.packets_of(answer, now) else {
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
        self.d2c_bytes.increment(bytes as u64);
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
                let name = percent_encoding::utf8_percent_encode(
                    &method,
                    percent_encoding::NON_ALPHANUMERIC,
                );
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
