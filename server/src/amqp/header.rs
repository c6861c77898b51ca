//! Which protocol header a client opens with. The Python SDK starts with SASL (`AMQP 3 1 0 0`);
//! the Node SDK (rhea) starts with plain AMQP (`AMQP 0 1 0 0`) and authorises through CBS only.
//! Both are served: the header is read here, then replayed to the AMQP stack, which then
//! negotiates SASL or not.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// The client's first eight bytes, and what they ask for.
pub enum Opening {
    Sasl,
    Amqp,
    /// Not an AMQP header: the connection is refused.
    Other([u8; 8]),
}

/// Reads the protocol header from `stream`; the returned stream yields it again first.
pub async fn read_header<Io>(mut stream: Io) -> io::Result<(Opening, Replay<Io>)>
where
    Io: AsyncRead + Unpin,
{
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).await?;
    let opening = match header {
        [b'A', b'M', b'Q', b'P', 3, 1, 0, 0] => Opening::Sasl,
        [b'A', b'M', b'Q', b'P', 0, 1, 0, 0] => Opening::Amqp,
        other => Opening::Other(other),
    };
    Ok((
        opening,
        Replay {
            header,
            replayed: 0,
            inner: stream,
        },
    ))
}

/// A stream whose first bytes are the header already read from it.
#[derive(Debug)]
pub struct Replay<Io> {
    header: [u8; 8],
    replayed: usize,
    inner: Io,
}

impl<Io: AsyncRead + Unpin> AsyncRead for Replay<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.replayed < self.header.len() {
            let n = (self.header.len() - self.replayed).min(buf.remaining());
            let start = self.replayed;
            buf.put_slice(&self.header[start..start + n]);
            self.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Replay<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
