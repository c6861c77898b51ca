//! IoT Hub's operation throttles as data: what is throttled, a rate, a refusal, and each tier's
//! published limit (seed 002 "Cotas e limitação" and IoT Hub's quotas page). No state here;
//! the limiters live in `throttle` and `fair_share`.

use std::time::Duration;

use crate::config::Tier;

/// What is throttled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Registry,
    C2dSend,
    C2dReceive,
    DeviceConnection,
    TwinRead,
    TwinUpdate,
    Method,
    Jobs,
    D2cSend,
    Query,
}

impl Operation {
    pub fn name(self) -> &'static str {
        match self {
            Operation::Registry => "registry",
            Operation::C2dSend => "c2d_send",
            Operation::C2dReceive => "c2d_receive",
            Operation::DeviceConnection => "device_connection",
            Operation::TwinRead => "twin_read",
            Operation::TwinUpdate => "twin_update",
            Operation::Method => "method",
            Operation::Jobs => "jobs",
            Operation::D2cSend => "d2c_send",
            Operation::Query => "query",
        }
    }
}

/// A refusal: try again after this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    pub operation: Operation,
    pub retry_after: Duration,
}

/// A rate: `count` per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

const MINUTE: Duration = Duration::from_secs(60);
const SECOND: Duration = Duration::from_secs(1);

pub(crate) fn per_minute(count: u32) -> Rate {
    Rate { count, per: MINUTE }
}

pub(crate) fn per_second(count: u32) -> Rate {
    Rate { count, per: SECOND }
}

/// IoT Hub's published limit of an operation for a tier and unit count; `None` for unlimited.
pub fn tier_rate(tier: Tier, units: u32, op: Operation) -> Option<Rate> {
    use Operation as O;
    use Tier as T;
    let u = units.max(1);
    Some(match (tier, op) {
        (T::Unlimited, _) => return None,
        (T::Free, O::Registry) => per_minute(100),
        (_, O::Registry) => per_minute((100 * u).min(5_000)),
        (T::Free, O::DeviceConnection) => per_second(100),
        (T::S1, O::DeviceConnection) => per_second((12 * u).max(100)),
        (T::S2, O::DeviceConnection) => per_second((120 * u).max(100)),
        (T::S3, O::DeviceConnection) => per_second(6_000 * u),
        (T::Free, O::D2cSend) => per_second(100),
        (T::S1, O::D2cSend) => per_second((12 * u).max(100)),
        (T::S2, O::D2cSend) => per_second((120 * u).max(100)),
        (T::S3, O::D2cSend) => per_second(6_000 * u),
        (T::S3, O::C2dSend) => per_minute(5_000 * u),
        (T::Free, O::C2dSend) => per_minute(100),
        (_, O::C2dSend) => per_minute(100 * u),
        (T::S3, O::C2dReceive) => per_minute(50_000 * u),
        (T::Free, O::C2dReceive) => per_minute(1_000),
        (_, O::C2dReceive) => per_minute(1_000 * u),
        (T::Free, O::TwinRead | O::TwinUpdate) => per_second(10),
        (T::S1, O::TwinRead | O::TwinUpdate) => per_second(100),
        (_, O::TwinRead | O::TwinUpdate) => per_second((10 * u).max(100)),
        (T::Free, O::Method) => per_minute(160),
        (T::S1, O::Method) => per_second(20 * u),
        (T::S2, O::Method) => per_second(60 * u),
        (T::S3, O::Method) => per_second(24_000 * u),
        (T::S3, O::Jobs) => per_minute(5_000 * u),
        (T::S3, O::Query) => per_minute(1_000 * u),
        (_, O::Query) => per_minute(20 * u),
        (_, O::Jobs) => per_minute(100 * u),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_examples() {
        // Two S1 units: 2 x 12 = 24/s, but at least 100/s; nine S1 units: 108/s.
        assert_eq!(
            tier_rate(Tier::S1, 2, Operation::DeviceConnection),
            Some(per_second(100))
        );
        assert_eq!(
            tier_rate(Tier::S1, 9, Operation::DeviceConnection),
            Some(per_second(108))
        );
        assert_eq!(
            tier_rate(Tier::S1, 80, Operation::Registry),
            Some(per_minute(5_000))
        );
        assert_eq!(
            tier_rate(Tier::S2, 3, Operation::C2dSend),
            Some(per_minute(300))
        );
        assert_eq!(tier_rate(Tier::Unlimited, 3, Operation::C2dSend), None);
    }
}
