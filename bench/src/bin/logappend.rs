//! What a replicated commit log on NATS JetStream costs (issue 49, docs/cluster.md): one writer
//! appends `--entries` entries of `--records` records of `--record-bytes` bytes each (a
//! serialized engine write batch) to a stream of `--replicas` replicas, fenced as the cluster
//! design fences its writer: every append carries `Nats-Expected-Last-Sequence`, so an append
//! from a writer whose idea of the log is stale fails. Up to `--window` appends are in flight.
//!
//! Prints one JSON line: entries/s, records/s, and the latency from sending an append to its
//! acknowledgement (which JetStream gives once a majority of replicas stored it). Then checks
//! the fence: an append expecting an older last sequence must be refused (`fenced: true`).
//! Bounded by the entry count and `--time-limit`. Needs a running NATS server or cluster.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, message::PublishMessage, stream};
use bytes::Bytes;
use clap::Parser;
use ferrohub_bench::stats;
use serde::Serialize;

#[derive(Parser, Debug)]
struct Args {
    /// NATS server URLs, comma-separated.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    #[arg(long, default_value = "FERROHUB_BENCH_LOG")]
    stream: String,
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    #[arg(long, default_value_t = 5000)]
    entries: usize,
    /// Records per entry (one entry is one group commit's batch).
    #[arg(long, default_value_t = 64)]
    records: usize,
    #[arg(long, default_value_t = 200)]
    record_bytes: usize,
    /// Appends in flight at once.
    #[arg(long, default_value_t = 1)]
    window: usize,
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    time_limit: Duration,
}

#[derive(Serialize)]
struct Report {
    replicas: usize,
    window: usize,
    entry_bytes: usize,
    entries: usize,
    seconds: f64,
    entries_per_s: f64,
    records_per_s: f64,
    ack: stats::Percentiles,
    fenced: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let servers = args
        .nats
        .split(',')
        .map(|u| u.trim().parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("NATS URLs {}", args.nats))?;
    let client = async_nats::connect(servers)
        .await
        .with_context(|| format!("connecting to {}", args.nats))?;
    let js = jetstream::new(client);
    // A fresh stream per run: the first append expects an empty log.
    let _ = js.delete_stream(&args.stream).await;
    let subject = format!("{}.log", args.stream);
    js.create_stream(stream::Config {
        name: args.stream.clone(),
        subjects: vec![subject.clone()],
        num_replicas: args.replicas,
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .context("creating the stream")?;

    let entry_bytes = args.records * args.record_bytes;
    let payload = Bytes::from(vec![0x5a; entry_bytes]);
    let mut last = 0u64;
    let mut in_flight = VecDeque::new();
    let mut samples = Vec::with_capacity(args.entries);
    let start = Instant::now();
    let mut sent = 0;
    while sent < args.entries && start.elapsed() < args.time_limit {
        while in_flight.len() >= args.window.max(1) {
            let (at, expected, ack) = in_flight.pop_front().expect("window is not empty");
            settle(at, expected, ack, &mut samples).await?;
        }
        let publish = PublishMessage::build()
            .payload(payload.clone())
            .expected_last_sequence(last);
        let ack = js.send_publish(subject.clone(), publish).await?;
        last += 1;
        sent += 1;
        in_flight.push_back((Instant::now(), last, ack));
    }
    while let Some((at, expected, ack)) = in_flight.pop_front() {
        settle(at, expected, ack, &mut samples).await?;
    }
    let seconds = start.elapsed().as_secs_f64();

    // A deposed writer still believes the log ends one entry earlier: its append must fail.
    let stale = PublishMessage::build()
        .payload(payload.clone())
        .expected_last_sequence(last.saturating_sub(1));
    let fenced = match js.send_publish(subject.clone(), stale).await {
        Ok(ack) => ack.await.is_err(),
        Err(_) => true,
    };
    let _ = js.delete_stream(&args.stream).await;

    let report = Report {
        replicas: args.replicas,
        window: args.window,
        entry_bytes,
        entries: sent,
        seconds,
        entries_per_s: sent as f64 / seconds,
        records_per_s: (sent * args.records) as f64 / seconds,
        ack: stats::percentiles(samples),
        fenced,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Waits for one append's acknowledgement and records its latency; the log position must be
/// the one the writer expected.
async fn settle(
    at: Instant,
    expected: u64,
    ack: jetstream::context::PublishAckFuture,
    samples: &mut Vec<u64>,
) -> anyhow::Result<()> {
    let ack = ack.await.context("append refused")?;
    samples.push(at.elapsed().as_micros() as u64);
    if ack.sequence != expected {
        bail!("append landed at {} instead of {expected}", ack.sequence);
    }
    Ok(())
}
