//! The direct-methods scenario: every device answers its method requests while `--callers`
//! back-end callers invoke methods over keep-alive HTTPS.

use std::sync::Arc;
use std::time::Instant;

use ferrohub_bench::http::HttpsConnection;
use ferrohub_bench::{client, stats};

use super::responders::{spawn_responders, Answer};
use super::Args;

/// Runs the methods scenario and prints its report.
pub async fn run_methods(
    args: Arc<Args>,
    tls: tokio_rustls::TlsConnector,
    ids: Vec<String>,
    key: String,
    owner_token: String,
) -> anyhow::Result<()> {
    let stop = Arc::new(tokio::sync::Notify::new());
    let answer: Answer = Arc::new(|p| {
        let rid = p.topic_name().split("$rid=").nth(1)?;
        client::publish(
            &format!("$iothub/methods/res/200/?$rid={rid}"),
            None,
            b"{\"ok\":true}".to_vec(),
        )
        .ok()
        .map(Into::into)
    });
    let (responders, _) = spawn_responders(
        &args,
        &tls,
        &ids,
        &key,
        &stop,
        |_| "$iothub/methods/POST/#".to_string(),
        answer,
    );
    // Wait until every device's subscription is in place: a call to the last one succeeds.
    let mut probe = HttpsConnection::connect(&tls, &args.host, args.https_port).await?;
    let body = br#"{"methodName":"probe","payload":null,"responseTimeoutInSeconds":30,"connectTimeoutInSeconds":60}"#;
    for id in &ids {
        let (status, text) = probe
            .request(
                "POST",
                &format!("/twins/{id}/methods?api-version=2021-04-12"),
                &owner_token,
                body,
            )
            .await?;
        anyhow::ensure!(
            status == 200,
            "probe of {id}: {status} {}",
            String::from_utf8_lossy(&text)
        );
    }
    let total = ids.len() * args.messages_per_device;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let ids = Arc::new(ids);
    let start = Instant::now();
    let callers: Vec<_> = (0..args.callers.max(1))
        .map(|_| {
            let (tls, args, ids, next, token) = (
                tls.clone(),
                Arc::clone(&args),
                Arc::clone(&ids),
                Arc::clone(&next),
                owner_token.clone(),
            );
            tokio::spawn(async move {
                let mut http = HttpsConnection::connect(&tls, &args.host, args.https_port)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut latencies = Vec::new();
                let body =
                    br#"{"methodName":"bench","payload":{"n":1},"responseTimeoutInSeconds":30}"#;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, String>(latencies);
                    }
                    let path = format!(
                        "/twins/{}/methods?api-version=2021-04-12",
                        ids[i % ids.len()]
                    );
                    let t = Instant::now();
                    let (status, _) = http
                        .request("POST", &path, &token, body)
                        .await
                        .map_err(|e| e.to_string())?;
                    if status != 200 {
                        return Err(format!("call answered {status}"));
                    }
                    latencies.push(t.elapsed().as_micros() as u64);
                }
            })
        })
        .collect();
    let results = futures::future::join_all(callers).await;
    let duration = start.elapsed();
    stop.notify_waiters();
    for r in responders {
        r.abort();
    }
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(Ok(l)) => latencies.extend(l),
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let report = serde_json::json!({
        "target": "ferrohub", "scenario": "methods", "devices": ids.len(), "callers": args.callers,
        "calls": latencies.len(), "errors": errors.len(), "first_error": errors.first(),
        "duration_s": duration.as_secs_f64(),
        "throughput_calls_per_s": latencies.len() as f64 / duration.as_secs_f64(),
        "call_latency": stats::percentiles(latencies),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
