//! What one AMQP connection is authorised for: the claim of its last accepted token (CBS
//! put-token, or SASL PLAIN), replaced by each renewal.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::auth::Permission;
use crate::hub::ServiceClaim;

/// Shared by the connection's SASL exchange, its `$cbs` node and its links.
#[derive(Clone, Default)]
pub struct Claims(Arc<Mutex<Option<ServiceClaim>>>);

impl Claims {
    /// Replaces the connection's claim (a renewed token replaces the old one).
    pub fn set(&self, claim: ServiceClaim) {
        *self.0.lock() = Some(claim);
    }

    /// Whether the connection may use a node needing `permission` at `now_secs`; the refusal
    /// says why, for the `amqp:unauthorized-access` description.
    pub fn check(&self, permission: Permission, now_secs: u64) -> Result<(), String> {
        let guard = self.0.lock();
        let Some(claim) = guard.as_ref() else {
            return Err("no token was put on $cbs for this connection".into());
        };
        if claim.expires_secs <= now_secs {
            return Err(format!(
                "the token expired at {} (seconds since the epoch)",
                claim.expires_secs
            ));
        }
        claim
            .principal
            .require_hub(permission)
            .map_err(|e| e.to_string())
    }
}
