//! MQTT over QUIC (MQT-1, issue 17): a UDP endpoint (quinn, the hub's certificate, TLS 1.3,
//! ALPN `mqtt`) where each QUIC connection carries one MQTT 3.1.1 connection on its first
//! client-opened bidirectional stream, byte for byte as over TCP (EMQX's single-stream mode;
//! docs/mqtt.md). The MQTT layer gets the stream as any other transport's.
//!
//! # Invariants
//! - One MQTT connection per QUIC connection: the client may open one bidirectional stream
//!   and no unidirectional ones; the QUIC connection closes when the MQTT connection ends.
//! - A client certificate presented in the handshake is the MQTT connection's, as over TLS.
//! - Connection migration is on: a client whose address or port changes keeps its connection
//!   and MQTT session (quinn validates the new path).
//! - A connection's quiet periods end with a tail loss probe when the device takes DATAGRAMs
//!   ([`TailProbed`]); DATAGRAMs the device sends are dropped unread.
//! - Limits: at most [`MAX_CONNECTIONS`] connections; while more than
//!   [`RETRY_ABOVE_HANDSHAKES`] handshakes are in flight, an unvalidated address gets a
//!   stateless Retry first (a flood of spoofed Initials costs the hub no state); the idle
//!   timeout is above the longest MQTT keep-alive, which the MQTT layer enforces itself.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicServerConfig;
use quinn::{
    AckFrequencyConfig, Endpoint, EndpointConfig, IdleTimeout, Incoming, ServerConfig,
    TransportConfig, VarInt,
};
use rustls::pki_types::CertificateDer;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::hub::HubContext;
use crate::mqtt::connection::{self, PeerInfo};
use crate::tls::{self, ServerCertificate};
use crate::transport::quic_tail_probe::TailProbed;

/// QUIC connections hold no file descriptor, but each holds memory and a session.
pub const MAX_CONNECTIONS: usize = 16_000;
/// Handshakes in flight above which unvalidated clients are sent a Retry.
pub const RETRY_ABOVE_HANDSHAKES: usize = 256;
/// The UDP socket's receive and send buffers.
const SOCKET_BUFFER: usize = 4 << 20;
/// How long an ended MQTT connection's QUIC connection waits for the client to close it.
const LINGER: Duration = Duration::from_secs(2);
/// Above IoT Hub's longest MQTT keep-alive (1,177 s, times 1.5).
const IDLE_TIMEOUT: Duration = Duration::from_secs(1_800);
/// The ACK delay asked of devices that support the ACK frequency extension.
const ACK_DELAY: Duration = Duration::from_millis(5);
/// DATAGRAMs received and never read (devices' tail loss probes) a connection keeps at most,
/// in bytes counted as quinn does (payload plus its handle); older ones are dropped. One
/// larger than this closes the connection: MQTT over QUIC gives DATAGRAMs no meaning.
const DATAGRAM_WINDOW: usize = 256;

/// Why the QUIC listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("QUIC TLS configuration: {0}")]
    Crypto(String),
    #[error("cannot listen on {addr} (UDP): {reason}")]
    Bind { addr: SocketAddr, reason: String },
}

fn server_config(certificate: &Arc<ServerCertificate>) -> Result<ServerConfig, QuicError> {
    let crypto = QuicServerConfig::try_from(tls::mqtt_quic_server_config(certificate)?)
        .map_err(|e| QuicError::Crypto(e.to_string()))?;
    let mut config = ServerConfig::with_crypto(Arc::new(crypto));
    let mut transport = TransportConfig::default();
    transport
        .max_idle_timeout(IdleTimeout::try_from(IDLE_TIMEOUT).ok())
        .max_concurrent_bidi_streams(VarInt::from_u32(1))
        .max_concurrent_uni_streams(VarInt::from_u32(0));
    // A lost PUBACK is found by the probe timeout, which adds the device's maximum ACK delay
    // (25 ms by default). A device that speaks the ACK frequency extension is asked to
    // acknowledge within ACK_DELAY instead; others keep their own.
    let mut ack = AckFrequencyConfig::default();
    ack.max_ack_delay(Some(ACK_DELAY));
    transport.ack_frequency_config(Some(ack));
    // quinn's default window is 1.25 MB per connection, which unread DATAGRAMs would fill.
    transport.datagram_receive_buffer_size(Some(DATAGRAM_WINDOW));
    config.transport_config(Arc::new(transport));
    config.migration(true);
    Ok(config)
}

/// Binds the UDP socket of the endpoint (an IPv6 unspecified address is dual-stack where the
/// host allows).
///
/// # Errors
/// [`QuicError::Bind`].
pub fn bind_socket(addr: SocketAddr) -> Result<std::net::UdpSocket, QuicError> {
    let bind_error = |e: std::io::Error| QuicError::Bind {
        addr,
        reason: e.to_string(),
    };
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(bind_error)?;
    if addr.is_ipv6() {
        socket.set_only_v6(false).map_err(bind_error)?;
    }
    // Every device shares this one socket: the default buffers (about 200 KB) overflow when
    // a thousand devices send at once, and each datagram lost there costs a probe timeout.
    // The kernel caps the sizes at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.bind(&addr.into()).map_err(bind_error)?;
    Ok(socket.into())
}

/// The endpoint on a socket from [`bind_socket`], presenting `certificate`.
///
/// # Errors
/// [`QuicError`] for the certificate or the socket.
pub fn endpoint_on(
    socket: std::net::UdpSocket,
    certificate: &Arc<ServerCertificate>,
) -> Result<Endpoint, QuicError> {
    let addr = socket
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let bind_error = |e: std::io::Error| QuicError::Bind {
        addr,
        reason: e.to_string(),
    };
    let runtime = quinn::default_runtime()
        .ok_or_else(|| bind_error(std::io::Error::other("no async runtime")))?;
    Endpoint::new(
        EndpointConfig::default(),
        Some(server_config(certificate)?),
        socket,
        runtime,
    )
    .map_err(bind_error)
}

/// Accepts QUIC connections until shutdown, each an MQTT connection.
pub async fn serve(
    endpoint: Endpoint,
    ctx: HubContext,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let handshaking = Arc::new(AtomicUsize::new(0));
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => match i { Some(i) => i, None => break },
            () = shutdown.cancelled() => break,
        };
        if !incoming.remote_address_validated()
            && handshaking.load(Ordering::Relaxed) > RETRY_ABOVE_HANDSHAKES
        {
            // Only fails when the address was validated already, checked above.
            let _ = incoming.retry();
            continue;
        }
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            incoming.refuse();
            continue;
        };
        let (ctx, shutdown, handshaking) =
            (ctx.clone(), shutdown.clone(), Arc::clone(&handshaking));
        tracker.spawn(async move {
            let _permit = permit;
            serve_connection(incoming, ctx, shutdown, handshaking).await;
        });
    }
    endpoint.close(VarInt::from_u32(0), b"shutting down");
}

async fn serve_connection(
    incoming: Incoming,
    ctx: HubContext,
    shutdown: CancellationToken,
    handshaking: Arc<AtomicUsize>,
) {
    let remote = incoming.remote_address();
    handshaking.fetch_add(1, Ordering::Relaxed);
    // The QUIC handshake and the client's first stream, within the TLS handshake's limit.
    let setup = tokio::time::timeout(ctx.timeouts.tls_handshake, async {
        let conn = incoming.await?;
        let streams = conn.accept_bi().await?;
        Ok::<_, quinn::ConnectionError>((conn, streams))
    })
    .await;
    handshaking.fetch_sub(1, Ordering::Relaxed);
    let (conn, (send, recv)) = match setup {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            tracing::debug!(peer = %remote, error = %e, "QUIC connection failed before MQTT");
            return;
        }
        Err(_) => {
            tracing::debug!(peer = %remote, "QUIC handshake or first stream timed out");
            return;
        }
    };
    let client_chain = conn
        .peer_identity()
        .and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok())
        .map(|chain| *chain)
        .unwrap_or_default();
    let info = PeerInfo {
        addr: conn.remote_address(),
        transport: "mqtt-quic",
        client_chain,
    };
    let io = tokio::io::join(recv, TailProbed::new(&conn, send));
    connection::run(io, info, ctx, shutdown).await;
    // The stream was finished when it dropped; give what the hub wrote last (a CONNACK
    // refusal, say) a moment to be delivered before the connection closes under it.
    let _ = tokio::time::timeout(LINGER, conn.closed()).await;
    conn.close(VarInt::from_u32(0), b"");
}
