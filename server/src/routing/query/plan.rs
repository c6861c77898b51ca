//! Which index probes could answer a twin query: from the top-level AND terms of its WHERE,
//! a comparison of a document path with a constant (`=`, `<`, `<=`, `>`, `>=`), `IN` a list
//! of scalars, or `STARTSWITH(path, 'text')`.
//!
//! # Invariants
//! - A probe selects a superset of the rows the whole condition selects: it comes from one
//!   term that every matching row must satisfy, and it only narrows on values of the
//!   constant's own type, as comparisons do. Rows are always re-checked against the whole
//!   condition.
//! - `!=`, `NIN`, `NOT` and OR give no probe (they select rows outside any one value range).

use ferrohub_engine::twin_index::Probe;
use serde_json::Value;

use super::ast::{Expr, Func, Step};
use super::lex::BinOp;
use super::statement::Statement;

/// A probe on one dotted path.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexProbe {
    pub path: String,
    pub probe: Probe,
}

fn dotted(steps: &[Step]) -> Option<String> {
    let names: Option<Vec<&str>> = steps
        .iter()
        .map(|s| match s {
            Step::Field(name) => Some(name.as_str()),
            Step::Index(_) => None,
        })
        .collect();
    Some(names?.join("."))
}

fn scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

/// `op` with its operands swapped (`3 < x` is `x > 3`).
fn flipped(op: BinOp) -> BinOp {
    match op {
        BinOp::Lt => BinOp::Gt,
        BinOp::Le => BinOp::Ge,
        BinOp::Gt => BinOp::Lt,
        BinOp::Ge => BinOp::Le,
        other => other,
    }
}

fn comparison(path: &[Step], op: BinOp, value: &Value) -> Option<IndexProbe> {
    if !scalar(value) {
        return None;
    }
    let probe = match op {
        BinOp::Eq => Probe::Eq(vec![value.clone()]),
        BinOp::Lt | BinOp::Le => Probe::Range {
            lo: None,
            hi: Some((value.clone(), op == BinOp::Le)),
        },
        BinOp::Gt | BinOp::Ge => Probe::Range {
            lo: Some((value.clone(), op == BinOp::Ge)),
            hi: None,
        },
        _ => return None,
    };
    Some(IndexProbe {
        path: dotted(path)?,
        probe,
    })
}

fn term_probe(term: &Expr) -> Option<IndexProbe> {
    match term {
        Expr::Chain(left, rest) if rest.len() == 1 => {
            let (op, right) = &rest[0];
            match (left.as_ref(), right) {
                (Expr::Body(path), Expr::Literal(v)) => comparison(path, *op, v),
                (Expr::Literal(v), Expr::Body(path)) => comparison(path, flipped(*op), v),
                _ => None,
            }
        }
        Expr::In {
            expr,
            list,
            negated: false,
        } => match expr.as_ref() {
            Expr::Body(path) if !list.is_empty() && list.iter().all(scalar) => Some(IndexProbe {
                path: dotted(path)?,
                probe: Probe::Eq(list.clone()),
            }),
            _ => None,
        },
        Expr::Call(Func::StartsWith, args) => match args.as_slice() {
            [Expr::Body(path), Expr::Literal(Value::String(prefix))] => Some(IndexProbe {
                path: dotted(path)?,
                probe: Probe::Prefix(prefix.clone()),
            }),
            _ => None,
        },
        _ => None,
    }
}

fn rank(p: &IndexProbe) -> u8 {
    match &p.probe {
        Probe::Eq(values) if values.len() == 1 => 0,
        Probe::Eq(_) => 1,
        Probe::Prefix(_) => 2,
        Probe::Range {
            lo: Some(_),
            hi: Some(_),
        } => 3,
        Probe::Range { .. } => 4,
    }
}

impl Statement {
    /// Probes that could narrow this query's rows, most selective kind first.
    pub fn index_probes(&self) -> Vec<IndexProbe> {
        let terms: Vec<&Expr> = match &self.filter {
            None => Vec::new(),
            Some(Expr::And(terms)) => terms.iter().collect(),
            Some(single) => vec![single],
        };
        let mut probes: Vec<IndexProbe> = terms.into_iter().filter_map(term_probe).collect();
        // Two bounds on one path make one range.
        let mut merged: Vec<IndexProbe> = Vec::new();
        for p in probes.drain(..) {
            let same = merged.iter_mut().find(|m| m.path == p.path);
            match (same, p.probe) {
                (
                    Some(IndexProbe {
                        probe: Probe::Range { lo, hi },
                        ..
                    }),
                    Probe::Range { lo: lo2, hi: hi2 },
                ) if (lo.is_none() && hi2.is_none()) || (hi.is_none() && lo2.is_none()) => {
                    *lo = lo.take().or(lo2);
                    *hi = hi.take().or(hi2);
                }
                (_, probe) => merged.push(IndexProbe {
                    path: p.path,
                    probe,
                }),
            }
        }
        merged.sort_by_key(rank);
        merged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn probes(condition: &str) -> Vec<IndexProbe> {
        Statement::target(condition).unwrap().index_probes()
    }

    #[test]
    fn and_terms_give_probes_and_the_rest_gives_none() {
        assert_eq!(
            probes("tags.n > 3 AND tags.plant = 'Lyon'"),
            [
                IndexProbe {
                    path: "tags.plant".into(),
                    probe: Probe::Eq(vec![json!("Lyon")])
                },
                IndexProbe {
                    path: "tags.n".into(),
                    probe: Probe::Range {
                        lo: Some((json!(3), false)),
                        hi: None
                    }
                },
            ]
        );
        assert_eq!(
            probes("3 <= tags.n AND tags.n < 9")[0].probe,
            Probe::Range {
                lo: Some((json!(3), true)),
                hi: Some((json!(9), false))
            }
        );
        assert_eq!(
            probes("tags.s IN ['a', 'b']")[0].probe,
            Probe::Eq(vec![json!("a"), json!("b")])
        );
        assert_eq!(
            probes("STARTSWITH(tags.s, 'ab')")[0].probe,
            Probe::Prefix("ab".into())
        );
        assert_eq!(
            probes("connectionState = 'Connected'")[0].path,
            "connectionState"
        );
        for none in [
            "tags.a = 1 OR tags.b = 2",
            "NOT tags.a = 1",
            "tags.a != 1",
            "tags.a NIN [1]",
            "tags.a = tags.b",
            "tags.a[0] = 1",
            "tags.a = {\"x\": 1}",
        ] {
            assert!(
                Statement::target(none)
                    .map(|s| s.index_probes().is_empty())
                    .unwrap_or(true),
                "{none}"
            );
        }
    }
}
