//! An AMQP 1.0 client connection over TLS (fe2o3-amqp) for the AMQP benchmarks.

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::Connection;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Connects over TCP and TLS (no Nagle: the benchmarks measure latency) and opens the AMQP
/// connection with `sasl`.
pub async fn open(
    tls: &TlsConnector,
    host: &str,
    port: u16,
    container_id: &str,
    sasl: SaslProfile,
) -> anyhow::Result<ConnectionHandle<()>> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    let stream = tls
        .connect(ServerName::try_from(host.to_string())?, tcp)
        .await?;
    Ok(Connection::builder()
        .container_id(container_id)
        .hostname(host)
        .sasl_profile(sasl)
        .open_with_stream(stream)
        .await?)
}
