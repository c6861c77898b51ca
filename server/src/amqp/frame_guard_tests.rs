use super::*;
use crate::amqp::value_check::{Malformed, MAX_DEPTH};

const SASL: &[u8] = b"AMQP\x03\x01\x00\x00";
const PLAIN: &[u8] = b"AMQP\x00\x01\x00\x00";

/// A frame around `body` (data offset 2, type `kind`, channel 0).
fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut f = ((body.len() + 8) as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&[2, kind, 0, 0]);
    f.extend_from_slice(body);
    f
}

/// A described list: descriptor `code`, then `fields` (already encoded), as list8.
fn performative(code: u8, fields: &[&[u8]]) -> Vec<u8> {
    let items: Vec<u8> = fields.concat();
    let mut out = vec![
        0x00,
        0x53,
        code,
        0xc0,
        (items.len() + 1) as u8,
        fields.len() as u8,
    ];
    out.extend(items);
    out
}

fn open() -> Vec<u8> {
    frame(
        0,
        &performative(
            0x10,
            &[b"\xa1\x03sdk", b"\xa1\x04host", b"\x70\x00\x01\x00\x00"],
        ),
    )
}

fn feed_all(pieces: &[&[u8]], piece: usize) -> Result<Vec<u8>, FramingError> {
    let stream = pieces.concat();
    let mut check = FrameCheck::new(65_536, 1 << 20);
    let mut out = Vec::new();
    for chunk in stream.chunks(piece) {
        check.feed(chunk, &mut out)?;
    }
    Ok(out)
}

#[test]
fn headers_and_whole_frames_pass_unchanged_in_any_pieces() {
    let sasl_init = frame(1, &performative(0x41, &[b"\xa3\x09ANONYMOUS"]));
    let mut transfer = performative(0x14, &[b"\x43", b"\x43", b"\xa0\x01\x01"]);
    transfer.extend_from_slice(b"\x00\x53\x75\xa0\x03abc"); // payload: a data section
    let transfer = frame(0, &transfer);
    let (open, heartbeat) = (open(), frame(0, b""));
    let pieces: Vec<&[u8]> = vec![SASL, &sasl_init, PLAIN, &open, &heartbeat, &transfer];
    let stream = pieces.concat();
    for piece in [1, 2, 3, 5, 7, 64, 1000] {
        assert_eq!(feed_all(&pieces, piece).unwrap(), stream, "piece {piece}");
    }
}

#[test]
fn a_frame_is_held_back_until_it_is_whole() {
    let mut check = FrameCheck::new(65_536, 1 << 20);
    let mut out = Vec::new();
    let open = open();
    check.feed(PLAIN, &mut out).unwrap();
    check.feed(&open[..open.len() - 1], &mut out).unwrap();
    assert_eq!(out, PLAIN);
    check.feed(&open[open.len() - 1..], &mut out).unwrap();
    assert_eq!(out, [PLAIN, &open].concat());
}

#[test]
fn bad_headers_fail_as_soon_as_they_arrive_and_for_good() {
    for (bytes, want) in [
        (vec![0, 0, 0, 4], FramingError::TooShort(4)),
        (vec![0, 0, 0, 7], FramingError::TooShort(7)),
        (
            vec![0, 1, 0, 1],
            FramingError::TooLarge {
                size: 65_537,
                max: 65_536,
            },
        ),
        (
            vec![0, 0, 0, 8, 0],
            FramingError::BadDataOffset { doff: 0, size: 8 },
        ),
        (
            vec![0, 0, 0, 8, 3],
            FramingError::BadDataOffset { doff: 3, size: 8 },
        ),
    ] {
        let mut check = FrameCheck::new(65_536, 1 << 20);
        let mut out = Vec::new();
        check.feed(PLAIN, &mut out).unwrap();
        assert_eq!(check.feed(&bytes, &mut out), Err(want.clone()));
        assert_eq!(check.feed(&open(), &mut out), Err(want));
        assert_eq!(out, PLAIN, "nothing after the error is released");
    }
}

#[test]
fn performatives_with_impossible_sizes_are_refused() {
    let cases: Vec<Vec<u8>> = vec![
        // A SASL init whose mechanism announces a 3 GB string (the library would zero-fill it).
        performative(0x41, &[b"\xb1\xb1\xb1\xb1\xb1"]),
        // list8 whose size is smaller than its count byte.
        vec![0x00, 0x53, 0x10, 0xc0, 0x00, 0x01],
        // map8 whose size runs past the frame.
        vec![0x00, 0x53, 0x10, 0xc1, 0x40, 0x02, 0x40, 0x40],
        // An unknown format code.
        performative(0x10, &[b"\x31"]),
        // An array of 4 billion nulls.
        performative(0x10, &[b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40"]),
        // An array of uints whose elements run past it.
        performative(0x10, &[b"\xe0\x03\x09\x70\x00"]),
        // Trailing bytes after an open.
        [performative(0x10, &[b"\x40"]), vec![0x40]].concat(),
    ];
    for body in cases {
        let result = feed_all(&[PLAIN, &frame(0, &body)], 3);
        assert!(
            matches!(result, Err(FramingError::Malformed(_))),
            "{body:02x?}: {result:?}"
        );
    }
}

#[test]
fn nesting_is_bounded() {
    let nested = |levels: usize| {
        let mut v = vec![0x45u8]; // list0
        for _ in 0..levels {
            let mut outer = vec![0xc0, (v.len() + 1) as u8, 1];
            outer.extend(v);
            v = outer;
            if v.len() > 250 {
                break;
            }
        }
        [vec![0x00, 0x53, 0x10], v].concat()
    };
    assert!(feed_all(&[PLAIN, &frame(0, &nested(MAX_DEPTH - 2))], 64).is_ok());
    let deep = feed_all(&[PLAIN, &frame(0, &nested(MAX_DEPTH + 5))], 64);
    assert_eq!(
        deep,
        Err(FramingError::Malformed(Malformed("values nest too deep")))
    );
}

/// A transfer on handle 0 with `more` and `payload`.
fn transfer(more: bool, payload: &[u8]) -> Vec<u8> {
    let more: &[u8] = if more { b"\x41" } else { b"\x42" };
    let mut body = performative(
        0x14,
        &[b"\x43", b"\x43", b"\xa0\x01\x01", b"\x43", b"\x42", more],
    );
    body.extend_from_slice(payload);
    frame(0, &body)
}

/// An amqp-value section of `levels` nested list32s.
fn nested_value(levels: usize) -> Vec<u8> {
    let mut inner = vec![0x45u8];
    for _ in 0..levels {
        let mut outer = vec![0xd0];
        outer.extend_from_slice(&((inner.len() + 4) as u32).to_be_bytes());
        outer.extend_from_slice(&1u32.to_be_bytes());
        outer.extend(inner);
        inner = outer;
    }
    [vec![0x00, 0x53, 0x77], inner].concat()
}

#[test]
fn a_deeply_nested_message_is_refused_in_one_frame_or_split() {
    let message = nested_value(7_000); // would overflow a 2 MiB stack in the library's decoder
    let one = feed_all(&[PLAIN, &open(), &transfer(false, &message)], 4096);
    assert_eq!(
        one,
        Err(FramingError::Malformed(Malformed("values nest too deep")))
    );

    let (a, b) = message.split_at(30_000);
    let mut check = FrameCheck::new(65_536, 1 << 20);
    let mut out = Vec::new();
    check.feed(PLAIN, &mut out).unwrap();
    check.feed(&transfer(true, a), &mut out).unwrap();
    assert_eq!(
        out.len(),
        8 + transfer(true, a).len(),
        "an unfinished delivery's frames pass"
    );
    assert!(
        check.feed(&transfer(false, b), &mut out).is_err(),
        "its last frame does not"
    );
}

#[test]
fn messages_split_over_frames_are_checked_whole() {
    let message = [
        &b"\x00\x53\x73\xc0\x03\x01\xa1\x00"[..],
        b"\x00\x53\x75\xb0\x00\x00\x00\x05hello",
    ]
    .concat();
    for cut in 1..message.len() {
        let (a, b) = message.split_at(cut);
        let frames = [PLAIN.to_vec(), transfer(true, a), transfer(false, b)];
        let pieces: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        assert!(feed_all(&pieces, 7).is_ok(), "cut at {cut}");
    }
}

#[test]
fn unfinished_deliveries_are_bounded() {
    let mut check = FrameCheck::new(65_536, 100_000);
    let mut out = Vec::new();
    check.feed(PLAIN, &mut out).unwrap();
    let piece = vec![0u8; 40_000];
    check.feed(&transfer(true, &piece), &mut out).unwrap();
    check.feed(&transfer(true, &piece), &mut out).unwrap();
    assert_eq!(
        check.feed(&transfer(true, &piece), &mut out),
        Err(FramingError::DeliveriesTooLarge(100_000))
    );
}

#[tokio::test]
async fn bytes_released_before_an_error_are_read_first() {
    use tokio::io::AsyncReadExt;
    // Not AMQP: the first 8 bytes pass as a protocol header (which the hub answers with its
    // own), the rest is refused as a frame.
    let mut guard = FrameGuard::new(&b"GET / HTTP/1.1\r\n\r\n"[..], 65_536, 1 << 20);
    let mut header = [0u8; 8];
    guard.read_exact(&mut header).await.unwrap();
    assert_eq!(&header, b"GET / HT");
    let err = guard.read(&mut [0u8; 64]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}

/// A reader handing out `stream` in pieces of `piece` bytes, one per read.
struct Pieces {
    stream: Vec<u8>,
    at: usize,
    piece: usize,
}

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let n = self
            .piece
            .min(self.stream.len() - self.at)
            .min(buf.remaining());
        let at = self.at;
        buf.put_slice(&self.stream[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn reads_into_large_and_small_buffers_release_the_same_bytes() {
    use tokio::io::AsyncReadExt;
    let mut transfer = performative(0x14, &[b"\x43", b"\x43", b"\xa0\x01\x01"]);
    transfer.extend_from_slice(b"\x00\x53\x75\xa0\x03abc");
    let transfer = frame(0, &transfer);
    let mut stream = [PLAIN, &open()[..]].concat();
    for _ in 0..200 {
        stream.extend_from_slice(&transfer);
    }
    // Pieces that end on frame boundaries and inside frames; buffers above and below the
    // size from which the guard reads in place.
    for piece in [1, 7, 100, transfer.len(), 5000, 1 << 20] {
        for read_size in [16, 1000, 4096, 65_536] {
            let inner = Pieces {
                stream: stream.clone(),
                at: 0,
                piece,
            };
            let mut guard = FrameGuard::new(inner, 65_536, 1 << 20);
            let (mut out, mut buf) = (Vec::new(), vec![0u8; read_size]);
            loop {
                let n = guard.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
            assert_eq!(out, stream, "piece {piece}, reads of {read_size}");
        }
    }
}

#[tokio::test]
async fn a_large_read_gets_what_came_before_an_error_then_the_error() {
    use tokio::io::AsyncReadExt;
    let mut guard = FrameGuard::new(&b"GET / HTTP/1.1\r\n\r\n"[..], 65_536, 1 << 20);
    let mut buf = [0u8; 4096];
    let n = guard.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"GET / HT");
    let err = guard.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}
