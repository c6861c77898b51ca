//! Running a twin query [`Statement`] over rows: the WHERE test, the select list, and
//! aggregation with GROUP BY. Rows are JSON documents as `SELECT *` returns them (a twin, a
//! module twin, a device job); paths in the statement are rooted at the row.
//!
//! # Invariants
//! - A row passes WHERE only when the condition is exactly `true` (three-valued logic).
//! - An undefined value leaves its field out of a projected row, never `null`.
//! - Groups come out in the order their first row was seen; `COUNT()` without GROUP BY gives
//!   one row even over no rows (its count 0).

use std::collections::HashMap;

use serde_json::{Map, Number, Value};

use super::ast::{Expr, Step};
use super::eval::MessageView;
use super::statement::{Aggregate, ItemValue, Projection, Statement};

/// A row as the evaluator sees it: the document is the "body" paths are walked in.
struct Row<'a>(&'a Value);

impl MessageView for Row<'_> {
    fn system_property(&self, _name: &str) -> Option<Value> {
        None
    }

    fn application_property(&self, _name: &str) -> Option<Value> {
        None
    }

    fn body(&self) -> Option<&Value> {
        Some(self.0)
    }
}

fn value_of(expr: &Expr, row: &Value) -> Option<Value> {
    expr.eval(&Row(row)).map(|v| v.into_owned())
}

fn path_value(steps: &[Step], row: &Value) -> Option<Value> {
    value_of(&Expr::Body(steps.to_vec()), row)
}

impl Statement {
    /// Whether `row` passes the WHERE clause.
    pub fn matches(&self, row: &Value) -> bool {
        match &self.filter {
            None => true,
            Some(filter) => matches!(filter.eval(&Row(row)).as_deref(), Some(Value::Bool(true))),
        }
    }

    /// The output of a non-aggregated query for one row that passed WHERE.
    pub fn project(&self, row: Value) -> Value {
        let Projection::Items(items) = &self.projection else {
            return row;
        };
        let mut out = Map::new();
        for item in items {
            if let ItemValue::Plain(expr) = &item.value {
                if let Some(v) = value_of(expr, &row) {
                    out.insert(item.name.clone(), v);
                }
            }
        }
        Value::Object(out)
    }
}

#[derive(Debug, Clone)]
enum Acc {
    Count(u64),
    Sum {
        int: i64,
        float: f64,
        exact: bool,
        any: bool,
    },
    Avg {
        total: f64,
        n: u64,
    },
    Min(Option<Value>),
    Max(Option<Value>),
}

impl Acc {
    fn new(a: &Aggregate) -> Acc {
        match a {
            Aggregate::Count => Acc::Count(0),
            Aggregate::Sum(_) => Acc::Sum {
                int: 0,
                float: 0.0,
                exact: true,
                any: false,
            },
            Aggregate::Avg(_) => Acc::Avg { total: 0.0, n: 0 },
            Aggregate::Min(_) => Acc::Min(None),
            Aggregate::Max(_) => Acc::Max(None),
        }
    }

    fn add(&mut self, a: &Aggregate, row: &Value) {
        let arg = match a {
            Aggregate::Count => None,
            Aggregate::Sum(e) | Aggregate::Avg(e) | Aggregate::Min(e) | Aggregate::Max(e) => {
                value_of(e, row)
            }
        };
        match (self, arg) {
            (Acc::Count(n), _) => *n += 1,
            (
                Acc::Sum {
                    int,
                    float,
                    exact,
                    any,
                },
                Some(Value::Number(x)),
            ) => {
                *any = true;
                *float += x.as_f64().unwrap_or(0.0);
                match (x.as_i64(), *exact) {
                    (Some(i), true) => match int.checked_add(i) {
                        Some(s) => *int = s,
                        None => *exact = false,
                    },
                    _ => *exact = false,
                }
            }
            (Acc::Avg { total, n }, Some(Value::Number(x))) => {
                *total += x.as_f64().unwrap_or(0.0);
                *n += 1;
            }
            (Acc::Min(best), Some(v)) => keep(best, v, std::cmp::Ordering::Less),
            (Acc::Max(best), Some(v)) => keep(best, v, std::cmp::Ordering::Greater),
            _ => {}
        }
    }

    fn result(&self) -> Option<Value> {
        match self {
            Acc::Count(n) => Some(Value::from(*n)),
            Acc::Sum {
                int,
                float,
                exact,
                any,
            } => any.then(|| {
                if *exact {
                    Value::from(*int)
                } else {
                    Number::from_f64(*float).map_or(Value::Null, Value::Number)
                }
            }),
            Acc::Avg { total, n } => (*n > 0)
                .then(|| Number::from_f64(total / *n as f64).map_or(Value::Null, Value::Number)),
            Acc::Min(v) | Acc::Max(v) => v.clone(),
        }
    }
}

/// Keeps `candidate` when it orders `wanted` against the best so far (numbers with numbers,
/// strings with strings; other values are not comparable and are skipped).
fn keep(best: &mut Option<Value>, candidate: Value, wanted: std::cmp::Ordering) {
    let ordering = match (&*best, &candidate) {
        (None, Value::Number(_) | Value::String(_)) => {
            *best = Some(candidate);
            return;
        }
        (Some(Value::Number(a)), Value::Number(b)) => b
            .as_f64()
            .zip(a.as_f64())
            .and_then(|(b, a)| b.partial_cmp(&a)),
        (Some(Value::String(a)), Value::String(b)) => Some(b.as_str().cmp(a.as_str())),
        _ => None,
    };
    if ordering == Some(wanted) {
        *best = Some(candidate);
    }
}

struct Group {
    keys: Vec<Option<Value>>,
    accs: Vec<Acc>,
}

/// Aggregated rows being built.
pub struct Aggregation<'s> {
    statement: &'s Statement,
    groups: Vec<Group>,
    index: HashMap<String, usize>,
}

impl<'s> Aggregation<'s> {
    pub fn new(statement: &'s Statement) -> Self {
        Aggregation {
            statement,
            groups: Vec::new(),
            index: HashMap::new(),
        }
    }

    fn aggregates(&self) -> Vec<&'s Aggregate> {
        match &self.statement.projection {
            Projection::Items(items) => items
                .iter()
                .filter_map(|i| match &i.value {
                    ItemValue::Aggregate(a) => Some(a),
                    ItemValue::Plain(_) => None,
                })
                .collect(),
            Projection::Star => Vec::new(),
        }
    }

    /// Adds a row that passed WHERE.
    pub fn add(&mut self, row: &Value) {
        let keys: Vec<Option<Value>> = self
            .statement
            .group_by
            .iter()
            .map(|steps| path_value(steps, row))
            .collect();
        let key = serde_json::to_string(&keys).unwrap_or_default();
        let aggregates = self.aggregates();
        let at = *self.index.entry(key).or_insert_with(|| {
            self.groups.push(Group {
                keys,
                accs: aggregates.iter().map(|a| Acc::new(a)).collect(),
            });
            self.groups.len() - 1
        });
        let group = &mut self.groups[at];
        for (acc, a) in group.accs.iter_mut().zip(aggregates) {
            acc.add(a, row);
        }
    }

    /// The output rows.
    pub fn finish(mut self) -> Vec<Value> {
        if self.groups.is_empty() && self.statement.group_by.is_empty() {
            let aggregates = self.aggregates();
            self.groups.push(Group {
                keys: Vec::new(),
                accs: aggregates.iter().map(|a| Acc::new(a)).collect(),
            });
        }
        let Projection::Items(items) = &self.statement.projection else {
            return Vec::new();
        };
        self.groups
            .iter()
            .map(|group| {
                let mut out = Map::new();
                let mut accs = group.accs.iter();
                for item in items {
                    let value = match &item.value {
                        ItemValue::Aggregate(_) => accs.next().and_then(Acc::result),
                        ItemValue::Plain(Expr::Body(steps)) => self
                            .statement
                            .group_by
                            .iter()
                            .position(|g| g == steps)
                            .and_then(|i| group.keys[i].clone()),
                        ItemValue::Plain(_) => None,
                    };
                    if let Some(v) = value {
                        out.insert(item.name.clone(), v);
                    }
                }
                Value::Object(out)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows() -> Vec<Value> {
        vec![
            json!({"deviceId": "a", "status": "enabled", "tags": {"plant": "R43", "n": 1}, "properties": {"reported": {"fw": "1.0", "t": 20.5}}}),
            json!({"deviceId": "b", "status": "disabled", "tags": {"plant": "R43", "n": 2}, "properties": {"reported": {"fw": "1.0"}}}),
            json!({"deviceId": "c", "status": "enabled", "tags": {"plant": "X", "n": 3}, "properties": {"reported": {"fw": "2.0", "t": 30}}}),
            json!({"deviceId": "d", "status": "enabled", "tags": {}, "properties": {"reported": {}}}),
        ]
    }

    fn run(text: &str) -> Vec<Value> {
        let s = Statement::parse(text).unwrap();
        let matching: Vec<Value> = rows().into_iter().filter(|r| s.matches(r)).collect();
        if s.aggregated() {
            let mut agg = Aggregation::new(&s);
            matching.iter().for_each(|r| agg.add(r));
            agg.finish()
        } else {
            matching.into_iter().map(|r| s.project(r)).collect()
        }
    }

    fn ids(text: &str) -> Vec<String> {
        run(text)
            .iter()
            .map(|r| r["deviceId"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn where_operators_and_functions() {
        assert_eq!(
            ids("SELECT * FROM devices WHERE tags.plant = 'R43'"),
            ["a", "b"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE tags.plant != 'R43'"),
            ["c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE tags.n > 1 AND tags.n <= 3"),
            ["b", "c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE tags.n < 2 OR status = 'disabled'"),
            ["a", "b"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE NOT (status = 'enabled')"),
            ["b"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE tags.plant IN ['X', 'Y']"),
            ["c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE tags.plant NIN ['X']"),
            ["a", "b"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE IS_DEFINED(properties.reported.t)"),
            ["a", "c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE NOT IS_DEFINED(tags.plant)"),
            ["d"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE IS_NUMBER(properties.reported.t)"),
            ["a", "c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE IS_STRING(properties.reported.fw)"),
            ["a", "b", "c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE IS_OBJECT(tags) AND IS_BOOL(true)"),
            ["a", "b", "c", "d"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE STARTSWITH(properties.reported.fw, '2.')"),
            ["c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE ENDSWITH(tags.plant, '43')"),
            ["a", "b"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE CONTAINS(deviceId, 'b')"),
            ["b"]
        );
        assert_eq!(ids("SELECT * FROM devices WHERE tags.n * 2 + 1 = 5"), ["b"]);
        assert_eq!(
            ids("SELECT * FROM devices WHERE tags.n % 2 = 1 AND tags.n - 1 > 0"),
            ["c"]
        );
        assert_eq!(
            ids("SELECT * FROM devices WHERE Status = 'disabled'"),
            ["b"]
        );
    }

    #[test]
    fn projections_leave_undefined_out() {
        let rows = run(
            "SELECT deviceId, properties.reported.t AS temp FROM devices WHERE tags.plant = 'R43'",
        );
        assert_eq!(
            rows,
            [
                json!({"deviceId": "a", "temp": 20.5}),
                json!({"deviceId": "b"})
            ]
        );
    }

    #[test]
    fn counts_and_groups() {
        assert_eq!(run("SELECT COUNT() AS n FROM devices"), [json!({"n": 4})]);
        assert_eq!(
            run("SELECT COUNT() AS n FROM devices WHERE tags.plant = 'none'"),
            [json!({"n": 0})]
        );
        assert_eq!(
            run("SELECT properties.reported.fw AS fw, COUNT() AS n FROM devices GROUP BY properties.reported.fw"),
            [json!({"fw": "1.0", "n": 2}), json!({"fw": "2.0", "n": 1}), json!({"n": 1})]
        );
        assert_eq!(
            run("SELECT SUM(tags.n) AS s, AVG(tags.n) AS a, MIN(tags.n) AS lo, MAX(properties.reported.fw) AS hi FROM devices"),
            [json!({"s": 6, "a": 2.0, "lo": 1, "hi": "2.0"})]
        );
    }
}
