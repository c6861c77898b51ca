//! An in-process hub for protocol tests in Rust: the real hub services (engine, C2D deadline
//! tasks, event router, authenticator) on a temporary data directory, with connections over
//! in-memory streams and REST through warp's test client.
//!
//! Why no sockets: tests run on tokio's paused clock (`#[tokio::test(start_paused = true)]`),
//! which jumps to the next timer whenever every task waits. A real socket wait looks idle to
//! tokio, so keep-alives would fire spuriously; an in-memory stream is driven by tasks only, so
//! time moves exactly when the test and the hub are both waiting for it. The hub's wall clock
//! ([`ferrohub_server::clock::Clock::tokio`]) follows the same paused clock, so C2D lock and
//! TTL deadlines agree with `tokio::time::advance`.

use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::{Store, StoreConfig, UnixMillis};
use ferrohub_server::clock::Clock;
use ferrohub_server::config::Config;
use ferrohub_server::hub::HubContext;
use ferrohub_server::mqtt::codec::MqttCodec;
use ferrohub_server::mqtt::connection::{self, PeerInfo, MAX_PACKET};
use ferrohub_server::node::Services;
use futures::{SinkExt, StreamExt};
use mqtt::packet::*;
use mqtt::{Encodable, TopicName};
use serde_json::Value;
use tokio::io::DuplexStream;
use tokio::task::JoinHandle;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;

/// A hub running inside the test's runtime. Shut down on drop.
pub struct InProcHub {
    pub ctx: HubContext,
    pub dir: tempfile::TempDir,
    routes: BoxedFilter<(warp::reply::Response,)>,
    shutdown: CancellationToken,
    owner_key: String,
}

impl InProcHub {
    /// A hub with the default configuration and engine settings.
    pub async fn start() -> InProcHub {
        Self::start_with(Config::default(), StoreConfig::default()).await
    }

    /// A hub with the given configuration and engine settings. The wall clock starts at the
    /// system's time and then follows tokio's clock.
    pub async fn start_with(config: Config, engine: StoreConfig) -> InProcHub {
        let dir = tempfile::tempdir().expect("temp dir");
        let clock = Clock::tokio(UnixMillis(chrono::Utc::now().timestamp_millis()));
        let (store, settings) = {
            let (path, config, clock) = (dir.path().to_path_buf(), config.clone(), clock.clone());
            tokio::task::spawn_blocking(move || {
                let store = Store::open(&path.join("db"), engine).expect("store opens");
                let (settings, _) =
                    ferrohub_server::node::initialise_settings(&store, &config, &clock)
                        .expect("hub initialises");
                (Arc::new(store), settings)
            })
            .await
            .expect("open task")
        };
        let owner_key = settings
            .policy("iothubowner")
            .expect("owner policy")
            .primary_key
            .clone();
        let shutdown = CancellationToken::new();
        let services = Services::start(store, settings, &config, clock, &shutdown)
            .await
            .expect("services start");
        let ctx = services.ctx.clone();
        // The services' tasks stop with `shutdown`; nothing waits for them here.
        drop(services);
        InProcHub {
            routes: ferrohub_server::rest::routes(ctx.clone()),
            ctx,
            dir,
            shutdown,
            owner_key,
        }
    }

    /// An owner token for the hub, valid for an hour of the hub's clock.
    pub fn owner_token(&self) -> String {
        let expiry = self.ctx.clock.now_secs() + 3600;
        ferrohub_server::auth::sas::sign(
            &self.ctx.settings.host_name,
            &self.owner_key,
            expiry,
            Some("iothubowner"),
        )
        .expect("token")
    }

    /// A token of `policy` for the hub, expiring at `expiry` (seconds since the epoch).
    pub fn policy_token(&self, policy: &str, expiry: u64) -> String {
        let key = &self
            .ctx
            .settings
            .policy(policy)
            .unwrap_or_else(|| panic!("no policy {policy}"))
            .primary_key;
        ferrohub_server::auth::sas::sign(&self.ctx.settings.host_name, key, expiry, Some(policy))
            .expect("token")
    }

    /// Opens a byte stream served by the hub's real AMQP connection code (as after TLS).
    pub fn amqp_stream(&self) -> tokio::io::DuplexStream {
        let (client, server) = tokio::io::duplex(1 << 17);
        tokio::spawn(ferrohub_server::amqp::serve(
            server,
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            Vec::new(),
            self.ctx.clone(),
            self.shutdown.clone(),
        ));
        client
    }

    /// A REST call with the owner's token: status and JSON body (`Null` when empty).
    pub async fn rest(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = warp::test::request()
            .method(method)
            .path(path)
            .header("authorization", self.owner_token());
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&b).expect("json"));
        }
        let res = req.reply(&self.routes).await;
        let json = if res.body().is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(res.body()).unwrap_or(Value::Null)
        };
        (res.status(), json)
    }

    /// Registers a SAS device and returns its primary key.
    pub async fn create_device(&self, device_id: &str) -> String {
        let (status, body) = self
            .rest(
                "PUT",
                &format!("/devices/{device_id}?api-version=2021-04-12"),
                Some(serde_json::json!({ "deviceId": device_id })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "create {device_id}: {body}");
        body["authentication"]["symmetricKey"]["primaryKey"]
            .as_str()
            .expect("primary key")
            .to_string()
    }

    /// Opens an MQTT connection (not yet connected) served by the hub's real connection code.
    pub fn mqtt_stream(&self) -> MqttClient {
        let (client, server) = tokio::io::duplex(MAX_PACKET * 2);
        let peer = PeerInfo {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            transport: "in-process",
            client_chain: Vec::new(),
        };
        let task = tokio::spawn(connection::run(
            server,
            peer,
            self.ctx.clone(),
            self.shutdown.clone(),
        ));
        MqttClient {
            framed: Framed::new(client, MqttCodec::new(MAX_PACKET * 2)),
            task,
        }
    }

    /// Connects `device_id` with a SAS token signed by `key`; panics unless accepted.
    pub async fn connect(&self, device_id: &str, key: &str, keep_alive: u16) -> MqttClient {
        let mut c = self.mqtt_stream();
        let host = &self.ctx.settings.host_name;
        let token = ferrohub_server::auth::sas::sign(
            &format!("{host}/devices/{device_id}"),
            key,
            self.ctx.clock.now_secs() + 3600,
            None,
        )
        .expect("token");
        let mut connect = ConnectPacket::new(device_id);
        connect.set_user_name(Some(format!("{host}/{device_id}/?api-version=2021-04-12")));
        connect.set_password(Some(token));
        connect.set_keep_alive(keep_alive);
        connect.set_clean_session(true);
        c.send(connect).await;
        match c.recv().await {
            Some(VariablePacket::ConnackPacket(ack)) => assert_eq!(
                ack.connect_return_code(),
                mqtt::control::ConnectReturnCode::ConnectionAccepted
            ),
            other => panic!("expected CONNACK, got {other:?}"),
        }
        c
    }
}

impl Drop for InProcHub {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The device side of an in-process MQTT connection.
pub struct MqttClient {
    framed: Framed<DuplexStream, MqttCodec>,
    /// The hub's connection task: finished once the hub closed the connection.
    pub task: JoinHandle<()>,
}

impl MqttClient {
    pub async fn send(&mut self, packet: impl Into<VariablePacket> + Encodable) {
        self.framed
            .send(packet.into())
            .await
            .expect("the hub's end is open");
    }

    /// The next packet from the hub; `None` when the hub closed the connection.
    pub async fn recv(&mut self) -> Option<VariablePacket> {
        match self.framed.next().await {
            Some(Ok(p)) => Some(p),
            _ => None,
        }
    }

    /// The next packet within `wait` of the hub's clock, or `None` if none came.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<VariablePacket> {
        tokio::time::timeout(wait, self.recv()).await.ok().flatten()
    }

    /// Publishes telemetry at QoS 1.
    pub async fn publish_telemetry(&mut self, device_id: &str, pkid: u16, body: &[u8]) {
        let topic = TopicName::new(format!("devices/{device_id}/messages/events/")).expect("topic");
        self.send(PublishPacket::new(
            topic,
            QoSWithPacketIdentifier::Level1(pkid),
            body.to_vec(),
        ))
        .await;
    }

    /// Subscribes to one filter at QoS 1 and waits for the SUBACK.
    pub async fn subscribe(&mut self, filter: &str, pkid: u16) {
        let filter = mqtt::TopicFilter::new(filter).expect("filter");
        self.send(SubscribePacket::new(
            pkid,
            vec![(filter, mqtt::QualityOfService::Level1)],
        ))
        .await;
        match self.recv().await {
            Some(VariablePacket::SubackPacket(_)) => {}
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }
}
