//! D2C sends: the hub-wide budget (THR-1) and each device's fair share of it (THR-2).
//!
//! # Policy
//! - The hub admits D2C sends at its tier's rate (one second's worth of burst). A send that
//!   would wait at most the shaping delay for the hub's budget waits; a longer wait refuses it.
//! - A device's fair share is the hub rate divided by the number of devices that sent in the
//!   last one to two seconds. Sends within the share go straight to the hub budget.
//! - Sends above the share are work-conserving: while the budget is not contended they take
//!   spare budget like any other send. It counts as contended for [`PRESSURE_WINDOW`] after a
//!   send had to wait for it or left less than half of its burst. Then a device above its
//!   share waits for its own turn first (the connection stops reading, so its PUBACKs come
//!   late), which holds it to its share and leaves the rest, at least about half a second's
//!   budget at any moment, to the quiet devices.
//! - A device held for longer than the hold limit in all, with no gap as long as the hold limit
//!   between holds, is refused: its connection is closed and its CONNECTs are refused for the
//!   hold limit (at least a second).
//!
//! # Invariants
//! - `unlimited` builds no limiter: admission is free and touches no shared state.
//! - Refusals are decided here; the protocol layer only carries them out.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::clock::{Clock as _, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use parking_lot::Mutex;

use super::limits::{Operation, Rate, Throttled};
use crate::ids::DeviceId;

/// How long contention on the hub budget counts as pressure after it was last seen.
pub const PRESSURE_WINDOW: Duration = Duration::from_secs(1);

/// A send admitted, and how long it was held to its device's share first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admitted {
    pub held: Duration,
}

/// Why a send was refused; the device may come back after `retry_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum D2cRefusal {
    /// Sustained excess over the hub-wide budget.
    HubBudget(Throttled),
    /// Held to its fair share for longer than the hold limit.
    FairShare { retry_after: Duration },
}

impl D2cRefusal {
    pub fn retry_after(&self) -> Duration {
        match self {
            D2cRefusal::HubBudget(t) => t.retry_after,
            D2cRefusal::FairShare { retry_after } => *retry_after,
        }
    }
}

/// Devices that sent in the current and the previous window of one second.
struct ActiveSenders {
    window: u64,
    current: HashSet<DeviceId>,
    previous: usize,
}

impl ActiveSenders {
    fn touch(&mut self, device: &DeviceId, window: u64) -> usize {
        if window != self.window {
            self.previous = if window == self.window + 1 {
                self.current.len()
            } else {
                0
            };
            self.current.clear();
            self.window = window;
        }
        if !self.current.contains(device) {
            self.current.insert(device.clone());
        }
        self.current.len().max(self.previous).max(1)
    }
}

/// Where a sender was last counted among the active senders: a connection keeps one, so that
/// it takes the shared set's lock once a second rather than once a message.
#[derive(Debug, Clone, Copy, Default)]
pub struct SenderMark {
    window: Option<u64>,
}

/// The hub budget, reporting what is left after each admission.
type HubLimiter = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

struct Budget {
    hub: HubLimiter,
    /// Below this many cells left in the hub budget, it counts as contended.
    reserve: u32,
    /// Each device's share: the hub rate in cells, a send costing as many cells as there are
    /// active senders.
    per_device: DefaultKeyedRateLimiter<DeviceId>,
    burst: u32,
    interval: Duration,
    active: Mutex<ActiveSenders>,
    /// The active senders' count as of the last touch.
    active_count: AtomicU64,
    /// Until when (nanoseconds after `epoch`) the budget counts as contended.
    pressure_until: AtomicU64,
    waiting: AtomicU64,
    epoch: Instant,
    clock: DefaultClock,
    /// Devices refused until the given instant.
    penalties: Mutex<HashMap<DeviceId, Instant>>,
}

/// The hub's D2C admission.
pub struct FairShare {
    budget: Option<Budget>,
    shaping_delay: Duration,
    hold_limit: Duration,
}

impl FairShare {
    pub fn new(rate: Option<Rate>, shaping_delay: Duration, hold_limit: Duration) -> FairShare {
        let budget = rate.and_then(|rate| {
            // Per second, with one second's burst, whatever the configured unit.
            let per_second = (rate.count as u128 * 1_000 / rate.per.as_millis().max(1)) as u32;
            let burst = NonZeroU32::new(per_second.max(1))?;
            let quota = Quota::per_second(burst);
            Some(Budget {
                hub: RateLimiter::direct(quota).with_middleware::<StateInformationMiddleware>(),
                reserve: burst.get() / 2,
                per_device: RateLimiter::keyed(quota),
                burst: burst.get(),
                interval: Duration::from_secs(1) / burst.get(),
                active: Mutex::new(ActiveSenders {
                    window: 0,
                    current: HashSet::new(),
                    previous: 0,
                }),
                active_count: AtomicU64::new(1),
                pressure_until: AtomicU64::new(0),
                waiting: AtomicU64::new(0),
                epoch: Instant::now(),
                clock: DefaultClock::default(),
                penalties: Mutex::new(HashMap::new()),
            })
        });
        FairShare {
            budget,
            shaping_delay,
            hold_limit,
        }
    }

    /// How long a device may be held before it is refused.
    pub fn hold_limit(&self) -> Duration {
        self.hold_limit
    }

    /// Whether D2C sends are limited at all.
    pub fn is_limited(&self) -> bool {
        self.budget.is_some()
    }

    /// How long a device must still stay away after a refusal, if it must.
    pub fn penalty(&self, device: &DeviceId) -> Option<Duration> {
        let b = self.budget.as_ref()?;
        let mut penalties = b.penalties.lock();
        let until = *penalties.get(device)?;
        let now = Instant::now();
        if until <= now {
            penalties.remove(device);
            return None;
        }
        Some(until - now)
    }

    /// Admits one D2C send of `device`, after holding it to its share when the budget is
    /// contended; `held_so_far` is how long this device has been held lately (see the policy).
    ///
    /// # Errors
    /// [`D2cRefusal`]; the device is then refused until its retry-after has passed.
    pub async fn admit(
        &self,
        device: &DeviceId,
        mark: &mut SenderMark,
        held_so_far: Duration,
    ) -> Result<Admitted, D2cRefusal> {
        let Some(b) = &self.budget else {
            return Ok(Admitted::default());
        };
        let window = b.epoch.elapsed().as_secs();
        let active = if mark.window == Some(window) {
            b.active_count.load(Ordering::Relaxed) as usize
        } else {
            let n = b.active.lock().touch(device, window);
            b.active_count.store(n as u64, Ordering::Relaxed);
            mark.window = Some(window);
            n
        };
        let cost = NonZeroU32::new(active.clamp(1, b.burst as usize) as u32).expect("at least 1");
        let mut held = Duration::ZERO;
        let within_share = matches!(b.per_device.check_key_n(device, cost), Ok(Ok(())));
        if !within_share {
            if !self.under_pressure(b) {
                if let Ok(left) = b.hub.check() {
                    if left.remaining_burst_capacity() < b.reserve {
                        self.mark_pressure(b);
                    }
                    return Ok(Admitted::default());
                }
            }
            self.mark_pressure(b);
            // Wait for this device's own turn, as long as the hold limit allows.
            loop {
                let wait = match b.per_device.check_key_n(device, cost) {
                    Ok(Ok(())) => break,
                    Ok(Err(not_until)) => not_until.wait_time_from(b.clock.now()),
                    Err(_) => Duration::from_secs(1),
                };
                if held_so_far + held + wait > self.hold_limit {
                    // Refused for as long as it may be held: a flooder cannot come straight back.
                    let retry_after = self.hold_limit.max(Duration::from_secs(1));
                    self.refuse(b, device, retry_after);
                    return Err(D2cRefusal::FairShare { retry_after });
                }
                tokio::time::sleep(wait).await;
                held += wait;
            }
        }
        match self.take_hub_budget(b).await {
            Ok(()) => Ok(Admitted { held }),
            Err(retry_after) => {
                self.refuse(b, device, retry_after);
                Err(D2cRefusal::HubBudget(Throttled {
                    operation: Operation::D2cSend,
                    retry_after,
                }))
            }
        }
    }

    /// Waits for the hub budget within the shaping delay; otherwise the wait to retry after.
    async fn take_hub_budget(&self, b: &Budget) -> Result<(), Duration> {
        loop {
            let wait = match b.hub.check() {
                Ok(left) => {
                    if left.remaining_burst_capacity() < b.reserve {
                        self.mark_pressure(b);
                    }
                    return Ok(());
                }
                Err(not_until) => not_until.wait_time_from(b.clock.now()),
            };
            self.mark_pressure(b);
            let queued = b.interval * b.waiting.load(Ordering::Acquire) as u32;
            if wait + queued > self.shaping_delay {
                return Err(wait + queued);
            }
            b.waiting.fetch_add(1, Ordering::AcqRel);
            tokio::time::sleep(wait).await;
            b.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn refuse(&self, b: &Budget, device: &DeviceId, retry_after: Duration) {
        metrics::counter!("ferrohub_throttled_total", "operation" => Operation::D2cSend.name())
            .increment(1);
        b.penalties
            .lock()
            .insert(device.clone(), Instant::now() + retry_after);
    }

    fn mark_pressure(&self, b: &Budget) {
        let until = (b.epoch.elapsed() + PRESSURE_WINDOW).as_nanos() as u64;
        b.pressure_until.fetch_max(until, Ordering::AcqRel);
    }

    fn under_pressure(&self, b: &Budget) -> bool {
        (b.epoch.elapsed().as_nanos() as u64) < b.pressure_until.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(n: usize) -> DeviceId {
        DeviceId::new(format!("d{n}"))
    }

    fn share(per_second: u32, hold: Duration) -> FairShare {
        FairShare::new(
            Some(Rate {
                count: per_second,
                per: Duration::from_secs(1),
            }),
            Duration::from_millis(250),
            hold,
        )
    }

    #[tokio::test]
    async fn unlimited_admits_everything() {
        let f = FairShare::new(None, Duration::from_millis(250), Duration::from_secs(5));
        for _ in 0..100_000 {
            f.admit(&device(0), &mut SenderMark::default(), Duration::ZERO)
                .await
                .unwrap();
        }
        assert!(!f.is_limited() && f.penalty(&device(0)).is_none());
    }

    #[tokio::test]
    async fn one_device_alone_gets_the_whole_budget() {
        let f = share(100, Duration::from_secs(5));
        let started = Instant::now();
        let mut held = Duration::ZERO;
        for _ in 0..150 {
            held += f
                .admit(&device(0), &mut SenderMark::default(), Duration::ZERO)
                .await
                .unwrap()
                .held;
        }
        // The burst (100) passes, then 50 at 100/s: never faster than the rate...
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(400), "{took:?}");
        // ...and held no longer than the rate asks (the waits the limiter chose, not the time
        // a busy machine took to run them).
        assert!(held <= Duration::from_millis(600), "{held:?}");
    }

    #[tokio::test]
    async fn a_flooder_is_held_to_its_share_and_then_refused() {
        let f = share(100, Duration::from_millis(600));
        // Ten devices active: each one's share is 10/s.
        for n in 1..10 {
            f.admit(&device(n), &mut SenderMark::default(), Duration::ZERO)
                .await
                .unwrap();
        }
        let flooder = device(0);
        let (mut held, mut mark) = (Duration::ZERO, SenderMark::default());
        let refusal = loop {
            match f.admit(&flooder, &mut mark, held).await {
                Ok(a) => held += a.held,
                Err(r) => break r,
            }
        };
        assert!(
            matches!(refusal, D2cRefusal::FairShare { .. }),
            "{refusal:?}"
        );
        assert!(f.penalty(&flooder).is_some(), "refused for a while");
        // A quiet device is still admitted at once: not held at all.
        let quiet = f
            .admit(&device(3), &mut SenderMark::default(), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(quiet.held, Duration::ZERO);
    }
}
