//! A twin section (`tags`, `desired` or `reported`) with its `$version` and per-node
//! `$metadata` (TWN-5, TWN-6), and the JSON merge rules of a patch (TWN-3, TWN-4).
//!
//! # Invariants
//! - Every change of the section raises `version` by exactly one.
//! - Every object and leaf in the body has a metadata node with the time and section version of
//!   its last change; a parent's node is refreshed whenever anything below it changes, including
//!   a removal, so a node whose children were all removed keeps its metadata.
//! - The body never contains `null`: in a patch, `null` removes the member.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::UnixMillis;

/// When a node last changed, and in which version of its section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaNode {
    pub last_updated: UnixMillis,
    pub last_updated_version: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub children: BTreeMap<String, MetaNode>,
}

impl MetaNode {
    fn leaf(now: UnixMillis, version: u64) -> Self {
        MetaNode {
            last_updated: now,
            last_updated_version: version,
            children: BTreeMap::new(),
        }
    }

    /// `$metadata` as IoT Hub renders it; `with_version` adds `$lastUpdatedVersion` (shown for
    /// desired properties).
    pub fn to_json(&self, fmt_time: &dyn Fn(UnixMillis) -> String, with_version: bool) -> Value {
        let mut out = Map::new();
        out.insert(
            "$lastUpdated".into(),
            Value::String(fmt_time(self.last_updated)),
        );
        if with_version {
            out.insert(
                "$lastUpdatedVersion".into(),
                Value::from(self.last_updated_version),
            );
        }
        for (k, child) in &self.children {
            out.insert(k.clone(), child.to_json(fmt_time, with_version));
        }
        Value::Object(out)
    }
}

/// One section of a twin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Section {
    /// The members, never containing `null`. Stored as JSON text: MessagePack cannot tell an
    /// integer-valued float from an integer, and twins must give back what they were given.
    #[serde(with = "json_text")]
    pub body: Map<String, Value>,
    pub version: u64,
    pub metadata: MetaNode,
}

pub(crate) mod json_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_json::{Map, Value};

    pub fn serialize<S: Serializer>(v: &Map<String, Value>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&serde_json::to_string(v).map_err(serde::ser::Error::custom)?)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
        let text = String::deserialize(d)?;
        serde_json::from_str(&text).map_err(serde::de::Error::custom)
    }
}

/// Merges `patch` into `target`, refreshing `meta` for everything it touches.
fn merge(
    target: &mut Map<String, Value>,
    meta: &mut MetaNode,
    patch: &Map<String, Value>,
    now: UnixMillis,
    version: u64,
) {
    for (key, change) in patch {
        match change {
            Value::Null => {
                target.remove(key);
                meta.children.remove(key);
            }
            Value::Object(inner) => {
                let slot = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                    meta.children.remove(key);
                }
                let child_meta = meta
                    .children
                    .entry(key.clone())
                    .or_insert_with(|| MetaNode::leaf(now, version));
                if let Value::Object(child) = slot {
                    merge(child, child_meta, inner, now, version);
                }
            }
            leaf => {
                target.insert(key.clone(), leaf.clone());
                meta.children
                    .insert(key.clone(), MetaNode::leaf(now, version));
            }
        }
    }
    meta.last_updated = now;
    meta.last_updated_version = version;
}

impl Section {
    /// An empty section at version 1, as a new twin has.
    pub fn new(now: UnixMillis) -> Self {
        Section {
            body: Map::new(),
            version: 1,
            metadata: MetaNode::leaf(now, 1),
        }
    }

    /// Applies a merge patch (members added or replaced, `null` removes, objects merge) and
    /// returns the new version.
    pub fn patch(&mut self, patch: &Map<String, Value>, now: UnixMillis) -> u64 {
        self.version += 1;
        merge(&mut self.body, &mut self.metadata, patch, now, self.version);
        self.version
    }

    /// Replaces the whole body and returns the new version. `null` members are dropped.
    pub fn replace(&mut self, body: &Map<String, Value>, now: UnixMillis) -> u64 {
        self.version += 1;
        let mut fresh = Map::new();
        let mut meta = MetaNode::leaf(now, self.version);
        merge(&mut fresh, &mut meta, body, now, self.version);
        self.body = fresh;
        self.metadata = meta;
        self.version
    }

    /// The body with `$metadata` and `$version`, as the REST API and MQTT return it.
    pub fn to_json(
        &self,
        fmt_time: &dyn Fn(UnixMillis) -> String,
        metadata_version: bool,
    ) -> Value {
        let mut out = self.body.clone();
        out.insert(
            "$metadata".into(),
            self.metadata.to_json(fmt_time, metadata_version),
        );
        out.insert("$version".into(), Value::from(self.version));
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn t(ms: i64) -> UnixMillis {
        UnixMillis(ms)
    }

    fn fmt(t: UnixMillis) -> String {
        t.0.to_string()
    }

    #[test]
    fn versions_rise_by_one_per_change() {
        let mut s = Section::new(t(0));
        for i in 0..100 {
            assert_eq!(s.patch(&obj(json!({"n": i})), t(i)), 2 + i as u64);
        }
        assert_eq!(s.version, 101);
        assert_eq!(s.replace(&obj(json!({"x": 1})), t(500)), 102);
    }

    #[test]
    fn merge_semantics() {
        let mut s = Section::new(t(0));
        s.patch(
            &obj(json!({"a": {"b": 1, "c": {"d": 2}}, "e": "f", "g": [1, 2]})),
            t(10),
        );
        s.patch(
            &obj(json!({"a": {"c": null, "x": true}, "e": null, "g": [3]})),
            t(20),
        );
        assert_eq!(
            Value::Object(s.body.clone()),
            json!({"a": {"b": 1, "x": true}, "g": [3]})
        );
        // A patch replacing a leaf with an object, with nested nulls dropped.
        s.patch(&obj(json!({"g": {"h": 1, "i": null}})), t(30));
        assert_eq!(s.body["g"], json!({"h": 1}));
    }

    #[test]
    fn metadata_per_node_kept_on_parents() {
        let mut s = Section::new(t(0));
        s.patch(&obj(json!({"a": {"b": 1, "c": 2}, "z": 0})), t(10));
        s.patch(&obj(json!({"a": {"c": 3}})), t(20));
        let m = s.to_json(&fmt, true)["$metadata"].clone();
        assert_eq!(m["$lastUpdated"], "20");
        assert_eq!(m["$lastUpdatedVersion"], 3);
        assert_eq!(m["a"]["$lastUpdated"], "20");
        assert_eq!(m["a"]["b"]["$lastUpdated"], "10");
        assert_eq!(m["a"]["b"]["$lastUpdatedVersion"], 2);
        assert_eq!(m["a"]["c"]["$lastUpdatedVersion"], 3);
        assert_eq!(m["z"]["$lastUpdated"], "10");
        // Removing every child keeps the parent, with the removal's time and version.
        s.patch(&obj(json!({"a": {"b": null, "c": null}})), t(30));
        let doc = s.to_json(&fmt, true);
        assert_eq!(doc["a"], json!({}));
        assert_eq!(
            doc["$metadata"]["a"],
            json!({"$lastUpdated": "30", "$lastUpdatedVersion": 4})
        );
        assert_eq!(doc["$version"], 4);
        // Reported properties render without $lastUpdatedVersion.
        assert!(s.to_json(&fmt, false)["$metadata"]
            .get("$lastUpdatedVersion")
            .is_none());
    }

    #[test]
    fn replace_resets_metadata() {
        let mut s = Section::new(t(0));
        s.patch(&obj(json!({"old": {"x": 1}})), t(10));
        s.replace(&obj(json!({"new": {"y": 2}})), t(20));
        let doc = s.to_json(&fmt, true);
        assert_eq!(doc["new"], json!({"y": 2}));
        assert!(doc.get("old").is_none());
        assert_eq!(
            doc["$metadata"]["new"]["y"],
            json!({"$lastUpdated": "20", "$lastUpdatedVersion": 3})
        );
        assert!(doc["$metadata"].get("old").is_none());
    }

    #[test]
    fn stored_form_round_trips_numbers_exactly() {
        let mut s = Section::new(t(0));
        s.patch(
            &obj(json!({"f": 1.0, "i": 1, "big": 4503599627370495i64})),
            t(1),
        );
        let bytes = ferrohub_migrations::record::encode(&s);
        let back: Section = ferrohub_migrations::record::decode(&bytes).unwrap();
        assert_eq!(back, s);
        assert_eq!(serde_json::to_string(&back.body["f"]).unwrap(), "1.0");
    }
}
