//! The one async seam to the synchronous engine.
//!
//! Engine calls block while their write is synced (group commit), so they run on tokio's
//! blocking pool, never on a runtime worker. Many waiting callers is exactly what lets the
//! committer fold their writes into one sync.

use std::sync::Arc;

use ferrohub_engine::d2c::{Appended, D2cError, NewEvent};
use ferrohub_engine::{StorageError, Store, UnixMillis};
use tokio::sync::oneshot;

use super::D2cNotify;

#[derive(Clone)]
pub struct StoreHandle {
    store: Arc<Store>,
}

impl StoreHandle {
    pub fn new(store: Arc<Store>) -> Self {
        StoreHandle { store }
    }

    /// Runs `f` against the store on the blocking pool.
    ///
    /// # Errors
    /// The closure's own error; a panic inside it becomes [`StorageError::Backend`] (via `E`).
    pub async fn run<T, E>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StorageError> + Send + 'static,
    {
        let store = Arc::clone(&self.store);
        match tokio::task::spawn_blocking(move || f(&store)).await {
            Ok(r) => r,
            Err(e) => Err(E::from(StorageError::Backend(format!(
                "engine task failed: {e}"
            )))),
        }
    }

    /// Queues telemetry in order now and resolves when it is durable (then wakes readers).
    /// Call it from the connection's own task, in the order messages arrived: the order of
    /// calls is the order in the partition.
    pub fn append_in_order(
        &self,
        events: Vec<NewEvent>,
        now: UnixMillis,
        notify: Arc<D2cNotify>,
    ) -> impl std::future::Future<Output = Result<Vec<Appended>, D2cError>> {
        let (tx, rx) = oneshot::channel();
        let queued = self.store.append_events_then(events, now, move |result| {
            if let Ok(appended) = &result {
                for a in appended {
                    notify.appended(a.partition, a.sequence_number);
                }
            }
            let _ = tx.send(result);
        });
        async move {
            queued?;
            match rx.await {
                Ok(r) => Ok(r?),
                Err(_) => Err(D2cError::Storage(StorageError::Closed)),
            }
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
}
