//! Errors, one enum per kind of operation, each wrapping the shared [`StorageError`].

use std::fmt;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// A key shown in messages: printable when it is text, hex otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyDisplay(pub Vec<u8>);

impl fmt::Display for KeyDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.iter().all(|b| (0x20..0x7f).contains(b)) {
            write!(f, "{:?}", String::from_utf8_lossy(&self.0))
        } else {
            for b in &self.0 {
                write!(f, "{b:02x}")?;
            }
            Ok(())
        }
    }
}

/// Failures of the storage layer itself; every domain error can carry one.
#[derive(Debug, Clone, thiserror::Error, Serialize, Deserialize)]
pub enum StorageError {
    /// A stored record failed its checksum or does not decode. The data is not served.
    #[error("corrupt record in column family {cf} at key {key}: {reason}")]
    Corruption {
        /// A column family's name (`Cow`, so the error serializes for a cluster follower).
        cf: Cow<'static, str>,
        key: KeyDisplay,
        reason: String,
    },
    /// RocksDB reported an error (I/O, its own checksums, ...).
    #[error("storage backend error: {0}")]
    Backend(String),
    /// This durable write failed (a full disk, an I/O error, a commit log that did not take
    /// it): it is not applied, and this store refuses writes until it is opened again.
    #[error(
        "durable write failed, nothing of it applied; writes are refused until the store is \
         reopened, which the hub does by itself once the cause clears: {0}"
    )]
    WriteFailed(String),
    /// An earlier durable write failed; this store refuses writes until it is opened again.
    #[error(
        "an earlier durable write failed; writes are refused until the store is reopened, \
         which the hub does by itself once the cause clears"
    )]
    Poisoned,
    /// The engine is shutting down.
    #[error("storage is closed")]
    Closed,
    /// The store was opened read-only.
    #[error("storage was opened read-only")]
    ReadOnly,
    /// A call made without waiting ([`crate::Store::without_waiting`]) would have had to wait:
    /// for a disk read, a lock, or room in the commit queue. The step refused changed nothing;
    /// [`crate::Store::without_waiting`] reports it, and the caller makes the call again where
    /// waiting is allowed.
    #[error("the call would have had to wait")]
    WouldBlock,
    /// A cluster follower's store: it applies the writer's log and serves reads, and its
    /// writes go to the writer instead (docs/cluster.md).
    #[error("this cluster node is not the writer")]
    NotWriter,
    /// A write forwarded to the cluster's writer got no answer (no writer, NATS without a
    /// majority): it may or may not have happened, as with any 503.
    #[error("the cluster's writer is unavailable: {0}")]
    Unavailable(String),
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Schema(#[from] ferrohub_migrations::MigrationError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot use data directory {path}: {reason}")]
    Directory { path: String, reason: String },
    #[error("the database in {path} is in use by another process (a running hub?): {reason}")]
    InUse { path: String, reason: String },
    /// A cluster node's replica opened to write outside the commit log: what it wrote would be
    /// in no log, and the node would diverge from every other.
    #[error(
        "{path} is a cluster node's replica (it applied the commit log up to entry {applied}): \
         run it with its [cluster] section; commands that only read it (backup, export, \
         connection-string, ca list) still work. To run this hub as a single node, `ferrohub export` it and \
         `ferrohub restore` the export into a new data directory"
    )]
    ClusterReplica { path: String, applied: u64 },
}

/// Input the registry refuses; each maps to an IoT Hub 400 error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ValidationError {
    #[error("{field} is invalid: {reason}")]
    Invalid {
        field: Cow<'static, str>,
        reason: String,
    },
}

impl ValidationError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: Cow::Borrowed(field),
            reason: reason.into(),
        }
    }
}

/// An `If-Match` etag that is not the current one; each domain reports it as its own
/// `EtagMismatch` variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtagMismatch {
    pub given: String,
    pub current: String,
}

/// Registry operations (devices and modules).
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum RegistryError {
    #[error("device {0} not registered")]
    DeviceNotFound(String),
    #[error("module {module_id} on device {device_id} not registered")]
    ModuleNotFound {
        device_id: String,
        module_id: String,
    },
    #[error("a device with id {0} is already registered")]
    DeviceAlreadyExists(String),
    #[error("a module with id {module_id} already exists on device {device_id}")]
    ModuleAlreadyExists {
        device_id: String,
        module_id: String,
    },
    #[error("precondition failed: etag {given} does not match the current etag {current}")]
    EtagMismatch { given: String, current: String },
    #[error("device {device_id} already has the maximum of {max} modules")]
    TooManyModules { device_id: String, max: usize },
    #[error("{count} identities in one bulk request; at most {max} are allowed")]
    TooManyInBulk { count: usize, max: usize },
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<EtagMismatch> for RegistryError {
    fn from(EtagMismatch { given, current }: EtagMismatch) -> Self {
        RegistryError::EtagMismatch { given, current }
    }
}

/// Twin operations: reads, service-side patches and replacements, device-side reported patches.
/// Messages are the registry's for the same conditions, so either layer words them alike.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum TwinError {
    /// The device (`module_id` `None`) or module is not registered.
    #[error("{}", not_registered(.device_id, .module_id.as_deref()))]
    NotFound {
        device_id: String,
        module_id: Option<String>,
    },
    /// `If-Match` named another etag than the twin's; nothing was stored.
    #[error("precondition failed: etag {given} does not match the current etag {current}")]
    EtagMismatch { given: String, current: String },
    /// The change breaks a TWN-7 rule (depth, size, names, value types); nothing was stored.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

fn not_registered(device_id: &str, module_id: Option<&str>) -> String {
    match module_id {
        None => format!("device {device_id} not registered"),
        Some(m) => format!("module {m} on device {device_id} not registered"),
    }
}

impl From<EtagMismatch> for TwinError {
    fn from(EtagMismatch { given, current }: EtagMismatch) -> Self {
        TwinError::EtagMismatch { given, current }
    }
}

/// Hub settings and policies.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum HubError {
    #[error("the hub has not been initialised")]
    NotInitialised,
    #[error("no shared access policy named {0:?}")]
    PolicyNotFound(String),
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}
