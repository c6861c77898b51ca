//! One TLS identity for the whole cluster: clients trust one CA and one certificate wherever
//! the address sends them, and the writer may move. The first node to start makes the
//! material and publishes it in the [`TLS_BUCKET`](super::link::TLS_BUCKET) bucket; every node
//! serves with what the bucket holds.
//!
//! # Invariants
//! - The bucket's key is created once (compare-and-set): of two nodes starting together, the
//!   loser replaces its own fresh material with the winner's before it serves.
//! - The bucket holds the material only sealed with the cluster's secret
//!   ([`super::secret`]): NATS, and whoever reads its storage, never sees a private key. A value
//!   published in clear by an earlier version is sealed in place by the first node that reads
//!   it.
//! - A value this node's secret cannot open stops the node (its `secret_file` differs from the
//!   node that published it): serving with other material would split the cluster's identity.

use async_nats::jetstream::kv;
use bytes::Bytes;

use super::secret::SecretError;
use super::{ClusterError, Link};
use crate::tls::{self, TlsPaths};

const MATERIAL_KEY: &str = "material";

fn tls_err(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Tls(e.to_string())
}

fn decode(bytes: &[u8]) -> Result<Vec<(String, String)>, ClusterError> {
    serde_json::from_slice(bytes).map_err(tls_err)
}

fn seal(link: &Link, files: &[(String, String)]) -> Result<Bytes, ClusterError> {
    let plain = serde_json::to_vec(files).map_err(tls_err)?;
    Ok(Bytes::from(link.secret.seal(&plain)?))
}

/// The material in a bucket entry: opened with the cluster's secret, or (published in clear
/// before values were sealed) read as it is and sealed in its place.
async fn material_of(
    link: &Link,
    entry: &kv::Entry,
) -> Result<Vec<(String, String)>, ClusterError> {
    match link.secret.open(&entry.value) {
        Ok(plain) => decode(&plain),
        Err(SecretError::NotSealed) => {
            let files = decode(&entry.value)?;
            match link
                .tls
                .update(MATERIAL_KEY, seal(link, &files)?, entry.revision)
                .await
            {
                Ok(_) => tracing::info!("sealed the shared TLS material published in clear"),
                // Another node sealed it first: the same material either way.
                Err(e) => {
                    tracing::info!(error = %e, "the shared TLS material was sealed meanwhile")
                }
            }
            Ok(files)
        }
        Err(e) => Err(e.into()),
    }
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
        return tls::write_material(paths, &material_of(link, &entry).await?).map_err(tls_err);
    }
    tls::ensure_material_for(paths, hub_name, host_name, &link.section.certificate_names)
        .map_err(tls_err)?;
    let mine = tls::read_material(paths).ok_or_else(|| tls_err("incomplete after creation"))?;
    match link.tls.create(MATERIAL_KEY, seal(link, &mine)?).await {
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
            tls::write_material(paths, &material_of(link, &entry).await?).map_err(tls_err)
        }
        Err(e) => Err(ClusterError::nats("publishing the TLS material", e)),
    }
}
