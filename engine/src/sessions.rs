//! Persistent MQTT sessions (MQT-9): the subscriptions of a client id that connected with
//! CleanSession=0, kept across connections and restarts. The official device SDK subscribes
//! once and never again after a reconnect or token renewal, so forgetting these would silently
//! stop C2D, twin and method delivery.
//!
//! Invariant: a SUBSCRIBE is acknowledged only after the session record holding it is durable.

use serde::{Deserialize, Serialize};

use ferrohub_migrations::cf;

use crate::error::StorageError;
use crate::raw::Batch;
use crate::Store;

/// One subscription: topic filter and granted QoS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscription {
    pub filter: String,
    pub qos: u8,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub subscriptions: Vec<Subscription>,
}

impl SessionRecord {
    /// Adds or replaces subscriptions (same filter: the new QoS wins).
    pub fn subscribe(&mut self, subs: impl IntoIterator<Item = Subscription>) {
        for s in subs {
            match self.subscriptions.iter_mut().find(|x| x.filter == s.filter) {
                Some(existing) => existing.qos = s.qos,
                None => self.subscriptions.push(s),
            }
        }
    }

    pub fn unsubscribe<'a>(&mut self, filters: impl IntoIterator<Item = &'a str>) {
        for f in filters {
            self.subscriptions.retain(|s| s.filter != f);
        }
    }
}

impl Store {
    /// The stored session of a client id, if any.
    ///
    /// # Errors
    /// Storage errors.
    pub fn load_session(&self, client_id: &str) -> Result<Option<SessionRecord>, StorageError> {
        self.raw.get_record(cf::SESSIONS, client_id.as_bytes())
    }

    /// Stores (replaces) a session durably.
    ///
    /// # Errors
    /// Storage errors.
    pub fn save_session(
        &self,
        client_id: &str,
        session: &SessionRecord,
    ) -> Result<(), StorageError> {
        let mut batch = Batch::default();
        batch.put_record(cf::SESSIONS, client_id.as_bytes().to_vec(), session);
        self.raw.commit(batch)
    }

    /// Forgets a session (CleanSession=1, or its identity was deleted).
    ///
    /// # Errors
    /// Storage errors.
    pub fn delete_session(&self, client_id: &str) -> Result<(), StorageError> {
        // Most clean-session connects have no stored session: no write, so no sync to wait for.
        // (A record that does not read back, e.g. corrupt, is deleted like any other.)
        if let Ok(None) = self.load_session(client_id) {
            return Ok(());
        }
        let mut batch = Batch::default();
        batch.delete(cf::SESSIONS, client_id.as_bytes().to_vec());
        self.raw.commit(batch)
    }
}
