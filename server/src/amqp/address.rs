//! Which node of the hub a link attaches to, from the address the client names.

use fe2o3_amqp::types::definitions::Role;
use fe2o3_amqp::types::messaging::TargetArchetype;
use fe2o3_amqp::types::performatives::Attach;

/// A partition of an Event Hubs entity as a receiver names it; `entity` is the hub's name
/// (or IoT Hub's `messages/events`) for the built-in endpoint, or a custom endpoint's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionAddress {
    pub entity: String,
    pub group: String,
    pub partition: String,
}

impl PartitionAddress {
    /// `{entity}/ConsumerGroups/{group}/Partitions/{partition}`, the literal segments in any
    /// case.
    fn parse(path: &str) -> Option<PartitionAddress> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let at = segments
            .iter()
            .position(|s| s.eq_ignore_ascii_case("consumergroups"))?;
        match &segments[at..] {
            [_, group, partitions, partition]
                if at > 0 && partitions.eq_ignore_ascii_case("partitions") =>
            {
                Some(PartitionAddress {
                    entity: segments[..at].join("/"),
                    group: (*group).to_string(),
                    partition: (*partition).to_string(),
                })
            }
            _ => None,
        }
    }
}

/// Which of a device's links an address names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceLink {
    /// `messages/events`: telemetry.
    Telemetry,
    /// `messages/devicebound`: C2D deliveries.
    CloudToDevice,
    /// `twin`: twin requests and replies, desired-property pushes.
    Twin,
    /// `methods/devicebound`: direct method calls and answers.
    Methods,
    /// `inputs` (modules): messages routed to the module.
    Inputs,
}

impl DeviceLink {
    /// `/devices/{d}[/modules/{m}]/{rest}` with the literal segments in any case.
    fn parse(path: &str) -> Option<(crate::ids::Identity, DeviceLink)> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let is = |s: &str, lit: &str| s.eq_ignore_ascii_case(lit);
        let (device, module, rest): (&str, Option<&str>, &[&str]) = match segments.as_slice() {
            [devices, d, modules, m, rest @ ..]
                if is(devices, "devices") && is(modules, "modules") && !rest.is_empty() =>
            {
                (d, Some(*m), rest)
            }
            [devices, d, rest @ ..] if is(devices, "devices") => (d, None, rest),
            _ => return None,
        };
        let link = match rest {
            [a, b] if is(a, "messages") && is(b, "events") => DeviceLink::Telemetry,
            [a, b] if is(a, "messages") && is(b, "devicebound") => DeviceLink::CloudToDevice,
            [a] if is(a, "twin") => DeviceLink::Twin,
            [a, b] if is(a, "methods") && is(b, "devicebound") => DeviceLink::Methods,
            [a] if is(a, "inputs") && module.is_some() => DeviceLink::Inputs,
            _ => return None,
        };
        let who = match module {
            Some(m) => crate::ids::Identity::for_module(device, m),
            None => crate::ids::Identity::for_device(device),
        };
        Some((who, link))
    }
}

/// A node of the service endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// `$cbs`: claims-based security.
    Cbs,
    /// `/messages/devicebound`: C2D sends.
    DeviceBound,
    /// `/messages/serviceBound/feedback`: C2D delivery feedback.
    Feedback,
    /// `/messages/serviceBound/filenotifications`: file upload notifications.
    FileNotifications,
    /// `$management`: Event Hubs' entity and partition properties.
    Management,
    /// `{entity}/ConsumerGroups/{group}/Partitions/{partition}`: an Event Hubs receiver.
    Partition(PartitionAddress),
    /// `/devices/{d}[/modules/{m}]/...`: a device's or module's own link (AMQ-6).
    Device {
        who: crate::ids::Identity,
        link: DeviceLink,
    },
    /// `messages/events/{rest}` other than a partition: IoT Hub's name for the built-in
    /// endpoint, answered with a redirect to its Event Hubs-compatible address (AMQ-8).
    EventsRedirect(String),
    /// `{idScope}/registrations/{registrationId}`: the provisioning service's device links.
    Registration {
        id_scope: String,
        registration_id: String,
    },
    /// Anything else, as named.
    Unknown(String),
}

impl Node {
    /// The node an attach names: the target of a client's sender, the source of its receiver.
    /// Addresses may be absolute (`amqps://{host}/messages/devicebound`) or a path; the path
    /// decides, case-insensitively, as IoT Hub does.
    pub fn of(attach: &Attach) -> Node {
        let address = match attach.role {
            Role::Sender => attach.target.as_deref().and_then(|t| match t {
                TargetArchetype::Target(t) => t.address.clone(),
                #[allow(unreachable_patterns)]
                _ => None,
            }),
            Role::Receiver => attach.source.as_deref().and_then(|s| s.address.clone()),
        };
        let Some(address) = address else {
            return Node::Unknown(String::new());
        };
        let path = match address.split_once("://") {
            Some((_, rest)) => rest.find('/').map_or("", |i| &rest[i..]),
            None => address.as_str(),
        };
        let path = path.trim_end_matches('/');
        if let Some(partition) = PartitionAddress::parse(path) {
            return Node::Partition(partition);
        }
        if let Some((who, link)) = DeviceLink::parse(path) {
            return Node::Device { who, link };
        }
        let trimmed = path.trim_start_matches('/');
        // `get`, not indexing: the address is the peer's text, and byte 16 may fall inside a
        // multi-byte character (a fuzz finding: slicing there panicked the connection task).
        if let Some(rest) = strip_prefix_ignore_ascii_case(trimmed, EVENTS_REDIRECT_PREFIX) {
            if !rest.is_empty() {
                return Node::EventsRedirect(rest.to_string());
            }
        }
        if let [scope, literal, rid] = path
            .trim_start_matches('/')
            .split('/')
            .collect::<Vec<_>>()
            .as_slice()
        {
            if literal.eq_ignore_ascii_case("registrations") && !scope.is_empty() && !rid.is_empty()
            {
                return Node::Registration {
                    id_scope: (*scope).to_string(),
                    registration_id: (*rid).to_string(),
                };
            }
        }
        let path = path.to_ascii_lowercase();
        match path.as_str() {
            "$management" | "/$management" => Node::Management,
            "$cbs" | "/$cbs" => Node::Cbs,
            "/messages/devicebound" | "messages/devicebound" => Node::DeviceBound,
            "/messages/servicebound/feedback" | "messages/servicebound/feedback" => Node::Feedback,
            "/messages/servicebound/filenotifications"
            | "messages/servicebound/filenotifications" => Node::FileNotifications,
            _ => Node::Unknown(address),
        }
    }
}

/// The address prefix of a back-end's receiver redirected to the built-in endpoint.
const EVENTS_REDIRECT_PREFIX: &str = "messages/events/";

/// `text` without `prefix` when it starts with it in any ASCII case; `None` otherwise, also when
/// the prefix's length falls inside a multi-byte character of `text`.
fn strip_prefix_ignore_ascii_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    let head = text.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &text[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multibyte_character_at_the_redirect_prefix_length_is_no_redirect() {
        // "messages/events" then a two-byte character straddling byte 16.
        let address = "messages/eventsé/x";
        assert_eq!(
            strip_prefix_ignore_ascii_case(address, EVENTS_REDIRECT_PREFIX),
            None
        );
        assert_eq!(
            strip_prefix_ignore_ascii_case("/x/MESSAGES/Events/$management", "/x/messages/events/"),
            Some("$management")
        );
        assert_eq!(
            strip_prefix_ignore_ascii_case("messages/ev", EVENTS_REDIRECT_PREFIX),
            None
        );
    }

    #[test]
    fn device_addresses_in_any_case() {
        let dev = crate::ids::Identity::for_device("d1");
        let module = crate::ids::Identity::for_module("d1", "m1");
        assert_eq!(
            DeviceLink::parse("/devices/d1/messages/events"),
            Some((dev.clone(), DeviceLink::Telemetry))
        );
        assert_eq!(
            DeviceLink::parse("/devices/d1/messages/deviceBound"),
            Some((dev.clone(), DeviceLink::CloudToDevice))
        );
        assert_eq!(
            DeviceLink::parse("devices/d1/modules/m1/twin"),
            Some((module.clone(), DeviceLink::Twin))
        );
        assert_eq!(
            DeviceLink::parse("/devices/d1/modules/m1/methods/devicebound"),
            Some((module.clone(), DeviceLink::Methods))
        );
        assert_eq!(
            DeviceLink::parse("/devices/d1/modules/m1/inputs"),
            Some((module, DeviceLink::Inputs))
        );
        assert_eq!(DeviceLink::parse("/devices/d1/inputs"), None);
        assert_eq!(DeviceLink::parse("/devices/d1/messages"), None);
        assert_eq!(DeviceLink::parse("/messages/devicebound"), None);
    }

    #[test]
    fn partition_addresses_absolute_or_relative() {
        let want = |entity: &str, group: &str, partition: &str| {
            Some(PartitionAddress {
                entity: entity.into(),
                group: group.into(),
                partition: partition.into(),
            })
        };
        assert_eq!(
            PartitionAddress::parse("/ferrohub/ConsumerGroups/$Default/Partitions/3"),
            want("ferrohub", "$Default", "3")
        );
        assert_eq!(
            PartitionAddress::parse("ferrohub/consumergroups/g1/partitions/0"),
            want("ferrohub", "g1", "0")
        );
        assert_eq!(
            PartitionAddress::parse("/messages/events/ConsumerGroups/$Default/Partitions/1"),
            want("messages/events", "$Default", "1")
        );
        assert_eq!(
            PartitionAddress::parse("/ConsumerGroups/g/Partitions/1"),
            None
        );
        assert_eq!(
            PartitionAddress::parse("/hub/ConsumerGroups/g/Partitions"),
            None
        );
        assert_eq!(
            PartitionAddress::parse("/hub/ConsumerGroups/g/Partitions/1/x"),
            None
        );
    }
}
