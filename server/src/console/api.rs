//! `/console/api/...`: what the console shows that IoT Hub's REST API has no call for. Every
//! route but `ca.pem` (the public CA certificate) authenticates like the REST API (a
//! hub-scoped policy token) and checks its right.
//!
//! - `GET session` (any policy): the hub and node (name, host, version, start, connected
//!   devices) and the caller's policy and rights, so the console can disable what the policy
//!   may not do.
//! - `GET metrics` (RegistryRead or ServiceConnect): the node's Prometheus text, as the ops
//!   listener serves it.
//! - `GET errors` (RegistryRead or ServiceConnect): the last warnings and errors the node
//!   logged ([`super::recent_log`]).
//! - `GET policies` (RegistryRead or ServiceConnect): the shared access policies and their
//!   rights; `GET policies/{name}/keys` their keys, for a caller holding every right (what
//!   `iothubowner` holds), never cached; `PUT policies/{name}`, `POST
//!   policies/{name}/regenerate`, `DELETE policies/{name}` change them, for such a caller too
//!   ([`super::policies`]).
//! - `POST routing/test`: whether a routing condition matches a sample message and twin,
//!   evaluated by the router's own condition code (IoT Hub's "test route").
//! - `GET provisioning`, `GET provisioning/policies/{name}/keys`: the provisioning service's
//!   ID scope, policies and keys ([`super::provisioning`]).
//! - `GET ca.pem` (no token: the certificate is public, and a plain link downloads it): the
//!   hub's CA certificate, what devices and back-ends verify the hub with.
//! - `GET history?minutes=N` (RegistryRead or ServiceConnect): this node's counters over the
//!   last N minutes, one point per sample interval ([`super::history`]).
//! - `GET stream` (ServiceConnect): the built-in endpoint's events from every partition in one
//!   long poll ([`super::stream`]), for the hub-wide live view.

use std::collections::BTreeMap;

use ferrohub_engine::d2c::NewEvent;
use serde::Deserialize;
use serde_json::json;
use warp::filters::BoxedFilter;
use warp::Filter;

use super::access::{require_policy, require_service_side, right_names};
use super::recent_log;
use super::NodeInfo;
use crate::auth::{Permission, Principal};
use crate::rest::error::ApiError;
use crate::rest::reply::{json as json_reply, one_of, Handled, Response};
use crate::rest::{caller, json_body, Context, PathId};
use crate::routing::query::Condition;
use crate::routing::view::{stored_system_name, EventView, TwinDoc, TwinSource};

#[rustfmt::skip]
pub fn routes(ctx: Context, node: NodeInfo) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let node = warp::any().map(move || node.clone());
    warp::path("api")
        .and(one_of([
            warp::path!("session").and(warp::get()).and(caller()).and(node.clone()).then(session_handler).boxed(),
            warp::path!("metrics").and(warp::get()).and(caller()).then(metrics_handler).boxed(),
            warp::path!("errors").and(warp::get()).and(caller()).then(errors_handler).boxed(),
            warp::path!("policies").and(warp::get()).and(caller()).then(super::policies::list_handler).boxed(),
            warp::path!("policies" / PathId / "keys").and(warp::get()).and(caller()).then(super::policies::keys_handler).boxed(),
            warp::path!("policies" / PathId).and(warp::put()).and(caller()).and(json_body()).then(super::policies::put_handler).boxed(),
            warp::path!("policies" / PathId / "regenerate").and(warp::post()).and(caller()).and(json_body()).then(super::policies::regenerate_handler).boxed(),
            warp::path!("policies" / PathId).and(warp::delete()).and(caller()).then(super::policies::remove_handler).boxed(),
            warp::path!("routing" / "test").and(warp::post()).and(caller()).and(json_body()).then(route_test_handler).boxed(),
            warp::path!("provisioning").and(warp::get()).and(caller()).then(super::provisioning::overview_handler).boxed(),
            warp::path!("provisioning" / "policies" / PathId / "keys").and(warp::get()).and(caller()).then(super::provisioning::keys_handler).boxed(),
            warp::path!("ca.pem").and(warp::get()).and(node.clone()).then(ca_handler).boxed(),
            warp::path!("history").and(warp::get()).and(warp::query::<super::history::HistoryQuery>()).and(caller()).and(node.clone()).then(super::history::history_handler).boxed(),
            warp::path!("stream").and(warp::get()).and(warp::query::<super::stream::StreamQuery>()).and(caller()).then(super::stream::stream_handler).boxed(),
        ]))
        .boxed()
}

async fn session_handler(ctx: Context, p: Principal, node: NodeInfo) -> Handled {
    require_policy(&p)?;
    let policy = match &p.signer {
        crate::auth::Signer::Policy(name) => name.clone(),
        crate::auth::Signer::Identity { .. } => String::new(),
    };
    let now = chrono::Utc::now();
    Ok(json_reply(&json!({
        "hubName": ctx.settings.hub_name,
        "hostName": ctx.settings.host_name,
        "version": env!("CARGO_PKG_VERSION"),
        "startedAtUtc": node.started.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "uptimeSeconds": (now - node.started).num_seconds().max(0),
        "connectedDevices": ctx.connections.connected_devices(),
        "policy": policy,
        "permissions": right_names(&p.permissions),
        "node": node.node,
    })))
}

async fn ca_handler(node: NodeInfo) -> Handled {
    let missing = || {
        ApiError::NotFound(
            "the hub's CA certificate (a hub serving a certificate of its operator's own has none here)".into(),
        )
    };
    let file = node.ca_file.as_ref().ok_or_else(missing)?;
    let mut response = crate::tls::ca_pem_reply(file).await.ok_or_else(missing)?;
    response.headers_mut().insert(
        "content-disposition",
        warp::http::HeaderValue::from_static("attachment; filename=\"ferrohub-ca.pem\""),
    );
    Ok(response)
}

async fn metrics_handler(ctx: Context, p: Principal) -> Handled {
    require_service_side(&p)?;
    let text = crate::hub::metrics::render(&ctx).await;
    let mut response = warp::reply::Reply::into_response(text);
    response.headers_mut().insert(
        "content-type",
        warp::http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

async fn errors_handler(_ctx: Context, p: Principal) -> Handled {
    require_service_side(&p)?;
    Ok(json_reply(&recent_log::newest_first()))
}

/// IoT Hub's test-route input: a condition, a sample message and, optionally, a twin.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RouteTest {
    condition: String,
    #[serde(default)]
    message: SampleMessage,
    #[serde(default)]
    twin: Option<TwinDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SampleMessage {
    #[serde(default)]
    body: String,
    #[serde(default)]
    app_properties: BTreeMap<String, String>,
    /// By routing keyword (`contentType`, `messageId`, ...) or stored name.
    #[serde(default)]
    system_properties: BTreeMap<String, String>,
}

/// The twin the sample names, or none.
struct GivenTwin(Option<TwinDoc>);

impl TwinSource for GivenTwin {
    fn twin(&self, _: &str, _: Option<&str>) -> Option<TwinDoc> {
        self.0.clone()
    }
}

async fn route_test_handler(ctx: Context, p: Principal, test: RouteTest) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let condition = Condition::parse(&test.condition)
        .map_err(|e| ApiError::argument(format!("the condition does not parse: {e}")))?;
    let message = test.message;
    let device_id = message
        .system_properties
        .get("connectionDeviceId")
        .cloned()
        .unwrap_or_else(|| "sample-device".into());
    let event = NewEvent {
        device_id,
        system_properties: message
            .system_properties
            .iter()
            .map(|(k, v)| (stored_system_name(k).to_string().into(), v.clone().into()))
            .collect(),
        application_properties: message.app_properties.into_iter().collect(),
        body: message.body.into_bytes(),
        ..NewEvent::default()
    };
    let twins = GivenTwin(test.twin);
    let view = EventView::new(&event, None, ctx.clock.now(), &twins);
    let result = condition.matches(&view);
    Ok(json_reply(&json!({ "result": result.to_string() })))
}
