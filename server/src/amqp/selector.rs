//! Where an Event Hubs receiver starts: the `apache.org:selector-filter:string` filter of its
//! source, `amqp.annotation.x-opt-{offset|sequence-number|enqueued-time} {>|>=} '{value}'`.
//!
//! Offsets are the engine's byte positions and sequence numbers and enqueued times are whole
//! numbers, so `> v` is `>= v + 1`. Offset `-1` is the start of the stream and `@latest` its
//! end (only events enqueued after the link attached). No filter reads from the start, as
//! Event Hubs does.

use fe2o3_amqp::types::messaging::FilterSet;
use fe2o3_amqp::types::primitives::Value;
use ferrohub_engine::d2c::ReadPosition;
use ferrohub_engine::UnixMillis;
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;

const SELECTOR_NAME: &str = "apache.org:selector-filter:string";
const SELECTOR_CODE: u64 = 0x0000_468C_0000_0004;

/// The position a source's filter asks for; the message says what is wrong with it.
pub fn start_position(filter: Option<&FilterSet>) -> Result<ReadPosition, String> {
    let Some(expression) = filter.and_then(selector) else {
        return Ok(ReadPosition::Start);
    };
    parse(expression)
}

fn selector(filter: &FilterSet) -> Option<&str> {
    filter.values().find_map(|v| match v {
        Value::Described(d) => selector_text(d),
        _ => None,
    })
}

fn selector_text(d: &Described<Value>) -> Option<&str> {
    let is_selector = match &d.descriptor {
        Descriptor::Name(n) => n.0 == SELECTOR_NAME,
        Descriptor::Code(c) => *c == SELECTOR_CODE,
    };
    match (&d.value, is_selector) {
        (Value::String(s), true) => Some(s),
        _ => None,
    }
}

/// Parses one selector expression.
pub fn parse(expression: &str) -> Result<ReadPosition, String> {
    let bad = |why: &str| format!("selector {expression:?}: {why}");
    let rest = expression
        .trim()
        .strip_prefix("amqp.annotation.x-opt-")
        .ok_or_else(|| {
            bad("expected amqp.annotation.x-opt-offset, -sequence-number or -enqueued-time")
        })?;
    let (name, rest) = rest
        .split_once(char::is_whitespace)
        .ok_or_else(|| bad("expected an operator"))?;
    let rest = rest.trim_start();
    let (inclusive, rest) = if let Some(r) = rest.strip_prefix(">=") {
        (true, r)
    } else if let Some(r) = rest.strip_prefix('>') {
        (false, r)
    } else {
        return Err(bad("the operator must be > or >="));
    };
    let value = rest
        .trim()
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .ok_or_else(|| bad("the value must be quoted"))?;
    let number = |v: &str| {
        v.parse::<i64>()
            .map_err(|_| bad("the value is not a number"))
    };
    // `> v` on whole numbers is `>= v + 1`; below zero means from the start.
    let from = |v: i64| -> u64 {
        let first = if inclusive { v } else { v.saturating_add(1) };
        first.max(0) as u64
    };
    match name {
        "offset" => match value {
            "@latest" => Ok(ReadPosition::End),
            "-1" => Ok(ReadPosition::Start),
            v => Ok(ReadPosition::Offset(from(number(v)?))),
        },
        "sequence-number" => Ok(ReadPosition::Sequence(from(number(value)?))),
        "enqueued-time" => Ok(ReadPosition::EnqueuedTime(UnixMillis(
            from(number(value)?) as i64
        ))),
        other => Err(bad(&format!("x-opt-{other} cannot be filtered on"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp::types::primitives::Symbol;

    #[test]
    fn the_sdks_selectors() {
        let p = |s: &str| parse(s).unwrap();
        assert_eq!(
            p("amqp.annotation.x-opt-offset > '-1'"),
            ReadPosition::Start
        );
        assert_eq!(
            p("amqp.annotation.x-opt-offset > '@latest'"),
            ReadPosition::End
        );
        assert_eq!(
            p("amqp.annotation.x-opt-offset > '120'"),
            ReadPosition::Offset(121)
        );
        assert_eq!(
            p("amqp.annotation.x-opt-offset >= '120'"),
            ReadPosition::Offset(120)
        );
        assert_eq!(
            p("amqp.annotation.x-opt-sequence-number > '5'"),
            ReadPosition::Sequence(6)
        );
        assert_eq!(
            p("amqp.annotation.x-opt-sequence-number >= '5'"),
            ReadPosition::Sequence(5)
        );
        assert_eq!(
            p("amqp.annotation.x-opt-sequence-number > '-1'"),
            ReadPosition::Sequence(0)
        );
        assert_eq!(
            p("amqp.annotation.x-opt-enqueued-time > '1700000000000'"),
            ReadPosition::EnqueuedTime(UnixMillis(1_700_000_000_001))
        );
        assert_eq!(
            p("  amqp.annotation.x-opt-enqueued-time   >=  '1700000000000' "),
            ReadPosition::EnqueuedTime(UnixMillis(1_700_000_000_000))
        );
    }

    #[test]
    fn bad_selectors_say_why() {
        for s in [
            "amqp.annotation.x-opt-offset = '1'",
            "amqp.annotation.x-opt-offset > 1",
            "amqp.annotation.x-opt-offset > 'x'",
            "amqp.annotation.x-opt-partition-key > 'a'",
            "x-opt-offset > '1'",
            "amqp.annotation.x-opt-offset",
        ] {
            assert!(parse(s).unwrap_err().contains("selector"), "{s}");
        }
    }

    #[test]
    fn the_filter_is_found_by_name_or_code_and_absent_means_start() {
        let mut set = FilterSet::new();
        assert_eq!(start_position(Some(&set)), Ok(ReadPosition::Start));
        assert_eq!(start_position(None), Ok(ReadPosition::Start));
        set.insert(
            Symbol::from("selector"),
            Value::Described(Box::new(Described {
                descriptor: Descriptor::Code(SELECTOR_CODE),
                value: Value::String("amqp.annotation.x-opt-sequence-number >= '7'".into()),
            })),
        );
        assert_eq!(start_position(Some(&set)), Ok(ReadPosition::Sequence(7)));
        set.clear();
        set.insert(
            Symbol::from(SELECTOR_NAME),
            Value::Described(Box::new(Described {
                descriptor: Descriptor::Name(Symbol::from(SELECTOR_NAME)),
                value: Value::String("amqp.annotation.x-opt-offset > '@latest'".into()),
            })),
        );
        assert_eq!(start_position(Some(&set)), Ok(ReadPosition::End));
    }
}
