//! A server TLS stream over rustls' unbuffered API, for connections that sit idle most of their
//! life (MQTT devices). The stream owns its TLS buffers and frees each one whenever it is empty,
//! so an idle connection holds no buffer at all. rustls' buffered connection, which
//! tokio-rustls drives, keeps a 4 KiB record reader per connection even when empty: a third of
//! what an idle device cost the hub (docs/performance.md, "Idle memory").
//!
//! # Invariants
//! - `incoming[incoming_start..incoming_len]` holds TLS bytes read from the socket and not yet
//!   processed; what rustls processed is skipped (`incoming_start` moves) before it is called
//!   again, so it sees each byte once. The rest moves to the front only before a socket read.
//! - `plaintext[plain_pos..]` holds decrypted application data the reader has not taken yet.
//! - `outgoing[out_pos..]` holds encrypted bytes not yet written to the socket. New records are
//!   only appended after them, so bytes leave in the order rustls produced them.
//! - A buffer found empty when the socket has nothing more to give (read) or took everything
//!   (write) is freed, not kept for the next use.
//! - The stream is handed out only once the handshake is complete (client certificate
//!   verified, if any), so [`LeanTlsStream::peer_certificates`] is final.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustls::pki_types::CertificateDer;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How much the read buffer grows per socket read.
const READ_CHUNK: usize = 4096;
/// The largest TLS record on the wire (16 KiB of data, 2 KiB of expansion, a 5-byte header):
/// a partial record never needs more room than this.
const MAX_RECORD: usize = 16_384 + 2_048 + 5;
/// During the handshake rustls joins a handshake message split over records in the read buffer,
/// and allows such a message (a long client certificate chain) up to 64 KiB.
const MAX_HANDSHAKE_BUFFER: usize = 0xffff + MAX_RECORD;
/// The most plaintext one `poll_write` encrypts, so one call cannot grow the write buffer
/// without bound.
const MAX_WRITE: usize = 64 * 1024;

/// Accepts TLS connections with one server configuration.
#[derive(Clone)]
pub struct LeanTlsAcceptor {
    config: Arc<ServerConfig>,
}

impl LeanTlsAcceptor {
    pub fn new(config: Arc<ServerConfig>) -> Self {
        LeanTlsAcceptor { config }
    }

    /// Runs the server handshake on `tcp` to completion.
    ///
    /// # Errors
    /// The TLS error that ended the handshake, or the socket's.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<LeanTlsStream> {
        let conn = UnbufferedServerConnection::new(Arc::clone(&self.config)).map_err(tls_error)?;
        let mut stream = LeanTlsStream {
            tcp,
            conn,
            incoming: Vec::new(),
            incoming_start: 0,
            incoming_len: 0,
            plaintext: Vec::new(),
            plain_pos: 0,
            outgoing: Vec::new(),
            out_pos: 0,
            peer_closed: false,
            close_notify_sent: false,
        };
        loop {
            match stream.step(None, None)? {
                Step::Progress => {}
                // Everything rustls queued is in the write buffer now (it reports this state
                // only then): it goes out before we wait for the peer's flight, or before the
                // stream is handed out (TLS 1.2's last flight, TLS 1.3's session tickets).
                Step::NeedBytes => {
                    poll_fn(|cx| stream.poll_drain(cx)).await?;
                    if !stream.conn.is_handshaking() {
                        break;
                    }
                    if poll_fn(|cx| stream.poll_fill(cx)).await? == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Step::Wrote(_) | Step::Closed => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "TLS connection closed during the handshake",
                    ))
                }
            }
        }
        Ok(stream)
    }
}

/// A server-side TLS connection over TCP; see the module docs.
pub struct LeanTlsStream {
    tcp: TcpStream,
    conn: UnbufferedServerConnection,
    incoming: Vec<u8>,
    incoming_start: usize,
    incoming_len: usize,
    plaintext: Vec<u8>,
    plain_pos: usize,
    outgoing: Vec<u8>,
    out_pos: usize,
    /// The peer sent close_notify: no more application data will come.
    peer_closed: bool,
    close_notify_sent: bool,
}

/// What one call into rustls achieved.
enum Step {
    /// Something moved (records decrypted, handshake or alert bytes queued, a state passed):
    /// call again.
    Progress,
    /// Nothing more can happen without more bytes from the peer.
    NeedBytes,
    /// The data given was encrypted into the write buffer: this many bytes of it.
    Wrote(usize),
    /// Both sides closed the connection.
    Closed,
}

impl LeanTlsStream {
    /// The client's certificate chain, end entity first, if it presented one.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.conn.peer_certificates()
    }

    /// Bytes of buffers this stream holds now (read, decrypted and write buffers), for tests.
    pub fn buffered_capacity(&self) -> usize {
        self.incoming.capacity() + self.plaintext.capacity() + self.outgoing.capacity()
    }

    /// One call into rustls with the unprocessed bytes, its state handled. With `to_write`, the
    /// data is encrypted once the connection can send application data. Decrypted data goes
    /// to `read_into` as far as it has room (nothing is waiting in `plaintext` then), the rest
    /// to `plaintext`.
    fn step(
        &mut self,
        to_write: Option<&[u8]>,
        mut read_into: Option<&mut ReadBuf<'_>>,
    ) -> io::Result<Step> {
        let Self {
            conn,
            incoming,
            incoming_start,
            incoming_len,
            plaintext,
            plain_pos,
            outgoing,
            peer_closed,
            ..
        } = self;
        let UnbufferedStatus { mut discard, state } =
            conn.process_tls_records(&mut incoming[*incoming_start..*incoming_len]);
        let step = match state.map_err(tls_error)? {
            ConnectionState::ReadTraffic(mut records) => {
                while let Some(record) = records.next_record() {
                    let record = record.map_err(tls_error)?;
                    discard += record.discard;
                    let mut payload = record.payload;
                    if let Some(buf) = read_into.as_deref_mut() {
                        if *plain_pos == plaintext.len() {
                            let n = payload.len().min(buf.remaining());
                            buf.put_slice(&payload[..n]);
                            payload = &payload[n..];
                        }
                    }
                    plaintext.extend_from_slice(payload);
                }
                Step::Progress
            }
            // The configurations allow no early data (a replayed CONNECT or PUBLISH would count
            // twice), so rustls never accepts any.
            ConnectionState::ReadEarlyData(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "TLS early data, which this server does not accept",
                ))
            }
            ConnectionState::EncodeTlsData(mut encode) => {
                let start = outgoing.len();
                let mut room = 1024;
                loop {
                    outgoing.resize(start + room, 0);
                    match encode.encode(&mut outgoing[start..]) {
                        Ok(n) => {
                            outgoing.truncate(start + n);
                            break;
                        }
                        Err(EncodeError::InsufficientSize(e)) => room = e.required_size,
                        Err(EncodeError::AlreadyEncoded) => {
                            outgoing.truncate(start);
                            break;
                        }
                    }
                }
                Step::Progress
            }
            // The bytes are in `outgoing`, which is written before anything queued later: for
            // rustls they are as good as sent.
            ConnectionState::TransmitTlsData(transmit) => {
                transmit.done();
                Step::Progress
            }
            ConnectionState::BlockedHandshake => Step::NeedBytes,
            ConnectionState::PeerClosed => {
                *peer_closed = true;
                Step::Progress
            }
            ConnectionState::Closed => Step::Closed,
            ConnectionState::WriteTraffic(mut traffic) => match to_write {
                None => Step::NeedBytes,
                Some(data) => {
                    let data = &data[..data.len().min(MAX_WRITE)];
                    let start = outgoing.len();
                    let mut room = data.len() + 64;
                    loop {
                        outgoing.resize(start + room, 0);
                        match traffic.encrypt(data, &mut outgoing[start..]) {
                            Ok(n) => {
                                outgoing.truncate(start + n);
                                break;
                            }
                            Err(EncryptError::InsufficientSize(e)) => room = e.required_size,
                            Err(e) => {
                                outgoing.truncate(start);
                                return Err(io::Error::other(e.to_string()));
                            }
                        }
                    }
                    Step::Wrote(data.len())
                }
            },
            // The enum is non-exhaustive; a state added later is not one this stream knows.
            other => {
                return Err(io::Error::other(format!(
                    "unexpected TLS connection state {other:?}"
                )))
            }
        };
        self.discard(discard);
        Ok(step)
    }

    /// Skips `n` processed bytes of the read buffer.
    fn discard(&mut self, n: usize) {
        self.incoming_start += n;
        if self.incoming_start == self.incoming_len {
            self.incoming_start = 0;
            self.incoming_len = 0;
        }
    }

    /// Reads what the socket has into the read buffer; `Ready(Ok(0))` at end of stream.
    /// Pending with an empty read buffer frees it: the connection is idle.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.incoming_start > 0 {
            self.incoming
                .copy_within(self.incoming_start..self.incoming_len, 0);
            self.incoming_len -= self.incoming_start;
            self.incoming_start = 0;
        }
        let limit = if self.conn.is_handshaking() {
            MAX_HANDSHAKE_BUFFER
        } else {
            MAX_RECORD
        };
        if self.incoming_len >= limit {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "TLS message larger than allowed",
            )));
        }
        let want = (self.incoming_len + READ_CHUNK).min(limit);
        if self.incoming.len() < want {
            self.incoming.resize(want, 0);
        }
        let mut buf = ReadBuf::new(&mut self.incoming[self.incoming_len..]);
        match Pin::new(&mut self.tcp).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len();
                self.incoming_len += n;
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if self.incoming_len == 0 {
                    self.incoming = Vec::new();
                }
                Poll::Pending
            }
        }
    }

    /// Writes the whole write buffer to the socket, then frees it.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.out_pos < self.outgoing.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.outgoing[self.out_pos..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out_pos += n;
        }
        self.outgoing = Vec::new();
        self.out_pos = 0;
        Poll::Ready(Ok(()))
    }

    /// Writes what the socket takes now without waiting; frees the buffer once empty.
    fn drain_some(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.poll_drain(cx) {
            Poll::Ready(r) => r,
            Poll::Pending => Ok(()),
        }
    }
}

impl AsyncRead for LeanTlsStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.plain_pos < this.plaintext.len() {
                let available = &this.plaintext[this.plain_pos..];
                let n = available.len().min(buf.remaining());
                buf.put_slice(&available[..n]);
                this.plain_pos += n;
                if this.plain_pos == this.plaintext.len() {
                    this.plaintext = Vec::new();
                    this.plain_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.peer_closed {
                return Poll::Ready(Ok(()));
            }
            let before = buf.filled().len();
            match this.step(None, Some(buf))? {
                Step::Progress => {
                    // Alerts or handshake messages rustls queued in answer (key updates).
                    this.drain_some(cx)?;
                    if buf.filled().len() > before {
                        return Poll::Ready(Ok(()));
                    }
                    continue;
                }
                Step::Closed => return Poll::Ready(Ok(())),
                Step::NeedBytes | Step::Wrote(_) => {}
            }
            if ready!(this.poll_fill(cx))? == 0 {
                // End of stream without close_notify: what the peer sent is all there is.
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl AsyncWrite for LeanTlsStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // What is already encrypted leaves first, so the buffer never holds more than one call.
        ready!(this.poll_drain(cx))?;
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        loop {
            match this.step(Some(data), None)? {
                Step::Wrote(n) => {
                    this.drain_some(cx)?;
                    return Poll::Ready(Ok(n));
                }
                // Records read meanwhile are kept for the reader; then try again.
                Step::Progress => continue,
                Step::NeedBytes => {
                    return Poll::Ready(Err(io::Error::other(
                        "TLS connection cannot send application data",
                    )))
                }
                Step::Closed => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_notify_sent {
            this.close_notify_sent = true;
            this.queue_close_notify()?;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

impl LeanTlsStream {
    /// Encrypts a close_notify alert into the write buffer, if the connection can still send.
    fn queue_close_notify(&mut self) -> io::Result<()> {
        // Pass whatever rustls has queued first (bounded: each pass handles one state).
        for _ in 0..16 {
            match self.step(None, None)? {
                Step::Progress => continue,
                Step::Closed => return Ok(()),
                Step::NeedBytes | Step::Wrote(_) => break,
            }
        }
        // Nothing is left to handle, so asking again gives the same resting state: sending is
        // allowed (WriteTraffic) or the handshake never finished (then nothing is sent).
        let Self {
            conn,
            incoming,
            incoming_start,
            incoming_len,
            outgoing,
            ..
        } = self;
        let UnbufferedStatus { discard, state } =
            conn.process_tls_records(&mut incoming[*incoming_start..*incoming_len]);
        if let Ok(ConnectionState::WriteTraffic(mut traffic)) = state {
            let start = outgoing.len();
            outgoing.resize(start + 64, 0);
            let written = traffic.queue_close_notify(&mut outgoing[start..]);
            outgoing.truncate(start + written.as_ref().map_or(0, |n| *n));
            written.map_err(|e| io::Error::other(e.to_string()))?;
        }
        self.discard(discard);
        Ok(())
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}
