//! Evaluation of a parsed expression against one message: what [`MessageView`] a condition
//! reads, and the operators' semantics.
//!
//! Invariants:
//! - Evaluation is total: it never fails and never panics; anything it cannot compute (a
//!   missing property or field, mismatched types, division by zero, a non-finite result) is
//!   *undefined* (`None`), and undefined propagates through comparisons and arithmetic.
//! - `AND`/`OR` are three-valued and short-circuit on their dominant value (`false` for `AND`,
//!   `true` for `OR`), so a later undefined operand cannot change a decided result.
//! - Comparisons only relate two values of one type (numbers by value, exactly for integers;
//!   strings by code point; booleans and nulls only with `=`/`!=`).
//! - `+`, `-`, `*` and `%` on two integers stay exact while the result fits in an i64; `/`
//!   and everything else is computed in f64.
//! - Evaluation only reads: the view may load the body or twin lazily, but the expression is
//!   shared (`Send + Sync`) and never changes.

use std::borrow::Cow;

use serde_json::Value;

use super::ast::{Expr, Step};
use super::lex::BinOp;
use super::value::{arithmetic, compare_numbers, negate, Eval};

/// What a condition can look at in one message. Values are JSON values; `None` = undefined.
pub trait MessageView {
    /// A system property by its routing keyword without the `$`, e.g. "contentType",
    /// "contentEncoding", "messageId", "correlationId", "userId", "connectionDeviceId",
    /// "connectionModuleId", "enqueuedTime", "iothub-connection-device-id".
    fn system_property(&self, name: &str) -> Option<Value>;
    /// An application property by name (case-sensitive).
    fn application_property(&self, name: &str) -> Option<Value>;
    /// The message body as JSON, or None when the body is not JSON (the caller decides:
    /// only content type application/json with encoding utf-8/utf-16/utf-32 is queryable).
    fn body(&self) -> Option<&Value>;
    /// A twin path as written after `$twin.`, e.g. ["tags","location"] or
    /// ["properties","reported","fw"]; None when undefined. (Default impl returns None.)
    fn twin(&self, _path: &[String]) -> Option<Value> {
        None
    }
}

fn owned<'a>(value: Option<Value>) -> Eval<'a> {
    value.map(Cow::Owned)
}

impl Expr {
    /// The value of this expression for one message; never fails, only yields undefined.
    pub(crate) fn eval<'a>(&'a self, m: &'a dyn MessageView) -> Eval<'a> {
        match self {
            Expr::Literal(value) => Some(Cow::Borrowed(value)),
            Expr::System(name) => owned(m.system_property(name)),
            Expr::App(name) => owned(m.application_property(name)),
            Expr::Body(path) => walk(m.body()?, path).map(Cow::Borrowed),
            Expr::Twin { names, rest } => {
                let root = m.twin(names)?;
                if rest.is_empty() {
                    Some(Cow::Owned(root))
                } else {
                    owned(walk(&root, rest).cloned())
                }
            }
            Expr::Not(inner) => match inner.eval(m).as_deref() {
                Some(Value::Bool(b)) => owned(Some(Value::Bool(!b))),
                _ => None,
            },
            Expr::Neg(inner) => owned(negate(inner.eval(m)?.as_ref())),
            Expr::And(terms) => logic(terms, m, false),
            Expr::Or(terms) => logic(terms, m, true),
            Expr::Chain(first, rest) => {
                let mut acc = first.eval(m);
                for (op, operand) in rest {
                    acc = owned(binary(*op, acc.as_deref(), operand.eval(m).as_deref()));
                }
                acc
            }
            Expr::Call(func, args) => {
                let values: Vec<Eval<'a>> = args.iter().map(|a| a.eval(m)).collect();
                owned(func.apply(&values))
            }
            Expr::In {
                expr,
                list,
                negated,
            } => {
                let value = expr.eval(m)?;
                let found = list
                    .iter()
                    .any(|c| compare(BinOp::Eq, &value, c) == Some(true));
                owned(Some(Value::Bool(found != *negated)))
            }
        }
    }
}

fn walk<'v>(mut value: &'v Value, path: &[Step]) -> Option<&'v Value> {
    for step in path {
        value = match step {
            Step::Field(name) => value.get(name.as_str())?,
            Step::Index(i) => value.get(*i)?,
        };
    }
    Some(value)
}

/// AND (`dominant` false) or OR (`dominant` true) in three-valued logic: any operand equal to
/// `dominant` decides; otherwise any non-boolean operand makes the result undefined.
fn logic<'a>(terms: &'a [Expr], m: &'a dyn MessageView, dominant: bool) -> Eval<'a> {
    let mut all_boolean = true;
    for term in terms {
        match term.eval(m).as_deref() {
            Some(Value::Bool(b)) if *b == dominant => return owned(Some(Value::Bool(dominant))),
            Some(Value::Bool(_)) => {}
            _ => all_boolean = false,
        }
    }
    all_boolean.then_some(Cow::Owned(Value::Bool(!dominant)))
}

fn binary(op: BinOp, left: Option<&Value>, right: Option<&Value>) -> Option<Value> {
    let (left, right) = (left?, right?);
    match op {
        BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            compare(op, left, right).map(Value::Bool)
        }
        BinOp::Concat => match (left, right) {
            (Value::String(a), Value::String(b)) => Some(Value::String(format!("{a}{b}"))),
            _ => None,
        },
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem => {
            arithmetic(op, left.as_number()?, right.as_number()?)
        }
    }
}

fn compare(op: BinOp, left: &Value, right: &Value) -> Option<bool> {
    let ordering = match (left, right) {
        (Value::Number(a), Value::Number(b)) => compare_numbers(a, b)?,
        (Value::String(a), Value::String(b)) => a.cmp(b),
        (Value::Bool(a), Value::Bool(b)) => return equality(op, a == b),
        (Value::Null, Value::Null) => return equality(op, true),
        _ => return None,
    };
    Some(match op {
        BinOp::Eq => ordering.is_eq(),
        BinOp::Ne => ordering.is_ne(),
        BinOp::Lt => ordering.is_lt(),
        BinOp::Le => ordering.is_le(),
        BinOp::Gt => ordering.is_gt(),
        BinOp::Ge => ordering.is_ge(),
        _ => return None,
    })
}

/// Booleans and nulls only support `=` and `!=`.
fn equality(op: BinOp, equal: bool) -> Option<bool> {
    match op {
        BinOp::Eq => Some(equal),
        BinOp::Ne => Some(!equal),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::routing::query::test_support::*;

    #[test]
    fn system_property_equality_and_inequality() {
        assert_all(
            &sample(),
            &[
                "$contentType = 'application/json'",
                "$connectionDeviceId = \"thermo-1\"",
                "$iothub-connection-device-id = 'thermo-1'",
                "$contentEncoding != 'utf-16'",
                "$messageId <> 'm-2'",
            ],
            &[
                "$contentType = 'text/plain'",
                "$contentType != 'application/json'",
                "$correlationId = 'x'",
                "$correlationId != 'x'",
            ],
        );
    }

    #[test]
    fn application_property_equality_and_inequality() {
        assert_all(
            &sample(),
            &["level = 'critical'", "level != 'normal'", "Empty = ''"],
            &[
                "level = 'normal'",
                "level <> 'critical'",
                "Level = 'critical'",
                "missing != 'x'",
            ],
        );
    }

    #[test]
    fn body_field_equality_and_inequality() {
        assert_all(
            &sample(),
            &[
                "$body.weather.sky = 'clear'",
                "$body.ok = true",
                "$body.ok != false",
                "$body.nothing = null",
                "$body.count = 3",
            ],
            &[
                "$body.weather.sky = 'cloudy'",
                "$body.nothing != null",
                "$body.absent = null",
            ],
        );
    }

    #[test]
    fn numeric_comparisons_on_body_numbers() {
        assert_all(
            &sample(),
            &[
                "$body.temperature > 30",
                "$body.temperature >= 31.5",
                "$body.temperature < 32",
                "$body.humidity <= 40",
                "$body.humidity = 40.0",
                "1 = 1.0",
                "$body.temperature > -1e3",
                "$body.count * 2 + 1 = 7",
                "9223372036854775807 > 9223372036854775806",
                "18446744073709551615 > 9223372036854775807",
            ],
            &[
                "$body.temperature > 31.5",
                "$body.humidity < 40",
                "$body.humidity != 40",
            ],
        );
    }

    #[test]
    fn string_comparison_is_by_code_point() {
        assert_all(
            &sample(),
            &[
                "'abc' < 'abd'",
                "'B' < 'a'",
                "'a' < 'ab'",
                "'z' < 'é'",
                "level >= 'critical'",
                "level > 'crit'",
            ],
            &["'abc' > 'abd'", "'a' = 'A'"],
        );
    }

    #[test]
    fn arithmetic_and_precedence() {
        let m = TestMessage::default();
        assert_eq!(eval("1 + 2 * 3", &m), Some(json!(7)));
        assert_eq!(eval("(1 + 2) * 3", &m), Some(json!(9)));
        assert_eq!(eval("10 - 4 - 3", &m), Some(json!(3)));
        assert_eq!(eval("7 / 2", &m), Some(json!(3.5)));
        assert_eq!(eval("7 % 3", &m), Some(json!(1)));
        assert_eq!(eval("-2 * -3", &m), Some(json!(6)));
        assert_eq!(eval("- (2 + 3)", &m), Some(json!(-5)));
        assert_eq!(eval("1.5e1 + 0.5", &m), Some(json!(15.5)));
        assert_eq!(eval("'a' || 'b' || 'c'", &m), Some(json!("abc")));
        assert_eq!(eval("1 + 2 = 3", &m), Some(json!(true)));
        assert_eq!(eval("NOT 1 = 2 AND 2 = 2", &m), Some(json!(true)));
        assert_eq!(eval("1 = 2 OR 2 = 2 AND 3 = 3", &m), Some(json!(true)));
        // Undefined arithmetic.
        assert_eq!(eval("1 / 0", &m), None);
        assert_eq!(eval("1 % 0", &m), None);
        assert_eq!(eval("1.5 / 0", &m), None);
        assert_eq!(eval("'a' + 'b'", &m), None);
        assert_eq!(eval("'a' + 1", &m), None);
        assert_eq!(eval("1 || 'a'", &m), None);
        assert_eq!(eval("-'a'", &m), None);
        assert_eq!(eval("1e308 * 10", &m), None);
        assert_eq!(
            eval("9223372036854775807 + 1", &m),
            Some(json!(9.223372036854776e18))
        );
    }

    #[test]
    fn and_or_not_two_valued() {
        assert_all(
            &sample(),
            &[
                "level = 'critical' AND $body.ok = true",
                "level = 'normal' OR $body.ok = true",
                "NOT level = 'normal'",
                "NOT (level = 'normal' OR level = 'low')",
                "NOT NOT true",
                "true",
            ],
            &[
                "level = 'critical' AND $body.ok = false",
                "level = 'normal' OR $body.ok = false",
                "NOT level = 'critical'",
                "false",
            ],
        );
    }

    #[test]
    fn and_or_not_three_valued() {
        let m = sample();
        // `missing = 1` is undefined.
        assert_eq!(eval("missing = 1", &m), None);
        assert_eq!(eval("false AND missing = 1", &m), Some(json!(false)));
        assert_eq!(eval("missing = 1 AND false", &m), Some(json!(false)));
        assert_eq!(eval("true AND missing = 1", &m), None);
        assert_eq!(eval("true OR missing = 1", &m), Some(json!(true)));
        assert_eq!(eval("missing = 1 OR true", &m), Some(json!(true)));
        assert_eq!(eval("false OR missing = 1", &m), None);
        assert_eq!(eval("NOT missing = 1", &m), None);
        assert_eq!(eval("NOT 'text'", &m), None);
        assert_eq!(eval("true AND 1", &m), None);
        assert_eq!(eval("false AND 1", &m), Some(json!(false)));
        assert_eq!(eval("true AND true AND true", &m), Some(json!(true)));
        assert_eq!(eval("false OR false OR false", &m), Some(json!(false)));
        assert_all(
            &m,
            &["true OR missing = 1", "NOT (false AND missing = 1)"],
            &[
                "NOT missing = 1",
                "missing = 1 OR false",
                "NOT (true AND missing = 1)",
            ],
        );
    }

    #[test]
    fn nested_body_fields_and_array_indexes() {
        assert_all(
            &sample(),
            &[
                "$body.weather.wind.speed = 12",
                "$body.readings[0] = 10",
                "$body.readings[1] > $body.readings[0]",
                "$body.readings[2].v = 30",
                "$body[\"odd keys\"]['key with space'] = 'yes'",
                "$body.weather['wind'].speed = 12",
                "$body . weather . sky = 'clear'",
            ],
            &[
                "$body.readings[3] = 10",
                "$body.readings[0].v = 10",
                "$body.weather[0] = 12",
                "$body.readings.v = 30",
            ],
        );
    }

    #[test]
    fn body_is_undefined_without_a_json_body() {
        let m = TestMessage::default().app("level", "critical");
        assert_all(
            &m,
            &["NOT IS_DEFINED($body)", "level = 'critical' OR $body.x = 1"],
            &[
                "$body.x = 1",
                "NOT ($body.x = 1)",
                "$body.x != 1",
                "$body = null",
                "IS_DEFINED($body.x)",
                "level = 'critical' AND $body.x = 1",
            ],
        );
    }

    #[test]
    fn mismatched_types_do_not_match() {
        assert_all(
            &sample(),
            &["temp = '35'", "temp > '30'"],
            &[
                "temp > 30",
                "temp = 35",
                "NOT temp = 35",
                "$body.count = '3'",
                "$body.ok = 'true'",
                "$body.ok > false",
                "null < null",
                "$body.nothing = 0",
                "$body.weather = $body.weather",
                "$body.readings = $body.readings",
                "level = true",
                "level",
                "$body.count",
            ],
        );
        assert_eq!(eval("temp > 30", &sample()), None);
        assert_eq!(eval("null = null", &sample()), Some(json!(true)));
        assert_eq!(eval("null != null", &sample()), Some(json!(false)));
    }

    #[test]
    fn twin_references() {
        assert_all(
            &sample(),
            &[
                "$twin.tags.location = 'west'",
                "$twin.tags.floor >= 3",
                "$twin.properties.reported.fw = '1.2.0'",
                "$twin.properties.reported.sensors[1] = 'b'",
                "$twin['tags'].location = 'west'",
                "IS_OBJECT($twin.tags)",
                "NOT IS_DEFINED($twin.tags.missing)",
            ],
            &[
                "$twin.tags.location = 'east'",
                "$twin.properties.desired.x = 1",
            ],
        );
        match parse("$twin.properties.reported.sensors[1].x").expr {
            Expr::Twin { names, rest } => {
                assert_eq!(names, ["properties", "reported", "sensors"]);
                assert_eq!(rest, [Step::Index(1), Step::Field("x".into())]);
            }
            other => panic!("unexpected {other:?}"),
        }
        // The default `twin` is undefined.
        struct NoTwin;
        impl MessageView for NoTwin {
            fn system_property(&self, _: &str) -> Option<Value> {
                None
            }
            fn application_property(&self, _: &str) -> Option<Value> {
                None
            }
            fn body(&self) -> Option<&Value> {
                None
            }
        }
        assert!(!parse("$twin.tags.location = 'west'").matches(&NoTwin));
        assert!(parse("NOT IS_DEFINED($twin.tags)").matches(&NoTwin));
    }

    #[test]
    fn lone_literals_and_references() {
        let m = sample().app("flag", true).app("text", "true");
        assert_all(
            &m,
            &[
                "true",
                " TRUE ",
                "(true)",
                "flag",
                "$body.ok",
                "IS_DEFINED(level)",
            ],
            &[
                "false",
                "null",
                "1",
                "'true'",
                "text",
                "missing",
                "$body.weather",
            ],
        );
        assert!(parse("true").matches(&TestMessage::default()));
    }
}
