//! A blob container named by a URI: `file://` directories and Azure container SAS URIs.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::azure::MicrosoftAzureBuilder;
use object_store::buffered::{BufReader, BufWriter};
use object_store::local::LocalFileSystem;
use object_store::path::Path as BlobPath;
use object_store::{ObjectStore, PutPayload};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, Lines};
use url::Url;

use super::BlobError;

/// Read buffer of a streamed blob: lines are cut from this much at a time.
const READ_BUFFER: usize = 1 << 20;
/// Size of the parts a blob is written in (Azure blocks; local temp-file writes).
const WRITE_PART: usize = 8 << 20;
/// Parts of one blob uploaded at once.
const WRITES_IN_FLIGHT: usize = 2;

/// A container: a local directory or an Azure Blob Storage container.
#[derive(Clone)]
pub struct BlobContainer {
    store: Arc<dyn ObjectStore>,
    /// What the user gave, without the signature (for messages).
    shown: String,
}

impl std::fmt::Debug for BlobContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobContainer")
            .field("uri", &self.shown)
            .finish()
    }
}

/// The lines of a blob, read as they are needed.
pub type BlobLines = Lines<BufReader>;

/// A blob being written; call [`BlobWriter::finish`] to make it visible.
pub struct BlobWriter {
    inner: BufWriter,
    name: String,
}

impl BlobWriter {
    /// # Errors
    /// [`BlobError::Io`] when the store refuses the data.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), BlobError> {
        self.inner
            .write_all(bytes)
            .await
            .map_err(|e| BlobError::Io {
                name: self.name.clone(),
                reason: e.to_string(),
            })
    }

    /// Uploads what is buffered and commits the blob under its name.
    ///
    /// # Errors
    /// [`BlobError::Io`].
    pub async fn finish(mut self) -> Result<(), BlobError> {
        self.inner.shutdown().await.map_err(|e| BlobError::Io {
            name: self.name.clone(),
            reason: e.to_string(),
        })
    }

    /// Drops what was written; the blob keeps its previous content (or stays absent).
    pub async fn abort(mut self) {
        let _ = self.inner.abort().await;
    }
}

impl BlobContainer {
    /// Parses a container URI (see the module docs for the forms accepted).
    ///
    /// # Errors
    /// [`BlobError::InvalidUri`] naming what is wrong.
    pub fn parse(uri: &str) -> Result<BlobContainer, BlobError> {
        let url = Url::parse(uri.trim())
            .map_err(|e| BlobError::InvalidUri(format!("{}: {e}", super::redact(uri))))?;
        let shown = super::redact(uri);
        let store: Arc<dyn ObjectStore> = match url.scheme() {
            "file" => Arc::new(local(&url)?),
            "http" | "https" => Arc::new(azure(&url)?),
            other => {
                return Err(BlobError::InvalidUri(format!(
                    "{shown}: scheme {other:?} is not supported; use file:// or an Azure container SAS URI (https://)"
                )))
            }
        };
        Ok(BlobContainer { store, shown })
    }

    /// A container over a store made elsewhere (an account's, from its connection string).
    pub(super) fn from_store(store: Arc<dyn ObjectStore>, shown: String) -> BlobContainer {
        BlobContainer { store, shown }
    }

    /// The URI as shown to users (signature hidden).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The blob's lines, streamed.
    ///
    /// # Errors
    /// [`BlobError::NotFound`], [`BlobError::Denied`] or a store error.
    pub async fn lines(&self, name: &str) -> Result<(BlobLines, u64), BlobError> {
        let meta = self.store.head(&blob_path(name)?).await?;
        let size = meta.size;
        let reader = BufReader::with_capacity(Arc::clone(&self.store), &meta, READ_BUFFER);
        Ok((reader.lines(), size))
    }

    /// A writer for the blob `name`, replacing it when finished.
    ///
    /// # Errors
    /// [`BlobError::InvalidUri`] for a bad name.
    pub fn writer(&self, name: &str) -> Result<BlobWriter, BlobError> {
        // Two parts in flight: many writers at once (every partition of a storage endpoint
        // closing its batch) stay within a few tens of MB each.
        let inner = BufWriter::with_capacity(Arc::clone(&self.store), blob_path(name)?, WRITE_PART)
            .with_max_concurrency(WRITES_IN_FLIGHT);
        Ok(BlobWriter {
            inner,
            name: name.to_string(),
        })
    }

    /// Writes a small blob in one request.
    ///
    /// # Errors
    /// Store errors.
    pub async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<(), BlobError> {
        self.store
            .put(&blob_path(name)?, PutPayload::from(bytes))
            .await?;
        Ok(())
    }

    /// Reads a small blob whole.
    ///
    /// # Errors
    /// [`BlobError::NotFound`] or store errors.
    pub async fn get(&self, name: &str) -> Result<Vec<u8>, BlobError> {
        let bytes = self.store.get(&blob_path(name)?).await?.bytes().await?;
        Ok(bytes.to_vec())
    }

    /// Checks that the container can be listed or written at all, so a job with a wrong URI
    /// fails at once with the store's answer rather than after its work.
    ///
    /// # Errors
    /// The store's error.
    pub async fn check_writable(&self) -> Result<(), BlobError> {
        let probe = blob_path(".ferrohub-write-check")?;
        self.store.put(&probe, PutPayload::from_static(b"")).await?;
        let _ = self.store.delete(&probe).await;
        Ok(())
    }
}

fn blob_path(name: &str) -> Result<BlobPath, BlobError> {
    BlobPath::parse(name).map_err(|e| BlobError::InvalidUri(format!("blob name {name:?}: {e}")))
}

fn local(url: &Url) -> Result<LocalFileSystem, BlobError> {
    let dir: PathBuf = url
        .to_file_path()
        .map_err(|()| BlobError::InvalidUri(format!("{url}: not an absolute local path")))?;
    std::fs::create_dir_all(&dir).map_err(|e| {
        BlobError::InvalidUri(format!(
            "{}: cannot create the directory: {e}",
            dir.display()
        ))
    })?;
    LocalFileSystem::new_with_prefix(&dir)
        .map_err(|e| BlobError::InvalidUri(format!("{}: {e}", dir.display())))
}

/// Where an Azure container is: account, container and the account endpoint URL.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct AzureLocation {
    pub account: String,
    pub container: String,
    pub endpoint: String,
}

/// `https://{account}.blob.core.windows.net/{container}` (virtual-host style) or
/// `http(s)://{host}[:port]/{account}/{container}` (path style: emulators, IP hosts).
pub(super) fn azure_location(url: &Url) -> Result<AzureLocation, BlobError> {
    let host = url.host_str().ok_or_else(|| {
        BlobError::InvalidUri(format!("{}: no host", url.origin().ascii_serialization()))
    })?;
    let segments: Vec<&str> = url
        .path_segments()
        .map(|s| s.filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    let origin = url.origin().ascii_serialization();
    let virtual_host = host.contains(".blob.") && segments.len() == 1;
    let path_style = !virtual_host && segments.len() == 2;
    if virtual_host {
        let account = host.split('.').next().unwrap_or_default().to_string();
        Ok(AzureLocation {
            account,
            container: segments[0].to_string(),
            endpoint: origin,
        })
    } else if path_style {
        Ok(AzureLocation {
            account: segments[0].to_string(),
            container: segments[1].to_string(),
            endpoint: format!("{origin}/{}", segments[0]),
        })
    } else {
        Err(BlobError::InvalidUri(format!(
            "{origin}{}: expected https://{{account}}.blob.core.windows.net/{{container}}?{{sas}} or http(s)://{{host}}/{{account}}/{{container}}?{{sas}}",
            url.path()
        )))
    }
}

fn azure(url: &Url) -> Result<impl ObjectStore, BlobError> {
    let location = azure_location(url)?;
    let sas: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if !sas.iter().any(|(k, _)| k == "sig") {
        return Err(BlobError::InvalidUri(format!(
            "{}: the container URI carries no SAS token (sig=...)",
            super::redact(url.as_str())
        )));
    }
    MicrosoftAzureBuilder::new()
        .with_account(location.account)
        .with_container_name(location.container)
        .with_endpoint(location.endpoint)
        .with_allow_http(url.scheme() == "http")
        .with_sas_authorization(sas)
        .build()
        .map_err(|e| BlobError::InvalidUri(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_host_and_path_style_locations() {
        let v = Url::parse("https://acct.blob.core.windows.net/backups?sv=1&sig=x").unwrap();
        assert_eq!(
            azure_location(&v).unwrap(),
            AzureLocation {
                account: "acct".into(),
                container: "backups".into(),
                endpoint: "https://acct.blob.core.windows.net".into()
            }
        );
        let p = Url::parse("http://127.0.0.1:10000/devstoreaccount1/c1?sig=x").unwrap();
        assert_eq!(
            azure_location(&p).unwrap(),
            AzureLocation {
                account: "devstoreaccount1".into(),
                container: "c1".into(),
                endpoint: "http://127.0.0.1:10000/devstoreaccount1".into()
            }
        );
        let bad = Url::parse("http://127.0.0.1:10000/only-one?sig=x").unwrap();
        assert!(azure_location(&bad).is_err());
    }

    #[test]
    fn azure_uris_build_an_https_client() {
        // Building the client sets up TLS (rustls with ring); no request is made.
        let c = BlobContainer::parse(
            "https://acct.blob.core.windows.net/c?sv=2023-11-03&sp=rw&sig=abc%3D",
        )
        .unwrap();
        assert_eq!(
            c.shown(),
            "https://acct.blob.core.windows.net/c?sv=2023-11-03&sp=rw&sig=REDACTED"
        );
    }

    #[test]
    fn uris_without_a_signature_or_with_other_schemes_are_refused() {
        assert!(matches!(
            BlobContainer::parse("https://a.blob.core.windows.net/c?sv=1"),
            Err(BlobError::InvalidUri(m)) if m.contains("SAS")
        ));
        assert!(matches!(
            BlobContainer::parse("ftp://x/y"),
            Err(BlobError::InvalidUri(m)) if m.contains("not supported")
        ));
    }

    #[tokio::test]
    async fn local_directory_round_trip_streams_lines() {
        let dir = tempfile::tempdir().unwrap();
        let uri = Url::from_directory_path(dir.path().join("out")).unwrap();
        let c = BlobContainer::parse(uri.as_str()).unwrap();
        let mut w = c.writer("devices.txt").unwrap();
        for i in 0..1000 {
            w.write(format!("{{\"id\":\"d{i}\"}}\n").as_bytes())
                .await
                .unwrap();
        }
        w.finish().await.unwrap();
        let (mut lines, size) = c.lines("devices.txt").await.unwrap();
        assert!(size > 10_000);
        let mut n = 0;
        while let Some(line) = lines.next_line().await.unwrap() {
            assert_eq!(line, format!("{{\"id\":\"d{n}\"}}"));
            n += 1;
        }
        assert_eq!(n, 1000);
        assert!(matches!(
            c.lines("absent.txt").await,
            Err(BlobError::NotFound(_))
        ));
    }
}
