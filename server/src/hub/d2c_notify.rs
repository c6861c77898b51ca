//! Wakes long-polling readers of a D2C partition when new events become durable.
//!
//! Each partition has a watch channel holding its next sequence number; writers publish after
//! their append is durable, readers wait for a change with a timeout.

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
