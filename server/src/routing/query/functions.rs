//! The built-in functions: their names, arity (checked when a condition is parsed) and what
//! they compute (when it is evaluated).
//!
//! Invariants:
//! - A call's arity is checked by the parser ([`Func::check_arity`]), so [`Func::apply`] may
//!   rely on it; a missing argument still yields undefined rather than a panic.
//! - Every function is total: an argument of the wrong type (or undefined) makes the result
//!   undefined, except the `IS_*` type checks, which are always `true` or `false`.
//! - Strings are measured and indexed in characters (`LENGTH`, `SUBSTRING`, `INDEX_OF`), not bytes.
//! - Math keeps integers exact where the result fits in an i64 and is otherwise an f64;
//!   non-finite results are undefined.

use serde_json::{Number, Value};

use super::ast::Func;
use super::value::{float_value, Eval};

fn arg<'v>(args: &'v [Eval<'_>], i: usize) -> Option<&'v Value> {
    args.get(i)?.as_deref()
}

fn text_arg<'v>(args: &'v [Eval<'_>], i: usize) -> Option<&'v str> {
    arg(args, i)?.as_str()
}

fn number_arg<'v>(args: &'v [Eval<'_>], i: usize) -> Option<&'v Number> {
    arg(args, i)?.as_number()
}

fn float_arg(args: &[Eval<'_>], i: usize) -> Option<f64> {
    number_arg(args, i)?.as_f64()
}

/// A character count for SUBSTRING: truncated, negative clamped to 0.
fn count_arg(args: &[Eval<'_>], i: usize) -> Option<usize> {
    let x = float_arg(args, i)?.trunc();
    Some(if x <= 0.0 { 0 } else { x as usize })
}

/// A math function that keeps integers exact when `int` can.
fn math(n: &Number, int: fn(i64) -> Option<i64>, float: fn(f64) -> f64) -> Option<Value> {
    if let Some(result) = n.as_i64().and_then(int) {
        return Some(result.into());
    }
    float_value(float(n.as_f64()?))
}

fn is(test: bool) -> Option<Value> {
    Some(Value::Bool(test))
}

impl Func {
    /// The result for these argument values; `None` (undefined) when an argument is missing or
    /// of the wrong type. The `IS_*` checks are never undefined.
    pub(crate) fn apply(self, args: &[Eval<'_>]) -> Option<Value> {
        let first = arg(args, 0);
        match self {
            Func::IsDefined => is(first.is_some()),
            Func::IsNull => is(matches!(first, Some(Value::Null))),
            Func::IsBool => is(matches!(first, Some(Value::Bool(_)))),
            Func::IsNumber => is(matches!(first, Some(Value::Number(_)))),
            Func::IsString => is(matches!(first, Some(Value::String(_)))),
            Func::IsObject => is(matches!(first, Some(Value::Object(_)))),
            Func::IsArray => is(matches!(first, Some(Value::Array(_)))),
            Func::IsPrimitive => is(matches!(
                first,
                Some(Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_))
            )),
            Func::StartsWith => is(text_arg(args, 0)?.starts_with(text_arg(args, 1)?)),
            Func::EndsWith => is(text_arg(args, 0)?.ends_with(text_arg(args, 1)?)),
            Func::Contains => is(text_arg(args, 0)?.contains(text_arg(args, 1)?)),
            Func::Length => Some(text_arg(args, 0)?.chars().count().into()),
            Func::Lower => Some(text_arg(args, 0)?.to_lowercase().into()),
            Func::Upper => Some(text_arg(args, 0)?.to_uppercase().into()),
            Func::Ltrim => Some(text_arg(args, 0)?.trim_start().into()),
            Func::Rtrim => Some(text_arg(args, 0)?.trim_end().into()),
            Func::Trim => Some(text_arg(args, 0)?.trim().into()),
            Func::Concat => {
                let mut joined = String::new();
                for i in 0..args.len() {
                    joined.push_str(text_arg(args, i)?);
                }
                Some(joined.into())
            }
            Func::Substring => {
                let text = text_arg(args, 0)?;
                let (start, len) = (count_arg(args, 1)?, count_arg(args, 2)?);
                Some(
                    text.chars()
                        .skip(start)
                        .take(len)
                        .collect::<String>()
                        .into(),
                )
            }
            Func::IndexOf => {
                let text = text_arg(args, 0)?;
                let index = match text.find(text_arg(args, 1)?) {
                    Some(byte) => text[..byte].chars().count() as i64,
                    None => -1,
                };
                Some(index.into())
            }
            Func::Abs => math(number_arg(args, 0)?, i64::checked_abs, f64::abs),
            Func::Ceiling => math(number_arg(args, 0)?, Some, f64::ceil),
            Func::Floor => math(number_arg(args, 0)?, Some, f64::floor),
            Func::Round => math(number_arg(args, 0)?, Some, f64::round),
            Func::Square => math(number_arg(args, 0)?, |i| i.checked_mul(i), |x| x * x),
            Func::Sqrt => float_value(float_arg(args, 0)?.sqrt()),
            Func::Power => float_value(float_arg(args, 0)?.powf(float_arg(args, 1)?)),
            Func::Sign => {
                let x = float_arg(args, 0)?;
                let sign: i64 = if x > 0.0 {
                    1
                } else if x < 0.0 {
                    -1
                } else {
                    0
                };
                Some(sign.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::routing::query::test_support::*;

    #[test]
    fn is_defined_on_properties_and_body_paths() {
        assert_all(
            &sample(),
            &[
                "IS_DEFINED(level)",
                "NOT IS_DEFINED(missing)",
                "IS_DEFINED($contentType)",
                "NOT IS_DEFINED($userId)",
                "IS_DEFINED($body.weather.wind.speed)",
                "NOT IS_DEFINED($body.weather.rain)",
                "NOT IS_DEFINED($body.weather.sky.deeper)",
                "IS_DEFINED($body.nothing)",
                "IS_DEFINED($body)",
                "IS_DEFINED([iothub-message-schema])",
            ],
            &["IS_DEFINED(missing)", "IS_DEFINED($body.absent)"],
        );
    }

    #[test]
    fn type_check_functions_are_never_undefined() {
        let m = sample();
        let cases = [
            ("IS_NULL($body.nothing)", true),
            ("IS_NULL($body.absent)", false),
            ("IS_BOOL($body.ok)", true),
            ("IS_BOOL(level)", false),
            ("IS_NUMBER($body.count)", true),
            ("IS_NUMBER(temp)", false),
            ("IS_STRING(temp)", true),
            ("IS_STRING(missing)", false),
            ("IS_OBJECT($body.weather)", true),
            ("IS_OBJECT($body.readings)", false),
            ("IS_ARRAY($body.readings)", true),
            ("IS_ARRAY($body)", false),
            ("IS_PRIMITIVE($body.nothing)", true),
            ("IS_PRIMITIVE(level)", true),
            ("IS_PRIMITIVE($body.weather)", false),
            ("IS_PRIMITIVE(missing)", false),
        ];
        for (text, expected) in cases {
            assert_eq!(eval(text, &m), Some(json!(expected)), "{text}");
        }
    }

    #[test]
    fn string_functions() {
        let m = sample();
        let cases = [
            ("STARTS_WITH(level, 'crit')", json!(true)),
            ("STARTS_WITH(level, 'tical')", json!(false)),
            ("ENDS_WITH(level, 'tical')", json!(true)),
            ("ENDS_WITH(level, 'crit')", json!(false)),
            ("CONTAINS(level, 'iti')", json!(true)),
            ("CONTAINS(level, 'xyz')", json!(false)),
            ("CONTAINS(level, '')", json!(true)),
            ("LENGTH(level)", json!(8)),
            ("LENGTH('Ünïcødé')", json!(7)),
            ("LENGTH('')", json!(0)),
            ("LOWER('AbC É')", json!("abc é")),
            ("UPPER('AbC é')", json!("ABC É")),
            ("CONCAT('a', 'b')", json!("ab")),
            (
                "CONCAT(level, '-', $connectionDeviceId)",
                json!("critical-thermo-1"),
            ),
            ("SUBSTRING('hello', 1, 3)", json!("ell")),
            ("SUBSTRING('héllo', 1, 2)", json!("él")),
            ("SUBSTRING('hello', 3, 100)", json!("lo")),
            ("SUBSTRING('hello', -2, 2)", json!("he")),
            ("SUBSTRING('hello', 9, 2)", json!("")),
            ("SUBSTRING('hello', 1, -1)", json!("")),
            ("INDEX_OF('hello', 'l')", json!(2)),
            ("INDEX_OF('héllo', 'l')", json!(2)),
            ("INDEX_OF('hello', 'z')", json!(-1)),
            ("INDEX_OF('hello', '')", json!(0)),
            ("LTRIM('  a b  ')", json!("a b  ")),
            ("RTRIM('  a b  ')", json!("  a b")),
            ("TRIM($body.name)", json!("Sensor Ünit")),
        ];
        for (text, expected) in cases {
            assert_eq!(eval(text, &m), Some(expected), "{text}");
        }
        let undefined = [
            "STARTS_WITH(missing, 'a')",
            "STARTS_WITH(level, 1)",
            "ENDS_WITH(1, '1')",
            "CONTAINS(level, missing)",
            "LENGTH(42)",
            "LOWER(missing)",
            "UPPER(true)",
            "CONCAT('a', 1)",
            "CONCAT('a', missing, 'b')",
            "SUBSTRING('abc', '1', 1)",
            "SUBSTRING(missing, 0, 1)",
            "INDEX_OF(null, 'a')",
            "LTRIM(1)",
            "RTRIM(missing)",
            "TRIM($body.weather)",
        ];
        for text in undefined {
            assert_eq!(eval(text, &m), None, "{text}");
        }
        assert_all(
            &m,
            &[
                "STARTS_WITH($contentType, 'application/')",
                "LOWER(UPPER(level)) = level",
                "LENGTH(TRIM($body.name)) = 11",
            ],
            &["NOT STARTS_WITH(missing, 'a')"],
        );
    }

    #[test]
    fn math_functions() {
        let m = sample();
        let cases = [
            ("ABS(-3)", json!(3)),
            ("ABS(-2.5)", json!(2.5)),
            ("CEILING(1.2)", json!(2.0)),
            ("CEILING(-1.2)", json!(-1.0)),
            ("CEILING(4)", json!(4)),
            ("FLOOR(1.8)", json!(1.0)),
            ("FLOOR(-1.2)", json!(-2.0)),
            ("ROUND(2.5)", json!(3.0)),
            ("ROUND(-2.5)", json!(-3.0)),
            ("ROUND(2.4)", json!(2.0)),
            ("SQUARE(4)", json!(16)),
            ("SQUARE(1.5)", json!(2.25)),
            ("SQRT(16)", json!(4.0)),
            ("POWER(2, 10)", json!(1024.0)),
            ("POWER(4, 0.5)", json!(2.0)),
            ("SIGN(-7.5)", json!(-1)),
            ("SIGN(0)", json!(0)),
            ("SIGN($body.humidity)", json!(1)),
        ];
        for (text, expected) in cases {
            assert_eq!(eval(text, &m), Some(expected), "{text}");
        }
        for text in [
            "ABS('1')",
            "SQRT(-1)",
            "POWER(10, 400)",
            "FLOOR(missing)",
            "SIGN(null)",
        ] {
            assert_eq!(eval(text, &m), None, "{text}");
        }
        assert_all(
            &m,
            &[
                "ROUND($body.temperature) = 32",
                "FLOOR($body.temperature) = 31",
            ],
            &[],
        );
    }
}
