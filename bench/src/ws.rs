//! MQTT over WebSocket for the load generator: `wss://{host}:{port}/$iothub/websocket` with the
//! `mqtt` subprotocol, as the device SDKs use it, read and written as a byte stream (packets
//! may span binary frames; each write is one frame).

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use anyhow::Context as _;
use bytes::{Buf, Bytes};
use futures::{Sink, Stream};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A WebSocket carrying a byte stream in binary frames.
pub struct WsBytes {
    ws: WebSocketStream<TlsStream<TcpStream>>,
    pending: Bytes,
}

/// Opens the MQTT WebSocket of `host:port` over TLS.
///
/// # Errors
/// Connection, TLS or WebSocket handshake failures.
pub async fn open(tls: &TlsConnector, host: &str, port: u16) -> anyhow::Result<WsBytes> {
    let tcp = TcpStream::connect((crate::dial::address_for(host), port)).await?;
    tcp.set_nodelay(true)?;
    let stream = tls
        .connect(ServerName::try_from(host.to_string())?, tcp)
        .await?;
    let mut request = format!("wss://{host}:{port}/$iothub/websocket").into_client_request()?;
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", HeaderValue::from_static("mqtt"));
    let (ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .context("WebSocket handshake")?;
    Ok(WsBytes {
        ws,
        pending: Bytes::new(),
    })
}

fn io_err(e: tokio_tungstenite::tungstenite::Error) -> io::Error {
    io::Error::other(e)
}

impl AsyncRead for WsBytes {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => self.pending = Bytes::from(data),
                Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(io_err(e))),
            }
        }
    }
}

impl AsyncWrite for WsBytes {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io_err)?;
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(data.to_vec()))
            .map_err(io_err)?;
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(io_err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_close(cx).map_err(io_err)
    }
}
