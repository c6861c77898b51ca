//! Changing the hub's shared access policies while it serves: add one, change its rights,
//! regenerate a key, remove one (what IoT Hub's portal does under "Shared access policies").
//!
//! # Invariants
//! - Every change reads the stored settings and writes them back whole under the hub lock, so
//!   two changes never lose one another, and the result passes [`HubSettings`]'s own checks
//!   (1 to [`crate::hub::MAX_POLICIES`] policies, distinct names).
//! - At least one policy holds all four rights after any change, so the hub can always be
//!   managed; a change that would leave none is refused and writes nothing.
//! - A new policy gets fresh 256-bit keys; changing rights keeps the keys.

use serde::{Deserialize, Serialize};

use crate::error::{HubError, ValidationError};
use crate::hub::{HubSettings, Permissions, SharedAccessPolicy};
use crate::model::generate_key;
use crate::Store;

/// Which key a regeneration replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyKey {
    Primary,
    Secondary,
}

/// One change to the policies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyChange {
    /// Adds the policy with new keys, or gives an existing one these rights (keys kept).
    Put {
        name: String,
        permissions: Permissions,
    },
    /// A new random value for one key of the policy.
    RegenerateKey {
        name: String,
        key: PolicyKey,
    },
    Remove {
        name: String,
    },
}

impl PolicyChange {
    fn name(&self) -> &str {
        match self {
            PolicyChange::Put { name, .. }
            | PolicyChange::RegenerateKey { name, .. }
            | PolicyChange::Remove { name } => name,
        }
    }
}

fn holds_every_right(p: &Permissions) -> bool {
    p.registry_read && p.registry_write && p.service_connect && p.device_connect
}

/// A policy name IoT Hub accepts: 1 to 64 letters, digits, '-', '.' or '_'.
fn check_name(name: &str) -> Result<(), ValidationError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "keyName",
            "must be 1 to 64 letters, digits, '-', '.' or '_'",
        ))
    }
}

/// `settings` with `change` made, checked; the settings are untouched on an error.
pub fn apply(settings: &HubSettings, change: &PolicyChange) -> Result<HubSettings, HubError> {
    let mut next = settings.clone();
    let name = change.name();
    let index = next.policies.iter().position(|p| p.name == name);
    let missing = || HubError::PolicyNotFound(name.to_string());
    match change {
        PolicyChange::Put { permissions, .. } => {
            check_name(name)?;
            if *permissions == Permissions::default() {
                return Err(
                    ValidationError::new("rights", "a policy needs at least one right").into(),
                );
            }
            match index {
                Some(i) => next.policies[i].permissions = *permissions,
                None => next
                    .policies
                    .push(SharedAccessPolicy::generate(name, *permissions)),
            }
        }
        PolicyChange::RegenerateKey { key, .. } => {
            let policy = &mut next.policies[index.ok_or_else(missing)?];
            match key {
                PolicyKey::Primary => policy.primary_key = generate_key(),
                PolicyKey::Secondary => policy.secondary_key = generate_key(),
            }
        }
        PolicyChange::Remove { .. } => {
            next.policies.remove(index.ok_or_else(missing)?);
        }
    }
    if !next
        .policies
        .iter()
        .any(|p| holds_every_right(&p.permissions))
    {
        return Err(ValidationError::new(
            "rights",
            "at least one policy must keep all four rights (registry read and write, service connect, device connect)",
        )
        .into());
    }
    next.validate()?;
    Ok(next)
}

impl Store {
    /// Makes one change to the shared access policies; the settings now in force.
    ///
    /// # Errors
    /// [`HubError::PolicyNotFound`], [`HubError::Invalid`] (a bad name, no right, too many
    /// policies, none left with every right), [`HubError::NotInitialised`], or storage errors.
    pub fn change_policy(&self, change: &PolicyChange) -> Result<HubSettings, HubError> {
        let _guard = self.hub_lock.lock();
        let current = self.hub_settings()?.ok_or(HubError::NotInitialised)?;
        let next = apply(&current, change)?;
        self.write_hub_settings(&next)?;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UnixMillis;

    fn hub() -> HubSettings {
        HubSettings {
            hub_name: "h".into(),
            host_name: "localhost".into(),
            other_host_names: Vec::new(),
            policies: HubSettings::default_policies(),
            created: UnixMillis(0),
            provisioning: None,
        }
    }

    const READ: Permissions = Permissions {
        registry_read: true,
        registry_write: false,
        service_connect: false,
        device_connect: false,
    };

    #[test]
    fn a_new_policy_gets_fresh_keys_and_a_changed_one_keeps_its_own() {
        let put = |name: &str, permissions| PolicyChange::Put {
            name: name.into(),
            permissions,
        };
        let added = apply(&hub(), &put("ops", READ)).expect("added");
        let ops = added.policy("ops").expect("there").clone();
        assert_eq!(ops.permissions, READ);
        assert_ne!(ops.primary_key, ops.secondary_key);
        let all = added.policy("iothubowner").expect("owner").permissions;
        let changed = apply(&added, &put("ops", all)).expect("changed");
        let after = changed.policy("ops").expect("there");
        assert_eq!(after.permissions, all);
        assert_eq!(after.primary_key, ops.primary_key);
    }

    #[test]
    fn regenerating_replaces_only_the_named_key() {
        let before = hub();
        let old = before.policy("service").expect("service").clone();
        let after = apply(
            &before,
            &PolicyChange::RegenerateKey {
                name: "service".into(),
                key: PolicyKey::Secondary,
            },
        )
        .expect("regenerated");
        let new = after.policy("service").expect("service");
        assert_eq!(new.primary_key, old.primary_key);
        assert_ne!(new.secondary_key, old.secondary_key);
    }

    #[test]
    fn refusals_change_nothing() {
        let settings = hub();
        let remove = |name: &str| PolicyChange::Remove { name: name.into() };
        assert!(matches!(
            apply(&settings, &remove("nope")),
            Err(HubError::PolicyNotFound(_))
        ));
        // iothubowner is the only policy with every right.
        assert!(matches!(
            apply(&settings, &remove("iothubowner")),
            Err(HubError::Invalid(_))
        ));
        let bad_name = PolicyChange::Put {
            name: "a b".into(),
            permissions: READ,
        };
        assert!(matches!(
            apply(&settings, &bad_name),
            Err(HubError::Invalid(_))
        ));
        let no_right = PolicyChange::Put {
            name: "none".into(),
            permissions: Permissions::default(),
        };
        assert!(matches!(
            apply(&settings, &no_right),
            Err(HubError::Invalid(_))
        ));
        let mut full = settings.clone();
        while full.policies.len() < crate::hub::MAX_POLICIES {
            let n = full.policies.len();
            full = apply(
                &full,
                &PolicyChange::Put {
                    name: format!("p{n}"),
                    permissions: READ,
                },
            )
            .expect("room");
        }
        let one_more = PolicyChange::Put {
            name: "extra".into(),
            permissions: READ,
        };
        assert!(matches!(apply(&full, &one_more), Err(HubError::Invalid(_))));
        assert_eq!(
            apply(&settings, &remove("service"))
                .expect("removed")
                .policies
                .len(),
            4
        );
    }
}
