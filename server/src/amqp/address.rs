//! Which node of the hub a link attaches to, from the address the client names.

use fe2o3_amqp::types::definitions::Role;
use fe2o3_amqp::types::messaging::TargetArchetype;
use fe2o3_amqp::types::performatives::Attach;

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
        let path = path.trim_end_matches('/').to_ascii_lowercase();
        match path.as_str() {
            "$cbs" | "/$cbs" => Node::Cbs,
            "/messages/devicebound" | "messages/devicebound" => Node::DeviceBound,
            "/messages/servicebound/feedback" | "messages/servicebound/feedback" => Node::Feedback,
            "/messages/servicebound/filenotifications"
            | "messages/servicebound/filenotifications" => Node::FileNotifications,
            _ => Node::Unknown(address),
        }
    }
}
