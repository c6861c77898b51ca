//! Identifiers that cross module boundaries, as types: a device id cannot be passed where a
//! module id or a client id is meant.
//!
//! Each derefs to `&str`, so the engine's `&str` API takes them as they are; the wire formats
//! (`deviceId/moduleId` client ids) are built in exactly one place, here.

use std::fmt;
use std::ops::Deref;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                $name(id.into())
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        // Hash and Eq agree with `str`'s, so a map keyed by the id can be probed with a `&str`.
        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

string_id!(
    /// A registered device's id.
    DeviceId
);
string_id!(
    /// A module's id, unique within its device.
    ModuleId
);
string_id!(
    /// A connection's client id: `deviceId` or `deviceId/moduleId`; one live connection each.
    ClientId
);
string_id!(
    /// A C2D lock token (GUID-shaped): names one lock of one message.
    LockToken
);

/// A device or one of its modules: who a connection or a device token acts for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub device_id: DeviceId,
    pub module_id: Option<ModuleId>,
}

impl Identity {
    pub fn new(device_id: impl Into<String>, module_id: Option<impl Into<String>>) -> Identity {
        Identity {
            device_id: DeviceId::new(device_id),
            module_id: module_id.map(ModuleId::new),
        }
    }

    pub fn for_device(device_id: impl Into<String>) -> Identity {
        Identity {
            device_id: DeviceId::new(device_id),
            module_id: None,
        }
    }

    pub fn for_module(device_id: impl Into<String>, module_id: impl Into<String>) -> Identity {
        Identity {
            device_id: DeviceId::new(device_id),
            module_id: Some(ModuleId::new(module_id)),
        }
    }

    /// `deviceId` or `deviceId/moduleId`, as in the MQTT CONNECT client id.
    pub fn client_id(&self) -> ClientId {
        ClientId(match &self.module_id {
            Some(m) => format!("{}/{m}", self.device_id),
            None => self.device_id.0.clone(),
        })
    }

    /// The identity a client id names (the inverse of [`Identity::client_id`]).
    pub fn of_client(client_id: &ClientId) -> Identity {
        match client_id.split_once('/') {
            Some((d, m)) => Identity::for_module(d, m),
            None => Identity::for_device(client_id.as_str()),
        }
    }

    /// Whether this is a module rather than its device.
    pub fn is_module(&self) -> bool {
        self.module_id.is_some()
    }

    /// The module id as `&str`, for engine calls that take `Option<&str>`.
    pub fn module(&self) -> Option<&str> {
        self.module_id.as_deref()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.module_id {
            Some(m) => write!(f, "{}/{m}", self.device_id),
            None => f.write_str(&self.device_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids() {
        assert_eq!(Identity::for_device("d1").client_id(), "d1");
        let m = Identity::for_module("d1", "m1");
        assert_eq!(m.client_id(), "d1/m1");
        assert_eq!(m.to_string(), "d1/m1");
        assert_eq!(m.module(), Some("m1"));
        assert_eq!(&*m.device_id, "d1");
    }
}
