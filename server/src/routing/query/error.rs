//! Why a condition was refused.
//!
//! Invariant: every variant carries `pos`, the 0-based *character* offset where the problem was
//! found, and its message starts with "at {pos}: ". The messages reach API clients (400
//! ArgumentInvalid) and are asserted verbatim in tests, so changing one is a behaviour change.

/// Why a condition was refused; every message starts with the character offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum QueryError {
    #[error("at {pos}: the condition is empty")]
    Empty { pos: usize },
    #[error("at {pos}: the condition is longer than {max} characters")]
    TooLong { pos: usize, max: usize },
    #[error("at {pos}: the condition is nested more than {max} levels deep")]
    TooDeep { pos: usize, max: usize },
    #[error("at {pos}: unterminated string literal (expected a closing quote)")]
    UnterminatedString { pos: usize },
    #[error("at {pos}: invalid escape sequence '\\{found}' in string")]
    InvalidEscape { pos: usize, found: char },
    #[error("at {pos}: invalid number '{text}'")]
    InvalidNumber { pos: usize, text: String },
    #[error("at {pos}: unexpected character {found:?}")]
    UnexpectedChar { pos: usize, found: char },
    #[error("at {pos}: expected a property name after '$'")]
    MissingPropertyName { pos: usize },
    #[error("at {pos}: expected ']' to close the property name but found end of condition")]
    UnterminatedName { pos: usize },
    #[error("at {pos}: the bracketed property name is empty")]
    EmptyName { pos: usize },
    #[error("at {pos}: expected {expected} but found {found}")]
    Expected {
        pos: usize,
        expected: String,
        found: String,
    },
    #[error("at {pos}: found ')' without a matching '('")]
    UnmatchedParen { pos: usize },
    /// A statement-level mistake of a twin query (clause order, aggregates, names).
    #[error("at {pos}: {message}")]
    Invalid { pos: usize, message: String },
    #[error("at {pos}: unknown function '{name}'")]
    UnknownFunction { pos: usize, name: String },
    #[error("at {pos}: {function} takes {expected} but was given {given}")]
    Arity {
        pos: usize,
        function: std::borrow::Cow<'static, str>,
        expected: String,
        given: usize,
    },
}
