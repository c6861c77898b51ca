//! One TLS identity for the whole cluster: clients trust one CA and one certificate wherever
//! the address sends them, and the writer may move. The first node to start makes the
//! material and publishes it in the [`TLS_BUCKET`](super::link::TLS_BUCKET) bucket; every node
//! serves with what the bucket holds.
//!
//! # Invariants
//! - The bucket's key is created once (compare-and-set): of two nodes starting together, the
//!   loser replaces its own fresh material with the winner's before it serves.

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::{ClusterError, Link};
use crate::tls::{self, TlsPaths};

const MATERIAL_KEY: &str = "material";

fn tls_err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Tls(e.to_string())
}

fn decode(bytes: &[u8]) -> Result<Vec<(String, String)>, ClusterError> {
    serde_json::from_slice(bytes).map_err(tls_err)
}

/// Makes `paths` hold the cluster's material, retrying for a minute while JetStream is not
/// ready to answer (a bucket just created has no leader yet).
///
/// # Errors
/// NATS unreachable for that long, or the files cannot be written.
pub async fn ensure(
    link: &Link,
    paths: &TlsPaths,
    hub_name: &str,
    host_name: &str,
) -> Result<(), ClusterError> {
    let mut attempts = 0;
    loop {
        match ensure_once(link, paths, hub_name, host_name).await {
            Err(ClusterError::Nats(e)) if attempts < 60 => {
                attempts += 1;
                tracing::warn!(error = %e, "shared TLS material not reachable yet; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

async fn ensure_once(
    link: &Link,
    paths: &TlsPaths,
    hub_name: &str,
    host_name: &str,
) -> Result<(), ClusterError> {
    if let Some(entry) = link
        .tls
        .entry(MATERIAL_KEY)
        .await
        .map_err(|e| ClusterError::nats("reading the shared TLS material", e))?
    {
        return tls::write_material(paths, &decode(&entry.value)?).map_err(tls_err);
    }
    tls::ensure_material_for(paths, hub_name, host_name, &link.section.certificate_names)
        .map_err(tls_err)?;
    let mine = tls::read_material(paths).ok_or_else(|| tls_err("incomplete after creation"))?;
    let value = Bytes::from(serde_json::to_vec(&mine).map_err(tls_err)?);
    match link.tls.create(MATERIAL_KEY, value).await {
        Ok(_) => {
            tracing::info!("published this node's TLS material to the cluster");
            Ok(())
        }
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
            let entry = link
                .tls
                .entry(MATERIAL_KEY)
                .await
                .map_err(|e| ClusterError::nats("reading the shared TLS material", e))?
                .ok_or_else(|| tls_err("the shared material vanished"))?;
            tls::write_material(paths, &decode(&entry.value)?).map_err(tls_err)
        }
        Err(e) => Err(ClusterError::nats("publishing the TLS material", e)),
    }
}
