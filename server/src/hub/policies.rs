//! The hub's shared access policies as they stand now: what authentication checks tokens
//! against, changed while the hub serves (the console's policies page, `ChangePolicy`).
//!
//! # Invariants
//! - [`LivePolicies`] holds the settings last read from the store, whole; a reader gets one
//!   consistent snapshot (an `Arc`) and never waits on a change for longer than a pointer swap.
//! - The node that made a change holds it before it answers ([`LivePolicies::replace`] with
//!   the settings the change wrote, on a follower once its replica applied them), so the
//!   caller's next request there is checked against the new policies. Every follower of a
//!   cluster reads its replica every [`REFRESH_EVERY`] ([`follow_stored`]) and holds the
//!   change within that; the writer (and a single node) runs every change itself. Only
//!   policies change at run time; the host names and the provisioning service's settings stay
//!   as the hub started with them.
//! - A connection authenticated before a change keeps its session until its token expires or
//!   is renewed, as with IoT Hub (whose policy changes take a while to reach every gateway).

use std::sync::Arc;
use std::time::Duration;

use ferrohub_engine::hub::HubSettings;
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use super::StoreHandle;

/// How often a node reads its store for policy changes made elsewhere.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);

pub struct LivePolicies {
    settings: RwLock<Arc<HubSettings>>,
}

impl LivePolicies {
    pub fn new(settings: Arc<HubSettings>) -> Arc<LivePolicies> {
        Arc::new(LivePolicies {
            settings: RwLock::new(settings),
        })
    }

    /// The settings now in force.
    pub fn current(&self) -> Arc<HubSettings> {
        Arc::clone(&self.settings.read())
    }

    /// Holds `settings`' policies from now on (the rest stays as the hub started).
    pub fn replace(&self, settings: &HubSettings) {
        let mut held = self.settings.write();
        if held.policies != settings.policies {
            let mut next = HubSettings::clone(&held);
            next.policies = settings.policies.clone();
            *held = Arc::new(next);
        }
    }
}

/// Keeps `live` in step with the policies in the store, until `stop`.
pub async fn follow_stored(store: StoreHandle, live: Arc<LivePolicies>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(REFRESH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match store.run_quick(|s| s.hub_settings()).await {
            Ok(Some(stored)) => live.replace(&stored),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "could not read the policies; keeping those held")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrohub_engine::UnixMillis;

    #[test]
    fn only_the_policies_are_taken() {
        let started = HubSettings {
            hub_name: "h".into(),
            host_name: "localhost".into(),
            other_host_names: Vec::new(),
            policies: HubSettings::default_policies(),
            created: UnixMillis(0),
            provisioning: None,
        };
        let live = LivePolicies::new(Arc::new(started.clone()));
        let mut stored = started.clone();
        stored.host_name = "elsewhere".into();
        stored.policies.pop();
        live.replace(&stored);
        let now = live.current();
        assert_eq!(now.policies, stored.policies);
        assert_eq!(now.host_name, "localhost");
    }
}
