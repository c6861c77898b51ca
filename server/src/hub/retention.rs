//! The D2C retention pass (D2C-3): at start and then every `interval`, remove every event older
//! than the retention, with one range delete per partition. Never on the append path.

use std::time::Duration;

use ferrohub_engine::UnixMillis;
use tokio_util::sync::CancellationToken;

use super::context::HubContext;

pub async fn run(
    ctx: HubContext,
    retention: Duration,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let cutoff = UnixMillis(ctx.clock.now().0 - retention.as_millis() as i64);
        match ctx.store.run(move |s| s.trim_events_before(cutoff)).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "retention pass removed expired events"),
            Err(e) => tracing::error!(error = %e, "retention pass failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
