//! The daily message quota (THR-1; IoT Hub's "total messages per day"): messages counted in
//! chunks of 4 KB (0.5 KB on the free tier), as IoT Hub meters them, reset at 00:00 UTC.
//!
//! # Invariants
//! - A message that would take the day's count past the quota is refused whole and counts
//!   nothing; the count never exceeds the quota.
//! - The day is the UTC calendar day of the hub clock's time, so a paused test clock moves
//!   the reset with it.
//! - The count lives in memory: a restart starts the day's count again (documented in
//!   docs/operations.md). `unlimited` has no quota.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use ferrohub_engine::UnixMillis;
use parking_lot::Mutex;

use crate::config::{ThrottlingSection, Tier};

const DAY_MS: i64 = 86_400_000;

/// The day's quota is used up until `resets_at` (the next 00:00 UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub resets_at: UnixMillis,
}

/// IoT Hub's daily quota of a tier, in chunks; `None` for unlimited.
pub fn tier_quota(tier: Tier, units: u32) -> Option<u64> {
    let u = units.max(1) as u64;
    match tier {
        Tier::Unlimited => None,
        Tier::Free => Some(8_000),
        Tier::S1 => Some(400_000 * u),
        Tier::S2 => Some(6_000_000 * u),
        Tier::S3 => Some(300_000_000 * u),
    }
}

/// The size of one metered chunk on a tier.
pub fn chunk_bytes(tier: Tier) -> usize {
    if tier == Tier::Free {
        512
    } else {
        4_096
    }
}

/// The hub's daily quota.
pub struct DailyQuota {
    limit: Option<u64>,
    chunk: usize,
    /// The day (days since the epoch, UTC) `used` counts, and the chunks used on it; a day
    /// change is rare and taken under the lock, counting is one atomic update.
    day: Mutex<i64>,
    day_index: AtomicI64,
    used: AtomicU64,
}

impl DailyQuota {
    pub fn new(section: &ThrottlingSection) -> DailyQuota {
        DailyQuota {
            limit: section
                .daily_messages
                .or_else(|| tier_quota(section.tier, section.units)),
            chunk: chunk_bytes(section.tier),
            day: Mutex::new(0),
            day_index: AtomicI64::new(0),
            used: AtomicU64::new(0),
        }
    }

    /// Chunks counted today, for the metrics.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Counts a message of `bytes` (at least one chunk) at time `now`.
    ///
    /// # Errors
    /// [`QuotaExceeded`] when the day's quota cannot hold it; nothing is counted then.
    pub fn charge(&self, now: UnixMillis, bytes: usize) -> Result<(), QuotaExceeded> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let chunks = bytes.div_ceil(self.chunk).max(1) as u64;
        let index = now.0.div_euclid(DAY_MS);
        if self.day_index.load(Ordering::Acquire) != index {
            let mut day = self.day.lock();
            if *day != index {
                *day = index;
                self.used.store(0, Ordering::Release);
                self.day_index.store(index, Ordering::Release);
            }
        }
        let counted = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + chunks <= limit).then_some(used + chunks)
            });
        if counted.is_err() {
            metrics::counter!("ferrohub_quota_refused_total").increment(1);
            return Err(QuotaExceeded {
                resets_at: UnixMillis((index + 1) * DAY_MS),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(tier: Tier, daily: Option<u64>) -> DailyQuota {
        DailyQuota::new(&ThrottlingSection {
            tier,
            daily_messages: daily,
            ..ThrottlingSection::default()
        })
    }

    #[test]
    fn messages_count_in_chunks_and_the_day_resets_at_midnight_utc() {
        let q = quota(Tier::S1, Some(10));
        // 2026-11-23T23:59:00Z
        let evening = UnixMillis(1_795_478_340_000);
        assert_eq!(evening.0.rem_euclid(DAY_MS), 86_340_000);
        q.charge(evening, 9 * 1024).unwrap(); // 3 chunks
        q.charge(evening, 1).unwrap(); // 1 chunk
        q.charge(evening, 0).unwrap(); // an empty message still counts 1
        q.charge(evening, 4096 * 5).unwrap(); // 5 chunks: 10 in all
        let refused = q.charge(evening, 1).unwrap_err();
        assert_eq!(refused.resets_at, UnixMillis(evening.0 + 60_000));
        // A refusal counts nothing; after midnight the day starts again.
        let midnight = UnixMillis(evening.0 + 60_000);
        q.charge(midnight, 4096 * 10).unwrap();
        assert!(q.charge(midnight, 1).is_err());
    }

    #[test]
    fn tiers_have_their_quotas_and_unlimited_has_none() {
        assert_eq!(tier_quota(Tier::S1, 2), Some(800_000));
        assert_eq!(tier_quota(Tier::Free, 1), Some(8_000));
        assert_eq!(chunk_bytes(Tier::Free), 512);
        let q = quota(Tier::Unlimited, None);
        for _ in 0..100_000 {
            q.charge(UnixMillis(0), 1 << 20).unwrap();
        }
        // The free tier meters 0.5 KB chunks.
        let free = quota(Tier::Free, Some(3));
        free.charge(UnixMillis(0), 1_500).unwrap();
        assert!(free.charge(UnixMillis(0), 1).is_err());
    }
}
