//! A follower's listeners: every connection a follower accepts on the HTTPS, MQTT or AMQP port
//! is forwarded, byte for byte, to the same service of the writer (the lease's [`Holder`]), so
//! a client reaches the hub through any node's address. TLS runs end to end between the
//! client and the writer: the follower never sees a key, a token or a client certificate, and
//! X.509 authentication and SNI work as on the writer itself.
//!
//! # Invariants
//! - A connection is forwarded to the holder the lease named at most [`HOLDER_FRESH`] ago;
//!   when that connect fails the lease is read again and the connect tried once more. Until
//!   the lease names another holder (it may name none, or be unreadable, while NATS has no
//!   majority), the holder last read stands. A node
//!   that finds itself named (it took the lease and is catching up) forwards nothing: the
//!   client's connection is closed and its SDK retries, by which time the node listens itself.
//! - Forwarded connections outlive the listeners: stopping the relay (the node is about to
//!   serve as the writer) closes only the listening sockets. A forwarded connection ends when
//!   either side closes it; a writer that dies ends all it held, as it would without a relay.
//! - At most [`MAX_FORWARDED`] connections are forwarded at once (each holds two descriptors);
//!   beyond that a new connection waits in the accept queue.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::lease::{current_holder, Holder};
use super::Link;

/// How long a lease read is used for new connections before it is read again.
const HOLDER_FRESH: Duration = Duration::from_secs(1);
/// The most connections one follower forwards at once.
const MAX_FORWARDED: usize = 9_000;
/// How long a connect to the writer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Which of the writer's listeners a follower's listener forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Https,
    Mqtt,
    Amqp,
}

impl Service {
    fn port(self, holder: &Holder) -> u16 {
        match self {
            Service::Https => holder.https,
            Service::Mqtt => holder.mqtt,
            Service::Amqp => holder.amqp,
        }
    }
}

/// The writer as last read from the lease, shared by a relay's listeners.
struct WriterCache {
    link: Link,
    me: String,
    last: parking_lot::Mutex<Option<(Instant, Option<Holder>)>>,
}

impl WriterCache {
    async fn holder(&self, fresh: bool) -> Option<Holder> {
        if !fresh {
            if let Some((at, h)) = self.last.lock().clone() {
                if at.elapsed() < HOLDER_FRESH {
                    return h;
                }
            }
        }
        let read = match current_holder(&self.link).await {
            Ok(Some(h)) => Some(h),
            // No holder named (the lease expired on a replica that cannot reach a majority, or
            // a writer released it), or NATS without a majority: the writer named last may
            // still serve (reads, and writes refused with 503), so keep sending clients there
            // until another is named.
            other => {
                if let Err(e) = other {
                    tracing::debug!(error = %e, "relay: cannot read the writer lease");
                }
                self.last.lock().as_ref().and_then(|(_, h)| h.clone())
            }
        };
        *self.last.lock() = Some((Instant::now(), read.clone()));
        read
    }

    /// A connection to `service` on the writer, reading the lease again once if the cached
    /// writer does not answer.
    async fn connect(&self, service: Service) -> Option<TcpStream> {
        for fresh in [false, true] {
            let Some(holder) = self.holder(fresh).await else {
                continue;
            };
            if holder.node == self.me {
                return None;
            }
            let addr = (holder.host.as_str(), service.port(&holder));
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => return Some(s),
                Ok(Err(e)) => {
                    tracing::debug!(writer = %holder.node, error = %e, "relay: writer refused")
                }
                Err(_) => tracing::debug!(writer = %holder.node, "relay: writer connect timed out"),
            }
        }
        None
    }
}

/// A follower's running listeners.
pub struct Relay {
    stop: CancellationToken,
    listeners: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Forwards every connection accepted on `listeners` until [`Relay::stop`].
    pub fn start(link: Link, listeners: Vec<(Service, TcpListener)>) -> Relay {
        let cache = Arc::new(WriterCache {
            me: link.section.node.clone(),
            link,
            last: parking_lot::Mutex::new(None),
        });
        let stop = CancellationToken::new();
        let slots = Arc::new(Semaphore::new(MAX_FORWARDED));
        let listeners = listeners
            .into_iter()
            .map(|(service, listener)| {
                tokio::spawn(accept_loop(
                    service,
                    listener,
                    Arc::clone(&cache),
                    Arc::clone(&slots),
                    stop.clone(),
                ))
            })
            .collect();
        Relay { stop, listeners }
    }

    /// Closes the listening sockets (forwarded connections go on) and waits until they are.
    pub async fn stop(self) {
        self.stop.cancel();
        for l in self.listeners {
            let _ = l.await;
        }
    }
}

async fn accept_loop(
    service: Service,
    listener: TcpListener,
    cache: Arc<WriterCache>,
    slots: Arc<Semaphore>,
    stop: CancellationToken,
) {
    loop {
        let permit = tokio::select! {
            _ = stop.cancelled() => return,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let client = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::warn!(?service, error = %e, "relay: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let cache = Arc::clone(&cache);
        tokio::spawn(async move {
            let _permit = permit;
            forward(service, client, &cache).await;
        });
    }
}

async fn forward(service: Service, mut client: TcpStream, cache: &WriterCache) {
    let Some(mut writer) = cache.connect(service).await else {
        return;
    };
    // MQTT acknowledgements and method calls are small packets: no Nagle delay on either leg.
    let _ = client.set_nodelay(true);
    let _ = writer.set_nodelay(true);
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut writer).await {
        tracing::trace!(?service, error = %e, "relay: forwarded connection ended");
    }
}
