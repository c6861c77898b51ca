//! The accept loop every TCP listener uses: at most `max_connections` connections are served per
//! listener, and one accepted beyond that is closed at once (counted in
//! `ferrohub_connections_refused_total`); accept errors back off (1 ms to 1 s) instead of
//! spinning; on shutdown the loop stops accepting and returns. [`accept_tls_loop`]
//! adds the TLS handshake the MQTT and AMQP listeners share, cut off at its timeout, with
//! tokio-rustls or with the [`LeanTlsAcceptor`] (see [`TlsHandshake`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lean_tls::{LeanTlsAcceptor, LeanTlsStream};

/// A server TLS handshake on an accepted TCP connection.
pub trait TlsHandshake: Send + Sync + 'static {
    type Stream: Send + 'static;
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl TlsHandshake for TlsAcceptor {
    type Stream = TlsStream<TcpStream>;
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Stream>> + Send {
        self.accept(tcp)
    }
}

impl TlsHandshake for LeanTlsAcceptor {
    type Stream = LeanTlsStream;
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Stream>> + Send {
        self.accept(tcp)
    }
}

pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    max_connections: usize,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    handle: F,
) where
    F: Fn(TcpStream, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(max_connections));
    let mut backoff = Duration::from_millis(1);
    let mut last_warning: Option<Instant> = None;
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => { backoff = Duration::from_millis(1); x }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; backing off");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        // At the limit a new connection is closed at once: the client learns it now and retries
        // with its back-off, instead of waiting in the listen backlog for a slot.
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            metrics::counter!("ferrohub_connections_refused_total", "reason" => "limit")
                .increment(1);
            if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                tracing::warn!(%peer, max_connections, "connection limit reached: refusing new connections");
                last_warning = Some(Instant::now());
            }
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        // Boxed: an async block that awaits a future it captured keeps two copies of it (the
        // capture and the awaited state), which doubled every connection's task.
        let fut = Box::pin(handle(tcp, peer));
        tracker.spawn(async move {
            let _permit = permit;
            fut.await;
        });
    }
}

/// [`accept_loop`] with a TLS handshake (within `handshake_timeout`, however slowly the client
/// sends) before `protocol` gets the stream; `name` labels the failures in the log.
#[allow(clippy::too_many_arguments)]
pub async fn accept_tls_loop<A, F, Fut>(
    listener: TcpListener,
    acceptor: A,
    handshake_timeout: Duration,
    max_connections: usize,
    shutdown: CancellationToken,
    tracker: TaskTracker,
    name: &'static str,
    protocol: F,
) where
    A: TlsHandshake,
    F: Fn(A::Stream, SocketAddr, CancellationToken) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let acceptor = Arc::new(acceptor);
    let inner_shutdown = shutdown.clone();
    accept_loop(
        listener,
        max_connections,
        shutdown,
        tracker,
        move |tcp, peer| {
            let (acceptor, protocol, shutdown) = (
                Arc::clone(&acceptor),
                protocol.clone(),
                inner_shutdown.clone(),
            );
            async move {
                // The stream is moved into the protocol's future in a scope of its own: a
                // result still in scope across the await would keep its room in the task.
                let serving = {
                    match tokio::time::timeout(handshake_timeout, acceptor.handshake(tcp)).await {
                        Ok(Ok(tls)) => protocol(tls, peer, shutdown),
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "{name} TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::info!(%peer, "{name} TLS handshake not finished in {handshake_timeout:?}: closed");
                            return;
                        }
                    }
                };
                serving.await
            }
        },
    )
    .await
}
