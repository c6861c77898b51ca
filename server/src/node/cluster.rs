//! A cluster node's life (docs/cluster.md): follow the commit log, serving clients from the
//! replica with writes forwarded to the writer, until this node holds the writer lease; then
//! serve as the writer until it must step down; then follow again.
//!
//! # Invariants
//! - A follower serves clients only once its replica holds a hub (the first writer's
//!   settings) and while its standing allows ([`Standing::may_follow_serve`]: NATS reachable,
//!   the log applied up to the end read since); otherwise its ports are closed and clients go
//!   to other nodes. A follower cut off from NATS stops serving, and serves again once back
//!   and caught up.
//! - The writer stops serving when its lease runs out unrenewed, before another node can
//!   take it ([`writer::hold`]).
//! - The operations listener (health, metrics) runs for the node's whole life, whatever its
//!   role ([`super::health`]).
//! - Before this node opens a writing store on its directory, the follower's services have
//!   stopped and every handle of the replica's store is gone; a writing store that finds the
//!   directory still held is tried again.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::hub::HubSettings;
use ferrohub_engine::{Durability, OpenError, Store};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::health::ClusterOps;
use super::listeners::{serve_follower, serve_store};
use super::{db_path, initialise_settings, store_config, NodeError, Opened};
use crate::clock::Clock;
use crate::cluster::bus::Bus;
use crate::cluster::follow::{self, Progress};
use crate::cluster::standing::{self, Role, Standing};
use crate::cluster::{log::JetStreamLog, tls_share, trim, writer, ClusterError, Link};
use crate::config::Config;
use crate::hub::cluster::Cluster;
use crate::hub::D2cNotify;
use crate::tls::TlsPaths;

/// How often a follower without a hub yet looks at its replica again.
const HUB_CHECK: Duration = Duration::from_millis(200);

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

fn fatal(e: ClusterError) -> NodeError {
    NodeError::Other(format!("cluster: {e}"))
}

/// How a spell of following ended.
enum Followed {
    /// This node holds the lease and caught up.
    Writer(crate::cluster::lease::Promotion),
    Shutdown,
    /// NATS failed; follow again after a pause.
    Again,
}

/// Follows the log, serving clients from the replica, until this node holds the lease and
/// caught up, or `shutdown`.
async fn follow(
    data_dir: &Path,
    config: &Config,
    link: &Link,
    bus: &Bus,
    ops: &Arc<ClusterOps>,
    shutdown: &CancellationToken,
) -> Result<Followed, NodeError> {
    let me = lease_holder(config)?;
    let db = db_path(data_dir);
    let Some(replica) = follow::open_replica(&db, shutdown).await.map_err(fatal)? else {
        return Ok(Followed::Shutdown);
    };
    let (applied_tx, applied) = tokio::sync::watch::channel(0);
    // Readers of the partitions an entry added to are woken while the hub serves.
    let readers: Arc<Mutex<Option<Arc<D2cNotify>>>> = Arc::default();
    let woken = Arc::clone(&readers);
    let progress = Progress {
        applied: applied_tx,
        advanced: Box::new(move |advanced| {
            if let Some(d2c) = woken.lock().as_ref() {
                for &(p, seq) in advanced {
                    d2c.appended(p, seq);
                }
            }
        }),
        standing: Arc::clone(&ops.standing),
    };
    let stop_serving = shutdown.child_token();
    // A directory from outside any log seeds a new cluster first (`cluster::seed`): it serves
    // only once it is the writer.
    let seeding = {
        let replica = Arc::clone(&replica);
        tokio::task::spawn_blocking(move || replica.holds_a_hub_outside_the_log())
            .await
            .map_err(|e| NodeError::Other(e.to_string()))?
            .map_err(|e| fatal(e.into()))?
    };
    if seeding {
        stop_serving.cancel();
    }
    let serving = tokio::spawn(serve_while_in_standing(
        FollowerServing {
            data_dir: data_dir.to_path_buf(),
            config: config.clone(),
            store: replica.store(),
            bus: bus.clone(),
            link: link.clone(),
            applied,
            ops: Arc::clone(ops),
            readers,
        },
        stop_serving.clone(),
    ));
    let mut followed = follow::follow_until_writer(link, &replica, &me, &progress, shutdown).await;
    stop_serving.cancel();
    // The follower's connections close before the writer's store opens; the lease must not
    // lapse while they drain.
    let (served, lost) = match &mut followed {
        Ok(Some(p)) => p.lease.keep_during(serving).await,
        _ => (serving.await, false),
    };
    match served {
        Ok(Err(e)) => tracing::warn!(error = %e, "serving as a follower failed"),
        Err(e) => tracing::warn!(error = %e, "the follower's services ended abnormally"),
        Ok(Ok(())) => {}
    }
    drop(progress);
    drop(replica);
    if lost {
        tracing::warn!("lost the writer lease while the follower's services stopped");
        return Ok(Followed::Again);
    }
    match followed {
        Ok(Some(p)) => Ok(Followed::Writer(p)),
        Ok(None) => Ok(Followed::Shutdown),
        Err(e @ (ClusterError::Replica(_) | ClusterError::Diverged(_))) => Err(fatal(e)),
        Err(e) => {
            tracing::warn!(error = %e, "following the commit log failed; following again");
            Ok(Followed::Again)
        }
    }
}

/// What a follower serves with, spell after spell.
struct FollowerServing {
    data_dir: std::path::PathBuf,
    config: Config,
    store: Arc<Store>,
    bus: Bus,
    link: Link,
    applied: tokio::sync::watch::Receiver<u64>,
    ops: Arc<ClusterOps>,
    readers: Arc<Mutex<Option<Arc<D2cNotify>>>>,
}

/// Serves clients from the replica whenever the node's standing allows, until `stop`: a spell
/// of serving ends (its connections closed) when the standing no longer allows it.
async fn serve_while_in_standing(
    f: FollowerServing,
    stop: CancellationToken,
) -> Result<(), NodeError> {
    let Some(hub) = wait_for_hub(&f.store, &stop).await else {
        return Ok(());
    };
    let mut may_serve = f.ops.standing.may_follow_serve();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Ok(()),
            allowed = may_serve.wait_for(|may| *may) => if allowed.is_err() { return Ok(()) },
        }
        let spell = stop.child_token();
        let cluster = Arc::new(Cluster::follower(
            f.bus.clone(),
            f.applied.clone(),
            spell.clone(),
            f.link.clone(),
        ));
        let readers = Arc::clone(&f.readers);
        let serving = move |ctx: &crate::hub::HubContext| {
            *readers.lock() = Some(Arc::clone(&ctx.d2c));
        };
        tracing::info!("serving clients as a follower");
        let served = serve_follower(
            &f.data_dir,
            &f.config,
            Arc::clone(&f.store),
            hub.clone(),
            cluster,
            Arc::clone(&f.ops),
            serving,
            spell.clone(),
        );
        tokio::pin!(served);
        let ended = tokio::select! {
            out = &mut served => Some(out),
            _ = may_serve.wait_for(|may| !*may) => None,
        };
        let out = match ended {
            Some(out) => out,
            None => {
                if f.ops.standing.role() == Role::Follower {
                    tracing::warn!(
                        "NATS unreachable for the lease time: this follower stops serving \
                         until it reaches NATS again and catches up"
                    );
                }
                spell.cancel();
                served.await
            }
        };
        *f.readers.lock() = None;
        if stop.is_cancelled() {
            return out;
        }
        if let Err(e) = out {
            tracing::warn!(error = %e, "serving as a follower failed; serving again shortly");
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// The hub settings once the replica holds them (the first writer wrote them), or `None` at
/// `stop`.
async fn wait_for_hub(store: &Arc<Store>, stop: &CancellationToken) -> Option<HubSettings> {
    loop {
        if stop.is_cancelled() {
            return None;
        }
        let read = {
            let store = Arc::clone(store);
            tokio::task::spawn_blocking(move || store.hub_settings()).await
        };
        match read {
            Ok(Ok(Some(hub))) => return Some(hub),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "the replica's hub settings cannot be read yet")
            }
            Err(e) => tracing::debug!(error = %e, "the replica's hub settings cannot be read yet"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(HUB_CHECK) => {}
        }
    }
}

/// Opens the writer's store on `db`, waiting (up to 30 s) while the follower's last handles of
/// the replica's store go.
async fn open_writer_store(
    db: &Path,
    config: &Config,
    log: Arc<JetStreamLog>,
    clock: &Clock,
) -> Result<(Arc<Store>, HubSettings, bool), NodeError> {
    for _ in 0..300 {
        let (db, config, clock, log) = (
            db.to_path_buf(),
            config.clone(),
            clock.clone(),
            Arc::clone(&log),
        );
        let opened = tokio::task::spawn_blocking(move || {
            let mut engine = store_config(&config);
            // The log is the durable copy: a node that loses its unsynced tail applies it
            // again from the log.
            engine.durability = Durability::Relaxed;
            let store = match Store::open_replicated(&db, engine, log) {
                Err(OpenError::InUse { .. }) => return Ok(None),
                other => other?,
            };
            let (hub, first_start) = initialise_settings(&store, &config, &clock)?;
            Ok::<_, NodeError>(Some((Arc::new(store), hub, first_start)))
        })
        .await
        .map_err(|e| NodeError::Other(e.to_string()))??;
        if let Some(opened) = opened {
            return Ok(opened);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(NodeError::Other(format!(
        "{} stayed in use for 30 s after following",
        db.display()
    )))
}

/// A cluster node: follow the commit log (serving clients from the replica) until this node
/// holds the writer lease, serve as the writer until it must step down (or `shutdown`), and
/// follow again. See docs/cluster.md.
pub(super) async fn serve_cluster(
    data_dir: &Path,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), NodeError> {
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
        config.hub.host_name(),
    )
    .await
    .map_err(fatal)?;
    let bus = Bus::start(link.client.clone(), &config.cluster.node)
        .await
        .map_err(fatal)?;
    let standing = Standing::new(&config.cluster.node, config.cluster.lease);
    let ops = ClusterOps::new(Arc::clone(&standing));
    let ops_stop = CancellationToken::new();
    let (ops_addr, ops_task) = crate::transport::ops::serve(
        config.listeners.metrics,
        Arc::clone(&ops) as Arc<dyn crate::transport::ops::OpsSource>,
        TlsPaths::new(data_dir).ca(),
        ops_stop.clone(),
    )
    .map_err(|reason| NodeError::Bind {
        addr: config.listeners.metrics,
        reason,
    })?;
    println!("listening metrics={ops_addr}");
    let contact_stop = shutdown.child_token();
    let contact = tokio::spawn(standing::watch_contact(
        link.client.clone(),
        Arc::clone(&standing),
        config.cluster.lease / 5,
        contact_stop.clone(),
    ));
    let served = roles(data_dir, &config, &link, &bus, &ops, &shutdown).await;
    contact_stop.cancel();
    let _ = contact.await;
    ops_stop.cancel();
    let _ = ops_task.await;
    served
}

/// The node's roles one after another: follower, writer, follower again..., until `shutdown`.
async fn roles(
    data_dir: &Path,
    config: &Config,
    link: &Link,
    bus: &Bus,
    ops: &Arc<ClusterOps>,
    shutdown: &CancellationToken,
) -> Result<(), NodeError> {
    let standing = &ops.standing;
    let pause = || async {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let db = db_path(data_dir);
    loop {
        standing.set_role(Role::Starting);
        let promotion = match follow(data_dir, config, link, bus, ops, shutdown).await? {
            Followed::Writer(p) => p,
            Followed::Shutdown => return Ok(()),
            Followed::Again => {
                pause().await;
                continue;
            }
        };
        let log = Arc::new(JetStreamLog::new(
            link.js.clone(),
            tokio::runtime::Handle::current(),
            &config.cluster.node,
            promotion.caught_up_to,
            config.cluster.appends_in_flight,
        ));
        let mut promotion = promotion;
        // Claim the log before serving: a deposed writer may have appended after this node
        // read the log's end, and this replica would lack those entries.
        let (claimed, lost) = promotion.lease.keep_during(log.claim()).await;
        match claimed {
            Err(e) => {
                tracing::warn!(error = %e, "could not claim the commit log; following again");
                if !lost {
                    promotion.lease.release().await;
                }
                continue;
            }
            Ok(_) if lost => {
                tracing::warn!(
                    "lost the writer lease while claiming the commit log; following again"
                );
                continue;
            }
            Ok(_) => {}
        }
        let clock = Clock::system();
        let (opened, lost) = promotion
            .lease
            .keep_during(open_writer_store(&db, config, Arc::clone(&log), &clock))
            .await;
        if lost {
            tracing::warn!("lost the writer lease while opening the store; following again");
            drop(opened);
            continue;
        }
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
        standing.set_role(Role::Writer);
        let keeper = tokio::spawn(writer::hold(
            promotion.lease,
            link.clone(),
            log,
            Arc::clone(standing),
            stop.clone(),
        ));
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
        let cluster = Arc::new(Cluster::writer(bus.clone()));
        let served = serve_store(
            data_dir,
            config,
            opened,
            stop.clone(),
            Some((cluster, Arc::clone(ops))),
            None,
        )
        .await;
        standing.set_role(Role::Starting);
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
