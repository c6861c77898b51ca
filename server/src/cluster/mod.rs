//! Cluster mode (docs/cluster.md): the hub's state lives in a commit log replicated by a NATS
//! JetStream cluster, every node keeps a replica of it, and the node holding the writer lease
//! serves the hub over its own replica, appending each commit group to the log before it
//! writes it.
//!
//! # Invariants
//! - Only the lease holder opens a writing [`ferrohub_engine::Store`]; every other node holds
//!   a [`ferrohub_engine::Replica`], applies the log, and serves clients from it, its writes
//!   sent to the writer over core NATS ([`bus`]; the hub's calls and live traffic ride it).
//! - Two writers can never both extend the log: every append expects the sequence its writer
//!   last saw ([`log::JetStreamLog`]), so a deposed writer's append is refused whatever the
//!   lease says. The lease only decides who tries.
//! - A writer whose append failed or was refused writes nothing more (the engine poisons its
//!   committer); it steps down once it can reach the log again, and follows it from what its
//!   replica holds.
//! - Every node serves with the same TLS material, shared through the cluster ([`tls_share`]);
//!   its private keys reach NATS only sealed with the cluster's secret ([`secret`]), which NATS
//!   never holds.
//! - A node that NATS refuses, or whose NATS servers' certificates do not verify, stops with an
//!   error instead of retrying: only an unreachable server is waited for.
//! - The log keeps every entry some node heard from recently may still need ([`trim`]).
//! - A node follows only the log its replica came from: it records the log's identity and the
//!   checksum of the last entry it holds, and refuses a log created anew, one that ends before
//!   what it applied, or one holding another entry at that sequence ([`lineage`]).

pub mod bus;
pub mod follow;
pub mod lease;
pub mod lineage;
pub mod link;
pub mod log;
pub mod secret;
pub mod seed;
pub mod standing;
pub mod tls_share;
pub mod trim;
pub mod writer;

pub use link::Link;

/// What can stop a node from taking part in the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("NATS: {0}")]
    Nats(String),
    #[error("nats-server {found} is too old: cluster mode needs 2.11 or later")]
    ServerTooOld { found: String },
    #[error("replica: {0}")]
    Replica(String),
    #[error("TLS material: {0}")]
    Tls(String),
    #[error(
        "NATS refused this node ({0}): check [cluster] nats_user and nats_password_file against \
         the users the NATS servers accept"
    )]
    NatsRefused(String),
    #[error(
        "no verified TLS connection to NATS ({0}): [cluster] nats_ca_file must be the CA that \
         signed the NATS servers' certificates, and those must cover the addresses in \
         [cluster] nats"
    )]
    NatsTls(String),
    #[error("cannot read [cluster] nats_password_file {path}: {reason}")]
    Credentials { path: String, reason: String },
    #[error(
        "the NATS servers take messages of at most {server} bytes, and the commit log's \
         entries need {needed}: set max_payload to at least 8MB in every nats-server's \
         configuration"
    )]
    PayloadTooSmall { server: usize, needed: usize },
    /// This node's replica and the commit log disagree: following would serve a hub that is
    /// not the cluster's.
    #[error("this node cannot follow the commit log: {0}")]
    Diverged(String),
    #[error("[cluster] secret_file is not set")]
    NoSecret,
    #[error("cluster secret: {0}")]
    Secret(#[from] secret::SecretError),
}

impl ClusterError {
    pub(crate) fn nats(what: &str, e: impl std::fmt::Display) -> ClusterError {
        ClusterError::Nats(format!("{what}: {e}"))
    }
}

impl From<ferrohub_engine::StorageError> for ClusterError {
    fn from(e: ferrohub_engine::StorageError) -> Self {
        ClusterError::Replica(e.to_string())
    }
}
