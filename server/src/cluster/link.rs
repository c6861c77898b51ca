//! The node's connection to the cluster's NATS servers, and the JetStream objects it uses: the
//! commit log stream, the writer lease bucket and the shared TLS material bucket.
//!
//! # Invariants
//! - A node talks only to nats-server 2.11 or later (`sync_interval`, and the crash fixes the
//!   log relies on); an older server is refused with a clear error before anything is created.
//! - The stream and buckets are created with the configured replica count by whichever node
//!   comes first; later nodes use what exists.
//! - With `[cluster] nats_user`, the node authenticates with a password read from a file; with
//!   `nats_ca_file`, it speaks to NATS only over TLS whose certificates that CA verifies. A
//!   refusal of either is final (the node stops with the reason); only an unreachable server
//!   is retried.
//! - The node's servers take messages as large as the largest log entry, or it refuses to start
//!   (a smaller `max_payload` would fail the writer's first large commit group instead).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use async_nats::{ConnectError, ConnectErrorKind, ConnectOptions};
use tokio_util::sync::CancellationToken;

use super::secret::ClusterSecret;
use super::ClusterError;
use crate::config::ClusterSection;

/// How long a JetStream API request (stream state, consumer creation, KV operations) may
/// go unanswered before it fails and its caller asks again.
const JETSTREAM_PATIENCE: Duration = Duration::from_secs(3);
/// The commit log stream and its one subject.
pub const LOG_STREAM: &str = "FERROHUB_LOG";
pub const LOG_SUBJECT: &str = "ferrohub.log";
/// The bucket holding the writer lease (key [`super::lease::LEASE_KEY`]).
pub const LEASE_BUCKET: &str = "FERROHUB_LEASE";
/// The bucket holding the TLS material every node serves with.
pub const TLS_BUCKET: &str = "FERROHUB_TLS";
/// The bucket where each node says how far its replica holds the log (see [`super::trim`]).
pub const NODES_BUCKET: &str = "FERROHUB_NODES";
/// The largest log entry the stream takes; the engine keeps groups under half of it.
const MAX_ENTRY_BYTES: i32 = 8 << 20;

/// Oldest nats-server accepted, as (major, minor).
const MIN_SERVER: (u64, u64) = (2, 11);

#[derive(Clone)]
pub struct Link {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub lease: kv::Store,
    pub tls: kv::Store,
    pub nodes: kv::Store,
    pub section: ClusterSection,
    /// Seals what the nodes share through NATS but NATS must not read ([`super::tls_share`]).
    pub secret: Arc<ClusterSecret>,
}

fn server_addrs(urls: &[String]) -> Result<Vec<async_nats::ServerAddr>, ClusterError> {
    urls.iter()
        .map(|u| {
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| ClusterError::nats(&format!("NATS URL {u}"), e))
        })
        .collect()
}

/// How this node connects: its name, and its credentials and TLS trust when configured.
fn connect_options(section: &ClusterSection) -> Result<ConnectOptions, ClusterError> {
    let mut options = ConnectOptions::new()
        .name(format!("ferrohub {}", section.node))
        .max_reconnects(None);
    if let (Some(user), Some(file)) = (&section.nats_user, &section.nats_password_file) {
        let password = std::fs::read_to_string(file).map_err(|e| ClusterError::Credentials {
            path: file.display().to_string(),
            reason: e.to_string(),
        })?;
        options = options.user_and_password(user.clone(), password.trim_end().to_string());
    }
    if let Some(ca) = &section.nats_ca_file {
        options = options.require_tls(true).add_root_certificates(ca.clone());
    }
    Ok(options)
}

/// The error that stops the node when NATS refused it (its credentials, or TLS that does not
/// verify); `None` when waiting could help (a server down or not yet listening).
fn refusal(e: &ConnectError) -> Option<ClusterError> {
    let chain = error_chain(e);
    match e.kind() {
        ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
            Some(ClusterError::NatsRefused(chain))
        }
        ConnectErrorKind::Tls => Some(ClusterError::NatsTls(chain)),
        _ if tls_failed(e) => Some(ClusterError::NatsTls(chain)),
        _ => None,
    }
}

/// Whether a TLS error (a certificate that does not verify, say) lies under `e`: the client
/// reports a failed handshake as an I/O error wrapping rustls's.
fn tls_failed(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(err) = next {
        if err.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            if tls_failed(inner) {
                return true;
            }
        }
        next = err.source();
    }
    false
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(err) = next {
        let part = err.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        next = err.source();
    }
    text
}

fn version_ok(version: &str) -> bool {
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= MIN_SERVER
}

impl Link {
    /// Connects, retrying every second until a server answers or `shutdown` (then `None`).
    ///
    /// # Errors
    /// A bad URL, a server older than 2.11, or JetStream refusing to create the stream.
    pub async fn connect(
        section: &ClusterSection,
        shutdown: &CancellationToken,
    ) -> Result<Option<Link>, ClusterError> {
        let addrs = server_addrs(&section.nats)?;
        // Validating the configuration made sure it is set.
        let secret_file = section
            .secret_file
            .as_deref()
            .ok_or(ClusterError::NoSecret)?;
        let secret = Arc::new(ClusterSecret::read(secret_file)?);
        let options = connect_options(section)?;
        let client = loop {
            let attempt = options.clone().connect(addrs.clone());
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                c = attempt => match c {
                    Ok(c) => break c,
                    Err(e) => {
                        if let Some(refused) = refusal(&e) {
                            return Err(refused);
                        }
                        tracing::warn!(error = %e, "cannot reach the cluster's NATS servers; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        };
        let info = client.server_info();
        if !version_ok(&info.version) {
            return Err(ClusterError::ServerTooOld {
                found: info.version,
            });
        }
        if info.max_payload < MAX_ENTRY_BYTES as usize {
            return Err(ClusterError::PayloadTooSmall {
                server: info.max_payload,
                needed: MAX_ENTRY_BYTES as usize,
            });
        }
        let mut js = jetstream::new(client.clone());
        // A stream or bucket electing a leader holds a request for the whole timeout (the
        // client's 10 s by default): a follower opening its log reader then, or a writer
        // reading the log's state, would stand still that long after a NATS server's loss.
        js.set_timeout(JETSTREAM_PATIENCE);
        loop {
            match Self::objects(&js, section).await {
                Ok((lease, tls, nodes)) => {
                    return Ok(Some(Link {
                        client,
                        js,
                        lease,
                        tls,
                        nodes,
                        section: section.clone(),
                        secret,
                    }))
                }
                // JetStream without a quorum yet (servers still meeting each other).
                Err(e) => {
                    tracing::warn!(error = %e, "JetStream not ready; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }

    async fn objects(
        js: &jetstream::Context,
        section: &ClusterSection,
    ) -> Result<(kv::Store, kv::Store, kv::Store), ClusterError> {
        js.get_or_create_stream(stream::Config {
            name: LOG_STREAM.into(),
            subjects: vec![LOG_SUBJECT.into()],
            num_replicas: section.replicas,
            storage: stream::StorageType::File,
            max_message_size: MAX_ENTRY_BYTES,
            ..Default::default()
        })
        .await
        .map_err(|e| ClusterError::nats("the commit log stream", e))?;
        let lease = bucket(
            js,
            kv::Config {
                bucket: LEASE_BUCKET.into(),
                history: 1,
                max_age: section.lease,
                num_replicas: section.replicas,
                storage: stream::StorageType::File,
                ..Default::default()
            },
        )
        .await?;
        // Values that last until replaced: one each, on disk, replicated like the log.
        let lasting = |name: &str| kv::Config {
            bucket: name.into(),
            history: 1,
            num_replicas: section.replicas,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        let tls = bucket(js, lasting(TLS_BUCKET)).await?;
        let nodes = bucket(js, lasting(NODES_BUCKET)).await?;
        Ok((lease, tls, nodes))
    }

    async fn log_stream(&self) -> Result<jetstream::stream::Stream, ClusterError> {
        self.js
            .get_stream(LOG_STREAM)
            .await
            .map_err(|e| ClusterError::nats("the commit log stream", e))
    }

    /// The log's last sequence (0 when empty), as JetStream's stream leader sees it.
    ///
    /// # Errors
    /// NATS unreachable, or the stream without a leader.
    pub async fn log_end(&self) -> Result<u64, ClusterError> {
        Ok(self.log_span().await?.1)
    }

    /// The log's first and last sequences as JetStream's stream leader sees them: entries
    /// before the first were trimmed (after a trim of everything, first = last + 1).
    ///
    /// # Errors
    /// NATS unreachable, or the stream without a leader.
    pub async fn log_span(&self) -> Result<(u64, u64), ClusterError> {
        let (first, last, _) = self.log_state().await?;
        Ok((first, last))
    }

    /// The log's first and last sequences and the bytes it holds, as its stream leader sees
    /// them.
    ///
    /// # Errors
    /// NATS unreachable, or the stream without a leader.
    pub async fn log_state(&self) -> Result<(u64, u64, u64), ClusterError> {
        let info = self.log_info().await?;
        Ok((
            info.state.first_sequence,
            info.state.last_sequence,
            info.state.bytes,
        ))
    }

    /// The log stream's info, from a leader that heard from a majority of its replicas within
    /// the lease: a NATS server cut off from the others stays the stream's leader for up to
    /// 20 s (its lost-quorum check) and keeps answering, though it can no longer take an
    /// append and may no longer hold the log's end.
    async fn log_info(&self) -> Result<async_nats::jetstream::stream::Info, ClusterError> {
        // Getting the stream asks its leader for the info already: one request, not two.
        let info = self.log_stream().await?.cached_info().clone();
        match info.cluster.as_ref() {
            Some(cluster) if !leader_has_majority(cluster, self.section.lease) => {
                Err(ClusterError::Nats(format!(
                    "the commit log's leader {} has not heard from a majority of its replicas \
                     within the lease",
                    cluster.leader.as_deref().unwrap_or("?")
                )))
            }
            _ => Ok(info),
        }
    }

    /// The log stream's identity (its name and creation time: a stream deleted and made again,
    /// or made anew on wiped NATS storage, has another) with its first and last sequences.
    ///
    /// # Errors
    /// NATS unreachable, or the stream without a leader.
    pub async fn log_identity(&self) -> Result<(String, u64, u64), ClusterError> {
        let info = self.log_info().await?;
        Ok((
            format!(
                "{LOG_STREAM} created at {} ns",
                info.created.unix_timestamp_nanos()
            ),
            info.state.first_sequence,
            info.state.last_sequence,
        ))
    }

    /// One entry of the log, as stored.
    ///
    /// # Errors
    /// NATS unreachable, the stream without a leader, or no such entry.
    pub async fn log_entry(&self, sequence: u64) -> Result<bytes::Bytes, ClusterError> {
        let message = self
            .log_stream()
            .await?
            .get_raw_message(sequence)
            .await
            .map_err(|e| ClusterError::nats(&format!("commit log entry {sequence}"), e))?;
        Ok(message.payload)
    }

    /// Drops the log's entries up to and including `through`.
    ///
    /// # Errors
    /// NATS unreachable, or the stream without a leader.
    pub async fn trim_log_through(&self, through: u64) -> Result<(), ClusterError> {
        self.log_stream()
            .await?
            .purge()
            .sequence(through + 1)
            .await
            .map_err(|e| ClusterError::nats("trimming the commit log", e))?;
        Ok(())
    }
}

async fn bucket(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store, ClusterError> {
    let name = config.bucket.clone();
    match js.get_key_value(&name).await {
        Ok(kv) => Ok(kv),
        Err(_) => js
            .create_key_value(config)
            .await
            .map_err(|e| ClusterError::nats(&format!("bucket {name}"), e)),
    }
}

/// Whether the answer came from a stream leader that heard from enough of its replicas within
/// `within` (at least 3 s: replicas answer heartbeats about once a second) to make a majority
/// with itself. A replica's `active` is the time since the leader last heard from it; 0 means
/// never, unless the replica is also `current`. A leaderless stream's member answers with its
/// own view (no leader, or itself among the replicas): that is no leader's answer.
fn leader_has_majority(cluster: &stream::ClusterInfo, within: Duration) -> bool {
    let within = within.max(Duration::from_secs(3));
    let Some(leader) = cluster.leader.as_deref().filter(|l| !l.is_empty()) else {
        return false;
    };
    if cluster.replicas.iter().any(|peer| peer.name == leader) {
        return false;
    }
    let members = cluster.replicas.len() + 1;
    let in_touch = cluster
        .replicas
        .iter()
        .filter(|peer| {
            !peer.offline && peer.active < within && (peer.active > Duration::ZERO || peer.current)
        })
        .count()
        + 1;
    in_touch * 2 > members
}

#[cfg(test)]
mod tests {
    #[test]
    fn server_versions() {
        assert!(super::version_ok("2.11.0"));
        assert!(super::version_ok("2.15.1"));
        assert!(super::version_ok("3.0.0"));
        assert!(!super::version_ok("2.9.10"));
        assert!(!super::version_ok("2.10.22-beta"));
        assert!(!super::version_ok(""));
    }

    fn cluster(actives_ms: &[(u64, bool)]) -> async_nats::jetstream::stream::ClusterInfo {
        led_by("n", actives_ms, true)
    }

    fn led_by(
        leader: &str,
        actives_ms: &[(u64, bool)],
        current: bool,
    ) -> async_nats::jetstream::stream::ClusterInfo {
        let replicas: Vec<_> = actives_ms
            .iter()
            .enumerate()
            .map(|(i, (ms, offline))| {
                serde_json::json!({"name": format!("n{i}"), "current": current,
                                   "active": ms * 1_000_000, "offline": offline})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"leader": leader, "replicas": replicas})).unwrap()
    }

    #[test]
    fn a_leader_answers_for_the_log_only_while_a_majority_heard_from_it() {
        let lease = std::time::Duration::from_secs(5);
        assert!(super::leader_has_majority(
            &cluster(&[(800, false), (900, false)]),
            lease
        ));
        // One replica lost: the leader and the other still make two of three.
        assert!(super::leader_has_majority(
            &cluster(&[(800, false), (12_000, false)]),
            lease
        ));
        assert!(super::leader_has_majority(
            &cluster(&[(800, false), (100, true)]),
            lease
        ));
        // Both lost: a lone server still answers, but has no majority.
        assert!(!super::leader_has_majority(
            &cluster(&[(6_000, false), (12_000, false)]),
            lease
        ));
        assert!(!super::leader_has_majority(
            &cluster(&[(100, true), (100, true)]),
            lease
        ));
        // A single-server log (no replicas) is its own majority.
        assert!(super::leader_has_majority(&cluster(&[]), lease));
        // A leaderless stream's member answering with its own view is no leader's answer.
        assert!(!super::leader_has_majority(
            &led_by("", &[(0, false), (0, false)], false),
            lease
        ));
        assert!(!super::leader_has_majority(
            &led_by("n0", &[(0, false), (100, false)], true),
            lease
        ));
        // Replicas never heard from (active 0, not current) do not count.
        assert!(!super::leader_has_majority(
            &led_by("n", &[(0, false), (0, false)], false),
            lease
        ));
        // A lease shorter than the heartbeat still counts replicas heard within 3 s.
        let short = std::time::Duration::from_secs(1);
        assert!(super::leader_has_majority(
            &cluster(&[(1_500, false), (2_000, false)]),
            short
        ));
    }
}
