//! The CONNECT phase of one MQTT connection: throttle, authentication, session, CONNACK.
//!
//! # Invariants
//! - Nothing but CONNECT is accepted, and it must arrive within `timeouts.mqtt_connect`.
//! - CONNACK 0 is sent only after the session is loaded and the device's connected state is
//!   staged; a refused CONNECT gets its return code and the connection closes.

use std::time::Duration;

use ferrohub_engine::sessions::SessionRecord;
use futures::{SinkExt, StreamExt};
use mqtt::control::{ConnectReturnCode, ProtocolLevel};
use mqtt::packet::*;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

use super::subscriptions::subscribes_methods;
use super::{
    Answers, Connection, Delivery, MqttCodec, PeerInfo, Registration, SettleMode, TelemetryBurst,
    BUFFER_START, MAX_KEEP_ALIVE_TIMEOUT, MAX_PACKET, WRITE_BATCH,
};
use crate::hub::connection_state::finish;
use crate::hub::connections::OUTBOUND_QUEUE;
use crate::hub::HubContext;
use crate::mqtt::authenticate::{authenticate, model_id_of};

/// What an accepted CONNECT leaves for the rest of the connection.
pub(super) struct Opened<IO> {
    pub conn: Connection<IO>,
    pub registration: Registration,
    /// The Will: topic, payload and retain flag.
    pub will: Option<(String, Vec<u8>, bool)>,
    pub keep_alive: Option<Duration>,
    /// The open-connections gauge of this transport.
    pub open: metrics::Gauge,
}

/// Reads and answers the CONNECT: throttle, authentication, session; `None` when the
/// connection ends here (refused, or the client went away).
pub(super) async fn open<IO>(io: IO, peer: PeerInfo, ctx: HubContext) -> Option<Box<Opened<IO>>>
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
    // A provisioning user name makes this a connection to the provisioning service (DPS-1).
    if crate::mqtt::provisioning::provisioning_user(connect.user_name()).is_some() {
        let peer = crate::mqtt::provisioning::Peer {
            addr: peer.addr,
            transport: peer.transport,
            client_chain: peer.client_chain,
        };
        crate::mqtt::provisioning::serve(framed, connect, peer, ctx).await;
        return None;
    }
    // A wrong protocol version, the device-connection throttle (THR-1), or a hub that cannot
    // write: a throttled or unserved CONNECT is CONNACK 3, which the SDKs retry with back-off.
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
    } else if ctx.store.is_poisoned() {
        // The hub cannot write (a failed durable write; in a cluster, the log unreachable): a
        // session would fail at its first message, so refuse it now, retryably.
        tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), "CONNECT refused: writes are failing");
        Some(ConnectReturnCode::ServiceUnavailable)
    } else {
        None
    };
    if let Some(code) = refusal {
        return refuse(&mut framed, code).await;
    }
    // A malformed model id refuses the CONNECT before anything is read or stored (PNP-1).
    let model_id = match model_id_of(connect.user_name()) {
        Ok(m) => m,
        Err(refusal) => {
            tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), %refusal, "CONNECT refused");
            return refuse(&mut framed, refusal.code()).await;
        }
    };
    let mut auth = match authenticate(
        &ctx,
        connect.client_identifier(),
        connect.user_name(),
        connect.password(),
        peer.client_cert(),
    )
    .await
    {
        Ok(a) => a,
        Err(refusal) => {
            tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), %refusal, "CONNECT refused");
            return refuse(&mut framed, refusal.code()).await;
        }
    };
    // A device refused for D2C excess stays away for its retry-after (THR-2).
    if let Some(wait) = ctx.throttles.d2c.penalty(&auth.who.device_id) {
        tracing::info!(peer = %peer.addr, client_id = connect.client_identifier(), retry_after = ?wait, "CONNECT refused: the device is held back for D2C excess");
        return refuse(&mut framed, ConnectReturnCode::ServiceUnavailable).await;
    }
    // A model id the identity does not have yet is stored, durably, before the CONNACK; the
    // same one again costs nothing. A connection without one leaves the stored one alone.
    if let Some(model) = model_id.filter(|m| auth.record.model_id.as_ref() != Some(m)) {
        let call = crate::hub::calls::SetModelId {
            device_id: auth.who.device_id.to_string(),
            module_id: auth.who.module().map(str::to_string),
            model_id: model.clone(),
        };
        let stored = ctx.write(call).await;
        if let Err(e) = stored {
            tracing::warn!(client_id = connect.client_identifier(), error = %e, "cannot store the model id; CONNECT refused");
            return refuse(&mut framed, ConnectReturnCode::ServiceUnavailable).await;
        }
        tracing::info!(client_id = connect.client_identifier(), model_id = %model, "Plug and Play model id stored");
        auth.record.model_id = Some(model);
    }
    let client_id = auth.who.client_id();
    let (outbound_tx, outbound) = mpsc::channel(OUTBOUND_QUEUE);
    let registration = ctx.connections.register(&auth.who, outbound_tx);

    let persistent = !connect.clean_session();
    // The session and the "connected" state in one call, made in place when nothing in it has
    // to wait: a trip to a blocking thread is two thread wake-ups, which cost a connect more
    // than the engine work itself (issue 19). The state is the call's one write, and its last.
    let stored = {
        let call = crate::hub::calls::OpenSession {
            who: auth.who.clone(),
            persistent,
            connection: crate::hub::connection_state::connection_ref(&ctx, &registration),
            now: ctx.clock.now(),
        };
        ctx.write(call).await
    };
    let (session, present) = match stored {
        Ok(Some(s)) => (s, true),
        Ok(None) => (SessionRecord::default(), false),
        Err(e) => {
            tracing::error!(%client_id, error = %e, "cannot load session");
            return refuse(&mut framed, ConnectReturnCode::ServiceUnavailable).await;
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
        finish(&ctx, &auth.who, &registration).await;
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
        burst: TelemetryBurst::default(),
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
        d2c_bytes: metrics::counter!("ferrohub_d2c_bytes_total"),
        activity: Default::default(),
    };
    Some(Box::new(Opened {
        conn,
        registration,
        will,
        keep_alive: keep_alive_timeout(connect.keep_alive()),
        open,
    }))
}

fn keep_alive_timeout(keep_alive: u16) -> Option<Duration> {
    (keep_alive > 0)
        .then(|| Duration::from_millis(keep_alive as u64 * 1500).min(MAX_KEEP_ALIVE_TIMEOUT))
}

/// Answers a refused CONNECT with `code`; the connection then closes.
async fn refuse<IO, T>(framed: &mut Framed<IO, MqttCodec>, code: ConnectReturnCode) -> Option<T>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    // The client may be gone already; the connection closes either way.
    let _ = framed.send(ConnackPacket::new(false, code)).await;
    None
}
