//! MQTT over WebSocket on the HTTPS port: `GET /$iothub/websocket` with subprotocol `mqtt`
//! (MQT-1, `compat` §A1). After the upgrade the connection is an ordinary MQTT connection.

use std::net::SocketAddr;

use tokio_util::sync::CancellationToken;
use warp::{Filter, Rejection, Reply};

use super::ws_io::WsIo;
use crate::hub::HubContext;
use crate::mqtt::connection::{self, PeerInfo, MAX_PACKET};

/// The client's address, put into each request's extensions by the HTTPS listener.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Cancelled when the node shuts down; upgraded connections watch it.
#[derive(Debug, Clone)]
pub struct ShutdownSignal(pub CancellationToken);

pub fn routes(
    ctx: HubContext,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Rejection> + Clone {
    warp::path!("$iothub" / "websocket")
        .and(warp::ws())
        .and(warp::ext::optional::<PeerAddr>())
        .and(warp::ext::optional::<ShutdownSignal>())
        .map(
            move |ws: warp::ws::Ws, peer: Option<PeerAddr>, shutdown: Option<ShutdownSignal>| {
                let ctx = ctx.clone();
                let addr = peer
                    .map(|p| p.0)
                    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                let shutdown = shutdown.map(|s| s.0).unwrap_or_default();
                let upgrade =
                    ws.max_message_size(MAX_PACKET)
                        .on_upgrade(move |socket| async move {
                            let peer = PeerInfo {
                                addr,
                                transport: "mqtt-ws",
                                client_cert: None,
                            };
                            connection::run(WsIo::new(socket), peer, ctx, shutdown).await;
                        });
                warp::reply::with_header(upgrade, "sec-websocket-protocol", "mqtt").into_response()
            },
        )
}
