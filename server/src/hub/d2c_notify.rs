//! Wakes long-polling readers of a D2C partition when new events become durable.
//!
//! Each partition has a watch channel holding its next sequence number; writers publish after
//! their append is durable, readers wait for a change with a timeout.
//!
//! # Invariants
//! - A reader subscribes before it reads the store. So a writer that finds no reader
//!   subscribed after its append became durable may skip the notification (its waker calls
//!   cost CPU per message): any reader that subscribes later reads that append anyway.
//! - The stored value is then left behind, lower than the partition's end; it only decides
//!   whether a later publish counts as a change, and a lower value makes it count.

use tokio::sync::watch;

pub struct D2cNotify {
    partitions: Vec<watch::Sender<u64>>,
}

impl D2cNotify {
    pub fn new(next_sequence: impl IntoIterator<Item = u64>) -> Self {
        D2cNotify {
            partitions: next_sequence
                .into_iter()
                .map(|n| watch::channel(n).0)
                .collect(),
        }
    }

    /// Records that events up to `sequence_number` of `partition` are durable.
    pub fn appended(&self, partition: u16, sequence_number: u64) {
        if let Some(tx) = self.partitions.get(partition as usize) {
            if tx.receiver_count() == 0 {
                return;
            }
            tx.send_if_modified(|next| {
                if sequence_number + 1 > *next {
                    *next = sequence_number + 1;
                    true
                } else {
                    false
                }
            });
        }
    }

    pub fn subscribe(&self, partition: u16) -> Option<watch::Receiver<u64>> {
        self.partitions
            .get(partition as usize)
            .map(|tx| tx.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reader_subscribed_after_unwatched_appends_is_woken_by_the_next() {
        let notify = D2cNotify::new([0, 0]);
        // Nobody watches: these publish nothing.
        notify.appended(1, 0);
        notify.appended(1, 1);
        let mut reader = notify.subscribe(1).unwrap();
        assert!(!reader.has_changed().unwrap());
        notify.appended(1, 2);
        assert!(reader.has_changed().unwrap());
        reader.changed().await.unwrap();
        assert_eq!(*reader.borrow_and_update(), 3);
        // An older sequence (another lane finishing late) is no change.
        notify.appended(1, 1);
        assert!(!reader.has_changed().unwrap());
        // Other partitions do not wake it.
        notify.appended(0, 9);
        assert!(!reader.has_changed().unwrap());
    }
}
