//! What a cluster follower keeps current beside the log it applies: the compiled routing
//! table. A follower routes no message itself (the writer does), but it answers the routing
//! API's reads and the console's route tester from its own table.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::routes::compile_stored;
use super::HubContext;

/// How often the stored routing configuration is compared with the one compiled.
const ROUTING_CHECK: Duration = Duration::from_secs(2);

/// Recompiles the routing table whenever the replica's stored configuration changed, until
/// `stop`.
pub async fn follow_routing(ctx: HubContext, stop: CancellationToken) {
    let mut compiled = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(ROUTING_CHECK) => {}
        }
        let known = compiled.clone();
        let read = ctx
            .store
            .run(move |s| {
                let config = s.routing_config()?;
                if known.as_ref() == Some(&config) {
                    return Ok((config, None));
                }
                let table = compile_stored(&config, s)?;
                Ok::<_, crate::routing::RouteError>((config, Some(table)))
            })
            .await;
        match read {
            Ok((config, Some(table))) => {
                if compiled.is_some() {
                    tracing::info!("routing configuration changed; table recompiled");
                }
                let _order = ctx.routing.lock_changes();
                ctx.routing.install(table);
                compiled = Some(config);
            }
            Ok((_, None)) => {}
            Err(e) => tracing::debug!(error = %e, "cannot follow the routing configuration"),
        }
    }
}
