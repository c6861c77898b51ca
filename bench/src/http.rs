//! The bench crate's one HTTP/1.1 client: requests to the hub's REST API (a JSON body, a SAS
//! token in `Authorization`) over one TLS connection kept open between requests. No HTTP
//! library: a load run should measure the hub, not a handshake per request, and one call
//! shape needs little.
//!
//! # Limits
//! - One request at a time per connection, no pipelining.
//! - A response body is delimited by `Content-Length`, by chunked encoding, or (when the
//!   response has neither) by the server closing the connection; 204 and 304 have none.

use anyhow::{bail, ensure, Context as _};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// One HTTPS connection to the hub.
pub struct HttpsConnection {
    stream: TlsStream<TcpStream>,
    host: String,
    /// Bytes read but not yet consumed: a response may arrive in pieces, and nothing after it
    /// belongs to it.
    buf: Vec<u8>,
    /// The server closed the connection (a body delimited by the close): no more requests.
    closed: bool,
}

impl HttpsConnection {
    pub async fn connect(tls: &TlsConnector, host: &str, port: u16) -> anyhow::Result<Self> {
        let tcp = TcpStream::connect((crate::dial::address_for(host), port)).await?;
        tcp.set_nodelay(true)?;
        let stream = tls
            .connect(ServerName::try_from(host.to_string())?, tcp)
            .await?;
        Ok(HttpsConnection {
            stream,
            host: host.to_string(),
            buf: Vec::new(),
            closed: false,
        })
    }

    /// Sends one request with a JSON body and reads its response: the status and the body
    /// (de-chunked). An empty `token` sends no `Authorization` (a client certificate is the
    /// credential).
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        token: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        ensure!(!self.closed, "the server closed the connection");
        let authorization = if token.is_empty() {
            String::new()
        } else {
            format!("Authorization: {token}\r\n")
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{authorization}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        self.stream.write_all(head.as_bytes()).await?;
        self.stream.write_all(body).await?;
        self.stream.flush().await?;
        self.read_response().await
    }

    async fn read_response(&mut self) -> anyhow::Result<(u16, Vec<u8>)> {
        let header_end = self.find(0, b"\r\n\r\n").await?;
        let head = String::from_utf8_lossy(&self.buf[..header_end]).to_string();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .context("no status line")?
            .parse()?;
        let header = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.trim().eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.trim().to_ascii_lowercase())
            })
        };
        let start = header_end + 4;
        let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let (body, end) = match header("content-length") {
            _ if chunked => self.read_chunked(start).await?,
            Some(length) => {
                let end = start + length.parse::<usize>()?;
                self.fill_to(end).await?;
                (self.buf[start..end].to_vec(), end)
            }
            None if status == 204 || status == 304 => (Vec::new(), start),
            None => {
                while self.read_more().await? {}
                self.closed = true;
                (self.buf[start..].to_vec(), self.buf.len())
            }
        };
        self.buf.drain(..end);
        Ok((status, body))
    }

    /// A chunked body starting at `pos`: the body, and where the response ends.
    async fn read_chunked(&mut self, mut pos: usize) -> anyhow::Result<(Vec<u8>, usize)> {
        let mut body = Vec::new();
        loop {
            let line_end = self.find(pos, b"\r\n").await?;
            let line = std::str::from_utf8(&self.buf[pos..line_end])?;
            // A chunk extension (`;name=value`) may follow the size.
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .context("bad chunk header")?;
            pos = line_end + 2;
            if size == 0 {
                // Trailer lines, if any, up to an empty line.
                loop {
                    let end = self.find(pos, b"\r\n").await?;
                    let empty = end == pos;
                    pos = end + 2;
                    if empty {
                        return Ok((body, pos));
                    }
                }
            }
            self.fill_to(pos + size + 2).await?;
            body.extend_from_slice(&self.buf[pos..pos + size]);
            pos += size + 2;
        }
    }

    /// Where `pattern` first occurs in the buffer at or after `from`, reading until it does.
    async fn find(&mut self, from: usize, pattern: &[u8]) -> anyhow::Result<usize> {
        loop {
            if let Some(i) = self.buf[from.min(self.buf.len())..]
                .windows(pattern.len())
                .position(|w| w == pattern)
            {
                return Ok(from + i);
            }
            if !self.read_more().await? {
                bail!("connection closed mid-response");
            }
        }
    }

    /// Reads until the buffer holds at least `len` bytes.
    async fn fill_to(&mut self, len: usize) -> anyhow::Result<()> {
        while self.buf.len() < len {
            ensure!(self.read_more().await?, "connection closed mid-response");
        }
        Ok(())
    }

    /// Reads what has arrived into the buffer; `false` at the end of the stream.
    async fn read_more(&mut self) -> anyhow::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }
}
