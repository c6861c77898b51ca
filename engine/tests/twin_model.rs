//! Twins against a model (issue 18, ENG-2): random service patches and replacements of tags and
//! desired properties, device reported patches, stale and current etags, invalid writes and
//! reopening the store, each checked against a model that keeps a section as a flat map of
//! paths (a different shape from the engine's tree): bodies, `$version`s, every node's
//! `$metadata`, the twin version and etag.

mod common;

use std::collections::BTreeMap;

use ferrohub_engine::model::{IdentitySpec, IfMatch, UnixMillis};
use ferrohub_engine::twin::store::TwinWrite;
use ferrohub_engine::{Store, TwinError};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const DEVICE: &str = "model-twin";

/// A patch or body: small keys so that writes meet each other's paths, `null` to remove.
fn value(depth: u32) -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        3 => Just(Value::Null),
        3 => (0i64..4).prop_map(Value::from),
        1 => Just(json!("s")),
        1 => Just(json!(true)),
        1 => Just(json!([1, 2])),
    ];
    if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![3 => leaf, 2 => object(depth - 1).prop_map(Value::Object)].boxed()
    }
}

fn object(depth: u32) -> BoxedStrategy<Map<String, Value>> {
    proptest::collection::btree_map(
        prop_oneof![Just("a"), Just("b"), Just("c")],
        value(depth),
        0..3,
    )
    .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    .boxed()
}

#[derive(Debug, Clone)]
enum Op {
    /// Service PATCH (`merge`) or PUT of tags and/or desired, with the current etag, a stale
    /// one, or none.
    Service {
        merge: bool,
        tags: Option<Map<String, Value>>,
        desired: Option<Map<String, Value>>,
        etag: EtagChoice,
    },
    Reported(Map<String, Value>),
    /// A write naming a key IoT Hub refuses; nothing may change.
    Invalid {
        reported: bool,
    },
    Advance(i64),
    Reopen,
}

#[derive(Debug, Clone, Copy)]
enum EtagChoice {
    None,
    Current,
    Stale,
}

fn op() -> impl Strategy<Value = Op> {
    let etag = prop_oneof![
        Just(EtagChoice::None),
        Just(EtagChoice::Current),
        Just(EtagChoice::Stale)
    ];
    prop_oneof![
        5 => (any::<bool>(), proptest::option::of(object(2)), proptest::option::of(object(2)), etag)
            .prop_map(|(merge, tags, desired, etag)| Op::Service { merge, tags, desired, etag }),
        4 => object(2).prop_map(Op::Reported),
        1 => any::<bool>().prop_map(|reported| Op::Invalid { reported }),
        3 => (0i64..3).prop_map(Op::Advance),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Object,
    Leaf(Value),
}

/// A section as paths: every object and leaf with its (time, version) of last change.
#[derive(Debug, Clone)]
struct Section {
    nodes: BTreeMap<Vec<String>, (Node, i64, u64)>,
    root: (i64, u64),
    version: u64,
}

impl Section {
    fn new(now: i64) -> Self {
        Section {
            nodes: BTreeMap::new(),
            root: (now, 1),
            version: 1,
        }
    }

    fn remove_under(&mut self, path: &[String]) {
        self.nodes.retain(|p, _| !p.starts_with(path));
    }

    fn apply(&mut self, at: &[String], patch: &Map<String, Value>, now: i64) {
        let v = self.version;
        for (key, change) in patch {
            let mut path = at.to_vec();
            path.push(key.clone());
            match change {
                Value::Null => self.remove_under(&path),
                Value::Object(inner) => {
                    if !matches!(self.nodes.get(&path), Some((Node::Object, _, _))) {
                        self.remove_under(&path);
                    }
                    self.nodes
                        .entry(path.clone())
                        .or_insert((Node::Object, now, v));
                    self.apply(&path, inner, now);
                    // An object is touched by anything written below it.
                    self.nodes.get_mut(&path).expect("inserted").1 = now;
                    self.nodes.get_mut(&path).expect("inserted").2 = v;
                }
                leaf => {
                    self.remove_under(&path);
                    self.nodes.insert(path, (Node::Leaf(leaf.clone()), now, v));
                }
            }
        }
    }

    fn patch(&mut self, patch: &Map<String, Value>, now: i64) {
        self.version += 1;
        self.apply(&[], patch, now);
        self.root = (now, self.version);
    }

    fn replace(&mut self, body: &Map<String, Value>, now: i64) {
        self.version += 1;
        self.nodes.clear();
        self.apply(&[], body, now);
        self.root = (now, self.version);
    }

    /// The section as IoT Hub renders it (times as plain numbers).
    fn render(&self, with_version: bool) -> Value {
        let stamp = |(t, v): (i64, u64)| {
            let mut m = Map::new();
            m.insert("$lastUpdated".into(), json!(t.to_string()));
            if with_version {
                m.insert("$lastUpdatedVersion".into(), json!(v));
            }
            m
        };
        let mut body = Map::new();
        let mut meta = stamp(self.root);
        // Parents sort before their children, so each parent already exists when met.
        for (path, (node, t, v)) in &self.nodes {
            let (last, parents) = path.split_last().expect("non-empty");
            let mut b = &mut body;
            let mut m = &mut meta;
            for p in parents {
                b = b
                    .get_mut(p)
                    .and_then(Value::as_object_mut)
                    .expect("parent object");
                m = m
                    .get_mut(p)
                    .and_then(Value::as_object_mut)
                    .expect("parent meta");
            }
            b.insert(
                last.clone(),
                match node {
                    Node::Object => Value::Object(Map::new()),
                    Node::Leaf(x) => x.clone(),
                },
            );
            m.insert(last.clone(), Value::Object(stamp((*t, *v))));
        }
        body.insert("$metadata".into(), Value::Object(meta));
        body.insert("$version".into(), json!(self.version));
        Value::Object(body)
    }
}

fn contains_null(m: &Map<String, Value>) -> bool {
    m.values().any(|v| match v {
        Value::Null => true,
        Value::Object(inner) => contains_null(inner),
        _ => false,
    })
}

/// Tags: a JSON merge patch without metadata.
fn merge_tags(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(inner) => {
                let slot = target.entry(k.clone()).or_insert_with(|| json!({}));
                if !slot.is_object() {
                    *slot = json!({});
                }
                merge_tags(slot.as_object_mut().expect("object"), inner);
            }
            leaf => {
                target.insert(k.clone(), leaf.clone());
            }
        }
    }
}

struct Model {
    now: i64,
    tags: Map<String, Value>,
    desired: Section,
    reported: Section,
    version: u64,
}

fn fmt(t: UnixMillis) -> String {
    t.0.to_string()
}

fn check(
    store: &Store,
    model: &Model,
    etag: &mut String,
    step: usize,
) -> Result<(), TestCaseError> {
    let twin = store.get_twin(DEVICE, None).unwrap().record;
    prop_assert_eq!(
        &Value::Object(twin.tags.clone()),
        &Value::Object(model.tags.clone()),
        "step {}: tags",
        step
    );
    prop_assert_eq!(
        twin.desired.to_json(&fmt, true),
        model.desired.render(true),
        "step {}: desired",
        step
    );
    prop_assert_eq!(
        twin.reported.to_json(&fmt, false),
        model.reported.render(false),
        "step {}: reported",
        step
    );
    prop_assert_eq!(twin.version, model.version, "step {}: twin version", step);
    *etag = twin.etag;
    Ok(())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut store: Store = common::open(dir.path());
    store
        .create_device(DEVICE, &IdentitySpec::default(), common::T0)
        .unwrap();
    let first = store.get_twin(DEVICE, None).unwrap().record;
    let mut model = Model {
        now: common::T0.0,
        tags: Map::new(),
        desired: Section::new(first.desired.metadata.last_updated.0),
        reported: Section::new(first.reported.metadata.last_updated.0),
        version: first.version,
    };
    let mut etag = String::new();
    let mut etags_seen: Vec<String> = Vec::new();
    check(&store, &model, &mut etag, 0)?;
    for (step, op) in ops.into_iter().enumerate() {
        let now = UnixMillis(model.now);
        match op {
            Op::Service {
                merge,
                tags,
                desired,
                etag: choice,
            } => {
                let write = TwinWrite {
                    tags: tags.clone(),
                    desired: desired.clone(),
                };
                let if_match = match choice {
                    EtagChoice::None => IfMatch::Any,
                    EtagChoice::Current => IfMatch::Etag(etag.clone()),
                    EtagChoice::Stale => IfMatch::Etag(format!("\"stale-{}\"", etags_seen.len())),
                };
                let got = if merge {
                    store.update_twin(DEVICE, None, &write, &if_match, now)
                } else {
                    store.replace_twin(DEVICE, None, &write, &if_match, now)
                };
                let has_null =
                    |m: &Option<Map<String, Value>>| m.as_ref().is_some_and(|m| contains_null(m));
                if !merge && (has_null(&tags) || has_null(&desired)) {
                    // A replacement is a whole document: null only means "remove" in a patch.
                    prop_assert!(
                        matches!(got, Err(TwinError::Invalid(_))),
                        "step {step}: a replacement with null gave {got:?}"
                    );
                } else if matches!(choice, EtagChoice::Stale) {
                    prop_assert!(
                        matches!(got, Err(TwinError::EtagMismatch { .. })),
                        "step {step}: stale etag gave {got:?}"
                    );
                } else {
                    got.map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                    if let Some(t) = &tags {
                        if merge {
                            merge_tags(&mut model.tags, t);
                        } else {
                            model.tags = Map::new();
                            merge_tags(&mut model.tags, t);
                        }
                    }
                    if let Some(d) = &desired {
                        if merge {
                            model.desired.patch(d, model.now);
                        } else {
                            model.desired.replace(d, model.now);
                        }
                    }
                    model.version += 1;
                }
            }
            Op::Reported(patch) => {
                let version = store
                    .patch_reported(DEVICE, None, &patch, now)
                    .map_err(|e| TestCaseError::fail(format!("step {step}: {e}")))?;
                model.reported.patch(&patch, model.now);
                model.version += 1;
                prop_assert_eq!(version, model.reported.version, "step {}", step);
            }
            Op::Invalid { reported } => {
                let bad = json!({"a": {"$bad": 1}}).as_object().cloned().unwrap();
                let got = if reported {
                    store.patch_reported(DEVICE, None, &bad, now).map(|_| ())
                } else {
                    let write = TwinWrite {
                        tags: None,
                        desired: Some(bad),
                    };
                    store
                        .update_twin(DEVICE, None, &write, &IfMatch::Any, now)
                        .map(|_| ())
                };
                prop_assert!(
                    matches!(got, Err(TwinError::Invalid(_))),
                    "step {step}: {got:?}"
                );
            }
            Op::Advance(ms) => model.now += ms,
            Op::Reopen => {
                drop(store);
                store = common::open(dir.path());
            }
        }
        etags_seen.push(etag.clone());
        check(&store, &model, &mut etag, step + 1)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::proptest_cases(200)))]
    #[test]
    fn twin_matches_its_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(ops)?;
    }
}
