//! A minimal MQTT 3.1.1 client over TLS for load generation and tests: CONNECT, QoS 0/1
//! PUBLISH with PUBACK tracking, SUBSCRIBE, DISCONNECT.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use ferrohub_server::mqtt::codec::MqttCodec;
use futures::{SinkExt, StreamExt};
use mqtt::control::ConnectReturnCode;
use mqtt::packet::*;
use mqtt::TopicName;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_util::codec::Framed;

pub type Conn = Framed<TlsStream<TcpStream>, MqttCodec>;

/// A TLS client configuration trusting one CA file (PEM).
pub fn tls_connector(ca_pem: &std::path::Path) -> anyhow::Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca_pem).with_context(|| format!("reading {}", ca_pem.display()))?;
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Connects and completes CONNECT/CONNACK.
pub async fn connect(
    tls: &TlsConnector,
    host: &str,
    port: u16,
    client_id: &str,
    username: Option<String>,
    password: Option<String>,
    keep_alive: u16,
) -> anyhow::Result<Conn> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(host.to_string())?;
    let stream = tls.connect(name, tcp).await?;
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
