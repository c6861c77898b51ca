//! A minimal MQTT 3.1.1 client for load generation and tests: CONNECT, QoS 0/1 PUBLISH with
//! PUBACK tracking, SUBSCRIBE, DISCONNECT; over TLS/TCP, over QUIC (one bidirectional
//! stream, ALPN `mqtt`, as docs/mqtt.md describes) or over WebSocket.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use ferrohub_server::mqtt::codec::MqttCodec;
use ferrohub_server::transport::quic_tail_probe::TailProbed;
use futures::{SinkExt, StreamExt};
use mqtt::control::ConnectReturnCode;
use mqtt::packet::*;
use mqtt::TopicName;
use quinn::crypto::rustls::QuicClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_util::codec::Framed;

/// A byte stream an MQTT connection runs on.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

pub type Conn = Framed<Box<dyn Io>, MqttCodec>;

fn roots(ca_pem: &std::path::Path) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca_pem).with_context(|| format!("reading {}", ca_pem.display()))?;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert?)?;
    }
    Ok(roots)
}

/// A TLS client configuration trusting one CA file (PEM).
pub fn tls_connector(ca_pem: &std::path::Path) -> anyhow::Result<TlsConnector> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots(ca_pem)?)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// A TLS client configuration trusting one CA file (PEM) that presents a client certificate:
/// `chain` (PEM, the leaf first) and its `key` (PEM, PKCS#8 or SEC1), as an X.509 device does.
pub fn tls_connector_with_identity(
    ca_pem: &std::path::Path,
    chain: &std::path::Path,
    key: &std::path::Path,
) -> anyhow::Result<TlsConnector> {
    let chain_pem = std::fs::read(chain).with_context(|| format!("reading {}", chain.display()))?;
    let certs = rustls_pemfile::certs(&mut chain_pem.as_slice()).collect::<Result<Vec<_>, _>>()?;
    let key_pem = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_slice())?
        .with_context(|| format!("no private key in {}", key.display()))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots(ca_pem)?)
    .with_client_auth_cert(certs, key)?;
    Ok(TlsConnector::from(Arc::new(config)))
}

/// How a client reaches the broker.
#[derive(Clone)]
pub enum Dialer {
    /// TLS over TCP.
    Tls(TlsConnector),
    /// QUIC: connections spread over a few shared client endpoints (see [`Dialer::quic`]).
    Quic(Arc<QuicEndpoints>),
    /// WebSocket (`/$iothub/websocket`, subprotocol `mqtt`) over TLS, on the HTTPS port.
    Ws(TlsConnector),
}

impl Dialer {
    /// QUIC trusting one CA file (PEM): TLS 1.3, ALPN `mqtt`; with `tail_probe`, each
    /// connection's quiet periods end with a tail loss probe (the hub's, which it accepts).
    pub fn quic(ca_pem: &std::path::Path, tail_probe: bool) -> anyhow::Result<Dialer> {
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"mqtt".to_vec()];
        let crypto = QuicClientConfig::try_from(tls).map_err(|e| anyhow!("QUIC TLS: {e}"))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        config.transport_config(Arc::new(quic_transport()));
        let endpoints = (0..QUIC_ENDPOINTS)
            .map(|_| {
                let mut endpoint = quinn::Endpoint::client(([0u16; 8], 0).into())
                    .or_else(|_| quinn::Endpoint::client(([0, 0, 0, 0], 0).into()))?;
                endpoint.set_default_client_config(config.clone());
                Ok(endpoint)
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Dialer::Quic(Arc::new(QuicEndpoints {
            endpoints,
            next: AtomicUsize::new(0),
            tail_probe,
        })))
    }

    /// Opens the byte stream to `host:port` (`host` also names the certificate).
    pub async fn open(&self, host: &str, port: u16) -> anyhow::Result<Box<dyn Io>> {
        let name = ServerName::try_from(host.to_string())?;
        match self {
            Dialer::Tls(tls) => {
                let tcp = TcpStream::connect((crate::dial::address_for(host), port)).await?;
                tcp.set_nodelay(true)?;
                Ok(Box::new(tls.connect(name, tcp).await?))
            }
            Dialer::Ws(tls) => Ok(Box::new(crate::ws::open(tls, host, port).await?)),
            Dialer::Quic(quic) => {
                let addr = tokio::net::lookup_host((crate::dial::address_for(host), port))
                    .await?
                    .next()
                    .ok_or_else(|| anyhow!("{host} has no address"))?;
                let endpoint = quic.pick();
                let addr = if endpoint.local_addr()?.is_ipv6() {
                    to_dual_stack(addr)
                } else {
                    addr
                };
                let conn = endpoint.connect(addr, host)?.await?;
                let (send, recv) = conn.open_bi().await?;
                // The streams keep the connection (and its endpoint's driver) alive.
                if quic.tail_probe {
                    Ok(Box::new(tokio::io::join(
                        recv,
                        TailProbed::new(&conn, send),
                    )))
                } else {
                    Ok(Box::new(tokio::io::join(recv, send)))
                }
            }
        }
    }
}

/// Client endpoints (UDP sockets) that simulated devices share. A real device has a socket of
/// its own; a thousand sockets each with its own driver task in one process cost the load
/// generator enough CPU, on two cores shared with the hub, to add tens of milliseconds of
/// scheduling jitter to every round trip QUIC measures (TCP's round trips are timed in the
/// kernel and do not see it). The hub tells connections apart by connection ID either way.
pub struct QuicEndpoints {
    endpoints: Vec<quinn::Endpoint>,
    next: AtomicUsize,
    tail_probe: bool,
}

const QUIC_ENDPOINTS: usize = 8;

impl QuicEndpoints {
    fn pick(&self) -> &quinn::Endpoint {
        &self.endpoints[self.next.fetch_add(1, Ordering::Relaxed) % self.endpoints.len()]
    }
}

/// The devices' transport settings: they ask the hub, through the ACK frequency extension, to
/// acknowledge within 5 ms instead of the default 25 ms (the padding in every probe timeout).
fn quic_transport() -> quinn::TransportConfig {
    let mut ack = quinn::AckFrequencyConfig::default();
    ack.max_ack_delay(Some(Duration::from_millis(5)));
    let mut transport = quinn::TransportConfig::default();
    transport.ack_frequency_config(Some(ack));
    transport
}

/// An endpoint bound to `[::]` dials an IPv4 address in its mapped form.
fn to_dual_stack(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    match addr {
        std::net::SocketAddr::V4(v4) => (v4.ip().to_ipv6_mapped(), v4.port()).into(),
        v6 => v6,
    }
}

impl From<TlsConnector> for Dialer {
    fn from(tls: TlsConnector) -> Self {
        Dialer::Tls(tls)
    }
}

/// Connects and completes CONNECT/CONNACK.
pub async fn connect(
    dialer: &Dialer,
    host: &str,
    port: u16,
    client_id: &str,
    username: Option<String>,
    password: Option<String>,
    keep_alive: u16,
) -> anyhow::Result<Conn> {
    let stream = dialer.open(host, port).await?;
    let mut conn = Framed::new(stream, MqttCodec::new(1 << 20));
    let mut c = ConnectPacket::new(client_id);
    c.set_clean_session(false);
    c.set_keep_alive(keep_alive);
    c.set_user_name(username);
    c.set_password(password);
    conn.send(c).await?;
    match tokio::time::timeout(Duration::from_secs(30), conn.next()).await {
        Ok(Some(Ok(VariablePacket::ConnackPacket(ack)))) => {
            if ack.connect_return_code() != ConnectReturnCode::ConnectionAccepted {
                bail!("CONNACK refused: {:?}", ack.connect_return_code());
            }
            Ok(conn)
        }
        Ok(other) => Err(anyhow!("expected CONNACK, got {other:?}")),
        Err(_) => Err(anyhow!("no CONNACK within 30 s")),
    }
}

pub fn publish(topic: &str, pkid: Option<u16>, payload: Vec<u8>) -> anyhow::Result<PublishPacket> {
    let qos = match pkid {
        Some(id) => QoSWithPacketIdentifier::Level1(id),
        None => QoSWithPacketIdentifier::Level0,
    };
    Ok(PublishPacket::new(
        TopicName::new(topic.to_string()).map_err(|e| anyhow!("{e:?}"))?,
        qos,
        payload,
    ))
}
