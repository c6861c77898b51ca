//! The HTTPS listener: TLS accept under a timeout, then HTTP/1.1 served by hyper with the warp
//! route table (the REST API and MQTT over WebSocket share port 443). Request heads must arrive
//! within `timeouts.http_headers`.
//!
//! Each request carries the client's address and the shutdown signal in its extensions, so
//! upgraded WebSocket connections know both. On shutdown the listener stops accepting and open
//! HTTP connections finish their in-flight request.

use std::net::SocketAddr;
use std::time::Duration;

use hyper::service::Service;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use warp::filters::BoxedFilter;

use super::accept::accept_loop;
use super::ws::{PeerAddr, ShutdownSignal};
use crate::config::TimeoutsSection;
use crate::x509::PeerChain;

/// Most concurrent HTTPS connections (WebSocket devices included).
const MAX_CONNECTIONS: usize = 2048;

pub async fn serve(
    listener: TcpListener,
    timeouts: TimeoutsSection,
    acceptor: TlsAcceptor,
    routes: BoxedFilter<(warp::reply::Response,)>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let inner = shutdown.clone();
    accept_loop(
        listener,
        MAX_CONNECTIONS,
        shutdown,
        tracker,
        move |tcp, peer| {
            handle(
                tcp,
                peer,
                timeouts,
                acceptor.clone(),
                routes.clone(),
                inner.clone(),
            )
        },
    )
    .await
}

async fn handle(
    tcp: TcpStream,
    peer: SocketAddr,
    timeouts: TimeoutsSection,
    acceptor: TlsAcceptor,
    routes: BoxedFilter<(warp::reply::Response,)>,
    shutdown: CancellationToken,
) {
    let tls = match tokio::time::timeout(timeouts.tls_handshake, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "HTTPS TLS handshake not finished in {:?}: closed", timeouts.tls_handshake);
            return;
        }
    };
    // The client certificate chain (X.509 provisioning over HTTPS, MQTT over WebSocket).
    let chain = PeerChain(std::sync::Arc::new(
        tls.get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    ));
    let warp_service = warp::service(routes);
    let signal = ShutdownSignal(shutdown.clone());
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::Body>| {
        req.extensions_mut().insert(PeerAddr(peer));
        req.extensions_mut().insert(chain.clone());
        req.extensions_mut().insert(signal.clone());
        let mut svc = warp_service.clone();
        async move { svc.call(req).await }
    });
    // The header timeout runs from when the connection waits for a request head, so it also
    // ends idle keep-alive connections (clients reopen them) and slow-loris clients alike.
    let conn = hyper::server::conn::Http::new()
        .http1_only(true)
        .http1_header_read_timeout(timeouts.http_headers)
        .serve_connection(tls, service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r { tracing::debug!(%peer, error = %e, "HTTPS connection ended with an error"); }
        }
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(10), conn).await;
        }
    }
}
