//! The column families' RocksDB options, shared by every way the database is opened and by
//! migrations that create column families.

use ferrohub_migrations::{cf, m0002_registry_counters::DeviceCounters, record};
use rocksdb::{MergeOperands, Options};

/// Uncompressed size of a `d2c_log` table block (see [`cf_options`]).
const D2C_LOG_BLOCK_BYTES: usize = 64 << 10;

/// Column families the engine knows, each with its options.
pub(super) fn cf_options(name: &str) -> Options {
    let mut opts = Options::default();
    if name == cf::COUNTERS {
        opts.set_merge_operator_associative("ferrohub_add_counters", add_counters);
    }
    if name == cf::D2C_LOG {
        // A read of events seeks once and then takes consecutive keys, so blocks sixteen
        // times RocksDB's default cost a seek one larger decompression and nothing per
        // event, while a memtable flush (every few hundred milliseconds under a telemetry
        // flood) pays a compression call, a checksum and an index entry per 64 KiB instead
        // of per 4 KiB; the table indexes of retained events shrink the same way.
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_block_size(D2C_LOG_BLOCK_BYTES);
        opts.set_block_based_table_factory(&table);
    }
    opts
}

/// Merge operator for [`DeviceCounters`]: sums framed operands. Returns `None` (RocksDB then
/// reports corruption on read) if any operand fails its checksum.
fn add_counters(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let mut sum: DeviceCounters = match existing {
        Some(v) => record::decode(v).ok()?,
        None => DeviceCounters::default(),
    };
    for op in operands {
        let d: DeviceCounters = record::decode(op).ok()?;
        sum.total += d.total;
        sum.enabled += d.enabled;
        sum.disabled += d.disabled;
    }
    Some(record::encode(&sum))
}
