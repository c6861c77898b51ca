//! Load generator (PRF-2): N simulated devices send QoS 1 telemetry over MQTT on TLS/TCP, QUIC
//! or WebSocket (`--transport`) and the report gives throughput and PUBACK latency percentiles.
//!
//! Against ferrohub it registers the devices first (bulk REST, one shared key) and signs real
//! SAS tokens; against a plain MQTT broker (`--target plain`, e.g. Mosquitto) it connects
//! anonymously with the same topics and payloads. Every run is bounded by
//! `--messages-per-device` and `--time-limit`.
//!
//! Example:
//! `loadgen --ca DIR/tls/ca.pem --owner "HostName=localhost;SharedAccessKeyName=iothubowner;SharedAccessKey=..." --devices 100`

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use ferrohub_bench::{client, registry, stats};
use ferrohub_server::auth::sas;
use futures::{SinkExt, StreamExt};
use mqtt::packet::{DisconnectPacket, VariablePacket};
use serde::Serialize;
use tokio::sync::Semaphore;

mod amqp_devices;
mod c2d;
mod methods;
mod responders;

#[derive(Clone, Copy, Debug, ValueEnum, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Target {
    Ferrohub,
    Plain,
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Transport {
    Tls,
    Quic,
    /// MQTT over WebSocket on the HTTPS port (`--https-port`).
    Ws,
    /// AMQP device links on `--amqp-port` (telemetry only, ferrohub only).
    Amqp,
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Scenario {
    /// QoS 1 telemetry; latency to PUBACK.
    Telemetry,
    /// Twin reported-property patches (ferrohub only); latency to the 204 answer.
    Reported,
    /// Direct methods (ferrohub only): every device answers; `--callers` back-end callers
    /// invoke `devices × messages-per-device` calls over keep-alive HTTPS; latency per call.
    Methods,
    /// C2D (ferrohub only): every device subscribes and PUBACKs (which completes); `--callers`
    /// back-end senders send `devices × messages-per-device` messages over HTTPS or AMQP
    /// (`--c2d-sender`); latency from the send to the device's receipt.
    C2d,
}

/// How the C2D scenario's back-end sends.
#[derive(Clone, Copy, Debug, ValueEnum, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum C2dSender {
    /// `POST /devices/{id}/messages/deviceBound`, one keep-alive connection per sender.
    Https,
    /// AMQP sender links to `/messages/devicebound` after a CBS put-token, as the service
    /// SDKs send; `--links` per connection.
    Amqp,
}

#[derive(Parser, Debug)]
#[command(about = "MQTT/TLS telemetry load generator for ferrohub (and plain MQTT brokers)")]
struct Args {
    #[arg(long, value_enum, default_value = "ferrohub")]
    target: Target,
    #[arg(long, value_enum, default_value = "telemetry")]
    scenario: Scenario,
    #[arg(long, default_value = "localhost")]
    host: String,
    #[arg(long, default_value_t = 8883)]
    mqtt_port: u16,
    /// How devices reach the hub: TLS over TCP (`--mqtt-port`), QUIC (`--quic-port`) or
    /// WebSocket (`--https-port`).
    #[arg(long, value_enum, default_value = "tls")]
    transport: Transport,
    #[arg(long, default_value_t = 14567)]
    quic_port: u16,
    /// QUIC devices end each quiet period with a tail loss probe, as the hub does
    /// (`ferrohub_server::transport::quic_tail_probe`).
    #[arg(long)]
    quic_tail_probe: bool,
    #[arg(long, default_value_t = 443)]
    https_port: u16,
    /// Open every connection to this address instead of `--host`, which still names the
    /// certificate and the tokens' audience (one node of a cluster, say).
    #[arg(long)]
    connect_to: Option<String>,
    /// CA certificate (PEM) the broker's certificate chains to.
    #[arg(long)]
    ca: PathBuf,
    /// Owner connection string (ferrohub target): used to register the devices.
    #[arg(long)]
    owner: Option<String>,
    #[arg(long, default_value_t = 100)]
    devices: usize,
    #[arg(long, default_value_t = 100)]
    messages_per_device: usize,
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Unacknowledged QoS 1 messages each device may have (paho, the SDK's client, allows 20).
    #[arg(long, default_value_t = 10)]
    inflight: usize,
    /// Total messages per second over all devices (telemetry and reported): each device sends
    /// at `rate / devices`, its sends spread evenly, so latencies are measured at a set load
    /// rather than at saturation. Unset: as fast as `--inflight` allows.
    #[arg(long)]
    rate: Option<f64>,
    /// Concurrent connection handshakes.
    #[arg(long, default_value_t = 64)]
    connect_concurrency: usize,
    /// Hard stop for the whole run, in seconds.
    #[arg(long, default_value_t = 300)]
    time_limit: u64,
    /// Also write every PUBACK latency (µs) to this file: a JSON array per device, in send order.
    #[arg(long)]
    latencies_out: Option<std::path::PathBuf>,
    /// Concurrent back-end callers (methods and C2D scenarios).
    #[arg(long, default_value_t = 32)]
    callers: usize,
    /// How the C2D scenario sends.
    #[arg(long, value_enum, default_value = "https")]
    c2d_sender: C2dSender,
    /// AMQP sender links per connection (C2D over AMQP).
    #[arg(long, default_value_t = 8)]
    links: usize,
    #[arg(long, default_value_t = 5671)]
    amqp_port: u16,
    /// Telemetry as JSON (`{"temp":..,"seq":..,"pad":".."}` of `--payload-bytes`) with
    /// content type, encoding and a `level=high` application property in the topic, so routing
    /// conditions have properties and a body to look at.
    #[arg(long)]
    json_body: bool,
    /// Device id prefix (ids are `{prefix}{n}`).
    #[arg(long, default_value = "load-")]
    prefix: String,
}

#[derive(Serialize)]
struct Report {
    target: Target,
    scenario: Scenario,
    transport: Transport,
    devices: usize,
    connected: usize,
    messages_per_device: usize,
    payload_bytes: usize,
    inflight: usize,
    rate: Option<f64>,
    quic_tail_probe: bool,
    acknowledged: usize,
    errors: usize,
    duration_s: f64,
    throughput_msgs_per_s: f64,
    connect_latency: stats::Percentiles,
    /// Time to the acknowledgement: PUBACK (telemetry) or the twin 204 answer (reported).
    puback_latency: stats::Percentiles,
    first_error: Option<String>,
}

/// The devices' port for the chosen transport.
fn mqtt_port(args: &Args) -> u16 {
    match args.transport {
        Transport::Tls => args.mqtt_port,
        Transport::Quic => args.quic_port,
        Transport::Ws => args.https_port,
        Transport::Amqp => args.amqp_port,
    }
}

fn dialer_of(args: &Args, tls: &tokio_rustls::TlsConnector) -> Result<client::Dialer, String> {
    match args.transport {
        Transport::Tls => Ok(tls.clone().into()),
        Transport::Ws => Ok(client::Dialer::Ws(tls.clone())),
        Transport::Quic => {
            client::Dialer::quic(&args.ca, args.quic_tail_probe).map_err(|e| format!("{e:#}"))
        }
        // AMQP devices dial with the TLS connector themselves (`amqp_devices`).
        Transport::Amqp => Ok(tls.clone().into()),
    }
}

fn parse_cs(cs: &str) -> HashMap<String, String> {
    cs.split(';')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

struct DeviceResult {
    connect_us: Option<u64>,
    latencies_us: Vec<u64>,
    error: Option<String>,
}

async fn run_device(
    args: Arc<Args>,
    dialer: client::Dialer,
    id: String,
    key: Option<String>,
    connect_gate: Arc<Semaphore>,
    start: Arc<tokio::sync::Barrier>,
) -> DeviceResult {
    let mut result = DeviceResult {
        connect_us: None,
        latencies_us: Vec::with_capacity(args.messages_per_device),
        error: None,
    };
    let (user, pass) = match &key {
        Some(k) => {
            let expiry = chrono::Utc::now().timestamp() as u64 + 3600;
            (
                Some(format!("{}/{id}/?api-version=2021-04-12", args.host)),
                sas::sign(&format!("{}/devices/{id}", args.host), k, expiry, None),
            )
        }
        None => (None, None),
    };
    let permit = connect_gate.acquire().await;
    let t0 = Instant::now();
    let conn = client::connect(&dialer, &args.host, mqtt_port(&args), &id, user, pass, 60).await;
    drop(permit);
    let mut conn = match conn {
        Ok(c) => c,
        Err(e) => {
            result.error = Some(format!("{id}: connect: {e:#}"));
            start.wait().await;
            return result;
        }
    };
    result.connect_us = Some(t0.elapsed().as_micros() as u64);
    start.wait().await;
    let topic = if args.json_body {
        format!("devices/{id}/messages/events/%24.ct=application%2Fjson&%24.ce=utf-8&level=high")
    } else {
        format!("devices/{id}/messages/events/")
    };
    let payload = if args.json_body {
        let head = r#"{"temp":21.5,"seq":1,"pad":""#;
        let pad = args.payload_bytes.saturating_sub(head.len() + 2);
        format!("{head}{}\"}}", "x".repeat(pad)).into_bytes()
    } else {
        vec![b'x'; args.payload_bytes]
    };
    let mut sent_at: HashMap<u16, Instant> = HashMap::new();
    let mut next_id: u16 = 1;
    let mut sent = 0;
    // Paced sends: the next one is due at `due`; devices start spread over one interval.
    let interval = args
        .rate
        .map(|r| Duration::from_secs_f64(args.devices as f64 / r.max(0.001)));
    let mut due = tokio::time::Instant::now()
        + interval.map_or(Duration::ZERO, |i| {
            let spread = id
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
            i.mul_f64((spread % 1000) as f64 / 1000.0)
        });
    while result.latencies_us.len() < args.messages_per_device {
        while sent < args.messages_per_device
            && sent_at.len() < args.inflight
            && interval.is_none_or(|_| tokio::time::Instant::now() >= due)
        {
            if let Some(i) = interval {
                due += i;
            }
            let pkid = next_id;
            next_id = next_id.checked_add(1).unwrap_or(1);
            // Telemetry: QoS 1, answered by PUBACK. Reported patch: QoS 0, answered on the twin
            // response topic carrying the same request id.
            let sent_packet = match args.scenario {
                // Methods and C2D never reach here: they run in `run_methods` / `run_c2d`.
                Scenario::Telemetry | Scenario::Methods | Scenario::C2d => {
                    client::publish(&topic, Some(pkid), payload.clone())
                }
                Scenario::Reported => client::publish(
                    &format!("$iothub/twin/PATCH/properties/reported/?$rid={pkid}"),
                    None,
                    format!(r#"{{"seq":{sent},"fw":"1.2.3","interval":30}}"#).into_bytes(),
                ),
            };
            let packet = match sent_packet {
                Ok(p) => p,
                Err(e) => {
                    result.error = Some(e.to_string());
                    return result;
                }
            };
            sent_at.insert(pkid, Instant::now());
            if let Err(e) = conn.feed(packet).await {
                result.error = Some(format!("{id}: send: {e}"));
                return result;
            }
            sent += 1;
        }
        if let Err(e) = SinkExt::<mqtt::packet::PublishPacket>::flush(&mut conn).await {
            result.error = Some(format!("{id}: flush: {e}"));
            return result;
        }
        let waiting_to_send =
            interval.is_some() && sent < args.messages_per_device && sent_at.len() < args.inflight;
        let next = if waiting_to_send {
            tokio::select! {
                p = conn.next() => p,
                _ = tokio::time::sleep_until(due) => continue,
            }
        } else {
            conn.next().await
        };
        match next {
            Some(Ok(VariablePacket::PubackPacket(ack))) if args.scenario == Scenario::Telemetry => {
                if let Some(t) = sent_at.remove(&ack.packet_identifier()) {
                    result.latencies_us.push(t.elapsed().as_micros() as u64);
                }
            }
            Some(Ok(VariablePacket::PublishPacket(p))) if args.scenario == Scenario::Reported => {
                // $iothub/twin/res/204/?$rid={rid}&$version={v}
                let topic = p.topic_name();
                if !topic.starts_with("$iothub/twin/res/204/") {
                    result.error = Some(format!("{id}: twin answer {topic}"));
                    return result;
                }
                let rid = topic
                    .split("$rid=")
                    .nth(1)
                    .and_then(|r| r.split('&').next())
                    .and_then(|r| r.parse::<u16>().ok());
                if let Some(t) = rid.and_then(|r| sent_at.remove(&r)) {
                    result.latencies_us.push(t.elapsed().as_micros() as u64);
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                result.error = Some(format!("{id}: receive: {e}"));
                return result;
            }
            None => {
                result.error = Some(format!(
                    "{id}: connection closed with {} messages unacknowledged",
                    sent_at.len()
                ));
                return result;
            }
        }
    }
    let _ = conn.send(DisconnectPacket::new()).await;
    result
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    if let Some(address) = &args.connect_to {
        ferrohub_bench::dial::connect_everything_to(address.clone());
    }
    let tls = client::tls_connector(&args.ca)?;
    let ids: Vec<String> = (0..args.devices)
        .map(|i| format!("{}{i}", args.prefix))
        .collect();
    let key = match args.target {
        Target::Ferrohub => {
            let owner = parse_cs(
                args.owner
                    .as_deref()
                    .context("--owner is required for the ferrohub target")?,
            );
            let policy = owner
                .get("SharedAccessKeyName")
                .context("owner connection string lacks SharedAccessKeyName")?;
            let policy_key = owner
                .get("SharedAccessKey")
                .context("owner connection string lacks SharedAccessKey")?;
            let expiry = chrono::Utc::now().timestamp() as u64 + 3600;
            let token =
                sas::sign(&args.host, policy_key, expiry, Some(policy)).context("bad owner key")?;
            // One key for every simulated device: its value is irrelevant to the measurement.
            let device_key = "bG9hZGdlbi1kZXZpY2Uta2V5LTMyLWJ5dGVzLWxvbmchISE=".to_string();
            registry::register(&tls, &args.host, args.https_port, &token, &ids, &device_key)
                .await?;
            match args.scenario {
                Scenario::Methods => {
                    return methods::run_methods(Arc::clone(&args), tls, ids, device_key, token)
                        .await
                }
                Scenario::C2d => {
                    return c2d::run_c2d(Arc::clone(&args), tls, ids, device_key, token).await
                }
                Scenario::Telemetry | Scenario::Reported => {}
            }
            Some(device_key)
        }
        Target::Plain => None,
    };
    let dialer = dialer_of(&args, &tls).map_err(anyhow::Error::msg)?;
    let gate = Arc::new(Semaphore::new(args.connect_concurrency.max(1)));
    let barrier = Arc::new(tokio::sync::Barrier::new(ids.len() + 1));
    if args.transport == Transport::Amqp && (args.scenario != Scenario::Telemetry || key.is_none())
    {
        anyhow::bail!("--transport amqp sends telemetry to ferrohub only");
    }
    let handles: Vec<_> = ids
        .iter()
        .map(|id| match (args.transport, &key) {
            (Transport::Amqp, Some(key)) => tokio::spawn(amqp_devices::run_device(
                Arc::clone(&args),
                tls.clone(),
                id.clone(),
                key.clone(),
                Arc::clone(&gate),
                Arc::clone(&barrier),
            )),
            _ => tokio::spawn(run_device(
                Arc::clone(&args),
                dialer.clone(),
                id.clone(),
                key.clone(),
                Arc::clone(&gate),
                Arc::clone(&barrier),
            )),
        })
        .collect();
    // Everyone connected (or failed): the clock starts.
    barrier.wait().await;
    let start = Instant::now();
    let collected = tokio::time::timeout(
        Duration::from_secs(args.time_limit),
        futures::future::join_all(handles),
    )
    .await;
    let duration = start.elapsed();
    let results: Vec<DeviceResult> = match collected {
        Ok(r) => r.into_iter().filter_map(Result::ok).collect(),
        Err(_) => anyhow::bail!("time limit of {} s reached", args.time_limit),
    };
    if let Some(path) = &args.latencies_out {
        let rows: Vec<&Vec<u64>> = results.iter().map(|r| &r.latencies_us).collect();
        std::fs::write(path, serde_json::to_string(&rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let acknowledged: usize = results.iter().map(|r| r.latencies_us.len()).sum();
    let errors: Vec<String> = results.iter().filter_map(|r| r.error.clone()).collect();
    let report = Report {
        target: args.target,
        scenario: args.scenario,
        transport: args.transport,
        devices: args.devices,
        connected: results.iter().filter(|r| r.connect_us.is_some()).count(),
        messages_per_device: args.messages_per_device,
        payload_bytes: args.payload_bytes,
        inflight: args.inflight,
        rate: args.rate,
        quic_tail_probe: args.quic_tail_probe,
        acknowledged,
        errors: errors.len(),
        duration_s: duration.as_secs_f64(),
        throughput_msgs_per_s: acknowledged as f64 / duration.as_secs_f64(),
        connect_latency: stats::percentiles(results.iter().filter_map(|r| r.connect_us).collect()),
        puback_latency: stats::percentiles(
            results.into_iter().flat_map(|r| r.latencies_us).collect(),
        ),
        first_error: errors.first().cloned(),
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
