//! The lean TLS stream against tokio-rustls' client: data both ways in pieces of every size,
//! buffers freed while idle, client certificates, close_notify, and garbage refused.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

use super::lean_tls::{LeanTlsAcceptor, LeanTlsStream};
use crate::tls::{ensure_material, server_config, ServerCertificate, TlsPaths};

struct Setup {
    _dir: tempfile::TempDir,
    acceptor: LeanTlsAcceptor,
    roots: Arc<rustls::RootCertStore>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let paths = TlsPaths::new(dir.path());
    ensure_material(&paths, "leanhub", "localhost").unwrap();
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(paths.ca()).unwrap();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert.unwrap()).unwrap();
    }
    Setup {
        acceptor: LeanTlsAcceptor::new(
            server_config(&ServerCertificate::load(paths.generated()).unwrap()).unwrap(),
        ),
        roots: Arc::new(roots),
        _dir: dir,
    }
}

fn client_config(
    roots: &Arc<rustls::RootCertStore>,
    version: &'static rustls::SupportedProtocolVersion,
    client_cert: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
) -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(Arc::clone(roots));
    let config = match client_cert {
        Some((cert, key)) => builder.with_client_auth_cert(vec![cert], key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    TlsConnector::from(Arc::new(config))
}

/// A connected pair: the lean server side and a tokio-rustls client.
async fn pair(
    setup: &Setup,
    connector: TlsConnector,
) -> (LeanTlsStream, tokio_rustls::client::TlsStream<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap()
    });
    let (tcp, _) = listener.accept().await.unwrap();
    let server = setup.acceptor.accept(tcp).await.unwrap();
    (server, client.await.unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

async fn exchange_both_ways(version: &'static rustls::SupportedProtocolVersion) {
    let setup = setup();
    let (mut server, mut client) = pair(&setup, client_config(&setup.roots, version, None)).await;
    // Larger than the 64 KiB a write takes at once and than a 16 KiB record; read back in
    // small pieces so reads stop inside records.
    let up = pattern(300_000, 7);
    let down = pattern(250_001, 9);
    let (up2, down2) = (up.clone(), down.clone());
    let client_side = tokio::spawn(async move {
        client.write_all(&up2).await.unwrap();
        client.flush().await.unwrap();
        let mut got = vec![0; down2.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(
            got == down2,
            "the client read other bytes than the server wrote"
        );
        client
    });
    let mut got = Vec::new();
    let mut piece = [0u8; 777];
    while got.len() < up.len() {
        let n = server.read(&mut piece).await.unwrap();
        assert!(n > 0, "end of stream after {} bytes", got.len());
        got.extend_from_slice(&piece[..n]);
    }
    assert!(
        got == up,
        "the server read other bytes than the client wrote"
    );
    server.write_all(&down).await.unwrap();
    server.flush().await.unwrap();
    let _client = client_side.await.unwrap();
}

#[tokio::test]
async fn data_crosses_both_ways_over_tls13() {
    exchange_both_ways(&rustls::version::TLS13).await;
}

#[tokio::test]
async fn data_crosses_both_ways_over_tls12() {
    exchange_both_ways(&rustls::version::TLS12).await;
}

#[tokio::test]
async fn an_idle_connection_holds_no_buffer() {
    let setup = setup();
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let (mut server, mut client) =
            pair(&setup, client_config(&setup.roots, version, None)).await;
        client.write_all(b"ping").await.unwrap();
        client.flush().await.unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await.unwrap();
        server.write_all(b"pong").await.unwrap();
        server.flush().await.unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        // A read that finds nothing waiting, as a serving loop's does between packets.
        let waited = tokio::time::timeout(Duration::from_millis(50), server.read(&mut buf)).await;
        assert!(waited.is_err(), "nothing was sent, yet the read returned");
        assert_eq!(server.buffered_capacity(), 0, "{version:?}");
        // And it still works afterwards.
        client.write_all(b"more").await.unwrap();
        client.flush().await.unwrap();
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"more");
    }
}

#[tokio::test]
async fn the_client_certificate_is_available_after_the_handshake() {
    let setup = setup();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["lean-device".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let der = cert.der().clone();
    let connector = client_config(
        &setup.roots,
        &rustls::version::TLS13,
        Some((
            der.clone(),
            PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
        )),
    );
    let (server, _client) = pair(&setup, connector).await;
    assert_eq!(
        server.peer_certificates().map(|c| c.to_vec()),
        Some(vec![der])
    );
    let (server, _client) = pair(
        &setup,
        client_config(&setup.roots, &rustls::version::TLS13, None),
    )
    .await;
    assert!(server.peer_certificates().is_none_or(|c| c.is_empty()));
}

#[tokio::test]
async fn shutdown_sends_close_notify_and_the_peer_sees_a_clean_end() {
    let setup = setup();
    let (mut server, mut client) = pair(
        &setup,
        client_config(&setup.roots, &rustls::version::TLS13, None),
    )
    .await;
    server.write_all(b"last words").await.unwrap();
    server.shutdown().await.unwrap();
    let mut got = Vec::new();
    // tokio-rustls reports an end without close_notify as an error, so this checks it came.
    client.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"last words");
}

#[tokio::test]
async fn the_peers_close_notify_ends_the_stream() {
    let setup = setup();
    let (mut server, mut client) = pair(
        &setup,
        client_config(&setup.roots, &rustls::version::TLS12, None),
    )
    .await;
    client.write_all(b"bye").await.unwrap();
    client.shutdown().await.unwrap();
    let mut got = Vec::new();
    server.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"bye");
}

#[tokio::test]
async fn garbage_instead_of_a_handshake_is_refused() {
    let setup = setup();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let garbage = tokio::spawn(async move {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(&pattern(5000, 3)).await.unwrap();
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest).await;
    });
    let (tcp, _) = listener.accept().await.unwrap();
    let refused = setup.acceptor.accept(tcp).await;
    assert!(refused.is_err(), "a handshake of garbage succeeded");
    garbage.abort();
    // A client that closes in the middle of its handshake is refused too.
    let half = tokio::spawn(async move {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(&[0x16, 0x03, 0x01, 0x00, 0x50, 0x01])
            .await
            .unwrap();
    });
    let (tcp, _) = listener.accept().await.unwrap();
    assert!(setup.acceptor.accept(tcp).await.is_err());
    half.await.unwrap();
}
