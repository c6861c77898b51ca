//! WebSocket upgrades on the HTTPS port, each then an ordinary connection of its protocol:
//! - MQTT: `GET /$iothub/websocket`, subprotocol `mqtt` (MQT-1, `compat` §A1);
//! - AMQP: `GET /$servicebus/websocket/`, subprotocol `AMQPWSB10` (AMQ-1, `compat` §B5), and
//!   `GET /$iothub/websocket` when the client asks for `AMQPWSB10` (the device-side SDKs).

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;
use warp::{Filter, Rejection, Reply};

use super::ws_io::WsIo;
use crate::hub::HubContext;
use crate::mqtt::connection::{self, PeerInfo, MAX_PACKET};
use crate::x509::PeerChain;

pub use crate::rest::PeerAddr;

/// Cancelled when the node shuts down; upgraded connections watch it.
#[derive(Debug, Clone)]
pub struct ShutdownSignal(pub CancellationToken);

/// Largest WebSocket message accepted on an AMQP connection: one AMQP frame (64 KiB) and the
/// WebSocket framing, with room to spare.
const MAX_AMQP_WS_MESSAGE: usize = 1 << 20;

pub fn routes(
    ctx: HubContext,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Rejection> + Clone {
    mqtt(ctx.clone()).or(amqp(ctx)).unify()
}

/// The peer's address and the node's shutdown signal, as the HTTPS listener recorded them.
fn connection_facts(
) -> impl Filter<Extract = ((SocketAddr, CancellationToken),), Error = std::convert::Infallible> + Clone
{
    warp::ext::optional::<PeerAddr>()
        .and(warp::ext::optional::<ShutdownSignal>())
        .map(|peer: Option<PeerAddr>, shutdown: Option<ShutdownSignal>| {
            let addr = peer
                .map(|p| p.0)
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            (addr, shutdown.map(|s| s.0).unwrap_or_default())
        })
}

/// AMQP over WebSocket; the SDK's path ends with a slash, which is accepted with or without.
fn amqp(
    ctx: HubContext,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Rejection> + Clone {
    warp::path("$servicebus")
        .and(warp::path("websocket"))
        .and(warp::path::tail())
        .and_then(|rest: warp::path::Tail| async move {
            if rest.as_str().is_empty() {
                Ok(())
            } else {
                Err(warp::reject::not_found())
            }
        })
        .untuple_one()
        .and(warp::ws())
        .and(connection_facts())
        .and(warp::ext::optional::<PeerChain>())
        .map(
            move |ws: warp::ws::Ws,
                  (addr, shutdown): (SocketAddr, CancellationToken),
                  chain: Option<PeerChain>| {
                amqp_upgrade(ws, addr, shutdown, chain, ctx.clone())
            },
        )
}

/// The upgrade to an AMQP connection over the WebSocket.
fn amqp_upgrade(
    ws: warp::ws::Ws,
    addr: SocketAddr,
    shutdown: CancellationToken,
    chain: Option<PeerChain>,
    ctx: HubContext,
) -> warp::reply::Response {
    let chain = chain.map(|c| c.0.to_vec()).unwrap_or_default();
    let upgrade = ws
        .max_message_size(MAX_AMQP_WS_MESSAGE)
        .max_frame_size(MAX_AMQP_WS_MESSAGE)
        .on_upgrade(move |socket| {
            crate::amqp::serve(WsIo::new(socket), addr, chain, ctx, shutdown)
        });
    warp::reply::with_header(upgrade, "sec-websocket-protocol", "AMQPWSB10").into_response()
}

fn mqtt(
    ctx: HubContext,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Rejection> + Clone {
    warp::path!("$iothub" / "websocket")
        .and(warp::ws())
        .and(connection_facts())
        .and(warp::ext::optional::<PeerChain>())
        .and(warp::header::optional::<String>("sec-websocket-protocol"))
        .map(
            move |ws: warp::ws::Ws,
                  (addr, shutdown): (SocketAddr, CancellationToken),
                  chain: Option<PeerChain>,
                  protocols: Option<String>| {
                let ctx = ctx.clone();
                // The device SDKs' AMQP over WebSocket (and the provisioning transport's)
                // asks for AMQPWSB10 on this same path.
                if protocols.is_some_and(|p| p.split(',').any(|p| p.trim() == "AMQPWSB10")) {
                    return amqp_upgrade(ws, addr, shutdown, chain, ctx);
                }
                let upgrade = ws
                    .max_message_size(MAX_PACKET)
                    .max_frame_size(MAX_PACKET)
                    .on_upgrade(move |socket| async move {
                        let peer = PeerInfo {
                            addr,
                            transport: "mqtt-ws",
                            client_chain: chain.map(|c| c.0.to_vec()).unwrap_or_default(),
                        };
                        connection::run(WsIo::new(socket), peer, ctx, shutdown).await;
                    });
                warp::reply::with_header(upgrade, "sec-websocket-protocol", "mqtt").into_response()
            },
        )
}
