//! A WebSocket as a byte stream: MQTT (MQT-1) and AMQP (AMQ-1) over WebSocket carry their byte streams in
//! binary frames, and packets may span frames or share one, so the codec reads it as a stream.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use futures::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use warp::ws::{Message, WebSocket};

pub struct WsIo {
    ws: WebSocket,
    pending: Bytes,
}

impl std::fmt::Debug for WsIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsIo")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl WsIo {
    pub fn new(ws: WebSocket) -> Self {
        WsIo {
            ws,
            pending: Bytes::new(),
        }
    }
}

fn io_err(e: warp::Error) -> io::Error {
    io::Error::new(io::ErrorKind::Other, e)
}

impl AsyncRead for WsIo {
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
                Some(Ok(msg)) if msg.is_close() => return Poll::Ready(Ok(())),
                // Pings are answered by the WebSocket layer itself.
                Some(Ok(msg)) if msg.is_binary() || msg.is_text() => {
                    self.pending = Bytes::from(msg.into_bytes())
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Poll::Ready(Err(io_err(e))),
                None => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl AsyncWrite for WsIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io_err)?;
        Pin::new(&mut self.ws)
            .start_send(Message::binary(data.to_vec()))
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
