//! The IoT Hub MQTT topic grammar, parsed once into typed values (seed 001, `compat` §A4).
//!
//! Device and module ids cannot contain `/` (REG-1), so splitting on `/` is exact.

pub use crate::ids::Identity;
use crate::ids::LockToken;

/// The topic prefix of an identity's own topics.
fn prefix(who: &Identity) -> String {
    match &who.module_id {
        Some(m) => format!("devices/{}/modules/{m}/", who.device_id),
        None => format!("devices/{}/", who.device_id),
    }
}

/// A PUBLISH from a device, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound<'a> {
    /// Telemetry; the raw property bag (may be empty).
    Telemetry {
        bag: &'a str,
    },
    TwinGet {
        rid: String,
    },
    TwinReportedPatch {
        rid: String,
    },
    MethodResponse {
        status: i32,
        rid: String,
    },
    /// C2D-7 (beyond IoT Hub): `devices/{id}/messages/devicebound/{lockToken}/{action}`.
    C2dSettle {
        lock_token: LockToken,
        action: ferrohub_engine::c2d::Settle,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("topic {0:?} names another identity")]
    OtherIdentity(String),
    #[error("topic {0:?} is not one a device may publish to")]
    Unknown(String),
}

/// `k=v` query items after the `?` of a `$iothub` topic.
fn query_param(topic: &str, name: &str) -> Option<String> {
    let (_, query) = topic.split_once('?')?;
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Classifies a PUBLISH topic for `me`.
pub fn parse_publish<'a>(topic: &'a str, me: &Identity) -> Result<Inbound<'a>, TopicError> {
    if let Some(rest) = topic.strip_prefix("$iothub/") {
        let rid = || query_param(topic, "$rid").filter(|r| !r.is_empty());
        if rest.starts_with("twin/GET/") {
            return rid()
                .map(|rid| Inbound::TwinGet { rid })
                .ok_or_else(|| TopicError::Unknown(topic.into()));
        }
        if rest.starts_with("twin/PATCH/properties/reported/") {
            return rid()
                .map(|rid| Inbound::TwinReportedPatch { rid })
                .ok_or_else(|| TopicError::Unknown(topic.into()));
        }
        if let Some(res) = rest.strip_prefix("methods/res/") {
            let status = res.split('/').next().and_then(|s| s.parse().ok());
            return match (status, rid()) {
                (Some(status), Some(rid)) => Ok(Inbound::MethodResponse { status, rid }),
                _ => Err(TopicError::Unknown(topic.into())),
            };
        }
        return Err(TopicError::Unknown(topic.into()));
    }
    if !topic.starts_with("devices/") {
        return Err(TopicError::Unknown(topic.into()));
    }
    let prefix = prefix(me);
    let Some(rest) = topic.strip_prefix(prefix.as_str()) else {
        return Err(if topic.contains("/messages/events") {
            TopicError::OtherIdentity(topic.into())
        } else {
            TopicError::Unknown(topic.into())
        });
    };
    if let Some(bag) = rest.strip_prefix("messages/events/") {
        return Ok(Inbound::Telemetry { bag });
    }
    if rest == "messages/events" {
        return Ok(Inbound::Telemetry { bag: "" });
    }
    if me.module_id.is_none() {
        if let Some(settle) = rest.strip_prefix("messages/devicebound/") {
            use ferrohub_engine::c2d::Settle;
            let parsed = settle.split_once('/').and_then(|(token, action)| {
                let action = match action.trim_end_matches('/') {
                    "complete" => Settle::Complete,
                    "reject" => Settle::Reject,
                    "abandon" => Settle::Abandon,
                    _ => return None,
                };
                (!token.is_empty()).then(|| Inbound::C2dSettle {
                    lock_token: LockToken::new(token),
                    action,
                })
            });
            return parsed.ok_or_else(|| TopicError::Unknown(topic.into()));
        }
    }
    Err(TopicError::Unknown(topic.into()))
}

/// What a subscription filter asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    CloudToDevice,
    ModuleInputs,
    TwinResponses,
    DesiredPatches,
    Methods,
}

/// Classifies a SUBSCRIBE filter; `None` for filters IoT Hub does not offer (SUBACK 0x80).
pub fn parse_filter(filter: &str, me: &Identity) -> Option<Feature> {
    match filter {
        "$iothub/twin/res/#" => return Some(Feature::TwinResponses),
        "$iothub/twin/PATCH/properties/desired/#" => return Some(Feature::DesiredPatches),
        "$iothub/methods/POST/#" => return Some(Feature::Methods),
        _ => {}
    }
    match &me.module_id {
        None => (filter == format!("devices/{}/messages/devicebound/#", me.device_id))
            .then_some(Feature::CloudToDevice),
        Some(m) => (filter == format!("devices/{}/modules/{m}/inputs/#", me.device_id))
            .then_some(Feature::ModuleInputs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> Identity {
        Identity::for_device("dev1")
    }

    fn module() -> Identity {
        Identity::for_module("dev1", "m1")
    }

    #[test]
    fn telemetry() {
        assert_eq!(
            parse_publish("devices/dev1/messages/events/", &dev()),
            Ok(Inbound::Telemetry { bag: "" })
        );
        assert_eq!(
            parse_publish("devices/dev1/messages/events", &dev()),
            Ok(Inbound::Telemetry { bag: "" })
        );
        assert_eq!(
            parse_publish("devices/dev1/messages/events/a=1&b", &dev()),
            Ok(Inbound::Telemetry { bag: "a=1&b" })
        );
        assert_eq!(
            parse_publish("devices/dev1/modules/m1/messages/events/x=1", &module()),
            Ok(Inbound::Telemetry { bag: "x=1" })
        );
        assert!(matches!(
            parse_publish("devices/dev2/messages/events/", &dev()),
            Err(TopicError::OtherIdentity(_))
        ));
        assert!(matches!(
            parse_publish("devices/dev1/messages/events/", &module()),
            Err(TopicError::OtherIdentity(_))
        ));
        assert!(matches!(
            parse_publish("devices/dev1/messages/devicebound/", &dev()),
            Err(TopicError::Unknown(_))
        ));
        assert_eq!(
            parse_publish("devices/dev1/messages/devicebound/0000-1/reject", &dev()),
            Ok(Inbound::C2dSettle {
                lock_token: LockToken::new("0000-1"),
                action: ferrohub_engine::c2d::Settle::Reject
            })
        );
        assert!(parse_publish("devices/dev1/messages/devicebound/t/explode", &dev()).is_err());
        assert!(parse_publish(
            "devices/dev1/modules/m1/messages/devicebound/t/complete",
            &module()
        )
        .is_err());
        assert!(matches!(
            parse_publish("random/topic", &dev()),
            Err(TopicError::Unknown(_))
        ));
    }

    #[test]
    fn iothub_topics() {
        assert_eq!(
            parse_publish("$iothub/twin/GET/?$rid=abc", &dev()),
            Ok(Inbound::TwinGet { rid: "abc".into() })
        );
        assert_eq!(
            parse_publish(
                "$iothub/twin/PATCH/properties/reported/?$rid=7&$version=3",
                &dev()
            ),
            Ok(Inbound::TwinReportedPatch { rid: "7".into() })
        );
        assert_eq!(
            parse_publish("$iothub/methods/res/200/?$rid=abc%2F1", &dev()),
            Ok(Inbound::MethodResponse {
                status: 200,
                rid: "abc/1".into()
            })
        );
        assert!(parse_publish("$iothub/twin/GET/", &dev()).is_err());
        assert!(parse_publish("$iothub/methods/res/x/?$rid=1", &dev()).is_err());
    }

    #[test]
    fn filters() {
        assert_eq!(
            parse_filter("devices/dev1/messages/devicebound/#", &dev()),
            Some(Feature::CloudToDevice)
        );
        assert_eq!(
            parse_filter("devices/dev2/messages/devicebound/#", &dev()),
            None
        );
        assert_eq!(
            parse_filter("devices/dev1/modules/m1/inputs/#", &module()),
            Some(Feature::ModuleInputs)
        );
        assert_eq!(
            parse_filter("$iothub/twin/res/#", &dev()),
            Some(Feature::TwinResponses)
        );
        assert_eq!(
            parse_filter("$iothub/methods/POST/#", &module()),
            Some(Feature::Methods)
        );
        assert_eq!(parse_filter("#", &dev()), None);
        assert_eq!(
            parse_filter("devices/+/messages/devicebound/#", &dev()),
            None
        );
    }
}
