//! Built-in endpoint read benchmark (AMQ-4): events/s read while devices publish, and the
//! latency from a device's PUBACK to the reader's receipt.
//!
//! Devices publish QoS 1 telemetry over MQTT/TLS (`--devices` × `--messages`, `--inflight`
//! unacknowledged each); each body starts with `{device}:{n}:`. At the same time readers
//! follow the partitions from their end: over AMQP as an `EventHubConsumerClient` does (one
//! connection, SASL PLAIN with the service policy, one receiver link per partition from the
//! run's start by enqueued time, `--prefetch` credit), or over the HTTPS read API (one long-poll loop
//! per partition, `max=1000`). `--partitions` says which partitions are read. The run ends
//! when every event of those partitions arrived, or at `--time-limit`.
//!
//! Output (JSON): events read, read rate (events over first-to-last receipt), and receipt
//! minus PUBACK (p50/p99; negative when the event reached the reader before the device saw its
//! PUBACK, counted as `before_puback`) and receipt minus publish.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use base64::Engine as _;
use clap::{Parser, ValueEnum};
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::link::Receiver;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::types::messaging::{Body, Source};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use fe2o3_amqp::Session;
use ferrohub_bench::http::HttpsConnection;
use ferrohub_bench::{client, registry, stats};
use ferrohub_server::auth::sas;
use futures::{SinkExt, StreamExt};
use mqtt::packet::VariablePacket;
use parking_lot::Mutex;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Reader {
    Amqp,
    Https,
}

#[derive(Parser, Debug)]
#[command(about = "Reads the built-in endpoint while devices publish")]
struct Args {
    #[arg(long, value_enum, default_value = "amqp")]
    reader: Reader,
    #[arg(long, default_value = "localhost")]
    host: String,
    #[arg(long)]
    mqtt_port: u16,
    #[arg(long)]
    https_port: u16,
    #[arg(long)]
    amqp_port: u16,
    #[arg(long)]
    ca: PathBuf,
    /// The iothubowner connection string (registers the devices).
    #[arg(long)]
    owner: String,
    /// The service policy's key (the readers' credential).
    #[arg(long)]
    service_key: String,
    #[arg(long, default_value = "ferrohub")]
    hub_name: String,
    /// Partitions to read, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3")]
    partitions: Vec<u16>,
    /// Partitions the hub has (to know which device writes where).
    #[arg(long, default_value_t = 4)]
    partition_count: u16,
    #[arg(long, default_value_t = 100)]
    devices: usize,
    #[arg(long, default_value_t = 200)]
    messages: usize,
    #[arg(long, default_value_t = 10)]
    inflight: usize,
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Link credit per AMQP receiver (the Python SDK's default prefetch is 300).
    #[arg(long, default_value_t = 300)]
    prefetch: u32,
    #[arg(long, default_value = "ehread-")]
    prefix: String,
    #[arg(long, default_value_t = 300)]
    time_limit: u64,
}

/// When each message was published and acknowledged, by (device, n).
#[derive(Default)]
struct Published(Mutex<HashMap<(usize, usize), (Instant, Option<Instant>)>>);

/// Receipts: (device, n, when).
#[derive(Default)]
struct Received(Mutex<Vec<(usize, usize, Instant)>>);

fn parse_body(body: &[u8]) -> Option<(usize, usize)> {
    let text = std::str::from_utf8(body.get(..body.len().min(32))?).ok()?;
    let mut parts = text.splitn(3, ':');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

async fn publish_device(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    d: usize,
    key: String,
    published: Arc<Published>,
) -> anyhow::Result<()> {
    let id = format!("{}{d}", args.prefix);
    let expiry = chrono::Utc::now().timestamp() as u64 + 3600;
    let user = format!("{}/{id}/?api-version=2021-04-12", args.host);
    let pass = sas::sign(&format!("{}/devices/{id}", args.host), &key, expiry, None);
    let mut conn = client::connect(
        &tls.into(),
        &args.host,
        args.mqtt_port,
        &id,
        Some(user),
        pass,
        60,
    )
    .await?;
    let topic = format!("devices/{id}/messages/events/");
    let mut inflight: HashMap<u16, usize> = HashMap::new();
    let (mut sent, mut acked) = (0, 0);
    while acked < args.messages {
        while sent < args.messages && inflight.len() < args.inflight {
            let pkid = (sent % 60_000) as u16 + 1;
            let mut body = format!("{d}:{sent}:").into_bytes();
            body.resize(args.payload_bytes.max(body.len()), b'x');
            published.0.lock().insert((d, sent), (Instant::now(), None));
            conn.feed(client::publish(&topic, Some(pkid), body)?)
                .await?;
            inflight.insert(pkid, sent);
            sent += 1;
        }
        SinkExt::<mqtt::packet::PublishPacket>::flush(&mut conn).await?;
        match conn.next().await {
            Some(Ok(VariablePacket::PubackPacket(ack))) => {
                if let Some(n) = inflight.remove(&ack.packet_identifier()) {
                    if let Some(entry) = published.0.lock().get_mut(&(d, n)) {
                        entry.1 = Some(Instant::now());
                    }
                    acked += 1;
                }
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => bail!("{id}: {e}"),
            None => bail!("{id}: connection closed"),
        }
    }
    Ok(())
}

async fn amqp_readers(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    received: Arc<Received>,
    attached: Arc<tokio::sync::Barrier>,
) -> anyhow::Result<()> {
    let sasl = SaslProfile::Plain {
        username: format!("service@sas.root.{}", args.hub_name),
        password: args.service_key.clone(),
    };
    let mut connection =
        ferrohub_bench::amqp::open(&tls, &args.host, args.amqp_port, "ehread", sasl).await?;
    let mut session = Session::begin(&mut connection).await?;
    let mut links = Vec::new();
    // From now on by enqueued time: unlike `@latest`, no event published right after the
    // attach can fall before the position the hub resolves.
    let since = chrono::Utc::now().timestamp_millis();
    for &p in &args.partitions {
        let selector = Described {
            descriptor: Descriptor::Name(Symbol::from("apache.org:selector-filter:string")),
            value: Value::String(format!("amqp.annotation.x-opt-enqueued-time >= '{since}'")),
        };
        let source = Source::builder()
            .address(format!(
                "{}/ConsumerGroups/$Default/Partitions/{p}",
                args.hub_name
            ))
            .add_to_filter("apache.org:selector-filter:string", selector)
            .build();
        let mut receiver = Receiver::builder()
            .name(format!("ehread-{p}"))
            .source(source)
            .credit_mode(CreditMode::Manual)
            .attach(&mut session)
            .await?;
        let received = Arc::clone(&received);
        let prefetch = args.prefetch;
        links.push(tokio::spawn(async move {
            // As the Event Hubs SDKs do with settled deliveries: top the credit back up to the
            // prefetch count whenever half of it has been used.
            receiver.set_credit(prefetch).await?;
            let mut used = 0;
            loop {
                let delivery = receiver.recv::<Body<Value>>().await?;
                used += 1;
                if used >= prefetch / 2 {
                    receiver.set_credit(prefetch).await?;
                    used = 0;
                }
                let at = Instant::now();
                if let Body::Data(sections) = delivery.body() {
                    if let Some((d, n)) = sections.iter().next().and_then(|s| parse_body(&s.0)) {
                        received.0.lock().push((d, n, at));
                    }
                }
            }
            #[allow(unreachable_code)]
            anyhow::Ok(())
        }));
    }
    attached.wait().await;
    for l in links {
        l.await??;
    }
    Ok(())
}

async fn https_reader(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    partition: u16,
    received: Arc<Received>,
    attached: Arc<tokio::sync::Barrier>,
) -> anyhow::Result<()> {
    let key = args.service_key.clone();
    let token = sas::sign(
        &args.host,
        &key,
        chrono::Utc::now().timestamp() as u64 + 3600,
        Some("service"),
    )
    .context("token")?;
    let mut http = HttpsConnection::connect(&tls, &args.host, args.https_port).await?;
    let base = format!("/events/consumergroups/$Default/partitions/{partition}");
    let (status, info) = http
        .request(
            "GET",
            &format!("/events/partitions/{partition}?api-version=2021-04-12"),
            &token,
            b"",
        )
        .await?;
    if status != 200 {
        bail!("partition info answered {status}");
    }
    let info: serde_json::Value = serde_json::from_slice(&info)?;
    let mut next = info["lastEnqueuedSequenceNumber"]
        .as_u64()
        .map_or(0, |s| s + 1);
    attached.wait().await;
    loop {
        let path = format!(
            "{base}/messages?sequenceNumber={next}&max=1000&timeout=5&api-version=2021-04-12"
        );
        let (status, body) = http.request("GET", &path, &token, b"").await?;
        if status != 200 {
            bail!("read answered {status}");
        }
        let at = Instant::now();
        let page: serde_json::Value = serde_json::from_slice(&body)?;
        for e in page["events"].as_array().into_iter().flatten() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(e["body"].as_str().unwrap_or(""))?;
            if let Some((d, n)) = parse_body(&bytes) {
                received.0.lock().push((d, n, at));
            }
        }
        if let Some(n) = page["nextSequenceNumber"].as_u64() {
            next = n;
        }
    }
}

fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64() * 1000.0
    } else {
        -((earlier - later).as_secs_f64() * 1000.0)
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    let tls = client::tls_connector(&args.ca)?;
    let owner_key = args
        .owner
        .split(';')
        .find_map(|p| p.strip_prefix("SharedAccessKey="))
        .context("owner key")?;
    let owner_token = sas::sign(
        &args.host,
        owner_key,
        chrono::Utc::now().timestamp() as u64 + 3600,
        Some("iothubowner"),
    )
    .context("token")?;
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let ids: Vec<String> = (0..args.devices)
        .map(|d| format!("{}{d}", args.prefix))
        .collect();
    registry::register(&tls, &args.host, args.https_port, &owner_token, &ids, &key).await?;
    // Which messages the chosen partitions will hold (the hub's crc32 placement).
    let wanted: Vec<usize> = (0..args.devices)
        .filter(|d| {
            args.partitions.contains(
                &((crc32fast::hash(ids[*d].as_bytes()) % u32::from(args.partition_count)) as u16),
            )
        })
        .collect();
    let expected = wanted.len() * args.messages;
    let (published, received) = (
        Arc::new(Published::default()),
        Arc::new(Received::default()),
    );
    let readers = match args.reader {
        Reader::Amqp => 1,
        Reader::Https => args.partitions.len(),
    };
    let attached = Arc::new(tokio::sync::Barrier::new(readers + 1));
    let mut reader_tasks = Vec::new();
    match args.reader {
        Reader::Amqp => reader_tasks.push(tokio::spawn(amqp_readers(
            Arc::clone(&args),
            tls.clone(),
            Arc::clone(&received),
            Arc::clone(&attached),
        ))),
        Reader::Https => {
            for &p in &args.partitions {
                reader_tasks.push(tokio::spawn(https_reader(
                    Arc::clone(&args),
                    tls.clone(),
                    p,
                    Arc::clone(&received),
                    Arc::clone(&attached),
                )));
            }
        }
    }
    if tokio::time::timeout(Duration::from_secs(30), attached.wait())
        .await
        .is_err()
    {
        for r in reader_tasks {
            if r.is_finished() {
                r.await??;
            }
        }
        bail!("the readers did not attach within 30 s");
    }
    let started = Instant::now();
    let publishers: Vec<_> = (0..args.devices)
        .map(|d| {
            tokio::spawn(publish_device(
                Arc::clone(&args),
                tls.clone(),
                d,
                key.clone(),
                Arc::clone(&published),
            ))
        })
        .collect();
    let deadline = started + Duration::from_secs(args.time_limit);
    while received.0.lock().len() < expected && Instant::now() < deadline {
        for r in &reader_tasks {
            if r.is_finished() {
                bail!("a reader stopped early");
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for p in publishers {
        p.await??;
    }
    reader_tasks.iter().for_each(|r| r.abort());
    let got = std::mem::take(&mut *received.0.lock());
    let published = published.0.lock();
    let (mut after_puback, mut after_publish, mut before_puback) = (Vec::new(), Vec::new(), 0usize);
    for (d, n, at) in &got {
        if let Some((sent, Some(acked))) = published.get(&(*d, *n)) {
            let ms = signed_ms(*at, *acked);
            if ms < 0.0 {
                before_puback += 1;
            }
            after_puback.push(ms);
            after_publish.push((*at - *sent).as_micros() as u64);
        }
    }
    after_puback.sort_by(f64::total_cmp);
    let first = got.iter().map(|r| r.2).min();
    let last = got.iter().map(|r| r.2).max();
    let span = match (first, last) {
        (Some(f), Some(l)) if l > f => (l - f).as_secs_f64(),
        _ => 0.0,
    };
    let report = serde_json::json!({
        "reader": args.reader,
        "partitions": args.partitions,
        "devices": args.devices,
        "expected": expected,
        "events": got.len(),
        "read_events_per_s": if span > 0.0 { got.len() as f64 / span } else { 0.0 },
        "receipt_after_puback_ms": {
            "p50": quantile(&after_puback, 0.5),
            "p99": quantile(&after_puback, 0.99),
            "before_puback": before_puback,
        },
        "receipt_after_publish": stats::percentiles(after_publish),
    });
    println!("{}", serde_json::to_string(&report)?);
    if got.len() < expected {
        bail!(
            "read {} of {expected} events within the time limit",
            got.len()
        );
    }
    Ok(())
}
