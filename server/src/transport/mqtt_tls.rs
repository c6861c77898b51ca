//! MQTT over TLS (port 8883): TLS 1.2 and 1.3, a client certificate asked for but optional
//! (X.509 devices present one; SAS devices do not), then the MQTT connection. The TLS stream is
//! the [`LeanTlsStream`], which frees its buffers while a device is idle.

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accept::accept_tls_loop;
use super::lean_tls::LeanTlsAcceptor;
use crate::hub::HubContext;
use crate::mqtt::connection::{self, PeerInfo};

pub async fn serve(
    listener: TcpListener,
    max_connections: usize,
    acceptor: LeanTlsAcceptor,
    ctx: HubContext,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    accept_tls_loop(
        listener,
        acceptor,
        ctx.timeouts.tls_handshake,
        max_connections,
        shutdown,
        tracker,
        "MQTT",
        move |tls, peer, shutdown| {
            let client_chain = tls
                .peer_certificates()
                .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default();
            let info = PeerInfo {
                addr: peer,
                transport: "mqtt-tls",
                client_chain,
            };
            connection::run(tls, info, ctx.clone(), shutdown)
        },
    )
    .await
}
