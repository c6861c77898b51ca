//! Values during evaluation and number semantics, shared by the operators (`eval`), the
//! built-in functions (`functions`) and the parser's constant folding (`-5`).
//!
//! Invariants:
//! - *Undefined* is `None`; no function here fails or panics.
//! - Integers stay exact while the result fits in an i64; anything else is an f64, and a
//!   non-finite f64 is undefined.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::lex::BinOp;

/// A value, or `None` for undefined. Borrowed where it can be (literals, `$body` fields), so
/// evaluation does not copy the body.
pub(crate) type Eval<'a> = Option<Cow<'a, Value>>;

/// By value: exactly for two integers, as f64 otherwise (so `1 = 1.0`).
pub(crate) fn compare_numbers(a: &Number, b: &Number) -> Option<Ordering> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return Some(x.cmp(&y));
    }
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return Some(x.cmp(&y));
    }
    a.as_f64()?.partial_cmp(&b.as_f64()?)
}

/// A finite f64 as a JSON number; NaN and infinities are undefined.
pub(crate) fn float_value(x: f64) -> Option<Value> {
    Number::from_f64(x).map(Value::Number)
}

/// Exact on integers when the result fits, f64 otherwise; division by zero is undefined.
pub(crate) fn arithmetic(op: BinOp, a: &Number, b: &Number) -> Option<Value> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        let exact = match op {
            BinOp::Add => x.checked_add(y),
            BinOp::Sub => x.checked_sub(y),
            BinOp::Mul => x.checked_mul(y),
            BinOp::Rem => x.checked_rem(y),
            _ => None,
        };
        if let Some(result) = exact {
            return Some(result.into());
        }
    }
    let (x, y) = (a.as_f64()?, b.as_f64()?);
    let result = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div | BinOp::Rem if y == 0.0 => return None,
        BinOp::Div => x / y,
        BinOp::Rem => x % y,
        _ => return None,
    };
    float_value(result)
}

/// Unary minus; the parser also uses it to fold `-5` into a literal.
pub(crate) fn negate(value: &Value) -> Option<Value> {
    let n = value.as_number()?;
    if let Some(negated) = n.as_i64().and_then(i64::checked_neg) {
        return Some(negated.into());
    }
    float_value(-n.as_f64()?)
}
