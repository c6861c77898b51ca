//! What automatic device configurations (ADM) make of one twin: which configurations target
//! it, which wins each desired property, and the patch that brings the twin there.
//!
//! Rules (IoT Hub's, `iot-hub-automatic-device-management`):
//! - A configuration targets the twins its target condition selects (device twins for
//!   `deviceContent`, module twins for `moduleContent` with a `FROM devices.modules` target).
//! - Per desired path, the targeting configuration with the highest priority wins; on equal
//!   priority the one created last. A path inside or around a path already won is shadowed.
//! - A configuration that wins at least one path is `Applied` to the twin, else `Targeted`.
//! - Paths a configuration set before and nobody wins now are removed (`null`).
//!
//! # Invariants
//! - Pure: the decision is a function of the configurations and the twin read; deciding again
//!   on the twin it produced yields nothing to write (reconciling is idempotent).

use std::collections::BTreeMap;

use ferrohub_engine::configurations::Configuration;
use ferrohub_engine::twin::configured::ConfiguredTwin;
use ferrohub_engine::twin::record::AppliedConfiguration;
use ferrohub_engine::twin::store::Twin;
use ferrohub_engine::UnixMillis;
use serde_json::{Map, Value};

use crate::routing::query::{Collection, Statement};

/// Most custom metric queries a configuration may have.
pub const MAX_METRICS: usize = 5;
const DESIRED: &str = "properties.desired";

/// A configuration ready to be decided with.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub id: String,
    pub priority: i64,
    pub created: UnixMillis,
    pub target: Statement,
    /// Desired paths (below `properties.desired`) and their values.
    pub content: Vec<(Vec<String>, Value)>,
}

/// Reads `content` (`deviceContent` or `moduleContent`, keys `properties.desired` or
/// `properties.desired.<path>`): which twins it is for and its paths.
///
/// # Errors
/// Why the content is not acceptable, in words for a 400.
pub fn read_content(content: &Value) -> Result<(Collection, Vec<(Vec<String>, Value)>), String> {
    let part = |name: &str| -> Result<Option<&Map<String, Value>>, String> {
        match content.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) if m.is_empty() => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(format!("content.{name} must be a JSON object")),
        }
    };
    if part("modulesContent")?.is_some() {
        return Err("content.modulesContent (IoT Edge deployments) is not supported; use deviceContent or moduleContent".into());
    }
    let (collection, map) = match (part("deviceContent")?, part("moduleContent")?) {
        (Some(_), Some(_)) => {
            return Err("content has deviceContent and moduleContent; give one".into())
        }
        (Some(d), None) => (Collection::Devices, d),
        (None, Some(m)) => (Collection::Modules, m),
        (None, None) => return Ok((Collection::Devices, Vec::new())),
    };
    let mut paths = Vec::new();
    for (key, value) in map {
        if key == DESIRED {
            let Value::Object(whole) = value else {
                return Err("content key properties.desired needs a JSON object".into());
            };
            paths.extend(whole.iter().map(|(k, v)| (vec![k.clone()], v.clone())));
        } else if let Some(path) = key.strip_prefix("properties.desired.") {
            let steps: Vec<String> = path.split('.').map(str::to_string).collect();
            if steps.iter().any(String::is_empty) {
                return Err(format!("content key {key:?} has an empty name"));
            }
            paths.push((steps, value.clone()));
        } else {
            return Err(format!(
                "content key {key:?} must be properties.desired or start with properties.desired."
            ));
        }
    }
    Ok((collection, paths))
}

impl Compiled {
    /// Compiles a stored configuration.
    ///
    /// # Errors
    /// Why it cannot be applied (checked when it was stored, so only for records that no
    /// longer read).
    pub fn compile(c: &Configuration) -> Result<Compiled, String> {
        let content: Value = serde_json::from_str(&c.content).map_err(|e| e.to_string())?;
        let (collection, content) = read_content(&content)?;
        let target = Statement::target(&c.target_condition).map_err(|e| e.to_string())?;
        if target.from != collection {
            return Err(match collection {
                Collection::Modules => {
                    "moduleContent needs a target condition FROM devices.modules WHERE ...".into()
                }
                _ => {
                    "deviceContent needs a target condition on devices, not devices.modules".into()
                }
            });
        }
        Ok(Compiled {
            id: c.id.clone(),
            priority: c.priority,
            created: c.created,
            target,
            content,
        })
    }
}

/// Whether `current` already holds `wanted`: equal, or for an object every member held
/// (a merge patch leaves other members alone); `null` is held by absence.
fn holds(current: Option<&Value>, wanted: &Value) -> bool {
    match (current, wanted) {
        (None, Value::Null) => true,
        (Some(Value::Object(have)), Value::Object(want)) => {
            want.iter().all(|(k, v)| holds(have.get(k), v))
        }
        (Some(have), want) => have == want,
        (None, _) => false,
    }
}

fn get<'a>(map: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let mut at = map.get(first)?;
    for step in rest {
        at = at.as_object()?.get(step)?;
    }
    Some(at)
}

fn set(map: &mut Map<String, Value>, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = map;
    for step in parents {
        let slot = at
            .entry(step.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(next) = slot else { return };
        at = next;
    }
    at.insert(last.clone(), value);
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// What the configurations make of `twin` (read as `row`, its query JSON), or `None` when the
/// twin is already so.
pub fn decide(configs: &[Compiled], twin: &Twin, row: &Value) -> Option<ConfiguredTwin> {
    let collection = if twin.identity.module_id.is_some() {
        Collection::Modules
    } else {
        Collection::Devices
    };
    let mut targeting: Vec<&Compiled> = configs
        .iter()
        .filter(|c| c.target.from == collection && c.target.matches(row))
        .collect();
    targeting.sort_by(|a, b| (b.priority, b.created, &b.id).cmp(&(a.priority, a.created, &a.id)));
    let mut won: Vec<(Vec<String>, &Value, &str)> = Vec::new();
    for c in &targeting {
        for (path, value) in &c.content {
            if !won.iter().any(|(p, ..)| overlaps(p, path)) {
                won.push((path.clone(), value, &c.id));
            }
        }
    }
    let configurations: BTreeMap<String, AppliedConfiguration> = targeting
        .iter()
        .map(|c| {
            let owned: Vec<String> = won
                .iter()
                .filter(|(.., id)| *id == c.id)
                .map(|(p, ..)| p.join("."))
                .collect();
            let status = if owned.is_empty() {
                "Targeted"
            } else {
                "Applied"
            };
            (
                c.id.clone(),
                AppliedConfiguration {
                    status: status.into(),
                    owned,
                },
            )
        })
        .collect();
    let desired = &twin.record.desired.body;
    let mut changed = won.iter().any(|(p, v, _)| !holds(get(desired, p), v));
    let mut patch = Map::new();
    for (path, value, _) in &won {
        set(&mut patch, path, (*value).clone());
    }
    let dropped = twin
        .record
        .configurations
        .values()
        .flat_map(|c| c.owned.iter())
        .map(|p| p.split('.').map(str::to_string).collect::<Vec<_>>())
        .filter(|p| !won.iter().any(|(w, ..)| overlaps(w, p)));
    for path in dropped {
        if get(desired, &path).is_some() {
            set(&mut patch, &path, Value::Null);
            changed = true;
        }
    }
    if !changed && configurations == twin.record.configurations {
        return None;
    }
    Some(ConfiguredTwin {
        desired: changed.then_some(patch),
        configurations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrohub_engine::model::{AuthType, Authentication, ConnectionState, Identity, Status};
    use ferrohub_engine::twin::record::TwinRecord;
    use serde_json::json;

    fn config(id: &str, priority: i64, created: i64, target: &str, content: Value) -> Compiled {
        let (_, content) = read_content(&json!({ "deviceContent": content })).unwrap();
        Compiled {
            id: id.into(),
            priority,
            created: UnixMillis(created),
            target: Statement::target(target).unwrap(),
            content,
        }
    }

    fn twin(tags: Value, desired: Value) -> (Twin, Value) {
        let mut record = TwinRecord::empty(UnixMillis(0));
        record.tags = tags.as_object().cloned().unwrap();
        record.desired.body = desired.as_object().cloned().unwrap();
        let twin = Twin {
            identity: Identity {
                device_id: "d".into(),
                module_id: None,
                generation_id: "1".into(),
                etag: "MQ==".into(),
                status: Status::Enabled,
                status_reason: None,
                status_updated_time: UnixMillis(0),
                connection_state: ConnectionState::Disconnected,
                connection_state_updated_time: None,
                last_activity_time: None,
                cloud_to_device_message_count: 0,
                authentication: Authentication {
                    kind: AuthType::Sas,
                    symmetric_keys: None,
                    thumbprints: None,
                },
                iot_edge: false,
                device_scope: None,
                parent_scopes: Vec::new(),
                managed_by: None,
                model_id: None,
            },
            record,
        };
        let row = crate::hub::twin_rows::twin_json(&twin);
        (twin, row)
    }

    #[test]
    fn content_keys_are_desired_paths() {
        let (c, paths) = read_content(&json!({"moduleContent": {"properties.desired.a.b": 1, "properties.desired": {"c": 2}}})).unwrap();
        assert_eq!(c, Collection::Modules);
        assert!(paths.contains(&(vec!["a".into(), "b".into()], json!(1))));
        assert!(paths.contains(&(vec!["c".into()], json!(2))));
        for bad in [
            json!({"deviceContent": {"tags.a": 1}}),
            json!({"modulesContent": {"$edgeAgent": {}}}),
            json!({"deviceContent": {"properties.desired.x": 1}, "moduleContent": {"properties.desired.y": 1}}),
        ] {
            assert!(read_content(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_highest_priority_wins_each_path_and_the_rest_is_targeted() {
        let low = config(
            "low",
            1,
            10,
            "tags.env = 'test'",
            json!({"properties.desired.mode": "slow", "properties.desired.x": 1}),
        );
        let high = config(
            "high",
            5,
            5,
            "*",
            json!({"properties.desired.mode": "fast"}),
        );
        let newer = config(
            "newer",
            1,
            20,
            "tags.env = 'test'",
            json!({"properties.desired.x": 2}),
        );
        let (t, row) = twin(json!({"env": "test"}), json!({}));
        let d = decide(&[low.clone(), high.clone(), newer.clone()], &t, &row).unwrap();
        assert_eq!(
            d.desired.as_ref().unwrap(),
            json!({"mode": "fast", "x": 2}).as_object().unwrap()
        );
        assert_eq!(d.configurations["high"].status, "Applied");
        assert_eq!(d.configurations["newer"].status, "Applied");
        assert_eq!(d.configurations["low"].status, "Targeted");
        // Applied already: nothing to do.
        let mut done = t.clone();
        done.record.desired.body = d.desired.clone().unwrap();
        done.record.configurations = d.configurations.clone();
        assert!(decide(&[low.clone(), high.clone(), newer], &done, &row).is_none());
        // Without `newer` and `high`, `low` takes both paths back.
        let back = decide(&[low.clone()], &done, &row).unwrap();
        assert_eq!(
            back.desired.unwrap(),
            *json!({"mode": "slow", "x": 1}).as_object().unwrap()
        );
        // Untargeted: what it set is removed, and the map is empty.
        let (other, other_row) = twin(json!({"env": "prod"}), json!({}));
        let mut set_before = other.clone();
        set_before.record.desired.body = json!({"mode": "slow", "keep": 1})
            .as_object()
            .cloned()
            .unwrap();
        set_before.record.configurations =
            decide(&[low.clone()], &done, &row).unwrap().configurations;
        let removed = decide(&[low], &set_before, &other_row).unwrap();
        assert_eq!(
            removed.desired.unwrap(),
            *json!({"mode": null}).as_object().unwrap()
        );
        assert!(removed.configurations.is_empty());
    }
}
