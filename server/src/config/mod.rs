//! Node configuration (P-4, P-5): defaults, then the TOML file, then command-line flags.
//!
//! Hub name and host name take effect when a data directory is initialised; afterwards the
//! values stored in the hub win (the server certificate and policies were made for them).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

mod backup;
mod cluster;
mod routing;
mod targets;
mod tls;
pub use backup::BackupSection;
pub use cluster::ClusterSection;
pub use routing::{EndpointConfig, EnrichmentConfig, RouteConfig, RoutingSection};
pub use targets::{BrokerConfig, StorageConfig, WebhookConfig};
pub use tls::TlsSection;

pub mod defaults {
    use std::time::Duration;

    pub const HUB_NAME: &str = "ferrohub";
    pub const HOST_NAME: &str = "localhost";
    /// `[::]` with IPV6_V6ONLY off: IPv6 and IPv4 (mapped) on one socket, so a client that
    /// resolves `localhost` to `::1` first is served as one that uses 127.0.0.1.
    pub const HTTPS_ADDR: &str = "[::]:443";
    pub const MQTT_ADDR: &str = "[::]:8883";
    /// MQTT over QUIC (UDP), EMQX's single-stream framing.
    pub const MQTT_QUIC_ADDR: &str = "[::]:14567";
    pub const AMQP_ADDR: &str = "[::]:5671";
    /// Metrics and health: plain HTTP, loopback only unless configured otherwise.
    pub const METRICS_ADDR: &str = "127.0.0.1:9464";
    pub const D2C_PARTITIONS: u16 = 4;
    /// IoT Hub's default retention of device-to-cloud events.
    pub const D2C_RETENTION: Duration = Duration::from_secs(86_400);
    pub const RETENTION_CHECK_INTERVAL: Duration = Duration::from_secs(3_600);
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path} is invalid: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("invalid setting {key}: {reason}")]
    Invalid { key: &'static str, reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DurabilitySetting {
    #[default]
    Synced,
    Relaxed,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HubSection {
    /// Name of a new hub.
    pub name: String,
    /// Host name devices and services use (connection strings carry it); the server
    /// certificate is made for it. Unset: `localhost` for a new hub, the stored one for an
    /// existing hub. Set on an existing hub, it must be the stored one: `ferrohub host-name
    /// set` changes it.
    pub host_name: Option<String>,
    /// Further names of a new hub (a DNS alias, an IP address), held to the same rule.
    pub other_host_names: Vec<String>,
    /// How often a device's traffic moves its `lastActivityTime`, at most (each move is a
    /// registry write; IoT Hub's lags too).
    #[serde(with = "humantime_serde")]
    pub last_activity_interval: Duration,
}

impl HubSection {
    /// The host name of a new hub.
    pub fn host_name(&self) -> &str {
        self.host_name.as_deref().unwrap_or(defaults::HOST_NAME)
    }

    /// Whether host names were given (so an existing hub must have these).
    pub fn names_given(&self) -> bool {
        self.host_name.is_some() || !self.other_host_names.is_empty()
    }
}

impl Default for HubSection {
    fn default() -> Self {
        HubSection {
            name: defaults::HUB_NAME.into(),
            host_name: None,
            other_host_names: Vec::new(),
            last_activity_interval: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenersSection {
    /// HTTPS: the REST API and MQTT over WebSocket.
    pub https: SocketAddr,
    /// MQTT over TLS.
    pub mqtt: SocketAddr,
    /// MQTT over QUIC (UDP; docs/mqtt.md).
    pub mqtt_quic: SocketAddr,
    /// AMQP 1.0 over TLS: the service endpoint (C2D sends, feedback).
    pub amqp: SocketAddr,
    /// Prometheus `/metrics` and `/health/live`, `/health/ready` (plain HTTP).
    pub metrics: SocketAddr,
    /// MQTT/TLS connections served at once; more are closed as they arrive. The process may
    /// hold about 20,000 files here, shared with HTTPS, AMQP and the store.
    pub mqtt_max_connections: usize,
}

impl Default for ListenersSection {
    fn default() -> Self {
        ListenersSection {
            https: defaults::HTTPS_ADDR.parse().expect("valid default address"),
            mqtt: defaults::MQTT_ADDR.parse().expect("valid default address"),
            mqtt_quic: defaults::MQTT_QUIC_ADDR
                .parse()
                .expect("valid default address"),
            amqp: defaults::AMQP_ADDR.parse().expect("valid default address"),
            metrics: defaults::METRICS_ADDR
                .parse()
                .expect("valid default address"),
            mqtt_max_connections: 16_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct D2cSection {
    /// Partitions of a new hub (1 to 32); fixed once the hub exists.
    pub partitions: u16,
    /// How long events are kept: 1 to 7 days (shorter only with `development.allow_short_retention`).
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// How often the retention pass runs.
    #[serde(with = "humantime_serde")]
    pub retention_check_interval: Duration,
}

impl Default for D2cSection {
    fn default() -> Self {
        D2cSection {
            partitions: defaults::D2C_PARTITIONS,
            retention: defaults::D2C_RETENTION,
            retention_check_interval: defaults::RETENTION_CHECK_INTERVAL,
        }
    }
}

/// Settings for development and tests only.
/// Cloud-to-device queues (seed 002's C2D configuration, C2D-4).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct C2dSection {
    /// Most messages one device queue holds.
    pub max_queue_depth: u32,
    /// `defaultTtlAsIso8601`: 1 minute to 2 days.
    #[serde(with = "humantime_serde")]
    pub default_ttl: Duration,
    /// `maxDeliveryCount`: 1 to 100.
    pub max_delivery_count: u32,
    /// How long a received message stays locked (invisible): 1 second to 1 hour.
    #[serde(with = "humantime_serde")]
    pub lock_timeout: Duration,
    /// `feedback.ttlAsIso8601`: 1 minute to 2 days.
    #[serde(with = "humantime_serde")]
    pub feedback_ttl: Duration,
    /// `feedback.maxDeliveryCount`: 1 to 100.
    pub feedback_max_delivery_count: u32,
}

impl Default for C2dSection {
    fn default() -> Self {
        let d = ferrohub_engine::c2d::QueueSettings::default();
        C2dSection {
            max_queue_depth: d.max_depth,
            default_ttl: Duration::from_millis(d.default_ttl_ms as u64),
            max_delivery_count: d.max_delivery_count,
            lock_timeout: Duration::from_millis(d.lock_timeout_ms as u64),
            feedback_ttl: Duration::from_millis(d.feedback_ttl_ms as u64),
            feedback_max_delivery_count: d.feedback_max_delivery_count,
        }
    }
}

impl C2dSection {
    pub fn queue_settings(&self) -> ferrohub_engine::c2d::QueueSettings {
        ferrohub_engine::c2d::QueueSettings {
            max_depth: self.max_queue_depth,
            default_ttl_ms: self.default_ttl.as_millis() as i64,
            max_delivery_count: self.max_delivery_count,
            lock_timeout_ms: self.lock_timeout.as_millis() as i64,
            feedback_ttl_ms: self.feedback_ttl.as_millis() as i64,
            feedback_max_delivery_count: self.feedback_max_delivery_count,
            ..ferrohub_engine::c2d::QueueSettings::default()
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let minute = Duration::from_secs(60);
        let two_days = Duration::from_secs(2 * 86_400);
        let ttl = |key, d: Duration| {
            if d < minute || d > two_days {
                Err(ConfigError::Invalid {
                    key,
                    reason: format!(
                        "{} is outside 1 minute to 2 days",
                        humantime::format_duration(d)
                    ),
                })
            } else {
                Ok(())
            }
        };
        ttl("c2d.default_ttl", self.default_ttl)?;
        ttl("c2d.feedback_ttl", self.feedback_ttl)?;
        for (key, n) in [
            ("c2d.max_delivery_count", self.max_delivery_count),
            (
                "c2d.feedback_max_delivery_count",
                self.feedback_max_delivery_count,
            ),
        ] {
            if !(1..=100).contains(&n) {
                return Err(ConfigError::Invalid {
                    key,
                    reason: format!("{n} is outside 1 to 100"),
                });
            }
        }
        if !(1..=5000).contains(&self.max_queue_depth) {
            return Err(ConfigError::Invalid {
                key: "c2d.max_queue_depth",
                reason: format!("{} is outside 1 to 5000", self.max_queue_depth),
            });
        }
        if self.lock_timeout < Duration::from_secs(1)
            || self.lock_timeout > Duration::from_secs(3600)
        {
            return Err(ConfigError::Invalid {
                key: "c2d.lock_timeout",
                reason: "must be 1 second to 1 hour".into(),
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DevelopmentSection {
    /// Allows a D2C retention under one day (tests shorten it to seconds).
    pub allow_short_retention: bool,
}

/// The twin query index (QRY-1): what is indexed beyond status, connectionState and tags.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct QuerySection {
    /// `properties.desired.…` / `properties.reported.…` paths to index (docs/query.md).
    pub indexed_paths: Vec<String>,
}

/// How long a client may take before the hub gives up on it: what keeps slow or silent clients
/// (slow-loris) and clients that stop reading from holding a connection and its buffers.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsSection {
    /// The whole TLS handshake (MQTT, AMQP and HTTPS listeners).
    #[serde(with = "humantime_serde")]
    pub tls_handshake: Duration,
    /// From the end of the TLS handshake to a complete MQTT CONNECT.
    #[serde(with = "humantime_serde")]
    pub mqtt_connect: Duration,
    /// A complete HTTP request head, from when the connection waits for one (an idle keep-alive
    /// connection is closed after this too).
    #[serde(with = "humantime_serde")]
    pub http_headers: Duration,
    /// One write to a client that is not reading: the connection is closed after this.
    #[serde(with = "humantime_serde")]
    pub write_stall: Duration,
}

impl Default for TimeoutsSection {
    fn default() -> Self {
        TimeoutsSection {
            tls_handshake: Duration::from_secs(10),
            mqtt_connect: Duration::from_secs(30),
            http_headers: Duration::from_secs(60),
            write_stall: Duration::from_secs(60),
        }
    }
}

impl TimeoutsSection {
    fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("timeouts.tls_handshake", self.tls_handshake),
            ("timeouts.mqtt_connect", self.mqtt_connect),
            ("timeouts.http_headers", self.http_headers),
            ("timeouts.write_stall", self.write_stall),
        ] {
            if value < Duration::from_millis(100) || value > Duration::from_secs(3_600) {
                return Err(ConfigError::Invalid {
                    key,
                    reason: format!("{} is outside 100ms..1h", humantime::format_duration(value)),
                });
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageSection {
    /// `synced` (every acknowledgement is on disk) or `relaxed` (development only).
    pub durability: DurabilitySetting,
    /// At most this many threads run engine calls at once (tokio's blocking pool; the C2D,
    /// twin and telemetry hot paths have fixed threads of their own). Each thread keeps
    /// allocator pages of its own: with hundreds of them after a connect storm, idle devices
    /// cost a third more memory, and connects were slower, not faster.
    pub engine_threads: usize,
    /// After a durable write failed (a full disk), the store is reopened once this many MiB can
    /// be written and synced in the data directory again: room for a new write-ahead log and a
    /// memtable flush, and more than RocksDB frees by itself when it drops a failed file.
    pub recovery_free_space_mb: u32,
}

impl Default for StorageSection {
    fn default() -> Self {
        StorageSection {
            durability: DurabilitySetting::default(),
            engine_threads: 8,
            recovery_free_space_mb: 32,
        }
    }
}

/// File upload (FUP-1): the storage account devices upload to. Absent: uploads are refused.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUploadSection {
    /// Azure Storage connection string (`AccountName`, `AccountKey`, optionally `BlobEndpoint`).
    pub connection_string: String,
    /// The container uploads go to, as `{deviceId}/{blobName}`.
    pub container: String,
    /// How long a device's upload SAS is valid.
    #[serde(with = "humantime_serde", default = "default_sas_ttl")]
    pub sas_ttl: Duration,
    /// Queue a notification for the service when a device reports a successful upload.
    #[serde(default)]
    pub notifications: bool,
    /// How long a notification waits to be received.
    #[serde(with = "humantime_serde", default = "default_notification_ttl")]
    pub notification_ttl: Duration,
    /// Deliveries of a notification before it is dropped.
    #[serde(default = "default_notification_deliveries")]
    pub notification_max_delivery_count: u32,
}

fn default_sas_ttl() -> Duration {
    Duration::from_secs(3_600)
}

fn default_notification_ttl() -> Duration {
    Duration::from_secs(3_600)
}

fn default_notification_deliveries() -> u32 {
    10
}

/// IoT Hub's tiers (seed 002, "Cotas e limitação"); `unlimited` is the self-hosted default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    #[default]
    Unlimited,
    Free,
    S1,
    S2,
    S3,
}

/// Operation throttles (THR-1): the tier's limits times the units, each overridable.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ThrottlingSection {
    pub tier: Tier,
    pub units: u32,
    /// A request that would wait at most this long for its turn is delayed, not refused.
    #[serde(with = "humantime_serde")]
    pub shaping_delay: Duration,
    pub registry_per_minute: Option<u32>,
    pub c2d_sends_per_minute: Option<u32>,
    pub c2d_receives_per_minute: Option<u32>,
    pub device_connections_per_second: Option<u32>,
    pub twin_reads_per_second: Option<u32>,
    pub twin_updates_per_second: Option<u32>,
    pub methods_per_second: Option<u32>,
    pub jobs_per_minute: Option<u32>,
    pub d2c_sends_per_second: Option<u32>,
    pub queries_per_minute: Option<u32>,
    /// The daily message quota in chunks (4 KB; 0.5 KB on the free tier), reset at 00:00 UTC.
    pub daily_messages: Option<u64>,
    /// A device held to its D2C fair share for this long without a break is disconnected
    /// (THR-2).
    #[serde(with = "humantime_serde")]
    pub fair_share_hold: Duration,
    /// Failed DPS attestations one source address may make per minute (the burst too);
    /// beyond it every DPS request from that address gets 429 until the budget refills. 0
    /// turns the limit off.
    pub dps_failed_attestations_per_minute: u32,
}

impl Default for ThrottlingSection {
    fn default() -> Self {
        ThrottlingSection {
            tier: Tier::Unlimited,
            units: 1,
            shaping_delay: Duration::from_millis(250),
            registry_per_minute: None,
            c2d_sends_per_minute: None,
            c2d_receives_per_minute: None,
            device_connections_per_second: None,
            twin_reads_per_second: None,
            twin_updates_per_second: None,
            methods_per_second: None,
            jobs_per_minute: None,
            d2c_sends_per_second: None,
            queries_per_minute: None,
            daily_messages: None,
            fair_share_hold: Duration::from_secs(5),
            dps_failed_attestations_per_minute: 60,
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub hub: HubSection,
    pub tls: TlsSection,
    pub backup: BackupSection,
    pub listeners: ListenersSection,
    pub storage: StorageSection,
    pub d2c: D2cSection,
    pub c2d: C2dSection,
    pub routing: RoutingSection,
    pub development: DevelopmentSection,
    pub file_upload: Option<FileUploadSection>,
    pub throttling: ThrottlingSection,
    pub query: QuerySection,
    pub timeouts: TimeoutsSection,
    pub cluster: ClusterSection,
}

impl Config {
    /// Reads a TOML file; missing sections and keys take their defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.into(),
            reason: e.to_string(),
        })?;
        Config::from_toml(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            reason: e.to_string(),
        })
    }

    /// Parses a configuration file's text; missing sections and keys take their defaults.
    ///
    /// # Errors
    /// TOML's error, with the line and column.
    pub fn from_toml(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }

    /// Checks ranges the types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let day = Duration::from_secs(86_400);
        let r = self.d2c.retention;
        if r > 7 * day || (r < day && !self.development.allow_short_retention) || r.is_zero() {
            return Err(ConfigError::Invalid {
                key: "d2c.retention",
                reason: format!("{} is outside 1 to 7 days", humantime::format_duration(r)),
            });
        }
        if !(1..=32).contains(&self.d2c.partitions) {
            return Err(ConfigError::Invalid {
                key: "d2c.partitions",
                reason: "must be 1 to 32".into(),
            });
        }
        self.c2d.validate()?;
        if !(1..=512).contains(&self.storage.engine_threads) {
            return Err(ConfigError::Invalid {
                key: "storage.engine_threads",
                reason: "must be 1 to 512".into(),
            });
        }
        if self.routing.endpoint_backlog_limit == Some(0) {
            return Err(ConfigError::Invalid {
                key: "routing.endpoint_backlog_limit",
                reason: "must be at least 1".into(),
            });
        }
        if self.d2c.retention_check_interval.is_zero() {
            return Err(ConfigError::Invalid {
                key: "d2c.retention_check_interval",
                reason: "must be positive".into(),
            });
        }
        if let Some(bad) = self.query.indexed_paths.iter().find(|p| {
            let rest = p
                .strip_prefix("properties.desired.")
                .or_else(|| p.strip_prefix("properties.reported."));
            rest.is_none_or(|r| r.split('.').any(str::is_empty))
        }) {
            return Err(ConfigError::Invalid {
                key: "query.indexed_paths",
                reason: format!(
                    "{bad:?}: a path is properties.desired.<name>[.<name>…] or properties.reported.<name>[.<name>…]"
                ),
            });
        }
        self.cluster.validate(self.listeners.https)?;
        self.tls.validate()?;
        if self.hub.last_activity_interval < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                key: "hub.last_activity_interval",
                reason: "at least 1s".into(),
            });
        }
        self.timeouts.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c: Config = toml::from_str("[listeners]\nhttps = \"127.0.0.1:8443\"\n").unwrap();
        assert_eq!(c.listeners.https.port(), 8443);
        assert_eq!(c.hub.host_name(), "localhost");
        assert!(!c.hub.names_given());
        assert_eq!(c.storage.durability, DurabilitySetting::Synced);
    }

    #[test]
    fn retention_range() {
        let mut c = Config::default();
        assert!(c.validate().is_ok());
        c.d2c.retention = Duration::from_secs(2);
        assert!(c.validate().is_err());
        c.development.allow_short_retention = true;
        assert!(c.validate().is_ok());
        c.d2c.retention = Duration::from_secs(8 * 86_400);
        assert!(c.validate().is_err());
        let parsed: Config = toml::from_str("[d2c]\nretention = \"3days\"\n").unwrap();
        assert_eq!(parsed.d2c.retention, Duration::from_secs(3 * 86_400));
    }

    #[test]
    fn indexed_paths_are_desired_or_reported_paths() {
        let mut c = Config::default();
        c.query.indexed_paths = vec![
            "properties.reported.temp".into(),
            "properties.desired.a.b".into(),
        ];
        assert!(c.validate().is_ok());
        for bad in ["tags.x", "properties.reported", "properties.reported..x"] {
            c.query.indexed_paths = vec![bad.into()];
            assert!(c.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn engine_threads_default_and_range() {
        assert_eq!(Config::default().storage.engine_threads, 8);
        let c: Config = toml::from_str("[storage]\nengine_threads = 32\n").unwrap();
        assert_eq!(c.storage.engine_threads, 32);
        assert_eq!(c.storage.durability, DurabilitySetting::Synced);
        for bad in [0, 513] {
            let c: Config =
                toml::from_str(&format!("[storage]\nengine_threads = {bad}\n")).unwrap();
            assert!(
                matches!(
                    c.validate(),
                    Err(ConfigError::Invalid {
                        key: "storage.engine_threads",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<Config>("[hub]\nhostname = \"x\"\n").is_err());
    }

    #[test]
    fn sample_config_parses() {
        let sample = include_str!("../../../docs/config.sample.toml");
        let c: Config = toml::from_str(sample).unwrap();
        assert_eq!(c.listeners.https.port(), 443);
        c.validate().unwrap();
        assert_eq!(
            c.c2d.queue_settings(),
            ferrohub_engine::c2d::QueueSettings::default()
        );
    }

    #[test]
    fn c2d_settings_outside_their_ranges_are_refused() {
        for (text, key) in [
            ("[c2d]\ndefault_ttl = \"30s\"", "c2d.default_ttl"),
            ("[c2d]\nfeedback_ttl = \"3days\"", "c2d.feedback_ttl"),
            ("[c2d]\nmax_delivery_count = 0", "c2d.max_delivery_count"),
            (
                "[c2d]\nfeedback_max_delivery_count = 101",
                "c2d.feedback_max_delivery_count",
            ),
            ("[c2d]\nmax_queue_depth = 0", "c2d.max_queue_depth"),
            ("[c2d]\nlock_timeout = \"500ms\"", "c2d.lock_timeout"),
        ] {
            let c: Config = toml::from_str(text).unwrap();
            match c.validate() {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let c: Config =
            toml::from_str("[c2d]\nlock_timeout = \"2s\"\nmax_queue_depth = 100").unwrap();
        c.validate().unwrap();
        assert_eq!(c.c2d.queue_settings().lock_timeout_ms, 2000);
        assert_eq!(c.c2d.queue_settings().max_depth, 100);
    }

    #[test]
    fn timeouts_outside_their_range_are_refused() {
        for (text, key) in [
            (
                "[timeouts]\ntls_handshake = \"50ms\"",
                "timeouts.tls_handshake",
            ),
            ("[timeouts]\nmqtt_connect = \"2h\"", "timeouts.mqtt_connect"),
            ("[timeouts]\nhttp_headers = \"0s\"", "timeouts.http_headers"),
            (
                "[timeouts]\nwrite_stall = \"61min\"",
                "timeouts.write_stall",
            ),
        ] {
            let c: Config = toml::from_str(text).unwrap();
            match c.validate() {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let c: Config = toml::from_str("[timeouts]\nwrite_stall = \"3s\"").unwrap();
        c.validate().unwrap();
        assert_eq!(c.timeouts.write_stall, Duration::from_secs(3));
        assert_eq!(c.timeouts.mqtt_connect, Duration::from_secs(30));
    }

    #[test]
    fn routing_section_parses_with_defaults() {
        let c: Config = toml::from_str(
            r#"
[routing]
fallback = false
[[routing.endpoints]]
name = "hot"
partitions = 2
[[routing.routes]]
name = "r"
source = "DeviceMessages"
endpoints = ["hot"]
[[routing.enrichments]]
key = "k"
value = "v"
endpoints = ["hot"]
"#,
        )
        .unwrap();
        assert_eq!(c.routing.fallback, Some(false));
        assert_eq!(c.routing.routes[0].condition, "true");
        assert!(c.routing.routes[0].enabled);
        assert!(
            toml::from_str::<Config>("[[routing.routes]]\nname = \"r\"\nsorce = \"x\"").is_err()
        );
    }
}
