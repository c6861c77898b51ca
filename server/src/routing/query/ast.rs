//! The expression tree a parsed condition becomes, and the built-in functions' names and
//! arity: what the parser builds and the evaluator walks, shared by both so neither depends on
//! the other.
//!
//! Invariants:
//! - Names are resolved when the tree is built: a `Call` names a known [`Func`] whose arity
//!   was checked, and a `System` property carries its canonical spelling.

use serde_json::Value;

use super::lex::BinOp;
use super::QueryError;

/// One step of a `$body` / `$twin` path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    Field(String),
    Index(usize),
}

/// A parsed expression; evaluated by `Expr::eval`.
#[derive(Debug, Clone)]
pub(crate) enum Expr {
    Literal(Value),
    /// `$name`, by its canonical name.
    System(String),
    /// An application property.
    App(String),
    Body(Vec<Step>),
    /// `$twin`: the leading field names go to [`MessageView::twin`], the rest (from the first
    /// array index on) is walked in the value it returns.
    ///
    /// [`MessageView::twin`]: super::MessageView::twin
    Twin {
        names: Vec<String>,
        rest: Vec<Step>,
    },
    Not(Box<Expr>),
    Neg(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    /// A left-associative run of operators of one precedence level: `a op b op c`.
    Chain(Box<Expr>, Vec<(BinOp, Expr)>),
    Call(Func, Vec<Expr>),
    /// `expr IN [constants]`, or `NIN` when `negated` (twin query dialect).
    In {
        expr: Box<Expr>,
        list: Vec<Value>,
        negated: bool,
    },
}

impl Expr {
    /// Whether evaluating it may ask for the device's twin (which routing must fetch from
    /// storage).
    pub(crate) fn reads_twin(&self) -> bool {
        match self {
            Expr::Twin { .. } => true,
            Expr::Literal(_) | Expr::System(_) | Expr::App(_) | Expr::Body(_) => false,
            Expr::Not(e) | Expr::Neg(e) => e.reads_twin(),
            Expr::And(terms) | Expr::Or(terms) | Expr::Call(_, terms) => {
                terms.iter().any(Expr::reads_twin)
            }
            Expr::Chain(first, rest) => {
                first.reads_twin() || rest.iter().any(|(_, e)| e.reads_twin())
            }
            Expr::In { expr, .. } => expr.reads_twin(),
        }
    }

    /// Calls `visit` on every document path (`Body`) in the tree, to rewrite it.
    pub(crate) fn visit_paths(&mut self, visit: &mut impl FnMut(&mut Vec<Step>)) {
        match self {
            Expr::Body(steps) => visit(steps),
            Expr::Literal(_) | Expr::System(_) | Expr::App(_) | Expr::Twin { .. } => {}
            Expr::Not(e) | Expr::Neg(e) => e.visit_paths(visit),
            Expr::In { expr, .. } => expr.visit_paths(visit),
            Expr::And(terms) | Expr::Or(terms) | Expr::Call(_, terms) => {
                terms.iter_mut().for_each(|t| t.visit_paths(visit))
            }
            Expr::Chain(first, rest) => {
                first.visit_paths(visit);
                rest.iter_mut().for_each(|(_, e)| e.visit_paths(visit));
            }
        }
    }
}

/// A built-in function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    IsDefined,
    IsNull,
    IsBool,
    IsNumber,
    IsString,
    IsObject,
    IsArray,
    IsPrimitive,
    StartsWith,
    EndsWith,
    Contains,
    Length,
    Lower,
    Upper,
    Concat,
    Substring,
    IndexOf,
    Ltrim,
    Rtrim,
    Trim,
    Abs,
    Ceiling,
    Floor,
    Round,
    Square,
    Sqrt,
    Power,
    Sign,
}

/// Names as IoT Hub spells them (error messages use this spelling); looked up
/// case-insensitively.
const FUNCTIONS: &[(&str, Func)] = &[
    ("IS_DEFINED", Func::IsDefined),
    ("IS_NULL", Func::IsNull),
    ("IS_BOOL", Func::IsBool),
    ("IS_NUMBER", Func::IsNumber),
    ("IS_STRING", Func::IsString),
    ("IS_OBJECT", Func::IsObject),
    ("IS_ARRAY", Func::IsArray),
    ("IS_PRIMITIVE", Func::IsPrimitive),
    ("STARTS_WITH", Func::StartsWith),
    ("ENDS_WITH", Func::EndsWith),
    ("CONTAINS", Func::Contains),
    ("LENGTH", Func::Length),
    ("LOWER", Func::Lower),
    ("UPPER", Func::Upper),
    ("CONCAT", Func::Concat),
    ("SUBSTRING", Func::Substring),
    ("INDEX_OF", Func::IndexOf),
    ("LTRIM", Func::Ltrim),
    ("RTRIM", Func::Rtrim),
    ("TRIM", Func::Trim),
    ("ABS", Func::Abs),
    ("CEILING", Func::Ceiling),
    ("FLOOR", Func::Floor),
    ("ROUND", Func::Round),
    ("SQUARE", Func::Square),
    ("SQRT", Func::Sqrt),
    ("POWER", Func::Power),
    ("SIGN", Func::Sign),
];

impl Func {
    pub(crate) fn lookup(name: &str) -> Option<Func> {
        FUNCTIONS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, f)| f)
    }

    /// A function of the twin query dialect, which spells `STARTSWITH` and `ENDSWITH` without
    /// the underscore (and refuses the routing spelling, as IoT Hub does).
    pub(crate) fn lookup_twin(name: &str) -> Option<Func> {
        if name.eq_ignore_ascii_case("startswith") {
            return Some(Func::StartsWith);
        }
        if name.eq_ignore_ascii_case("endswith") {
            return Some(Func::EndsWith);
        }
        Func::lookup(name).filter(|f| !matches!(f, Func::StartsWith | Func::EndsWith))
    }

    fn name(self) -> &'static str {
        FUNCTIONS
            .iter()
            .find(|&&(_, f)| f == self)
            .map_or("?", |&(n, _)| n)
    }

    /// Least and (if bounded) greatest number of arguments.
    fn arity(self) -> (usize, Option<usize>) {
        match self {
            Func::Concat => (2, None),
            Func::StartsWith | Func::EndsWith | Func::Contains | Func::IndexOf | Func::Power => {
                (2, Some(2))
            }
            Func::Substring => (3, Some(3)),
            _ => (1, Some(1)),
        }
    }

    /// Refuses a call with the wrong number of arguments, at parse time.
    pub(crate) fn check_arity(self, given: usize, pos: usize) -> Result<(), QueryError> {
        let (min, max) = self.arity();
        if given >= min && max.is_none_or(|max| given <= max) {
            return Ok(());
        }
        let plural = |n: usize| if n == 1 { "argument" } else { "arguments" };
        let expected = match max {
            Some(max) if max == min => format!("{min} {}", plural(min)),
            Some(max) => format!("{min} to {max} arguments"),
            None => format!("at least {min} {}", plural(min)),
        };
        Err(QueryError::Arity {
            pos,
            function: self.name().into(),
            expected,
            given,
        })
    }
}
