//! A hub node: initialise the data directory on first start (P-2), serve, and shut down
//! cleanly (P-7).
//!
//! Layout of a data directory: `db/` (the RocksDB database), `tls/` (see [`crate::tls`]).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use ferrohub_engine::c2d::TimerKind;
use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::provisioning::ProvisioningSettings;
use ferrohub_engine::{Durability, HubError, OpenError, Store, StoreConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::{Config, ConfigError, DurabilitySetting};
use crate::hub::{self, Authenticator, Connections, D2cNotify, HubContext, HubParts, StoreHandle};
use crate::rest;
use crate::tls::{self, TlsError, TlsPaths};

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
    #[error(
        "this hub's host name is {stored:?}, chosen when its data directory was initialised, \
         not {given:?}. To change it, stop the hub and run `ferrohub host-name set --data-dir DIR \
         {given}` (devices keep their keys and the CA; their connection strings need the new \
         name), then start it again"
    )]
    HostName { stored: String, given: String },
    #[error("{0}")]
    Other(String),
}

mod cluster;
mod health;
mod listeners;

use cluster::serve_cluster;
use listeners::{serve_store, Sockets};

pub use crate::layout::db_path;

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
    Some(p.connection_string(&hub.host_name))
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
            check_host_names(&h, &config.hub)?;
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
            host_name: config.hub.host_name().to_string(),
            other_host_names: config.hub.other_host_names.clone(),
            policies: HubSettings::default_policies(),
            created: clock.now(),
            provisioning: Some(ProvisioningSettings::generate()),
        })?,
    };
    Ok((hub, first_start))
}

/// Refuses host names given for a hub that has others: a hub's names change only by
/// `ferrohub host-name set`, which re-issues its certificate.
fn check_host_names(
    stored: &HubSettings,
    given: &crate::config::HubSection,
) -> Result<(), NodeError> {
    let mismatch = |given: String| NodeError::HostName {
        stored: stored.host_names().collect::<Vec<_>>().join(","),
        given,
    };
    if let Some(name) = &given.host_name {
        if !name.eq_ignore_ascii_case(&stored.host_name) {
            return Err(mismatch(name.clone()));
        }
    }
    let same_others = given.other_host_names.len() == stored.other_host_names.len()
        && given.other_host_names.iter().all(|n| {
            stored
                .other_host_names
                .iter()
                .any(|s| s.eq_ignore_ascii_case(n))
        });
    if !given.other_host_names.is_empty() && !same_others {
        return Err(mismatch(
            std::iter::once(given.host_name())
                .chain(given.other_host_names.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(","),
        ));
    }
    Ok(())
}

/// Re-issues the generated server certificate from the hub's CA when it does not cover every
/// host name (a hub restored under other names, or a certificate made before names were
/// added). Without the CA key it only warns: the certificate came from elsewhere.
fn cover_host_names(paths: &TlsPaths, hub: &HubSettings) {
    let served = tls::serving::describe_file(&paths.generated().chain);
    let missing: Vec<&str> = hub
        .host_names()
        .filter(|n| !served.as_ref().is_some_and(|d| d.covers(n)))
        .collect();
    if missing.is_empty() {
        return;
    }
    let names: Vec<&str> = hub.host_names().collect();
    match tls::reissue_server(paths, &names) {
        Ok(()) => tracing::info!(
            host_names = ?names,
            "server certificate re-issued from the hub's CA for its host names (the CA is unchanged: devices that trust it keep doing so)"
        ),
        Err(e) => tracing::warn!(
            missing = ?missing, error = %e,
            "the generated server certificate does not cover these host names and cannot be re-issued"
        ),
    }
}

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

/// Opens the store and makes sure the hub and its TLS material exist (the certificate covering
/// the hub's host names). Returns the store, the settings, and whether this call initialised
/// the hub. Blocking: call it before serving or on the blocking pool.
pub fn initialise(
    data_dir: &Path,
    config: &Config,
    clock: &Clock,
) -> Result<(Arc<Store>, HubSettings, bool), NodeError> {
    let store = Store::open(&db_path(data_dir), store_config(config))?;
    let (hub, first_start) = initialise_settings(&store, config, clock)?;
    let paths = TlsPaths::new(data_dir);
    let others: Vec<String> = hub.other_host_names.clone();
    let made = tls::ensure_material_for(&paths, &hub.hub_name, &hub.host_name, &others)?;
    if made && !first_start {
        // A hub restored without its TLS identity (or whose tls/ was lost).
        tracing::warn!(
            ca = %paths.ca().display(),
            "this hub had no TLS material: {}",
            crate::backup::NEW_CA_WARNING
        );
    }
    cover_host_names(&paths, &hub);
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
        Self::start_in(store, settings, config, clock, shutdown, None).await
    }

    /// [`Services::start`] for a cluster node: the writer runs the hub's background tasks and
    /// takes the followers' calls; a follower only reads its replica and forwards its writes.
    ///
    /// # Errors
    /// As [`Services::start`].
    pub async fn start_in(
        store: Arc<Store>,
        settings: HubSettings,
        config: &Config,
        clock: Clock,
        shutdown: &CancellationToken,
        cluster: Option<Arc<hub::cluster::Cluster>>,
    ) -> Result<Services, NodeError> {
        let follower = cluster.as_deref().is_some_and(|c| c.is_follower());
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
                    if follower {
                        // The writer applies the configuration; a follower reads what it made.
                        let router = hub::routes::load_router(s, &hub_name)?;
                        let next: Vec<u64> = (0..ferrohub_engine::d2c::MAX_PARTITIONS)
                            .map(|p| s.next_sequence_number(p).unwrap_or(0))
                            .collect();
                        return Ok((router, next));
                    }
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
        let connections = Connections::new();
        let methods: Arc<hub::methods::PendingCalls> = Arc::default();
        let live = cluster.as_ref().map(|c| {
            let live = hub::live::LiveReach::new(
                Arc::clone(c),
                &connections,
                Arc::clone(&methods),
                handle.clone(),
            );
            connections.set_reach(live.clone());
            live
        });
        let readers = hub::PartitionReaders::default();
        let policies = hub::policies::LivePolicies::new(Arc::clone(&settings));
        let ctx = HubContext::new(HubParts {
            auth: Authenticator::new(handle.clone(), Arc::clone(&policies), clock.clone()),
            provisioning: hub::provisioning::Provisioning::new(
                handle.clone(),
                &settings,
                clock.clone(),
                config.throttling.dps_failed_attestations_per_minute,
            ),
            store: handle,
            settings,
            policies,
            clock,
            connections,
            d2c: Arc::new(D2cNotify::new(next_sequences)),
            readers: readers.clone(),
            readers_everywhere: cluster
                .as_ref()
                .map(|c| hub::readers_everywhere::ReadersEverywhere::new(c.bus.clone(), readers)),
            methods,
            c2d: hub::c2d::C2d::new(config.c2d.queue_settings()),
            routing: Arc::new(routing),
            throttles: Arc::new(hub::throttle::Throttles::new(&config.throttling)),
            uploads,
            jobs: hub::scheduled_jobs::JobRunners::new(shutdown.clone()),
            configurations: hub::configurations::Reconciler::new(),
            timeouts: config.timeouts,
            forwarding: cluster
                .as_ref()
                .filter(|c| c.is_follower())
                .map(|c| hub::forwarded_appends::Forwarding::new(Arc::clone(c))),
            cluster,
            live,
            import_export: Arc::default(),
            delivery_health: Arc::default(),
            backups: Arc::default(),
            activity: Arc::new(hub::activity::Activity::new(
                config.hub.last_activity_interval,
            )),
        });
        ctx.import_export.set(Arc::new(|ctx: &HubContext, job| {
            rest::jobs::start_runner(ctx, job)
        }));
        let mut tasks = Vec::new();
        if let Some(live) = &ctx.live {
            tasks.push(tokio::spawn(
                Arc::clone(live).serve_roll_call(shutdown.clone()),
            ));
        }
        if let Some(everywhere) = &ctx.readers_everywhere {
            tasks.push(tokio::spawn(Arc::clone(everywhere).serve(shutdown.clone())));
        }
        if let Some(forwarding) = &ctx.forwarding {
            tasks.push(tokio::spawn(Arc::clone(forwarding).serve(shutdown.clone())));
        }
        if follower {
            tasks.push(tokio::spawn(hub::follower::follow_routing(
                ctx.clone(),
                shutdown.clone(),
            )));
            return Ok(Services { ctx, tasks });
        }
        hub::scheduled_jobs::resume(&ctx)
            .await
            .map_err(|e| NodeError::Other(format!("scheduled jobs: {e}")))?;
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
        tasks.push(tokio::spawn(hub::delivery::run(
            ctx.clone(),
            config.routing.endpoint_backlog_limit(),
            shutdown.clone(),
        )));
        tasks.push(tokio::spawn(hub::retention::run(
            ctx.clone(),
            config.d2c.retention,
            config.d2c.retention_check_interval,
            shutdown.clone(),
        )));
        if ctx.cluster.is_some() {
            // The writer takes what followers forward.
            tasks.push(tokio::spawn(hub::calls::serve(
                ctx.clone(),
                shutdown.clone(),
            )));
            tasks.push(tokio::spawn(hub::appends_from_followers::serve(
                ctx.clone(),
                shutdown.clone(),
            )));
            tasks.push(tokio::spawn(hub::departed_nodes::run(
                ctx.clone(),
                shutdown.clone(),
            )));
        }
        Ok(Services { ctx, tasks })
    }

    /// Waits for the background tasks to end (after shutdown was cancelled).
    pub async fn join(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

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
    // Before the data directory is touched: a port in use must not leave a new hub behind.
    let sockets = Sockets::bind(&config).await?;
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
    serve_store(data_dir, &config, opened, shutdown, None, Some(sockets)).await
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
