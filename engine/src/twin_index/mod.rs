//! The twin query index (QRY-1, issue 15 part 2): entries `(collection, path, value,
//! twin)` for the predicates fleets select on, so a selective query reads the twins it may
//! return instead of every twin.
//!
//! Indexed, for device and module twins alike:
//! - `status` and `connectionState` (identity fields, as queries spell their values);
//! - every scalar leaf under `tags` (`tags.a.b`; arrays are not indexed);
//! - the `properties.desired.…` / `properties.reported.…` paths the operator declares
//!   ([`Store::define_twin_index`]); a declared path indexes the scalar at that path.
//!
//! # Invariants
//! - Entries are staged by a [`BatchHook`] into the very batch that writes the identity or
//!   twin they describe, from the stored state before and the batch's state after, so every
//!   writer keeps the index exact without knowing of it and a query sees an entry exactly when
//!   it sees the write. Writers hold the device's stripe lock across the commit, so the state
//!   before is not changing under the hook.
//! - The index only proposes candidates: a query re-evaluates its whole condition on the twin
//!   it reads, so an entry can cost a read, never a wrong row.
//! - The definition in force is stored (`meta` `twin_index`); a store whose stored definition
//!   differs from the wanted one (or has none: new or upgraded) is rebuilt from the identities
//!   and twins before it serves. A rebuild interrupted by a crash is redone at the next open.

mod encode;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ferrohub_migrations::{cf, record};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::archive::IdentityRecords;
use crate::error::StorageError;
use crate::keys;
use crate::model::{ConnectionState, Identity, Status};
use crate::raw::{Batch, BatchHook, Op, Raw};
use crate::twin::record::{Twin, TwinRecord};
use crate::Store;

const DEFINITION_KEY: &[u8] = b"twin_index";
/// Bumped when entries change shape, so stores rebuild.
const FORMAT: u32 = 1;
/// Identities per batch of a rebuild.
const REBUILD_PAGE: usize = 512;

/// What is indexed beyond the fixed paths.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDefinition {
    format: u32,
    /// Declared `properties.desired.…` / `properties.reported.…` paths, sorted.
    declared: Vec<String>,
    /// A cluster follower's view while the writer rebuilds the index (its stored definition
    /// deleted): no path has usable entries, so queries scan.
    #[serde(skip)]
    suspended: bool,
}

impl IndexDefinition {
    fn new(mut declared: Vec<String>) -> Self {
        declared.sort();
        declared.dedup();
        IndexDefinition {
            format: FORMAT,
            declared,
            suspended: false,
        }
    }

    /// Whether `path` (dotted) has entries.
    pub fn covers(&self, path: &str) -> bool {
        if self.suspended {
            return false;
        }
        path == "status"
            || path == "connectionState"
            || path.starts_with("tags.")
            || self.declared.iter().any(|d| d == path)
    }

    /// Whether a path under `properties.reported` has entries.
    fn indexes_reported(&self) -> bool {
        self.declared
            .iter()
            .any(|d| d.starts_with("properties.reported"))
    }
}

/// Which entries of a path a query wants.
#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// Equal to one of the values (scalars).
    Eq(Vec<Value>),
    /// Between bounds of one type; `true` means inclusive.
    Range {
        lo: Option<(Value, bool)>,
        hi: Option<(Value, bool)>,
    },
    /// Strings starting with this.
    Prefix(String),
}

pub(crate) struct Hook {
    definition: RwLock<IndexDefinition>,
}

/// The hook as installed in the raw store (it and the store share it).
struct Shared(Arc<Hook>);

fn status_value(s: Status) -> &'static str {
    match s {
        Status::Enabled => "enabled",
        Status::Disabled => "disabled",
    }
}

fn connection_value(s: ConnectionState) -> &'static str {
    match s {
        ConnectionState::Connected => "Connected",
        ConnectionState::Disconnected => "Disconnected",
    }
}

fn leaves(prefix: &str, map: &Map<String, Value>, out: &mut Vec<(String, Value)>) {
    for (name, value) in map {
        let path = format!("{prefix}.{name}");
        match value {
            Value::Object(inner) => leaves(&path, inner, out),
            Value::Array(_) => {}
            scalar => out.push((path, scalar.clone())),
        }
    }
}

fn at<'a>(map: &'a Map<String, Value>, steps: &[&str]) -> Option<&'a Value> {
    let (first, rest) = steps.split_first()?;
    rest.iter()
        .try_fold(map.get(*first)?, |v, step| v.as_object()?.get(*step))
}

/// Every entry key of one identity and its twin.
fn entries(
    def: &IndexDefinition,
    twin_key: &[u8],
    identity: Option<&Identity>,
    twin: Option<&TwinRecord>,
) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    let Some(identity) = identity else {
        return out;
    };
    let module = identity.module_id.is_some();
    let mut values = vec![
        (
            "status".to_string(),
            Value::from(status_value(identity.status)),
        ),
        (
            "connectionState".to_string(),
            Value::from(connection_value(identity.connection_state)),
        ),
    ];
    if let Some(t) = twin {
        leaves("tags", &t.tags, &mut values);
        for path in &def.declared {
            let steps: Vec<&str> = path.split('.').collect();
            let value = match steps.as_slice() {
                ["properties", "desired", rest @ ..] => at(&t.desired.body, rest),
                ["properties", "reported", rest @ ..] => at(&t.reported.body, rest),
                _ => None,
            };
            if let Some(v) = value {
                values.push((path.clone(), v.clone()));
            }
        }
    }
    for (path, value) in values {
        let mut k = encode::path_prefix(module, &path);
        if encode::push_value(&mut k, &value).is_some() {
            k.extend_from_slice(twin_key);
            out.insert(k);
        }
    }
    out
}

/// The identity key (column family and key) of a twin key.
fn identity_key(twin_key: &[u8]) -> Option<(&'static str, &[u8])> {
    match twin_key.split_first()? {
        (b'd', rest) => Some((cf::DEVICES, rest)),
        (b'm', rest) => Some((cf::MODULES, rest)),
        _ => None,
    }
}

/// The twin key an identity or twin write concerns.
fn twin_key_of(cf_name: &str, key: &[u8]) -> Option<Vec<u8>> {
    let kind = match cf_name {
        n if n == cf::TWINS => return Some(key.to_vec()),
        n if n == cf::DEVICES => b'd',
        n if n == cf::MODULES => b'm',
        _ => return None,
    };
    let mut k = vec![kind];
    k.extend_from_slice(key);
    Some(k)
}

/// The state a batch leaves a record in: `Some(None)` deleted, `None` untouched.
fn after_batch<T: serde::de::DeserializeOwned>(
    batch: &Batch,
    cf_name: &str,
    key: &[u8],
) -> Result<Option<Option<T>>, StorageError> {
    let mut last = None;
    for op in &batch.ops {
        match op {
            Op::Put { cf, key: k, value } if *cf == cf_name && k == key => last = Some(Some(value)),
            Op::Delete { cf, key: k } if *cf == cf_name && k == key => last = Some(None),
            _ => {}
        }
    }
    last.map(|v| {
        v.map(|bytes| {
            record::decode(bytes).map_err(|e| StorageError::Backend(format!("{cf_name}: {e}")))
        })
        .transpose()
    })
    .transpose()
}

/// The identity and twin behind `twin_key` before `batch` (`None`) or after it. "Before" is
/// the state every write queued ahead of the batch left, durable or not: a pipelined identity
/// or twin write (connection state, reported patch) is the state the next one follows, and
/// entries computed from the durable state would undo what the queued write staged.
/// With `with_twin` false the twin is not read (`None`).
fn state(
    raw: &Raw,
    batch: Option<&Batch>,
    twin_key: &[u8],
    with_twin: bool,
) -> Result<(Option<Identity>, Option<TwinRecord>), StorageError> {
    let Some((id_cf, id_key)) = identity_key(twin_key) else {
        return Ok((None, None));
    };
    let identity = match batch
        .map(|b| after_batch(b, id_cf, id_key))
        .transpose()?
        .flatten()
    {
        Some(staged) => staged,
        None => raw.get_for_update(id_cf, id_key)?,
    };
    if !with_twin {
        return Ok((identity, None));
    }
    let twin = match batch
        .map(|b| after_batch(b, cf::TWINS, twin_key))
        .transpose()?
        .flatten()
    {
        Some(staged) => staged,
        None => raw.get_for_update(cf::TWINS, twin_key)?,
    };
    Ok((identity, twin))
}

/// Whether `batch` writes the identity behind `twin_key`.
fn writes_identity(batch: &Batch, twin_key: &[u8]) -> bool {
    identity_key(twin_key).is_some_and(|(id_cf, id_key)| batch.writes_of(id_cf, id_key) > 0)
}

/// Whether `batch` writes the twin record under `twin_key`.
fn writes_twin(batch: &Batch, twin_key: &[u8]) -> bool {
    batch.ops.iter().any(|op| {
        matches!(op, Op::Put { cf, key, .. } | Op::Delete { cf, key }
            if *cf == cf::TWINS && key.as_slice() == twin_key)
    })
}

impl BatchHook for Shared {
    fn stage(&self, raw: &Raw, batch: &mut Batch) -> Result<(), StorageError> {
        let touched: BTreeSet<Vec<u8>> = batch
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Put { cf, key, .. } | Op::Delete { cf, key } => twin_key_of(cf, key),
                _ => None,
            })
            .collect();
        if touched.is_empty() {
            return Ok(());
        }
        let def = self.0.definition.read();
        let reported_indexed = def.indexes_reported();
        let mut changes = BTreeMap::new();
        for twin_key in touched {
            // A device's reported patch keeps the identity, tags and desired properties, and
            // with them every entry of a definition that indexes no reported path.
            if !reported_indexed
                && batch.twin_changes_reported_only(&twin_key)
                && !writes_identity(batch, &twin_key)
            {
                continue;
            }
            // An identity write that leaves the twin alone (a connection state, a status)
            // changes only the identity's own entries as long as the identity exists before
            // and after: the twin's entries are the same on both sides, so it is not read.
            let twin_written = writes_twin(batch, &twin_key);
            let (old_identity, mut old_twin) = state(raw, None, &twin_key, twin_written)?;
            let (new_identity, mut new_twin) = state(raw, Some(batch), &twin_key, twin_written)?;
            if !twin_written && (old_identity.is_none() || new_identity.is_none()) {
                old_twin = state(raw, None, &twin_key, true)?.1;
                new_twin.clone_from(&old_twin);
            }
            let old = entries(&def, &twin_key, old_identity.as_ref(), old_twin.as_ref());
            let new = entries(&def, &twin_key, new_identity.as_ref(), new_twin.as_ref());
            for k in old.difference(&new) {
                changes.insert(k.clone(), false);
            }
            for k in new.difference(&old) {
                changes.insert(k.clone(), true);
            }
        }
        for (key, put) in changes {
            if put {
                batch.put_framed(cf::TWIN_INDEX, key, Vec::new());
            } else {
                batch.delete(cf::TWIN_INDEX, key);
            }
        }
        Ok(())
    }
}

/// `[from, until)` key ranges of a probe, in key order.
fn ranges(prefix: &[u8], probe: &Probe) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let with = |v: &Value| {
        let mut k = prefix.to_vec();
        encode::push_value(&mut k, v).map(|()| k)
    };
    match probe {
        Probe::Eq(values) => {
            let mut keys: Vec<Vec<u8>> = values.iter().filter_map(with).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter()
                .map(|k| {
                    let end = keys::prefix_end(&k);
                    (k, end)
                })
                .collect()
        }
        Probe::Prefix(s) => {
            let mut k = prefix.to_vec();
            encode::push_string_body(&mut k, s);
            let end = keys::prefix_end(&k);
            vec![(k, end)]
        }
        Probe::Range { lo, hi } => {
            let kind = lo
                .as_ref()
                .or(hi.as_ref())
                .and_then(|(v, _)| encode::type_range(v));
            let Some((first, after)) = kind else {
                return Vec::new();
            };
            if let (Some((a, _)), Some((b, _))) = (lo, hi) {
                if encode::type_range(a) != encode::type_range(b) {
                    return Vec::new();
                }
            }
            let type_start = [prefix, &[first]].concat();
            let type_end = [prefix, &[after]].concat();
            let from = match lo {
                None => Some(type_start),
                Some((v, true)) => with(v),
                Some((v, false)) => with(v).and_then(|k| keys::prefix_end(&k)),
            };
            let until = match hi {
                None => Some(type_end),
                Some((v, false)) => with(v),
                Some((v, true)) => with(v).and_then(|k| keys::prefix_end(&k)),
            };
            match (from, until) {
                (Some(f), Some(u)) if f < u => vec![(f, Some(u))],
                _ => Vec::new(),
            }
        }
    }
}

/// The length of the encoded value at the start of `bytes`.
fn value_len(bytes: &[u8]) -> Option<usize> {
    match bytes.first()? {
        0x01..=0x03 => Some(1),
        0x04 => Some(9),
        0x05 => {
            let mut i = 1;
            while i + 1 < bytes.len() {
                match (bytes[i], bytes[i + 1]) {
                    (0x00, 0x01) => return Some(i + 2),
                    (0x00, _) => i += 2,
                    _ => i += 1,
                }
            }
            None
        }
        _ => None,
    }
}

impl Store {
    /// Installs the index maintenance with the stored definition, building the index first
    /// when there is none (a new or upgraded store). Called once, when a writable store opens.
    pub(crate) fn open_twin_index(&self) -> Result<(), StorageError> {
        let stored: Option<IndexDefinition> = self.raw.get_record(cf::META, DEFINITION_KEY)?;
        let def = match stored {
            Some(d) if d.format == FORMAT => d,
            _ => {
                let fresh = IndexDefinition::new(Vec::new());
                self.rebuild_twin_index(&fresh)?;
                fresh
            }
        };
        let hook = Arc::new(Hook {
            definition: RwLock::new(def),
        });
        if self
            .raw
            .set_hook(Box::new(Shared(Arc::clone(&hook))))
            .is_ok()
        {
            let _ = self.twin_index.set(hook);
        }
        Ok(())
    }

    /// A cluster follower's index: the definition the log wrote, read again whenever an
    /// applied entry touches it, and never a hook (a follower writes nothing of its own).
    pub(crate) fn follow_twin_index(&self) -> Result<(), StorageError> {
        let stored: Option<IndexDefinition> = self.raw.get_record(cf::META, DEFINITION_KEY)?;
        let def = match stored {
            Some(d) if d.format == FORMAT => d,
            _ => IndexDefinition {
                suspended: true,
                ..IndexDefinition::new(Vec::new())
            },
        };
        match self.twin_index.get() {
            Some(hook) => *hook.definition.write() = def,
            None => {
                let _ = self.twin_index.set(Arc::new(Hook {
                    definition: RwLock::new(def),
                }));
            }
        }
        Ok(())
    }

    /// Whether `key` of `meta` is where the index definition is stored.
    pub(crate) fn is_twin_index_definition_key(key: &[u8]) -> bool {
        key == DEFINITION_KEY
    }

    /// Makes `declared` (`properties.desired.…` / `properties.reported.…` paths) the indexed
    /// paths beyond the fixed ones, rebuilding the index when they changed. Call before the
    /// store serves: writes staged under the old definition while it rebuilds could be missed.
    /// Returns whether it rebuilt.
    ///
    /// # Errors
    /// Storage errors; an interrupted rebuild is redone at the next open.
    pub fn define_twin_index(&self, declared: Vec<String>) -> Result<bool, StorageError> {
        let Some(hook) = self.twin_index.get() else {
            return Ok(false);
        };
        let wanted = IndexDefinition::new(declared);
        let mut def = hook.definition.write();
        if *def == wanted {
            return Ok(false);
        }
        self.rebuild_twin_index(&wanted)?;
        *def = wanted;
        Ok(true)
    }

    /// The index definition in force, if the store maintains an index.
    pub fn twin_index_definition(&self) -> Option<IndexDefinition> {
        self.twin_index.get().map(|h| h.definition.read().clone())
    }

    /// Every entry key, in order: for tests comparing an index kept by writers with a rebuilt
    /// one.
    #[doc(hidden)]
    pub fn twin_index_keys(&self) -> Result<Vec<Vec<u8>>, StorageError> {
        let mut out = Vec::new();
        self.raw.scan_keys(cf::TWIN_INDEX, &[], None, |k| {
            out.push(k.to_vec());
            true
        })?;
        Ok(out)
    }

    fn rebuild_twin_index(&self, def: &IndexDefinition) -> Result<(), StorageError> {
        let mut clear = Batch::default();
        clear.delete(cf::META, DEFINITION_KEY.to_vec());
        clear.delete_range(cf::TWIN_INDEX, vec![0x00], vec![0xFF]);
        self.raw.commit(clear)?;
        let mut after: Option<String> = None;
        loop {
            let page = self.archive_page(after.as_deref(), REBUILD_PAGE)?;
            let Some(last) = page.last().map(|d| d.device.identity.device_id.clone()) else {
                break;
            };
            let mut batch = Batch::default();
            for device in page {
                for records in std::iter::once(device.device).chain(device.modules) {
                    let IdentityRecords { identity, twin } = records;
                    let key = keys::twin(&identity.device_id, identity.module_id.as_deref());
                    for k in entries(def, &key, Some(&identity), Some(&twin)) {
                        batch.put_framed(cf::TWIN_INDEX, k, Vec::new());
                    }
                }
            }
            self.raw.commit(batch)?;
            after = Some(last);
        }
        let mut done = Batch::default();
        done.put_record(cf::META, DEFINITION_KEY.to_vec(), def);
        self.raw.commit(done)
    }

    /// Up to `limit` twins of `path`'s entries that `probe` selects, after the entry `after`
    /// (a key this returned), in entry order, each with its entry key; `None` when the path is
    /// not indexed (the caller scans).
    ///
    /// # Errors
    /// Storage errors.
    pub fn twin_index_page(
        &self,
        module: bool,
        path: &str,
        probe: &Probe,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Option<Vec<(Vec<u8>, Twin)>>, StorageError> {
        let Some(hook) = self.twin_index.get() else {
            return Ok(None);
        };
        if !hook.definition.read().covers(path) {
            return Ok(None);
        }
        let prefix = encode::path_prefix(module, path);
        let mut found: Vec<Vec<u8>> = Vec::new();
        for (from, until) in ranges(&prefix, probe) {
            let start = match after {
                Some(a) if a >= from.as_slice() => [a, &[0x00]].concat(),
                _ => from,
            };
            if until.as_ref().is_some_and(|u| start >= *u) {
                continue;
            }
            self.raw.scan_keys(cf::TWIN_INDEX, &start, until, |k| {
                found.push(k.to_vec());
                found.len() < limit
            })?;
            if found.len() >= limit {
                break;
            }
        }
        let mut out = Vec::with_capacity(found.len());
        for key in found {
            let rest = &key[prefix.len()..];
            let Some(twin_key) = value_len(rest).map(|n| &rest[n..]) else {
                continue;
            };
            let Some((device, module)) = keys::parse_twin(twin_key) else {
                continue;
            };
            // Deleted since the entry was read: not a row any more.
            let Some(identity) = self.find_identity(&device, module.as_deref())? else {
                continue;
            };
            let record = self.load_twin_record(&identity)?;
            out.push((key, Twin { identity, record }));
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_skipped_to_reach_the_twin_key() {
        let mut k = Vec::new();
        encode::push_value(&mut k, &Value::from("a\u{0}b")).unwrap();
        let n = k.len();
        k.extend_from_slice(b"ddev");
        assert_eq!(value_len(&k), Some(n));
        assert_eq!(value_len(&[0x04, 1, 2, 3, 4, 5, 6, 7, 8, b'd']), Some(9));
    }

    /// The mark holds only while every write of the twin in the batch is a reported patch,
    /// whichever order the writes come in.
    #[test]
    fn a_twin_is_reported_only_while_every_write_of_it_is() {
        let twin = b"ddev".to_vec();
        let write = |batch: &mut Batch, reported_only: bool| {
            batch.put_framed(cf::TWINS, twin.clone(), Vec::new());
            batch.note_twin_write(&twin, reported_only);
        };
        let mut batch = Batch::default();
        write(&mut batch, true);
        write(&mut batch, true);
        assert!(batch.twin_changes_reported_only(&twin));
        write(&mut batch, false);
        assert!(!batch.twin_changes_reported_only(&twin));
        write(&mut batch, true);
        assert!(!batch.twin_changes_reported_only(&twin));

        let mut batch = Batch::default();
        write(&mut batch, false);
        write(&mut batch, true);
        assert!(!batch.twin_changes_reported_only(&twin));
        assert!(!batch.twin_changes_reported_only(b"dother"));
    }

    #[test]
    fn reported_paths_are_told_apart_from_the_others() {
        assert!(!IndexDefinition::new(Vec::new()).indexes_reported());
        assert!(!IndexDefinition::new(vec!["properties.desired.x".into()]).indexes_reported());
        assert!(IndexDefinition::new(vec!["properties.reported.x.y".into()]).indexes_reported());
    }
}
