//! One AMQP connection: SASL, then sessions, each serving the links the client attaches.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::acceptor::{
    ConnectionAcceptor, LinkAcceptor, LinkEndpoint, ListenerSessionHandle, SessionAcceptor,
    SupportedReceiverSettleModes, SupportedSenderSettleModes,
};
use fe2o3_amqp::connection::OpenError;
use fe2o3_amqp::types::definitions::{ReceiverSettleMode, SenderSettleMode};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::address::Node;
use super::cbs;
use super::claims::Claims;
use super::device::{DeviceCredentials, DeviceLinks};
use super::frame_guard::FrameGuard;
use super::full_fields::FullFields;
use super::header::{read_header, Opening};
use super::partition_link::{self, PartitionRequest};
use super::provisioning::{self, DeviceCredential};
use super::replies::Replies;
use super::sasl::HubSasl;
use super::{c2d_send, errors, feedback, management};
use crate::auth::Permission;
use crate::hub::HubContext;

/// SASL and the AMQP open must be done within this time.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest frame either side may send (the SDKs ask for 65,536).
const MAX_FRAME: u32 = 65_536;
/// Largest message a client may send on a link: a C2D message's body is at most 64 KB
/// (`c2d_message::check_size` says so precisely); this leaves room for its properties and
/// bounds what one delivery can make the hub hold and check.
const MAX_MESSAGE: u64 = 256 * 1024;
/// Most bytes of unfinished multi-frame deliveries one connection may have held for checking.
const MAX_HELD: usize = 4 * MAX_MESSAGE as usize;
/// How long after answering a `messages/events` attach its redirect follows.
const REDIRECT_AFTER: Duration = Duration::from_millis(100);
/// A connection that sends nothing (not even an empty frame) for this long is closed; IoT
/// Hub announces the same.
const IDLE_TIME_OUT_MS: u32 = 240_000;

/// Serves one connection on `stream` (TLS or WebSocket already done) until the client closes
/// it or the node shuts down.
pub async fn serve<Io>(
    stream: Io,
    peer: SocketAddr,
    client_chain: Vec<CertificateDer<'static>>,
    ctx: HubContext,
    shutdown: CancellationToken,
) where
    Io: AsyncRead + AsyncWrite + std::fmt::Debug + Send + Unpin + 'static,
{
    let claims = Claims::default();
    let device = DeviceCredential::default();
    let devices = DeviceCredentials::default();
    let stream = FullFields::new(FrameGuard::new(stream, MAX_FRAME as usize, MAX_HELD));
    let opened = async {
        let (opening, stream) = read_header(stream).await.map_err(OpenError::Io)?;
        let acceptor = ConnectionAcceptor::builder()
            .container_id(ctx.settings.hub_name.clone())
            .max_frame_size(MAX_FRAME)
            .idle_time_out(IDLE_TIME_OUT_MS);
        match opening {
            Opening::Sasl => {
                acceptor
                    .sasl_acceptor(HubSasl::new(
                        ctx.auth.clone(),
                        claims.clone(),
                        device.clone(),
                        devices.clone(),
                        ctx.settings.hub_name.clone(),
                    ))
                    .build()
                    .accept(stream)
                    .await
            }
            Opening::Amqp => acceptor.build().accept(stream).await,
            Opening::Other(header) => {
                // AMQP's answer to a header it does not speak: the one it does, then close.
                let mut stream = stream;
                let _ = stream.write_all(b"AMQP\x03\x01\x00\x00").await;
                let _ = stream.shutdown().await;
                Err(OpenError::ProtocolHeaderMismatch(
                    bytes::Bytes::copy_from_slice(&header),
                ))
            }
        }
    };
    let mut connection = match tokio::time::timeout(OPEN_TIMEOUT, opened).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "AMQP connection refused");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "AMQP open timed out");
            return;
        }
    };
    device.set_chain_unless_token(&client_chain);
    devices.set_chain(client_chain);
    let device_links = DeviceLinks::new(ctx.clone(), devices.clone());
    tracing::info!(%peer, "AMQP connection open");
    let open = metrics::gauge!("ferrohub_connections", "protocol" => "amqp", "transport" => "tls");
    open.increment(1.0);
    let sessions_acceptor = SessionAcceptor::new();
    let mut sessions = JoinSet::new();
    let reason;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                reason = "the hub is shutting down".to_string();
                break;
            }
            _ = device_links.kicked.cancelled() => {
                reason = "a device of the connection connected again elsewhere, or was disabled or deleted".to_string();
                break;
            }
            accepted = sessions_acceptor.accept(&mut connection) => match accepted {
                Ok(session) => {
                    sessions.spawn(serve_session(
                        session,
                        ctx.clone(),
                        claims.clone(),
                        device.clone(),
                        Arc::clone(&device_links),
                        peer.ip(),
                    ));
                }
                Err(e) => {
                    reason = e.to_string();
                    break;
                }
            },
        }
    }
    sessions.shutdown().await;
    device_links.finish().await;
    let _ = connection.close().await;
    tracing::info!(%peer, %reason, "AMQP connection closed");
    open.decrement(1.0);
}

/// Serves one session: each attached link by the node it names.
async fn serve_session(
    mut session: ListenerSessionHandle,
    ctx: HubContext,
    claims: Claims,
    device: DeviceCredential,
    device_links: Arc<DeviceLinks>,
    source: std::net::IpAddr,
) {
    // Dispositions always settle: uamqp's sender asks for rcv-settle-mode `second` but only
    // completes a message on a settled disposition, as IoT Hub sends (it answers `first`).
    let links_acceptor = LinkAcceptor::builder()
        .max_message_size(MAX_MESSAGE)
        .supported_receiver_settle_modes(SupportedReceiverSettleModes::First)
        .fallback_receiver_settle_mode(ReceiverSettleMode::First)
        .build();
    // Event Hubs receivers get their events settled, whatever mode they ask for: readers keep
    // their own positions and never settle (the Python SDK asks for `unsettled` and would
    // leave every delivery open).
    let event_links_acceptor = LinkAcceptor::builder()
        .supported_sender_settle_modes(SupportedSenderSettleModes::Settled)
        .fallback_sender_settle_mode(SenderSettleMode::Settled)
        .build();
    let cbs_replies = Replies::default();
    let management_replies = Replies::default();
    let registration_replies = Replies::default();
    let mut links = JoinSet::new();
    while let Some(attach) = session.next_incoming_attach().await {
        let node = Node::of(&attach);
        tracing::debug!(?node, role = ?attach.role, name = %attach.name, "AMQP attach");
        let partition_request = match &node {
            Node::Partition(address) => Some(PartitionRequest::of(address.clone(), &attach)),
            _ => None,
        };
        let acceptor = match partition_request {
            Some(_) => &event_links_acceptor,
            None => &links_acceptor,
        };
        let link = match acceptor.accept_incoming_attach(attach, &mut session).await {
            Ok(link) => link,
            Err(e) => {
                tracing::debug!(error = %e, "AMQP attach refused");
                continue;
            }
        };
        match (node, link) {
            (Node::Cbs, LinkEndpoint::Receiver(r)) => {
                links.spawn(cbs::serve_requests(
                    r,
                    cbs_replies.clone(),
                    ctx.clone(),
                    claims.clone(),
                    device_links.credentials(),
                ));
            }
            (Node::Cbs, LinkEndpoint::Sender(s)) => {
                let reply_task = cbs_replies.attach(s);
                links.spawn(async move {
                    let _ = reply_task.await;
                });
            }
            (Node::Management, LinkEndpoint::Receiver(r)) => {
                links.spawn(management::serve_requests(
                    r,
                    management_replies.clone(),
                    ctx.clone(),
                    claims.clone(),
                ));
            }
            (Node::Management, LinkEndpoint::Sender(s)) => {
                let reply_task = management_replies.attach(s);
                links.spawn(async move {
                    let _ = reply_task.await;
                });
            }
            (Node::Partition(_), LinkEndpoint::Sender(s)) => {
                let request = partition_request.expect("taken from the partition's attach");
                links.spawn(partition_link::serve(
                    s,
                    request,
                    ctx.clone(),
                    claims.clone(),
                ));
            }
            (Node::DeviceBound, LinkEndpoint::Receiver(r)) => {
                match claims.check(Permission::ServiceConnect, ctx.auth.now_secs()) {
                    Ok(()) => {
                        links.spawn(c2d_send::serve(r, ctx.clone(), claims.clone()));
                    }
                    Err(reason) => {
                        let _ = r.close_with_error(errors::unauthorized(&reason)).await;
                    }
                }
            }
            (
                Node::Registration {
                    id_scope,
                    registration_id,
                },
                LinkEndpoint::Receiver(r),
            ) => {
                links.spawn(provisioning::serve_requests(
                    r,
                    registration_replies.clone(),
                    ctx.clone(),
                    device.clone(),
                    id_scope,
                    registration_id,
                    source,
                ));
            }
            (Node::Registration { .. }, LinkEndpoint::Sender(s)) => {
                let reply_task = registration_replies.attach(s);
                links.spawn(async move {
                    let _ = reply_task.await;
                });
            }
            (Node::Device { who, link: kind }, link) => {
                Arc::clone(&device_links)
                    .serve(who, kind, link, &mut links)
                    .await;
            }
            (Node::EventsRedirect(rest), LinkEndpoint::Sender(s)) => {
                links.spawn(redirect(s, rest, ctx.clone(), claims.clone()));
            }
            (Node::Feedback, LinkEndpoint::Sender(s)) => {
                links.spawn(feedback::serve(s, ctx.clone(), claims.clone()));
            }
            (Node::FileNotifications, LinkEndpoint::Sender(s)) => {
                links.spawn(feedback::serve_file_notifications(
                    s,
                    ctx.clone(),
                    claims.clone(),
                ));
            }
            (node, link) => {
                let name = match node {
                    Node::Unknown(address) => address,
                    known => format!("{known:?} in this direction"),
                };
                let error = errors::unknown_node(&name);
                let _ = match link {
                    LinkEndpoint::Sender(s) => s.close_with_error(error).await.map_err(drop),
                    LinkEndpoint::Receiver(r) => r.close_with_error(error).await.map_err(drop),
                };
            }
        }
    }
    links.shutdown().await;
    let _ = session.end().await;
}

/// Answers a receiver on `messages/events/...` (AMQ-8): the attach is answered first, then,
/// in a later write (the Node sample waits for the attach before it listens for the detach),
/// the link is closed with the redirect to the built-in endpoint's Event Hubs entity.
async fn redirect(link: fe2o3_amqp::link::Sender, rest: String, ctx: HubContext, claims: Claims) {
    if let Err(reason) = claims.check(Permission::ServiceConnect, ctx.auth.now_secs()) {
        let _ = link.close_with_error(errors::unauthorized(&reason)).await;
        return;
    }
    tokio::time::sleep(REDIRECT_AFTER).await;
    let host = &ctx.settings.host_name;
    let address = format!("amqps://{host}:5671/{}/{rest}", ctx.settings.hub_name);
    tracing::info!(%address, "messages/events receiver redirected");
    let _ = link
        .close_with_error(errors::redirect(host, &address))
        .await;
}
