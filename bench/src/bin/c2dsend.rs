//! C2D send throughput (AMQ-2 benchmark): a back-end sending cloud-to-device messages to many
//! devices, over AMQP (what the service SDKs use) or over the HTTPS send, with the same load:
//! `--messages` sends spread round-robin over `--devices` registered devices (at most 50 per
//! device, IoT Hub's queue depth), from `--connections` connections with `--links` concurrent
//! senders each (one AMQP sender link, or one HTTPS connection, per sender; each sends one
//! message at a time and waits for `accepted` or the 204).
//!
//! Prints a JSON report: sends/s and the latency of each send's acknowledgement. Bounded by
//! the message count and `--time-limit`. Devices never connect, so the queues only fill.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, ValueEnum};
use ferrohub_bench::http::HttpsConnection;
use ferrohub_bench::{amqp, client, registry, stats};
use ferrohub_server::auth::sas;
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Transport {
    Amqp,
    Https,
}

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, value_enum)]
    transport: Transport,
    #[arg(long, default_value = "localhost")]
    host: String,
    #[arg(long, default_value_t = 443)]
    https_port: u16,
    #[arg(long, default_value_t = 5671)]
    amqp_port: u16,
    #[arg(long)]
    ca: PathBuf,
    /// The owner connection string: registers the devices and signs the sends.
    #[arg(long)]
    owner: String,
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    #[arg(long, default_value_t = 1)]
    connections: usize,
    #[arg(long, default_value_t = 8)]
    links: usize,
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    #[arg(long, default_value = "c2d-")]
    prefix: String,
    #[arg(long, default_value_t = 300)]
    time_limit: u64,
}

#[derive(Serialize)]
struct Report {
    transport: Transport,
    devices: usize,
    connections: usize,
    links: usize,
    accepted: usize,
    refused: usize,
    duration_s: f64,
    sends_per_s: f64,
    latency: stats::Percentiles,
}

/// The next send's index, shared by every sender; `None` when all are taken.
struct Work {
    next: AtomicUsize,
    total: usize,
    devices: Vec<String>,
}

impl Work {
    fn take(&self) -> Option<(usize, &str)> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.total).then(|| (i, self.devices[i % self.devices.len()].as_str()))
    }
}

/// What every sender task needs.
struct Load {
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    token: String,
    work: Arc<Work>,
    body: Vec<u8>,
}

fn cs_field<'a>(cs: &'a str, name: &str) -> anyhow::Result<&'a str> {
    cs.split(';')
        .find_map(|p| p.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        .with_context(|| format!("the connection string lacks {name}"))
}

/// One AMQP connection: CBS put-token, then `links` sender links sending until work runs out.
async fn amqp_connection(load: Load) -> anyhow::Result<(Vec<u64>, usize)> {
    let Load {
        args,
        tls,
        token,
        work,
        body,
    } = load;
    let mut service =
        amqp::ServiceConnection::open(&tls, &args.host, args.amqp_port, "c2dsend", token).await?;
    let mut senders = Vec::new();
    for l in 0..args.links {
        let mut link = service.c2d_sender(format!("c2d-{l}")).await?;
        let (work, body) = (Arc::clone(&work), body.clone());
        senders.push(tokio::spawn(async move {
            let (mut latencies, mut refused) = (Vec::new(), 0usize);
            while let Some((i, device)) = work.take() {
                let start = Instant::now();
                match amqp::send_c2d(&mut link, device, format!("m-{i}"), body.clone()).await? {
                    amqp::SendOutcome::Accepted => {
                        latencies.push(start.elapsed().as_micros() as u64)
                    }
                    _ => refused += 1,
                }
            }
            let _ = link.close().await;
            anyhow::Ok((latencies, refused))
        }));
    }
    let mut out = (Vec::new(), 0);
    for s in senders {
        let (l, r) = s.await??;
        out.0.extend(l);
        out.1 += r;
    }
    service.close().await;
    Ok(out)
}

/// One HTTPS sender: `POST /devices/{id}/messages/deviceBound`, one at a time.
async fn https_sender(load: Load) -> anyhow::Result<(Vec<u64>, usize)> {
    let Load {
        args,
        tls,
        token,
        work,
        body,
    } = load;
    let mut http = HttpsConnection::connect(&tls, &args.host, args.https_port).await?;
    let (mut latencies, mut refused) = (Vec::new(), 0usize);
    while let Some((_, device)) = work.take() {
        let path = format!("/devices/{device}/messages/deviceBound?api-version=2021-04-12");
        let start = Instant::now();
        match http.request("POST", &path, &token, &body).await?.0 {
            204 => latencies.push(start.elapsed().as_micros() as u64),
            _ => refused += 1,
        }
    }
    Ok((latencies, refused))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Arc::new(Args::parse());
    if args.messages > args.devices * 50 {
        bail!("at most 50 messages per device fit in its queue");
    }
    let tls = client::tls_connector(&args.ca)?;
    let (policy, key) = (
        cs_field(&args.owner, "SharedAccessKeyName")?,
        cs_field(&args.owner, "SharedAccessKey")?,
    );
    let expiry = chrono::Utc::now().timestamp() as u64 + 3600;
    let token = sas::sign(&args.host, key, expiry, Some(policy)).context("bad owner key")?;
    let devices: Vec<String> = (0..args.devices)
        .map(|i| format!("{}{i}", args.prefix))
        .collect();
    let device_key = "YzJkc2VuZC1kZXZpY2Uta2V5LTMyLWJ5dGVzLWxvbmchISE=";
    registry::register(
        &tls,
        &args.host,
        args.https_port,
        &token,
        &devices,
        device_key,
    )
    .await?;
    let work = Arc::new(Work {
        next: AtomicUsize::new(0),
        total: args.messages,
        devices,
    });
    let body = vec![b'x'; args.payload_bytes];
    let start = Instant::now();
    // AMQP: one task per connection, which runs its links; HTTPS: one task per sender.
    let count = match args.transport {
        Transport::Amqp => args.connections,
        Transport::Https => args.connections * args.links,
    };
    let tasks: Vec<_> = (0..count)
        .map(|_| {
            let load = Load {
                args: Arc::clone(&args),
                tls: tls.clone(),
                token: token.clone(),
                work: Arc::clone(&work),
                body: body.clone(),
            };
            match args.transport {
                Transport::Amqp => tokio::spawn(amqp_connection(load)),
                Transport::Https => tokio::spawn(https_sender(load)),
            }
        })
        .collect();
    let joined = tokio::time::timeout(
        Duration::from_secs(args.time_limit),
        futures::future::join_all(tasks),
    )
    .await
    .context("time limit reached")?;
    let duration = start.elapsed();
    let (mut latencies, mut refused) = (Vec::new(), 0);
    for r in joined {
        let (l, n) = r??;
        latencies.extend(l);
        refused += n;
    }
    let report = Report {
        transport: args.transport,
        devices: args.devices,
        connections: args.connections,
        links: args.links,
        accepted: latencies.len(),
        refused,
        duration_s: duration.as_secs_f64(),
        sends_per_s: latencies.len() as f64 / duration.as_secs_f64(),
        latency: stats::percentiles(latencies),
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
