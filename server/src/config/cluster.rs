//! The `[cluster]` section: NATS servers, this node's name and address, the lease.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

/// Appends a writer keeps unanswered at once by default (`appends_in_flight`). Alone, the log
/// carries 4 times as many entries at 16 in flight as at 1 (scripts/bench-cluster-log.sh), but
/// with three hubs and three nats-servers sharing two cores, 1 carried the most writes: more
/// in flight sends smaller groups, and every entry costs each NATS server a sync
/// (docs/performance.md, "Cluster mode").
pub const DEFAULT_APPENDS_IN_FLIGHT: usize = 1;

/// Cluster mode (docs/cluster.md): with NATS URLs the node joins a cluster whose hub lives in
/// a replicated JetStream log; without (the default) it is a single node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// NATS servers of the cluster's JetStream (any subset; the client finds the rest).
    pub nats: Vec<String>,
    /// This node's name, unique in the cluster (it names the writer lease's holder).
    pub node: String,
    /// Replicas of the commit log and the lease: 3 tolerates the loss of one NATS server.
    pub replicas: usize,
    /// How long a writer's lease lasts unrenewed: the bound on failover after a writer dies.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// Names and addresses the shared server certificate covers besides the host name
    /// (each node's address, so a client may also connect to a node directly).
    pub certificate_names: Vec<String>,
    /// The address other nodes reach this node's listeners at, when it is the writer (a
    /// follower forwards the connections it accepts there). Default: the HTTPS listener's
    /// address, which must then not be unspecified.
    pub advertise: Option<String>,
    /// How often the writer drops the log entries every node holds (docs/cluster.md).
    #[serde(with = "humantime_serde")]
    pub log_trim_interval: Duration,
    /// How long the log keeps every entry, and how long a node that stopped saying how far it
    /// holds the log still holds trimming back; a node away longer restarts from another
    /// node's backup. The NATS servers' disks hold this long of writes.
    #[serde(with = "humantime_serde")]
    pub log_keeps_absent_nodes_for: Duration,
    /// The user this node authenticates to NATS as (with `nats_password_file`).
    pub nats_user: Option<String>,
    /// A file holding that user's password (never on a command line or in this file).
    pub nats_password_file: Option<PathBuf>,
    /// The CA that signed the NATS servers' certificates: with it, the node speaks to NATS
    /// only over TLS those certificates verify under.
    pub nats_ca_file: Option<PathBuf>,
    /// A file holding the cluster's secret (64 hexadecimal digits, the same on every node,
    /// never given to NATS): what the nodes share through NATS that NATS must not read, the
    /// TLS private keys, is sealed with it. Required in cluster mode.
    pub secret_file: Option<PathBuf>,
    /// Commit groups the writer keeps appended to the log and unanswered at once (1 to 256):
    /// more carries more writes per majority round trip (docs/cluster.md, "How it works").
    pub appends_in_flight: usize,
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            nats: Vec::new(),
            node: String::new(),
            replicas: 3,
            lease: Duration::from_secs(5),
            certificate_names: Vec::new(),
            advertise: None,
            log_trim_interval: Duration::from_secs(60),
            log_keeps_absent_nodes_for: Duration::from_secs(3600),
            nats_user: None,
            nats_password_file: None,
            nats_ca_file: None,
            secret_file: None,
            appends_in_flight: DEFAULT_APPENDS_IN_FLIGHT,
        }
    }
}

impl ClusterSection {
    pub fn enabled(&self) -> bool {
        !self.nats.is_empty()
    }

    /// The host other nodes reach this node at: `advertise`, or else the HTTPS listener's IP.
    pub fn advertised_host(&self, https: std::net::SocketAddr) -> Option<String> {
        match &self.advertise {
            Some(a) => Some(a.clone()),
            None if !https.ip().is_unspecified() => Some(https.ip().to_string()),
            None => None,
        }
    }

    pub(super) fn validate(&self, https: std::net::SocketAddr) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        if self.node.is_empty()
            || !self
                .node
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::Invalid {
                key: "cluster.node",
                reason: "a cluster node needs a name of letters, digits, '-' and '_'".into(),
            });
        }
        if !(1..=256).contains(&self.appends_in_flight) {
            return Err(ConfigError::Invalid {
                key: "cluster.appends_in_flight",
                reason: "must be 1 to 256".into(),
            });
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(ConfigError::Invalid {
                key: "cluster.replicas",
                reason: "must be 1 to 5 (JetStream's limit)".into(),
            });
        }
        for (key, value) in [
            ("cluster.lease", self.lease),
            ("cluster.log_trim_interval", self.log_trim_interval),
            (
                "cluster.log_keeps_absent_nodes_for",
                self.log_keeps_absent_nodes_for,
            ),
        ] {
            if value < Duration::from_secs(1) {
                return Err(ConfigError::Invalid {
                    key,
                    reason: "must be at least 1s".into(),
                });
            }
        }
        if self.advertised_host(https).is_none_or(|h| h.is_empty()) {
            return Err(ConfigError::Invalid {
                key: "cluster.advertise",
                reason: "the HTTPS listener listens on every address: say which one other \
                         nodes reach this node at"
                    .into(),
            });
        }
        if self.secret_file.is_none() {
            return Err(ConfigError::Invalid {
                key: "cluster.secret_file",
                reason: "cluster mode needs a secret shared by the nodes and not by NATS (a file \
                         of 64 hexadecimal digits: `openssl rand -hex 32`): the TLS private keys \
                         reach NATS only sealed with it"
                    .into(),
            });
        }
        if self.nats_user.is_some() != self.nats_password_file.is_some() {
            return Err(ConfigError::Invalid {
                key: "cluster.nats_user",
                reason: "nats_user and nats_password_file go together".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Config, ConfigError};

    #[test]
    fn cluster_section() {
        let c = Config::default();
        assert!(!c.cluster.enabled(), "a single node by default");
        let c: Config = toml::from_str(
            "[cluster]\nnats = [\"nats://127.0.0.2:4222\"]\nnode = \"hub-1\"\nlease = \"5s\"\n",
        )
        .unwrap();
        assert!(c.cluster.enabled());
        assert_eq!(c.cluster.replicas, 3);
        // The default HTTPS listener is [::]:443: other nodes need an address.
        assert_eq!(c.cluster.advertised_host(c.listeners.https), None);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Invalid {
                key: "cluster.advertise",
                ..
            })
        ));
        let c: Config = toml::from_str(
            "[cluster]\nnats = [\"nats://a\"]\nnode = \"n\"\n[listeners]\nhttps = \"10.0.0.7:443\"\n",
        )
        .unwrap();
        assert_eq!(
            c.cluster.advertised_host(c.listeners.https).as_deref(),
            Some("10.0.0.7")
        );
        let c: Config = toml::from_str(
            "[cluster]\nnats = [\"nats://a\"]\nnode = \"n\"\nadvertise = \"10.0.0.7\"\n\
             secret_file = \"/s\"\nnats_user = \"n\"\nnats_password_file = \"/p\"\n\
             nats_ca_file = \"/ca.pem\"\n",
        )
        .unwrap();
        c.validate().expect("a complete cluster section");
        for (text, key) in [
            ("nats = [\"nats://a\"]", "cluster.node"),
            ("nats = [\"nats://a\"]\nnode = \"a b\"", "cluster.node"),
            (
                "nats = [\"nats://a\"]\nnode = \"n\"\nreplicas = 7",
                "cluster.replicas",
            ),
            (
                "nats = [\"nats://a\"]\nnode = \"n\"\nlease = \"100ms\"",
                "cluster.lease",
            ),
            (
                "nats = [\"nats://a\"]\nnode = \"n\"\nadvertise = \"\"",
                "cluster.advertise",
            ),
            (
                "nats = [\"nats://a\"]\nnode = \"n\"\nlog_trim_interval = \"0s\"",
                "cluster.log_trim_interval",
            ),
            (
                "nats = [\"nats://a\"]\nnode = \"n\"\nadvertise = \"10.0.0.7\"",
                "cluster.secret_file",
            ),
            (
                "nats = [\"nats://a\"]\nnode = \"n\"\nadvertise = \"10.0.0.7\"\n\
                 secret_file = \"/s\"\nnats_user = \"n\"",
                "cluster.nats_user",
            ),
        ] {
            let c: Config = toml::from_str(&format!("[cluster]\n{text}\n")).unwrap();
            match c.validate() {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
