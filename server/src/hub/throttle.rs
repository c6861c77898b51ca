//! Operation throttles (THR-1, seed 002 "Cotas e limitação"): one GCRA limiter (`governor`) per
//! throttled operation, sized by tier and units, each limit overridable in `[throttling]`.
//!
//! # Invariants
//! - A limiter holds at most one interval's worth of burst (a minute's budget for per-minute
//!   limits, a second's for per-second ones), then admits at the sustained rate.
//! - Shaping before refusing: a caller whose turn comes within `shaping_delay` waits for it and
//!   is admitted; one whose turn is further away is refused with the wait as its retry-after.
//!   Waiters count against the delay too, so a crowd of waiters cannot each be promised the
//!   same slot.
//! - `unlimited` (the self-hosted default) builds no limiter: admission is free.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::daily_quota::DailyQuota;
use super::fair_share::FairShare;
use super::limits::{per_minute, per_second, tier_rate};
pub use super::limits::{Operation, Rate, Throttled};
use crate::config::ThrottlingSection;

fn override_of(section: &ThrottlingSection, op: Operation) -> Option<Rate> {
    let s = section;
    match op {
        Operation::Registry => s.registry_per_minute.map(per_minute),
        Operation::C2dSend => s.c2d_sends_per_minute.map(per_minute),
        Operation::C2dReceive => s.c2d_receives_per_minute.map(per_minute),
        Operation::DeviceConnection => s.device_connections_per_second.map(per_second),
        Operation::TwinRead => s.twin_reads_per_second.map(per_second),
        Operation::TwinUpdate => s.twin_updates_per_second.map(per_second),
        Operation::Method => s.methods_per_second.map(per_second),
        Operation::Jobs => s.jobs_per_minute.map(per_minute),
        Operation::D2cSend => s.d2c_sends_per_second.map(per_second),
        Operation::Query => s.queries_per_minute.map(per_minute),
    }
}

struct Limiter {
    limiter: DefaultDirectRateLimiter,
    /// Time between admissions at the sustained rate.
    interval: Duration,
    waiting: AtomicU32,
}

/// The hub's throttles.
pub struct Throttles {
    limiters: HashMap<Operation, Limiter>,
    shaping_delay: Duration,
    clock: DefaultClock,
    /// D2C sends: the hub-wide budget shared fairly between devices (THR-2).
    pub d2c: FairShare,
    /// The daily message quota.
    pub quota: DailyQuota,
}

/// The operations admitted through [`Throttles::admit`]; D2C sends go through [`FairShare`].
const ALL: [Operation; 9] = [
    Operation::Registry,
    Operation::C2dSend,
    Operation::C2dReceive,
    Operation::DeviceConnection,
    Operation::TwinRead,
    Operation::TwinUpdate,
    Operation::Method,
    Operation::Jobs,
    Operation::Query,
];

impl Throttles {
    pub fn new(section: &ThrottlingSection) -> Throttles {
        let mut limiters = HashMap::new();
        for op in ALL {
            let rate =
                override_of(section, op).or_else(|| tier_rate(section.tier, section.units, op));
            let Some(rate) = rate else { continue };
            let Some(count) = NonZeroU32::new(rate.count) else {
                continue;
            };
            let interval = rate.per / rate.count;
            let Some(quota) = Quota::with_period(interval) else {
                continue;
            };
            limiters.insert(
                op,
                Limiter {
                    limiter: RateLimiter::direct(quota.allow_burst(count)),
                    interval,
                    waiting: AtomicU32::new(0),
                },
            );
        }
        let d2c_rate = override_of(section, Operation::D2cSend)
            .or_else(|| tier_rate(section.tier, section.units, Operation::D2cSend));
        Throttles {
            limiters,
            shaping_delay: section.shaping_delay,
            clock: DefaultClock::default(),
            d2c: FairShare::new(d2c_rate, section.shaping_delay, section.fair_share_hold),
            quota: DailyQuota::new(section),
        }
    }

    /// Admits the operation, waiting up to the shaping delay for its turn.
    ///
    /// # Errors
    /// [`Throttled`] with how long to wait before trying again.
    pub async fn admit(&self, op: Operation) -> Result<(), Throttled> {
        let Some(l) = self.limiters.get(&op) else {
            return Ok(());
        };
        loop {
            let wait = match l.limiter.check() {
                Ok(()) => return Ok(()),
                Err(not_until) => not_until.wait_time_from(self.clock.now()),
            };
            // Everyone already waiting is ahead in line.
            let queued = l.interval * l.waiting.load(Ordering::Acquire);
            let total = wait + queued;
            if total > self.shaping_delay {
                metrics::counter!("ferrohub_throttled_total", "operation" => op.name())
                    .increment(1);
                return Err(Throttled {
                    operation: op,
                    retry_after: total,
                });
            }
            l.waiting.fetch_add(1, Ordering::AcqRel);
            tokio::time::sleep(wait).await;
            l.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Tier;

    #[tokio::test]
    async fn a_burst_passes_then_waits_then_is_refused() {
        let section = ThrottlingSection {
            tier: Tier::S1,
            registry_per_minute: Some(600), // one per 100 ms after a burst of 600
            shaping_delay: Duration::from_millis(250),
            ..ThrottlingSection::default()
        };
        let t = Throttles::new(&section);
        for _ in 0..600 {
            t.admit(Operation::Registry).await.unwrap();
        }
        // The next ones wait their turn (~100 ms each)...
        let started = std::time::Instant::now();
        t.admit(Operation::Registry).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        // ...and three waiters at once cannot all be promised a slot within 250 ms.
        let results = futures::future::join_all((0..5).map(|_| t.admit(Operation::Registry))).await;
        let refused: Vec<_> = results.iter().filter_map(|r| r.err()).collect();
        assert!(!refused.is_empty(), "sustained excess is refused");
        assert!(refused
            .iter()
            .all(|r| r.retry_after > Duration::from_millis(250)));
        // The self-hosted default holds nothing.
        let free = Throttles::new(&ThrottlingSection::default());
        for _ in 0..10_000 {
            free.admit(Operation::Registry).await.unwrap();
        }
    }
}

impl Throttles {
    /// Admits a device's twin operation under its throttle and the daily quota, or the
    /// refusal every device transport answers with: its status (429, or 403 when the quota is
    /// used up) and JSON body.
    pub async fn refuse_twin_operation(
        &self,
        op: Operation,
        bytes: usize,
        now: ferrohub_engine::UnixMillis,
    ) -> Option<(u16, serde_json::Value)> {
        if let Err(t) = self.admit(op).await {
            let body = serde_json::json!({
                "errorCode": 429001,
                "message": format!("ThrottlingException: the {} throttle is exceeded", op.name()),
                "retryAfterSeconds": t.retry_after.as_secs().max(1),
            });
            return Some((429, body));
        }
        if let Err(q) = self.quota.charge(now, bytes) {
            let body = serde_json::json!({
                "errorCode": 403002,
                "message": format!("IotHubQuotaExceeded: the daily message quota is used up until {}", crate::clock::iso7(q.resets_at)),
            });
            return Some((403, body));
        }
        metrics::counter!("ferrohub_twin_operations_total", "operation" => op.name()).increment(1);
        None
    }
}
