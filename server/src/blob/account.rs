//! The storage account devices upload files to (FUP-1): short-lived blob SAS URLs signed with
//! the account key, and reads of what was uploaded.

use std::time::Duration;

use base64::Engine as _;
use chrono::{DateTime, Utc};
use object_store::azure::{MicrosoftAzure, MicrosoftAzureBuilder};
use object_store::path::Path as BlobPath;
use object_store::ObjectStore;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use url::Url;

use super::sas::{blob_sas, BlobPermission};
use super::{BlobContainer, BlobError};

/// What a blob name's path segment keeps unescaped in a URI: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A storage account and the container uploads go to.
pub struct StorageAccount {
    store: MicrosoftAzure,
    account: String,
    /// The account key, decoded from base64, that grants are signed with.
    key: Vec<u8>,
    /// What devices put before `/{container}/{blob}`: `{account}.blob.core.windows.net`, or
    /// `{host}:{port}/{account}` for a path-style endpoint (the emulator).
    host_name: String,
    container: String,
    /// The blob endpoint with its scheme, for the blob URIs in notifications.
    endpoint: String,
}

impl std::fmt::Debug for StorageAccount {
    // Never the key: this may end up in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageAccount")
            .field("account", &self.account)
            .field("endpoint", &self.endpoint)
            .field("container", &self.container)
            .finish_non_exhaustive()
    }
}

/// What a device is given to upload one blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadGrant {
    pub host_name: String,
    pub container: String,
    pub blob_name: String,
    /// `?sv=...&sig=...`, as IoT Hub hands it to devices.
    pub sas_token: String,
}

fn connection_string_parts(cs: &str) -> Vec<(String, String)> {
    cs.split(';')
        .filter(|p| !p.trim().is_empty())
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

impl StorageAccount {
    /// From an Azure Storage connection string (`AccountName`, `AccountKey`, and
    /// `BlobEndpoint` or `DefaultEndpointsProtocol`/`EndpointSuffix`).
    ///
    /// # Errors
    /// [`BlobError::InvalidConnectionString`] naming what is missing.
    pub fn from_connection_string(cs: &str, container: &str) -> Result<StorageAccount, BlobError> {
        let parts = connection_string_parts(cs);
        let get = |k: &str| {
            parts
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.clone())
        };
        let missing = |k: &str| BlobError::InvalidConnectionString(format!("{k} is missing"));
        let account = get("AccountName").ok_or_else(|| missing("AccountName"))?;
        let key = get("AccountKey").ok_or_else(|| missing("AccountKey"))?;
        let endpoint = match get("BlobEndpoint") {
            Some(e) => e.trim_end_matches('/').to_string(),
            None => {
                let scheme = get("DefaultEndpointsProtocol").unwrap_or_else(|| "https".into());
                let suffix = get("EndpointSuffix").unwrap_or_else(|| "core.windows.net".into());
                format!("{scheme}://{account}.blob.{suffix}")
            }
        };
        let key_bytes = base64::engine::general_purpose::STANDARD
            .decode(&key)
            .map_err(|e| BlobError::InvalidConnectionString(format!("AccountKey: {e}")))?;
        let url = Url::parse(&endpoint).map_err(|e| {
            BlobError::InvalidConnectionString(format!("BlobEndpoint {endpoint}: {e}"))
        })?;
        let host_name = endpoint
            .split_once("://")
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default();
        let store = MicrosoftAzureBuilder::new()
            .with_account(&account)
            .with_access_key(key)
            .with_container_name(container)
            .with_endpoint(endpoint.clone())
            .with_allow_http(url.scheme() == "http")
            .build()
            .map_err(|e| BlobError::InvalidConnectionString(e.to_string()))?;
        Ok(StorageAccount {
            store,
            account,
            key: key_bytes,
            host_name,
            container: container.to_string(),
            endpoint,
        })
    }

    /// The account's container as a [`BlobContainer`] (written with the account key).
    pub fn into_container(self) -> BlobContainer {
        let shown = format!("{}/{}", self.endpoint, self.container);
        BlobContainer::from_store(std::sync::Arc::new(self.store), shown)
    }

    /// A SAS allowing one write of `blob_name` (as stored, not URL-encoded) for `ttl` from
    /// `now`. The grant's `blob_name` is that same decoded name, as IoT Hub returns it; a
    /// client percent-encodes it into the blob's URL (see docs/import-export.md).
    ///
    /// # Errors
    /// [`BlobError::InvalidUri`] for a name blob storage cannot hold.
    pub fn grant_upload(
        &self,
        blob_name: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<UploadGrant, BlobError> {
        BlobPath::parse(blob_name)
            .map_err(|e| BlobError::InvalidUri(format!("blob name {blob_name:?}: {e}")))?;
        let query = blob_sas(
            &self.account,
            &self.key,
            &self.container,
            blob_name,
            BlobPermission::Write,
            now,
            ttl,
        );
        Ok(UploadGrant {
            host_name: self.host_name.clone(),
            container: self.container.clone(),
            blob_name: blob_name.to_string(),
            sas_token: format!("?{query}"),
        })
    }

    /// The size of an uploaded blob and when it was last written (Unix milliseconds).
    ///
    /// # Errors
    /// [`BlobError::NotFound`] or store errors.
    pub async fn blob_info(&self, blob_name: &str) -> Result<(u64, i64), BlobError> {
        let path = BlobPath::parse(blob_name)
            .map_err(|e| BlobError::InvalidUri(format!("blob name {blob_name:?}: {e}")))?;
        let meta = self.store.head(&path).await?;
        Ok((meta.size, meta.last_modified.timestamp_millis()))
    }

    /// The blob's URI without any signature: each segment of the name percent-encoded, so the
    /// URI names exactly that blob whatever characters it holds.
    pub fn blob_uri(&self, blob_name: &str) -> String {
        format!(
            "{}/{}/{}",
            self.endpoint,
            self.container,
            encode_blob_path(blob_name)
        )
    }
}

/// A blob name as the path of a URL: each `/`-separated segment percent-encoded (UTF-8).
pub fn encode_blob_path(blob_name: &str) -> String {
    blob_name
        .split('/')
        .map(|segment| utf8_percent_encode(segment, SEGMENT).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    #[test]
    fn grants_a_write_sas_for_one_blob_on_a_path_style_endpoint() {
        let cs = format!("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={KEY};BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;");
        let a = StorageAccount::from_connection_string(&cs, "uploads").unwrap();
        let g = a
            .grant_upload("dev1/a.txt", Utc::now(), Duration::from_secs(3600))
            .unwrap();
        assert_eq!(g.host_name, "127.0.0.1:10000/devstoreaccount1");
        assert_eq!(g.container, "uploads");
        assert!(g.sas_token.starts_with('?'));
        for field in ["sp=w", "sr=b", "sig=", "se="] {
            assert!(g.sas_token.contains(field), "{field} in {}", g.sas_token);
        }
        assert_eq!(
            a.blob_uri("dev1/a.txt"),
            "http://127.0.0.1:10000/devstoreaccount1/uploads/dev1/a.txt"
        );
        assert_eq!(
            a.blob_uri("d:1@x/logs/été #1?%+'().bin"),
            "http://127.0.0.1:10000/devstoreaccount1/uploads/d%3A1%40x/logs/%C3%A9t%C3%A9%20%231%3F%25%2B%27%28%29.bin"
        );
    }

    #[test]
    fn default_endpoint_and_missing_parts() {
        let cs = format!("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.net");
        let a = StorageAccount::from_connection_string(&cs, "c").unwrap();
        assert_eq!(a.host_name, "acct.blob.core.windows.net");
        assert!(matches!(
            StorageAccount::from_connection_string("AccountName=a", "c"),
            Err(BlobError::InvalidConnectionString(m)) if m.contains("AccountKey")
        ));
    }
}
