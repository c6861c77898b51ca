//! MQTT over TLS (port 8883): TLS 1.2 and 1.3, a client certificate asked for but optional
//! (X.509 devices present one; SAS devices do not), then the MQTT connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accept::accept_loop;
use crate::hub::HubContext;
use crate::mqtt::connection::{self, PeerInfo};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The process may hold about 20,000 files; MQTT gets most of them.
pub const MAX_CONNECTIONS: usize = 16_000;

pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ctx: HubContext,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let acceptor = Arc::new(acceptor);
    let inner_shutdown = shutdown.clone();
    accept_loop(
        listener,
        MAX_CONNECTIONS,
        shutdown,
        tracker,
        move |tcp, peer| {
            handle(
                tcp,
                peer,
                Arc::clone(&acceptor),
                ctx.clone(),
                inner_shutdown.clone(),
            )
        },
    )
    .await
}

async fn handle(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: Arc<TlsAcceptor>,
    ctx: HubContext,
    shutdown: CancellationToken,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "MQTT TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let client_cert = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned());
    connection::run(
        tls,
        PeerInfo {
            addr: peer,
            transport: "mqtt-tls",
            client_cert,
        },
        ctx,
        shutdown,
    )
    .await;
}
