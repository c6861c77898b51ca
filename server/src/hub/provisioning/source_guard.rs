//! The per-source limit on failed attestations: a source address that keeps presenting
//! credentials nothing admits is refused (429) before any enrollment is read for it.
//!
//! # Invariants
//! - Only failures are charged (one GCRA cell each, `governor`'s keyed limiter, a minute's
//!   worth of budget): a source's `per_minute`-th failure in a burst (at least its second)
//!   makes it refused every DPS request, good or bad, until its next cell is due, so a
//!   flood gets at most that many attestations done for it. Other sources are untouched.
//! - Memory is bounded by the sources seen recently: the limiter forgets sources whose budget
//!   is whole again, and a block is forgotten once it ended.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use parking_lot::Mutex;

/// Past this many remembered sources, forgotten ones are swept out.
const SWEEP_ABOVE: usize = 10_000;

pub struct SourceGuard {
    limiter: Option<DefaultKeyedRateLimiter<IpAddr>>,
    blocked: Mutex<HashMap<IpAddr, Instant>>,
    clock: DefaultClock,
}

impl SourceGuard {
    /// `per_minute` failures a source may make (0: no limit).
    pub fn new(per_minute: u32) -> SourceGuard {
        SourceGuard {
            // One cell fewer than the budget: the failure that finds the limiter empty is the
            // one past the budget, so the budget's last failure must be the one refused.
            limiter: NonZeroU32::new(per_minute).map(|n| {
                let burst = NonZeroU32::new(n.get() - 1).unwrap_or(n);
                RateLimiter::keyed(Quota::per_minute(n).allow_burst(burst))
            }),
            blocked: Mutex::new(HashMap::new()),
            clock: DefaultClock::default(),
        }
    }

    /// How long `source` is still refused, if it is.
    pub fn refused_for(&self, source: IpAddr) -> Option<Duration> {
        self.limiter.as_ref()?;
        let mut blocked = self.blocked.lock();
        let until = *blocked.get(&source)?;
        let now = Instant::now();
        if until > now {
            return Some(until - now);
        }
        blocked.remove(&source);
        None
    }

    /// Charges one failed attestation to `source`; past its budget it is refused from now on
    /// until the next cell is due.
    pub fn failed(&self, source: IpAddr) {
        let Some(limiter) = &self.limiter else {
            return;
        };
        if let Err(not_until) = limiter.check_key(&source) {
            let wait = not_until.wait_time_from(self.clock.now());
            tracing::info!(%source, retry_after = ?wait, "DPS source refused: too many failed attestations");
            metrics::counter!("ferrohub_throttled_total", "operation" => "dpsFailedAttestations")
                .increment(1);
            let mut blocked = self.blocked.lock();
            if blocked.len() > SWEEP_ABOVE {
                let now = Instant::now();
                blocked.retain(|_, until| *until > now);
            }
            blocked.insert(source, Instant::now() + wait);
        }
        if limiter.len() > SWEEP_ABOVE {
            limiter.retain_recent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_refused_after_its_budget_and_others_are_not() {
        let guard = SourceGuard::new(3);
        let bad: IpAddr = "127.0.0.5".parse().unwrap();
        let good: IpAddr = "127.0.0.1".parse().unwrap();
        for _ in 0..2 {
            assert_eq!(guard.refused_for(bad), None);
            guard.failed(bad);
        }
        assert_eq!(guard.refused_for(bad), None, "two failures of three");
        guard.failed(bad);
        let wait = guard.refused_for(bad).expect("past the budget: refused");
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(20));
        assert_eq!(guard.refused_for(good), None);
        let off = SourceGuard::new(0);
        for _ in 0..100 {
            off.failed(bad);
        }
        assert_eq!(off.refused_for(bad), None);
    }
}
