//! Registers load-generator devices through the hub's bulk REST API (`POST /devices`), with a
//! plain HTTP/1.1 request over TLS: no HTTP client library needed for one call shape.

use anyhow::{bail, Context as _};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Creates or updates `ids` with symmetric key `key` (primary and secondary), 100 per request.
pub async fn register(
    tls: &TlsConnector,
    host: &str,
    port: u16,
    owner_token: &str,
    ids: &[String],
    key: &str,
) -> anyhow::Result<()> {
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
        let (status, _) = request(
            tls,
            host,
            port,
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

/// One request with `Connection: close`; returns the status and the (un-chunked) body.
pub async fn request(
    tls: &TlsConnector,
    host: &str,
    port: u16,
    method: &str,
    path: &str,
    token: &str,
    body: &[u8],
) -> anyhow::Result<(u16, Vec<u8>)> {
    let tcp = TcpStream::connect((host, port)).await?;
    let mut stream = tls
        .connect(ServerName::try_from(host.to_string())?, tcp)
        .await?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.flush().await?;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .context("no status line")?
        .parse()?;
    let raw = &response[split + 4..];
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(raw)?
    } else {
        raw.to_vec()
    };
    Ok((status, body))
}

fn dechunk(mut raw: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("bad chunk header")?;
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end])?.trim(), 16)?;
        raw = &raw[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        anyhow::ensure!(raw.len() >= size + 2, "truncated chunk");
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// One HTTPS connection kept open for many requests (HTTP/1.1 keep-alive), for load runs where a
/// TLS handshake per request would measure the handshake instead of the hub.
pub struct KeepAlive {
    stream: tokio_rustls::client::TlsStream<TcpStream>,
    host: String,
    buf: Vec<u8>,
}

impl KeepAlive {
    pub async fn connect(tls: &TlsConnector, host: &str, port: u16) -> anyhow::Result<KeepAlive> {
        let tcp = TcpStream::connect((host, port)).await?;
        tcp.set_nodelay(true)?;
        let stream = tls
            .connect(ServerName::try_from(host.to_string())?, tcp)
            .await?;
        Ok(KeepAlive {
            stream,
            host: host.to_string(),
            buf: Vec::new(),
        })
    }

    /// Sends one request and reads its response (the body must have a Content-Length).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        token: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.stream.write_all(head.as_bytes()).await?;
        self.stream.write_all(body).await?;
        self.stream.flush().await?;
        let header_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "connection closed");
            self.buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&self.buf[..header_end]).to_string();
        let status = head
            .split_whitespace()
            .nth(1)
            .context("no status line")?
            .parse()?;
        let declared = head.lines().find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.trim().to_string())
        });
        // 204 No Content has no body and need not say so.
        let length: usize = match declared {
            Some(v) => v.parse()?,
            None if status == 204 => 0,
            None => anyhow::bail!("no content-length"),
        };
        let total = header_end + 4 + length;
        while self.buf.len() < total {
            let mut chunk = [0u8; 16 * 1024];
            let n = self.stream.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "connection closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
        let body = self.buf[header_end + 4..total].to_vec();
        self.buf.drain(..total);
        Ok((status, body))
    }
}
