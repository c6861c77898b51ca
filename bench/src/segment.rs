//! A measurement prototype, not used by the hub: the alternative D2C store issue 3 asked us to
//! weigh against RocksDB — one append-only segment file per partition, CRC-framed records,
//! and group commit (one `fdatasync` for every record waiting). The `d2c` bench runs it and the
//! engine's RocksDB path under the same load, so the choice is measured, not assumed.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

struct Append {
    record: Vec<u8>,
    done: SyncSender<std::io::Result<()>>,
}

/// An append-only file with a group-committing writer thread.
pub struct SegmentLog {
    tx: Option<SyncSender<Append>>,
    thread: Option<JoinHandle<()>>,
}

impl SegmentLog {
    pub fn create(path: &Path) -> std::io::Result<SegmentLog> {
        let file = File::create(path)?;
        let (tx, rx) = sync_channel(8192);
        let thread = std::thread::spawn(move || writer(file, rx));
        Ok(SegmentLog {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Appends `crc32 ‖ len ‖ payload`; returns once it is synced.
    pub fn append(&self, payload: &[u8]) -> std::io::Result<()> {
        let mut record = Vec::with_capacity(payload.len() + 8);
        record.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
        record.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        record.extend_from_slice(payload);
        let (done, wait) = sync_channel(1);
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| std::io::Error::other("closed"))?;
        tx.send(Append { record, done })
            .map_err(|_| std::io::Error::other("closed"))?;
        wait.recv()
            .map_err(|_| std::io::Error::other("writer gone"))?
    }
}

impl Drop for SegmentLog {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn writer(file: File, rx: Receiver<Append>) {
    let mut out = BufWriter::with_capacity(1 << 20, file);
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        while let Ok(more) = rx.try_recv() {
            group.push(more);
            if group.len() >= 1024 {
                break;
            }
        }
        let result = group
            .iter()
            .try_for_each(|a| out.write_all(&a.record))
            .and_then(|()| out.flush())
            .and_then(|()| out.get_ref().sync_data());
        for a in group {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            };
            let _ = a.done.send(r);
        }
    }
}
