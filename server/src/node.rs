//! A hub node: initialise the data directory on first start (P-2), serve, and shut down
//! cleanly (P-7).
//!
//! Layout of a data directory: `db/` (the RocksDB database), `tls/` (see [`crate::tls`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::transport::lean_tls::LeanTlsAcceptor;
use ferrohub_engine::c2d::TimerKind;
use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::provisioning::ProvisioningSettings;
use ferrohub_engine::{Durability, HubError, OpenError, Store, StoreConfig};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::Clock;
use crate::config::{Config, ConfigError, DurabilitySetting};
use crate::hub::{self, Authenticator, Connections, D2cNotify, HubContext, HubParts, StoreHandle};
use crate::rest;
use crate::tls::{self, TlsError, TlsPaths};
use crate::transport::{amqp_tls, https, mqtt_tls};
use warp::Filter;

/// How long shutdown waits for open connections before closing the store anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot open the store: {0}")]
    Open(#[from] OpenError),
    #[error("hub settings: {0}")]
    Hub(#[from] HubError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Displayed with its cause by the `{:#}` chain in `main`.
    #[error("routing configuration")]
    Routing(#[from] crate::routing::RouteError),
    #[error("cannot listen on {addr}: {reason}")]
    Bind { addr: SocketAddr, reason: String },
    #[error("{0}")]
    Other(String),
}

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("db")
}

/// `HostName=...;SharedAccessKeyName=...;SharedAccessKey=...` for one policy.
pub fn policy_connection_string(hub: &HubSettings, policy: &str) -> Option<String> {
    let p = hub.policy(policy)?;
    Some(format!(
        "HostName={};SharedAccessKeyName={};SharedAccessKey={}",
        hub.host_name, p.name, p.primary_key
    ))
}

/// The provisioning service's connection string for one of its policies (DPS-5).
pub fn provisioning_connection_string(hub: &HubSettings, policy: &str) -> Option<String> {
    let p = hub.provisioning.as_ref()?.policy(policy)?;
    Some(format!(
        "HostName={};SharedAccessKeyName={};SharedAccessKey={}",
        hub.host_name, p.name, p.primary_key
    ))
}

/// The built-in endpoint's Event Hubs-compatible connection string for one policy:
/// `Endpoint=sb://{host}/;SharedAccessKeyName=...;SharedAccessKey=...;EntityPath={hub name}`.
pub fn event_hubs_connection_string(hub: &HubSettings, policy: &str) -> Option<String> {
    let p = hub.policy(policy)?;
    Some(format!(
        "Endpoint=sb://{}/;SharedAccessKeyName={};SharedAccessKey={};EntityPath={}",
        hub.host_name, p.name, p.primary_key, hub.hub_name
    ))
}

/// The stored hub settings, initialising the hub (policies with new keys) on first start.
/// Returns the settings and whether this call initialised the hub.
///
/// # Errors
/// [`NodeError::Hub`] when the settings cannot be read or written.
pub fn initialise_settings(
    store: &Store,
    config: &Config,
    clock: &Clock,
) -> Result<(HubSettings, bool), NodeError> {
    let existing = store.hub_settings()?;
    let first_start = existing.is_none();
    let hub = match existing {
        Some(h) => {
            if h.host_name != config.hub.host_name {
                tracing::warn!(stored = %h.host_name, configured = %config.hub.host_name,
                    "host name is fixed at initialisation; using the stored one");
            }
            if h.provisioning.is_none() {
                // A hub initialised before provisioning existed gets its ID scope now, once.
                let with_scope = HubSettings {
                    provisioning: Some(ProvisioningSettings::generate()),
                    ..h
                };
                store.replace_hub_settings(with_scope.clone())?;
                with_scope
            } else {
                h
            }
        }
        None => store.initialise_hub(HubSettings {
            hub_name: config.hub.name.clone(),
            host_name: config.hub.host_name.clone(),
            policies: HubSettings::default_policies(),
            created: clock.now(),
            provisioning: Some(ProvisioningSettings::generate()),
        })?,
    };
    Ok((hub, first_start))
}

/// Opens the store and makes sure the hub and its TLS material exist. Returns the store, the
/// settings, and whether this call initialised the hub. Blocking: call it before serving or
/// on the blocking pool.
/// The engine settings the configuration asks for.
fn store_config(config: &Config) -> StoreConfig {
    StoreConfig {
        durability: match config.storage.durability {
            DurabilitySetting::Synced => Durability::Synced,
            DurabilitySetting::Relaxed => Durability::Relaxed,
        },
        d2c_partitions: config.d2c.partitions,
        ..StoreConfig::default()
    }
}

pub fn initialise(
    data_dir: &Path,
    config: &Config,
    clock: &Clock,
) -> Result<(Arc<Store>, HubSettings, bool), NodeError> {
    let store = Store::open(&db_path(data_dir), store_config(config))?;
    let (hub, first_start) = initialise_settings(&store, config, clock)?;
    tls::ensure_material(&TlsPaths::new(data_dir), &hub.hub_name, &hub.host_name)?;
    Ok((Arc::new(store), hub, first_start))
}

/// The hub without its listeners: the shared context, and the background tasks (C2D
/// deadlines, the event router, retention) that run until the shutdown token is cancelled.
pub struct Services {
    pub ctx: HubContext,
    tasks: Vec<JoinHandle<()>>,
}

impl Services {
    /// Applies the configuration's routing section, loads the routing table, and starts the
    /// background tasks.
    ///
    /// # Errors
    /// [`NodeError::Routing`] when the routing configuration does not compile.
    pub async fn start(
        store: Arc<Store>,
        settings: HubSettings,
        config: &Config,
        clock: Clock,
        shutdown: &CancellationToken,
    ) -> Result<Services, NodeError> {
        let mut handle = StoreHandle::new(Arc::clone(&store));
        if clock.follows_tokio() {
            handle.wait_on_pool();
        }
        let notifications_wake = Arc::new(tokio::sync::Notify::new());
        let (routing, next_sequences) = {
            let (section, hub_name, now) = (
                config.routing.clone(),
                settings.hub_name.clone(),
                clock.now(),
            );
            let indexed = config.query.indexed_paths.clone();
            let wake = Arc::clone(&notifications_wake);
            handle
                .run(move |s| {
                    hub::routes::apply_config(s, &section, now)?;
                    // Before anything serves: a rebuild must not race writers.
                    if s.define_twin_index(indexed)? {
                        tracing::info!("twin query index rebuilt for the configured paths");
                    }
                    // Jobs a stopped hub left running are failed now, with how far they got.
                    crate::rest::jobs::fail_interrupted(s, now)?;
                    let router = hub::routes::load_router(s, &hub_name)?;
                    s.set_notification_hook(Box::new(move || wake.notify_one()));
                    let next: Vec<u64> = (0..ferrohub_engine::d2c::MAX_PARTITIONS)
                        .map(|p| s.next_sequence_number(p).unwrap_or(0))
                        .collect();
                    Ok::<_, crate::routing::RouteError>((router, next))
                })
                .await?
        };
        let settings = Arc::new(settings);
        let uploads = match &config.file_upload {
            Some(section) => Some(
                hub::file_uploads::FileUploads::new(section)
                    .map_err(|e| NodeError::Other(format!("file_upload: {e}")))?,
            ),
            None => None,
        };
        let ctx = HubContext::new(HubParts {
            auth: Authenticator::new(handle.clone(), Arc::clone(&settings), clock.clone()),
            provisioning: hub::provisioning::Provisioning::new(
                handle.clone(),
                &settings,
                clock.clone(),
            ),
            store: handle,
            settings,
            clock,
            connections: Connections::new(),
            d2c: Arc::new(D2cNotify::new(next_sequences)),
            readers: hub::PartitionReaders::default(),
            methods: Arc::default(),
            c2d: hub::c2d::C2d::new(config.c2d.queue_settings()),
            routing: Arc::new(routing),
            throttles: Arc::new(hub::throttle::Throttles::new(&config.throttling)),
            uploads,
            jobs: hub::scheduled_jobs::JobRunners::new(shutdown.clone()),
            configurations: hub::configurations::Reconciler::new(),
            timeouts: config.timeouts,
        });
        hub::scheduled_jobs::resume(&ctx)
            .await
            .map_err(|e| NodeError::Other(format!("scheduled jobs: {e}")))?;
        let mut tasks = Vec::new();
        for kind in [TimerKind::Lock, TimerKind::Expiry] {
            tasks.push(tokio::spawn(hub::c2d_sweeper::run(
                kind,
                ctx.clone(),
                shutdown.clone(),
            )));
        }
        tasks.push(tokio::spawn(hub::configurations::run(
            ctx.clone(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(hub::event_router::run(
            ctx.clone(),
            notifications_wake,
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(hub::retention::run(
            ctx.clone(),
            config.d2c.retention,
            config.d2c.retention_check_interval,
            shutdown.clone(),
        )));
        Ok(Services { ctx, tasks })
    }

    /// Waits for the background tasks to end (after shutdown was cancelled).
    pub async fn join(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Binds a listener; an IPv6 address listens dual-stack (IPV6_V6ONLY off). On a host without
/// IPv6, the unspecified `[::]` falls back to `0.0.0.0` on the same port.
async fn bind(addr: SocketAddr) -> Result<TcpListener, NodeError> {
    match listen(addr) {
        Err(e) if addr.is_ipv6() && addr.ip().is_unspecified() => {
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

/// How long the operations listener keeps answering (503) after readiness went false, at
/// least: a drain that ends sooner waits out the rest.
const READINESS_LINGER: Duration = Duration::from_millis(500);

/// Runs the node until `shutdown` is cancelled, then drains and closes the store. With a
/// `[cluster]` section the node joins the cluster instead (see [`serve_cluster`]).
pub async fn serve(
    data_dir: &Path,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    config.validate()?;
    if config.cluster.enabled() {
        return serve_cluster(data_dir, config, shutdown).await;
    }
    let clock = Clock::system();
    let (store, hub, first_start) = {
        let (dir, config, clock) = (data_dir.to_path_buf(), config.clone(), clock.clone());
        tokio::task::spawn_blocking(move || initialise(&dir, &config, &clock))
            .await
            .map_err(|e| NodeError::Other(e.to_string()))??
    };
    let opened = Opened {
        store,
        hub,
        first_start,
        clock,
        recovery: true,
    };
    serve_store(data_dir, &config, opened, shutdown).await
}

/// A store ready to serve.
struct Opened {
    store: Arc<Store>,
    hub: HubSettings,
    first_start: bool,
    clock: Clock,
    /// Whether the storage recovery task may reopen the store after a failed write (a single
    /// node; a cluster's writer steps down instead).
    recovery: bool,
}

/// This node as the writer lease names it: its name and where other nodes reach its listeners.
fn lease_holder(config: &Config) -> Result<crate::cluster::lease::Holder, NodeError> {
    let l = &config.listeners;
    let host = config
        .cluster
        .advertised_host(l.https)
        .ok_or_else(|| NodeError::Other("cluster.advertise is needed".into()))?;
    Ok(crate::cluster::lease::Holder {
        node: config.cluster.node.clone(),
        host,
        https: l.https.port(),
        mqtt: l.mqtt.port(),
        amqp: l.amqp.port(),
    })
}

/// A follower's listeners on the writer's ports (see [`crate::cluster::relay`]).
async fn relay_listeners(
    config: &Config,
) -> Result<Vec<(crate::cluster::relay::Service, TcpListener)>, NodeError> {
    use crate::cluster::relay::Service;
    let l = &config.listeners;
    Ok(vec![
        (Service::Https, bind(l.https).await?),
        (Service::Mqtt, bind(l.mqtt).await?),
        (Service::Amqp, bind(l.amqp).await?),
    ])
}

/// A cluster node: follow the commit log until this node holds the writer lease, serve as the
/// writer until it must step down (or `shutdown`), and follow again. A follower forwards the
/// connections it accepts to the writer ([`crate::cluster::relay`]), so clients reach the hub
/// through any node. See docs/cluster.md.
async fn serve_cluster(
    data_dir: &Path,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    use crate::cluster::{
        follow, log::JetStreamLog, relay, tls_share, trim, writer, ClusterError, Link,
    };
    let fatal = |e: ClusterError| NodeError::Other(format!("cluster: {e}"));
    let Some(link) = Link::connect(&config.cluster, &shutdown)
        .await
        .map_err(fatal)?
    else {
        return Ok(());
    };
    tls_share::ensure(
        &link,
        &TlsPaths::new(data_dir),
        &config.hub.name,
        &config.hub.host_name,
    )
    .await
    .map_err(fatal)?;
    let pause = || async {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let db = db_path(data_dir);
    let me = lease_holder(&config)?;
    loop {
        let relay = relay::Relay::start(link.clone(), relay_listeners(&config).await?);
        let followed = follow::follow_until_writer(&link, &db, &me, &shutdown).await;
        // The writer's own listeners take these ports next (or the next follow's relay).
        relay.stop().await;
        let promotion = match followed {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(()),
            Err(e @ ClusterError::Replica(_)) => return Err(fatal(e)),
            Err(e) => {
                tracing::warn!(error = %e, "following the commit log failed; following again");
                pause().await;
                continue;
            }
        };
        let log = Arc::new(JetStreamLog::new(
            link.js.clone(),
            tokio::runtime::Handle::current(),
            &config.cluster.node,
            promotion.caught_up_to,
        ));
        let clock = Clock::system();
        let opened = {
            let (db, config, clock, log) = (db.clone(), config.clone(), clock.clone(), log.clone());
            tokio::task::spawn_blocking(move || {
                let mut engine = store_config(&config);
                // The log is the durable copy: a node that loses its unsynced tail applies
                // it again from the log.
                engine.durability = Durability::Relaxed;
                let store = Store::open_replicated(&db, engine, log)?;
                let (hub, first_start) = initialise_settings(&store, &config, &clock)?;
                Ok::<_, NodeError>((Arc::new(store), hub, first_start))
            })
            .await
            .map_err(|e| NodeError::Other(e.to_string()))?
        };
        let (store, hub, first_start) = match opened {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "could not start as the writer; following again");
                promotion.lease.release().await;
                pause().await;
                continue;
            }
        };
        let stop = shutdown.child_token();
        let keeper = tokio::spawn(writer::hold(promotion.lease, log, stop.clone()));
        let trimmer = tokio::spawn(trim::run_on_writer(
            link.clone(),
            Arc::downgrade(&store),
            stop.clone(),
        ));
        tracing::info!(node = %config.cluster.node, log_end = promotion.caught_up_to, "serving as the cluster's writer");
        let opened = Opened {
            store,
            hub,
            first_start,
            clock,
            recovery: false,
        };
        let served = serve_store(data_dir, &config, opened, stop.clone()).await;
        stop.cancel();
        let _ = trimmer.await;
        let lease = keeper.await.ok().flatten();
        if let Some(lease) = lease {
            lease.release().await;
        }
        if shutdown.is_cancelled() {
            return served;
        }
        if let Err(e) = served {
            tracing::warn!(error = %e, "serving as the writer failed");
            pause().await;
        }
        tracing::warn!("stepped down as the writer; following the commit log again");
    }
}

/// Serves `opened` until `shutdown` is cancelled, then drains and closes the store.
async fn serve_store(
    data_dir: &Path,
    config: &Config,
    opened: Opened,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
    let Opened {
        store,
        hub,
        first_start,
        clock,
        recovery,
    } = opened;
    if first_start {
        println!(
            "Initialised hub {:?} in {}",
            hub.hub_name,
            data_dir.display()
        );
        println!("CA certificate: {}", TlsPaths::new(data_dir).ca().display());
        for p in &hub.policies {
            if let Some(cs) = policy_connection_string(&hub, &p.name) {
                println!("{cs}");
            }
        }
        // Event Hubs clients read the built-in endpoint with ServiceConnect.
        if let Some(cs) = event_hubs_connection_string(&hub, "service") {
            println!("Event Hubs-compatible endpoint: {cs}");
        }
        if let (Some(cs), Some(p)) = (
            provisioning_connection_string(&hub, "provisioningserviceowner"),
            &hub.provisioning,
        ) {
            println!("Provisioning service (ID scope {}): {cs}", p.id_scope);
        }
    }
    let paths = TlsPaths::new(data_dir);
    let https_listener = bind(config.listeners.https).await?;
    let mqtt_listener = bind(config.listeners.mqtt).await?;
    let amqp_listener = bind(config.listeners.amqp).await?;
    let (https_addr, mqtt_addr) = (local(&https_listener)?, local(&mqtt_listener)?);
    let amqp_addr = local(&amqp_listener)?;
    let quic = crate::transport::mqtt_quic::endpoint(config.listeners.mqtt_quic, &paths)
        .map_err(|e| NodeError::Other(e.to_string()))?;
    let quic_addr = quic
        .local_addr()
        .map_err(|e| NodeError::Other(format!("QUIC endpoint address: {e}")))?;
    let services = Services::start(store, hub, config, clock, &shutdown).await?;
    let ctx = services.ctx.clone();
    let console_node = crate::console::NodeInfo {
        node: config
            .cluster
            .enabled()
            .then(|| config.cluster.node.clone()),
        started: chrono::Utc::now(),
    };
    let recovery = recovery.then(|| {
        tokio::spawn(hub::storage_recovery::run(
            ctx.store.clone(),
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
    let readiness = crate::transport::ops::Readiness::default();
    // The ops listener outlives the drain, so readiness can be seen going false.
    let ops_stop = CancellationToken::new();
    let (metrics_addr, ops_task) = crate::transport::ops::serve(
        config.listeners.metrics,
        ctx.clone(),
        readiness.clone(),
        ops_stop.clone(),
    )
    .map_err(|reason| NodeError::Bind {
        addr: config.listeners.metrics,
        reason,
    })?;
    let tracker = TaskTracker::new();
    let listeners = vec![
        tokio::spawn(https::serve(
            https_listener,
            config.timeouts,
            TlsAcceptor::from(tls::server_config(&paths)?),
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
            mqtt_listener,
            config.listeners.mqtt_max_connections,
            LeanTlsAcceptor::new(tls::mqtt_server_config(&paths)?),
            ctx.clone(),
            shutdown.clone(),
            tracker.clone(),
        )),
        tokio::spawn(amqp_tls::serve(
            amqp_listener,
            TlsAcceptor::from(tls::server_config(&paths)?),
            ctx.clone(),
            shutdown.clone(),
            tracker.clone(),
        )),
        tokio::spawn(crate::transport::mqtt_quic::serve(
            quic,
            ctx.clone(),
            shutdown.clone(),
            tracker.clone(),
        )),
    ];
    // Tests and scripts read these lines to learn the bound addresses; https comes last.
    println!("listening metrics={metrics_addr}");
    println!("listening mqtt={mqtt_addr}");
    println!("listening amqp={amqp_addr}");
    println!("listening mqtt-quic={quic_addr}");
    println!("listening https={https_addr}");
    tracing::info!(%https_addr, %mqtt_addr, %amqp_addr, %metrics_addr, "listening");
    readiness.set(true);
    shutdown.cancelled().await;
    readiness.set(false);
    let not_ready_since = tokio::time::Instant::now();
    tracing::info!("shutting down: no new connections; draining");
    for t in listeners {
        let _ = t.await;
    }
    services.join().await;
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
    // A readiness probe needs a moment to see "not ready" before the listener goes away.
    tokio::time::sleep_until(not_ready_since + READINESS_LINGER).await;
    ops_stop.cancel();
    let _ = ops_task.await;
    Ok(())
}
