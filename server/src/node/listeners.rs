//! A node's listeners: binding them, serving the hub on them until shutdown, and the drain.
//!
//! # Invariants
//! - Listeners are bound before the hub's services start, so a port in use fails the start
//!   before anything runs.
//! - Shutdown stops accepting first, then waits (up to [`DRAIN_TIMEOUT`]) for open
//!   connections, then closes the store; the operations listener (when it runs) answers
//!   "not ready" for at least [`READINESS_LINGER`] of that.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::Store;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use warp::Filter;

use super::health::ClusterOps;
use super::{
    db_path, event_hubs_connection_string, policy_connection_string,
    provisioning_connection_string, store_config, NodeError, Opened, Services,
};
use crate::clock::Clock;
use crate::config::Config;
use crate::hub::{self, cluster::Cluster};
use crate::rest;
use crate::tls::{self, CertificateFiles, ServerCertificate, TlsPaths};
use crate::transport::lean_tls::LeanTlsAcceptor;
use crate::transport::{amqp_tls, https, mqtt_tls};

/// How long shutdown waits for open connections before closing the store anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// How long the operations listener keeps answering (503) after readiness went false, at
/// least: a drain that ends sooner waits out the rest.
const READINESS_LINGER: Duration = Duration::from_millis(500);

/// Binds a listener; an IPv6 address listens dual-stack (IPV6_V6ONLY off). On a host without
/// IPv6, the unspecified `[::]` falls back to `0.0.0.0` on the same port; any other failure
/// (a port in use, one below 1024 without the capability) is reported as it is.
pub(super) async fn bind(addr: SocketAddr) -> Result<TcpListener, NodeError> {
    match listen(addr) {
        Err(e) if addr.is_ipv6() && addr.ip().is_unspecified() && lacks_ipv6(&e) => {
            let v4 = SocketAddr::from(([0, 0, 0, 0], addr.port()));
            tracing::warn!(%addr, error = %e, fallback = %v4, "no IPv6 here; listening on IPv4 only");
            listen(v4)
        }
        other => other,
    }
    .map_err(|e| NodeError::Bind {
        addr,
        reason: e.to_string(),
    })
}

/// Whether a failed IPv6 bind says the host has no IPv6 (the address family is not supported,
/// or `::` is not an address here), rather than anything else.
fn lacks_ipv6(e: &std::io::Error) -> bool {
    /// Linux's EAFNOSUPPORT.
    const ADDRESS_FAMILY_NOT_SUPPORTED: i32 = 97;
    e.kind() == std::io::ErrorKind::AddrNotAvailable
        || e.raw_os_error() == Some(ADDRESS_FAMILY_NOT_SUPPORTED)
}

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

fn local(l: &TcpListener) -> Result<SocketAddr, NodeError> {
    l.local_addr().map_err(|e| NodeError::Other(e.to_string()))
}

/// The client listeners' sockets, bound before anything else happens: a port in use is
/// found before a new data directory is initialised and its keys are printed.
pub(super) struct Sockets {
    https: TcpListener,
    mqtt: TcpListener,
    amqp: TcpListener,
    quic: std::net::UdpSocket,
}

impl Sockets {
    pub(super) async fn bind(config: &Config) -> Result<Sockets, NodeError> {
        Ok(Sockets {
            https: bind(config.listeners.https).await?,
            mqtt: bind(config.listeners.mqtt).await?,
            amqp: bind(config.listeners.amqp).await?,
            quic: crate::transport::mqtt_quic::bind_socket(config.listeners.mqtt_quic)
                .map_err(|e| NodeError::Other(e.to_string()))?,
        })
    }
}

/// The client listeners, bound, with the certificate they present.
struct Bound {
    https: TcpListener,
    mqtt: TcpListener,
    amqp: TcpListener,
    quic: quinn::Endpoint,
    /// What every listener presents.
    certificate: Arc<ServerCertificate>,
}

impl Bound {
    async fn bind(
        config: &Config,
        paths: &TlsPaths,
        sockets: Option<Sockets>,
    ) -> Result<Bound, NodeError> {
        let sockets = match sockets {
            Some(s) => s,
            None => Sockets::bind(config).await?,
        };
        let certificate = served_certificate(config, paths)?;
        let quic = crate::transport::mqtt_quic::endpoint_on(sockets.quic, &certificate)
            .map_err(|e| NodeError::Other(e.to_string()))?;
        Ok(Bound {
            https: sockets.https,
            mqtt: sockets.mqtt,
            amqp: sockets.amqp,
            quic,
            certificate,
        })
    }
}

/// Logs what certificate is served and warns of host names it does not cover (clients that
/// connect by such a name fail to verify it).
fn announce_certificate(certificate: &ServerCertificate, hub: &HubSettings) {
    let Some(d) = certificate.description() else {
        return;
    };
    let file = certificate.files().chain.display().to_string();
    tracing::info!(
        host_names = ?hub.host_names().collect::<Vec<_>>(),
        %file,
        subject = %d.subject,
        issuer = %d.issuer,
        names = ?d.names,
        expires = %d.not_after,
        "serving certificate"
    );
    for name in hub.host_names().filter(|n| !d.covers(n)) {
        tracing::warn!(
            host_name = name,
            %file,
            "the served certificate does not cover this host name: clients connecting by it will fail TLS verification"
        );
    }
}

/// The configured certificate (`[tls]`), else the one the hub issued itself.
fn served_certificate(
    config: &Config,
    paths: &TlsPaths,
) -> Result<Arc<ServerCertificate>, NodeError> {
    let files = match config.tls.own() {
        Some((chain, key)) => CertificateFiles {
            chain,
            key,
            own: true,
        },
        None => paths.generated(),
    };
    Ok(ServerCertificate::load(files)?)
}

fn print_banner(data_dir: &Path, hub: &HubSettings) {
    println!(
        "Initialised hub {:?} in {}",
        hub.hub_name,
        data_dir.display()
    );
    println!("CA certificate: {}", TlsPaths::new(data_dir).ca().display());
    for p in &hub.policies {
        if let Some(cs) = policy_connection_string(hub, &p.name) {
            println!("{cs}");
        }
    }
    // Event Hubs clients read the built-in endpoint with ServiceConnect.
    if let Some(cs) = event_hubs_connection_string(hub, "service") {
        println!("Event Hubs-compatible endpoint: {cs}");
    }
    if let (Some(cs), Some(p)) = (
        provisioning_connection_string(hub, "provisioningserviceowner"),
        &hub.provisioning,
    ) {
        println!("Provisioning service (ID scope {}): {cs}", p.id_scope);
    }
}

/// Where a node's operations listener comes from.
pub(super) enum Ops {
    /// A single node runs its own while it serves.
    Own,
    /// A cluster node's runs for the node's life; serving attaches the hub to it.
    Cluster(Arc<ClusterOps>),
}

/// Serves `opened` (a single node, or a cluster's writer when `cluster` says so) until
/// `shutdown` is cancelled, then drains and closes the store.
pub(super) async fn serve_store(
    data_dir: &Path,
    config: &Config,
    opened: Opened,
    shutdown: CancellationToken,
    cluster: Option<(Arc<Cluster>, Arc<ClusterOps>)>,
    sockets: Option<Sockets>,
) -> Result<(), NodeError> {
    let (cluster, ops) = match cluster {
        Some((cluster, ops)) => (Some(cluster), Ops::Cluster(ops)),
        None => (None, Ops::Own),
    };
    let Opened {
        store,
        hub,
        first_start,
        clock,
        recovery,
    } = opened;
    let bound = Bound::bind(config, &TlsPaths::new(data_dir), sockets).await?;
    if first_start {
        print_banner(data_dir, &hub);
    }
    let services = Services::start_in(store, hub, config, clock, &shutdown, cluster).await?;
    let recovery = recovery.then(|| {
        tokio::spawn(hub::storage_recovery::run(
            services.ctx.store.clone(),
            hub::storage_recovery::Recovery {
                data_dir: data_dir.to_path_buf(),
                db_dir: db_path(data_dir),
                config: store_config(config),
                indexed_paths: config.query.indexed_paths.clone(),
                probe_bytes: (config.storage.recovery_free_space_mb as usize) << 20,
            },
            shutdown.clone(),
        ))
    });
    serve_services(data_dir, config, bound, services, recovery, ops, shutdown).await
}

/// Serves a cluster follower's hub over its replica's `store` (writes go to the writer)
/// until `shutdown`. `serving` hears the hub's context once it serves.
pub(super) async fn serve_follower(
    data_dir: &Path,
    config: &Config,
    store: Arc<Store>,
    hub: HubSettings,
    cluster: Arc<Cluster>,
    ops: Arc<ClusterOps>,
    serving: impl FnOnce(&hub::HubContext),
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    let bound = Bound::bind(config, &TlsPaths::new(data_dir), None).await?;
    let services = Services::start_in(
        store,
        hub,
        config,
        Clock::system(),
        &shutdown,
        Some(cluster),
    )
    .await?;
    serving(&services.ctx);
    serve_services(
        data_dir,
        config,
        bound,
        services,
        None,
        Ops::Cluster(ops),
        shutdown,
    )
    .await
}

/// Runs the listeners over `services` until `shutdown`, then drains and closes the store.
async fn serve_services(
    data_dir: &Path,
    config: &Config,
    bound: Bound,
    services: Services,
    recovery: Option<tokio::task::JoinHandle<()>>,
    ops: Ops,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    let paths = TlsPaths::new(data_dir);
    let ctx = services.ctx.clone();
    let (https_addr, mqtt_addr) = (local(&bound.https)?, local(&bound.mqtt)?);
    let amqp_addr = local(&bound.amqp)?;
    let quic_addr = bound
        .quic
        .local_addr()
        .map_err(|e| NodeError::Other(format!("QUIC endpoint address: {e}")))?;
    let console_node = crate::console::NodeInfo {
        node: config
            .cluster
            .enabled()
            .then(|| config.cluster.node.clone()),
        started: chrono::Utc::now(),
        history: Arc::default(),
        // The hub's own CA only while it serves the certificate it issued itself.
        ca_file: config.tls.own().is_none().then(|| paths.ca()),
    };
    let readiness = crate::transport::ops::Readiness::default();
    // The ops listener outlives the drain, so readiness can be seen going false.
    let ops_stop = CancellationToken::new();
    let own_ops = if matches!(ops, Ops::Own) {
        let source = Arc::new(crate::transport::ops::HubOps {
            ctx: ctx.clone(),
            readiness: readiness.clone(),
        });
        let (addr, task) = crate::transport::ops::serve(
            config.listeners.metrics,
            source,
            paths.ca(),
            ops_stop.clone(),
        )
        .map_err(|reason| NodeError::Bind {
            addr: config.listeners.metrics,
            reason,
        })?;
        println!("listening metrics={addr}");
        Some(task)
    } else {
        None
    };
    let tracker = TaskTracker::new();
    let listeners = vec![
        tokio::spawn(https::serve(
            bound.https,
            config.timeouts,
            TlsAcceptor::from(tls::server_config(&bound.certificate)?),
            // WebSocket upgrades first, then the console under /console/: the REST table
            // answers every other path.
            crate::transport::ws::routes(ctx.clone())
                .or(crate::console::routes(ctx.clone(), console_node.clone()))
                .unify()
                .or(rest::routes(ctx.clone()))
                .unify()
                .boxed(),
            shutdown.clone(),
            tracker.clone(),
        )),
        tokio::spawn(mqtt_tls::serve(
            bound.mqtt,
            config.listeners.mqtt_max_connections,
            LeanTlsAcceptor::new(tls::server_config(&bound.certificate)?),
            ctx.clone(),
            shutdown.clone(),
            tracker.clone(),
        )),
        tokio::spawn(amqp_tls::serve(
            bound.amqp,
            TlsAcceptor::from(tls::server_config(&bound.certificate)?),
            ctx.clone(),
            shutdown.clone(),
            tracker.clone(),
        )),
        tokio::spawn(crate::transport::mqtt_quic::serve(
            bound.quic,
            ctx.clone(),
            shutdown.clone(),
            tracker.clone(),
        )),
    ];
    announce_certificate(&bound.certificate, &ctx.settings);
    // Online backups on a single node: its control socket, and `POST /backups`.
    let control = match &ops {
        Ops::Own => {
            let backups = crate::backup::OnlineBackups {
                data_dir: data_dir.to_path_buf(),
                directory: config.backup.directory_for(data_dir),
            };
            let _ = ctx.backups.set(backups.clone());
            Some(
                crate::control::serve(ctx.clone(), backups, shutdown.clone()).map_err(|e| {
                    NodeError::Other(format!(
                        "control socket {}: {e}",
                        crate::layout::control_socket(data_dir).display()
                    ))
                })?,
            )
        }
        Ops::Cluster(_) => None,
    };
    let reloads = tokio::spawn(
        Arc::clone(&bound.certificate).watch(config.tls.check_interval, shutdown.clone()),
    );
    // Started once nothing above can fail, so no spell of serving leaves one behind; both end
    // with `shutdown` and are joined before the store closes. Only a follower follows the
    // stored policies: elsewhere every change is this node's own `ChangePolicy`, which
    // replaces them as it answers.
    let policies = ctx.cluster.as_ref().filter(|c| c.is_follower()).map(|_| {
        tokio::spawn(crate::hub::policies::follow_stored(
            ctx.store.clone(),
            Arc::clone(&ctx.policies),
            shutdown.clone(),
        ))
    });
    let history = tokio::spawn(crate::console::history::keep(
        ctx.clone(),
        console_node.history.clone(),
        shutdown.clone(),
    ));
    // Tests and scripts read these lines to learn the bound addresses; https comes last.
    println!("listening mqtt={mqtt_addr}");
    println!("listening amqp={amqp_addr}");
    println!("listening mqtt-quic={quic_addr}");
    println!("listening https={https_addr}");
    tracing::info!(%https_addr, %mqtt_addr, %amqp_addr, "listening");
    readiness.set(true);
    if let Ops::Cluster(ops) = &ops {
        ops.attach(ctx.clone());
    }
    shutdown.cancelled().await;
    readiness.set(false);
    if let Ops::Cluster(ops) = &ops {
        ops.detach();
    }
    let not_ready_since = tokio::time::Instant::now();
    tracing::info!("shutting down: no new connections; draining");
    for t in listeners {
        let _ = t.await;
    }
    services.join().await;
    let _ = reloads.await;
    if let Some(policies) = policies {
        let _ = policies.await;
    }
    let _ = history.await;
    if let Some(control) = control {
        let _ = control.await;
    }
    if let Some(recovery) = recovery {
        let _ = recovery.await;
    }
    tracker.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain timeout; closing anyway");
    }
    ctx.store
        .close()
        .await
        .map_err(|e| NodeError::Other(e.to_string()))?;
    tracing::info!("store closed");
    if let Some(ops) = own_ops {
        // A readiness probe needs a moment to see "not ready" before the listener goes away.
        tokio::time::sleep_until(not_ready_since + READINESS_LINGER).await;
        ops_stop.cancel();
        let _ = ops.await;
    }
    Ok(())
}
