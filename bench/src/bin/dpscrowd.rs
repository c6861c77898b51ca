//! A crowd of devices registering with the hub's DPS at once, or connecting straight to the hub:
//! the load side of `bench/dps_register.py`, which makes the enrollment group, the keys and
//! certificates, hands the crowd over as one JSON job on standard input and reads one JSON
//! report from standard output.
//!
//! Why Rust: a Python client doing every TLS handshake itself tops out near 800 connects/s on
//! these two cores, so it, not the hub, bounded what the benchmark could show.
//!
//! Modes:
//! - `register`: each device opens its own HTTPS connection, PUTs `register`, then polls its
//!   operation every `poll_interval_ms` until assigned (a 429 waits a second and asks again).
//!   Time to assigned runs from the TCP connect to the poll that says assigned.
//! - `connect`: TLS, MQTT CONNECT (clean session, SAS token), CONNACK, DISCONNECT; time from
//!   the TCP connect to CONNACK.
//!
//! At most `concurrency` devices are under way at once; the whole crowd is bounded by
//! `limit_s`, every request by 30 s.

use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use ferrohub_bench::client::{tls_connector, tls_connector_with_identity};
use ferrohub_bench::http::HttpsConnection;
use ferrohub_bench::stats;
use ferrohub_server::mqtt::codec::MqttCodec;
use futures::{SinkExt, StreamExt};
use mqtt::control::ConnectReturnCode;
use mqtt::packet::{ConnectPacket, DisconnectPacket, VariablePacket};
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;
use tokio_util::codec::Framed;

const DEVICE_API: &str = "2021-06-01";
const HUB_API: &str = "2021-04-12";
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Register,
    Connect,
}

#[derive(Deserialize)]
struct Job {
    mode: Mode,
    /// The hub's host name: the certificate's name and the tokens' audience.
    host: String,
    /// Where connections go instead of `host`.
    connect_to: Option<String>,
    port: u16,
    ca: PathBuf,
    /// The DPS ID scope (`register` only).
    #[serde(default)]
    scope: String,
    concurrency: usize,
    #[serde(default = "default_poll")]
    poll_interval_ms: u64,
    limit_s: u64,
    devices: Vec<Device>,
}

fn default_poll() -> u64 {
    50
}

/// One device: its registration (or device) id and its credential, a SAS token or a client
/// certificate chain with its key.
#[derive(Deserialize)]
struct Device {
    id: String,
    token: Option<String>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    failures: Vec<String>,
    throttled: u64,
}

fn main() -> anyhow::Result<()> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let job: Job = serde_json::from_str(&text).context("the job on standard input")?;
    if let Some(address) = job.connect_to.clone() {
        ferrohub_bench::dial::connect_everything_to(address);
    }
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(run(Arc::new(job)))?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn run(job: Arc<Job>) -> anyhow::Result<serde_json::Value> {
    // Every device's TLS configuration is made before the clock starts, as a fleet's are.
    let shared = tls_connector(&job.ca)?;
    let connectors = job
        .devices
        .iter()
        .map(|d| match (&d.cert, &d.key) {
            (Some(cert), Some(key)) => tls_connector_with_identity(&job.ca, cert, key),
            _ => Ok(shared.clone()),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let gate = Arc::new(Semaphore::new(job.concurrency.max(1)));
    let started = Instant::now();
    let mut crowd = tokio::task::JoinSet::new();
    for (i, tls) in connectors.into_iter().enumerate() {
        let (job, tally, gate) = (Arc::clone(&job), Arc::clone(&tally), Arc::clone(&gate));
        crowd.spawn(async move {
            let _turn = gate.acquire().await.expect("the gate is never closed");
            let device = &job.devices[i];
            let outcome = match job.mode {
                Mode::Register => register(&job, device, &tls, &tally).await,
                Mode::Connect => connect(&job, device, &tls).await,
            };
            let mut tally = tally.lock();
            match outcome {
                Ok(took) => tally.latencies_us.push(took.as_micros() as u64),
                Err(e) => tally.failures.push(format!("{}: {e:#}", device.id)),
            }
        });
    }
    let all_done = async { while crowd.join_next().await.is_some() {} };
    let finished = tokio::time::timeout(Duration::from_secs(job.limit_s), all_done)
        .await
        .is_ok();
    let wall = started.elapsed().as_secs_f64();
    let tally = tally.lock();
    let done = tally.latencies_us.len();
    let latency = stats::percentiles(tally.latencies_us.clone());
    Ok(serde_json::json!({
        "devices": job.devices.len(),
        "done": done,
        "finished_within_limit": finished,
        "failures": tally.failures.len(),
        "failure_examples": tally.failures.iter().take(3).collect::<Vec<_>>(),
        "throttled_429": tally.throttled,
        "wall_s": (wall * 100.0).round() / 100.0,
        "per_s": ((done as f64 / wall) * 10.0).round() / 10.0,
        "latency": {"p50_ms": latency.p50_ms, "p99_ms": latency.p99_ms, "max_ms": latency.max_ms},
    }))
}

/// Registers one device and polls until it is assigned; the time it took.
async fn register(
    job: &Job,
    device: &Device,
    tls: &TlsConnector,
    tally: &Mutex<Tally>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut conn = within(HttpsConnection::connect(tls, &job.host, job.port)).await?;
    let base = format!("/{}/registrations/{}", job.scope, device.id);
    let token = device.token.as_deref().unwrap_or("");
    let body = serde_json::to_vec(&serde_json::json!({ "registrationId": device.id }))?;
    let register = format!("{base}/register?api-version={DEVICE_API}");
    let answer = loop {
        let (status, answer) = within(conn.request("PUT", &register, token, &body)).await?;
        if status != 429 {
            ensure!(status == 202, "register: {status} {}", lossy(&answer));
            break answer;
        }
        tally.lock().throttled += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let answer: serde_json::Value = serde_json::from_slice(&answer)?;
    let operation = answer["operationId"]
        .as_str()
        .context("register answered no operationId")?;
    let poll = format!("{base}/operations/{operation}?api-version={DEVICE_API}");
    loop {
        let (status, answer) = within(conn.request("GET", &poll, token, b"")).await?;
        match status {
            200 => {
                let state: serde_json::Value = serde_json::from_slice(&answer)?;
                ensure!(state["status"] == "assigned", "ended {}", state["status"]);
                return Ok(started.elapsed());
            }
            202 => tokio::time::sleep(Duration::from_millis(job.poll_interval_ms)).await,
            429 => {
                tally.lock().throttled += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            other => bail!("poll: {other} {}", lossy(&answer)),
        }
    }
}

/// Connects one device straight to the hub over MQTT; the time to its CONNACK.
async fn connect(job: &Job, device: &Device, tls: &TlsConnector) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let dialer = ferrohub_bench::client::Dialer::Tls(tls.clone());
    let stream = within(dialer.open(&job.host, job.port)).await?;
    let mut conn = Framed::new(stream, MqttCodec::new(1 << 20));
    let mut hello = ConnectPacket::new(device.id.clone());
    hello.set_clean_session(true);
    hello.set_keep_alive(60);
    hello.set_user_name(Some(format!(
        "{}/{}/?api-version={HUB_API}",
        job.host, device.id
    )));
    hello.set_password(device.token.clone());
    conn.send(hello).await?;
    match within(async { Ok(conn.next().await) }).await? {
        Some(Ok(VariablePacket::ConnackPacket(ack))) => ensure!(
            ack.connect_return_code() == ConnectReturnCode::ConnectionAccepted,
            "CONNACK {:?}",
            ack.connect_return_code()
        ),
        other => bail!("expected CONNACK, got {other:?}"),
    }
    let took = started.elapsed();
    conn.send(DisconnectPacket::new()).await?;
    Ok(took)
}

async fn within<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(REQUEST_LIMIT, work)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {REQUEST_LIMIT:?}"))?
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned()
}
