//! AMQP over TLS (port 5671, AMQ-1): TLS 1.2 and 1.3 with the hub's server certificate, then
//! the AMQP connection (SASL first).

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accept::accept_tls_loop;
use crate::amqp;
use crate::hub::HubContext;

/// Service back-ends hold few connections; the rest of the process's files go to devices.
pub const MAX_CONNECTIONS: usize = 1_000;

pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ctx: HubContext,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    accept_tls_loop(
        listener,
        acceptor,
        ctx.timeouts.tls_handshake,
        MAX_CONNECTIONS,
        shutdown,
        tracker,
        "AMQP",
        move |tls, peer, shutdown| {
            // The client certificate: X.509 provisioning over AMQP sends no SASL at all.
            let chain = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default();
            amqp::serve(tls, peer, chain, ctx.clone(), shutdown)
        },
    )
    .await
}
