//! Registers load-generator devices through the hub's bulk REST API (`POST /devices`).

use anyhow::bail;
use tokio_rustls::TlsConnector;

use crate::http::HttpsConnection;

/// Creates or updates `ids` with symmetric key `key` (primary and secondary), 100 per request,
/// all over one connection.
pub async fn register(
    tls: &TlsConnector,
    host: &str,
    port: u16,
    owner_token: &str,
    ids: &[String],
    key: &str,
) -> anyhow::Result<()> {
    let mut http = HttpsConnection::connect(tls, host, port).await?;
    for chunk in ids.chunks(100) {
        let items: Vec<_> = chunk
            .iter()
            .map(|id| {
                serde_json::json!({
                    "id": id, "importMode": "createOrUpdate", "status": "enabled",
                    "authentication": {"type": "sas", "symmetricKey": {"primaryKey": key, "secondaryKey": key}}
                })
            })
            .collect();
        let body = serde_json::to_vec(&items)?;
        let (status, _) = http
            .request(
                "POST",
                "/devices?api-version=2021-04-12",
                owner_token,
                &body,
            )
            .await?;
        if status != 200 {
            bail!("bulk registration answered {status}");
        }
    }
    Ok(())
}
