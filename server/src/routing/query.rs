//! The IoT Hub message-routing query language: the condition of a route.
//!
//! A condition is parsed once, when the route is created ([`Condition::parse`]), and evaluated
//! against each message ([`Condition::matches`]). Keywords and function names are
//! case-insensitive; positions in errors are 0-based character offsets.
//!
//! ```text
//! condition  := or
//! or         := and ("OR" and)*
//! and        := not ("AND" not)*
//! not        := "NOT" not | comparison
//! comparison := additive (("=" | "!=" | "<>" | "<" | "<=" | ">" | ">=") additive)*
//! additive   := term (("+" | "-" | "||") term)*
//! term       := unary (("*" | "/" | "%") unary)*
//! unary      := "-" unary | primary
//! primary    := literal | "(" or ")" | FUNCTION "(" or ("," or)* ")"
//!             | "$body" path | "$twin" path | "$" name | identifier | "[" name "]"
//! path       := ("." identifier | "[" (string | integer) "]")*
//! literal    := 'string' | "string" | number | "true" | "false" | "null"
//! ```
//!
//! `$name` is a system property (known names are matched case-insensitively), a bare
//! identifier or `[any-name]` an application property; `$body…` walks the JSON body and
//! `$twin.a.b` asks [`MessageView::twin`] for `["a", "b"]`. Strings take `\'`, `\"`, `\\`,
//! `\/`, `\n`, `\t`, `\r`, `\b`, `\f` and `\uXXXX` escapes.
//!
//! Values are JSON; a missing property, body field or twin path is *undefined*. Comparisons
//! need two values of the same type (numbers by value, strings by code point, booleans and
//! nulls only with `=`/`!=`), arithmetic needs numbers, `||` needs strings; anything else,
//! and division by zero, is undefined. `AND`/`OR`/`NOT` use three-valued logic (`false AND
//! undefined` is false, `true OR undefined` is true, `NOT undefined` is undefined), and a
//! message matches only when the condition is exactly `true`. Nesting (parentheses, function
//! calls, `NOT`, unary minus) is capped at 64 levels and the text at 10,000 characters.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Number, Value};

/// Longest condition accepted, in characters.
const MAX_LEN: usize = 10_000;
/// Deepest nesting of parentheses, function calls, `NOT` and unary minus.
const MAX_DEPTH: usize = 64;

/// System properties with their canonical spelling; a `$name` matching one of these
/// case-insensitively is looked up by this spelling, any other by the name as written.
const SYSTEM_PROPERTIES: &[&str] = &[
    "contentType",
    "contentEncoding",
    "messageId",
    "correlationId",
    "userId",
    "connectionDeviceId",
    "connectionModuleId",
    "enqueuedTime",
    "iothub-connection-device-id",
    "iothub-connection-module-id",
    "iothub-enqueuedtime",
    "iothub-interface-name",
    "dt-dataschema",
    "dt-subject",
];

/// A parsed route condition.
#[derive(Debug, Clone)]
pub struct Condition {
    text: String,
    expr: Expr,
}

/// Why a condition was refused; every message starts with the character offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    #[error("at {pos}: unknown function '{name}'")]
    UnknownFunction { pos: usize, name: String },
    #[error("at {pos}: {function} takes {expected} but was given {given}")]
    Arity {
        pos: usize,
        function: &'static str,
        expected: String,
        given: usize,
    },
}

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

impl Condition {
    /// Parses a condition; an empty or whitespace-only text is an error; "true" matches everything.
    pub fn parse(text: &str) -> Result<Condition, QueryError> {
        if text.chars().take(MAX_LEN + 1).count() > MAX_LEN {
            return Err(QueryError::TooLong {
                pos: MAX_LEN,
                max: MAX_LEN,
            });
        }
        if text.trim().is_empty() {
            return Err(QueryError::Empty { pos: 0 });
        }
        let tokens = Lexer::tokenize(text)?;
        let expr = Parser::new(tokens).condition()?;
        Ok(Condition {
            text: text.to_string(),
            expr,
        })
    }

    /// Whether the message matches. Anything undefined or of mismatched types makes the
    /// comparison undefined, and an undefined or non-boolean result does not match.
    pub fn matches(&self, message: &dyn MessageView) -> bool {
        matches!(self.expr.eval(message).as_deref(), Some(Value::Bool(true)))
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Add,
    Sub,
    Concat,
    Mul,
    Div,
    Rem,
}

impl BinOp {
    fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }

    fn is_additive(self) -> bool {
        matches!(self, BinOp::Add | BinOp::Sub | BinOp::Concat)
    }

    fn is_multiplicative(self) -> bool {
        matches!(self, BinOp::Mul | BinOp::Div | BinOp::Rem)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Str(String),
    Num(Number),
    Ident(String),
    /// `$name`, without the `$`.
    Sys(String),
    /// `[name]`, an application property name.
    Bracketed(String),
    LParen,
    RParen,
    /// `[` opening an index or quoted field of a `$body`/`$twin` path.
    LBracket,
    RBracket,
    Comma,
    Dot,
    /// An operator with its spelling (`!=` and `<>` are both `Ne`).
    Op(BinOp, &'static str),
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Num(n) => format!("number {n}"),
            Tok::Ident(s) if is_keyword(s) => format!("keyword {}", s.to_ascii_uppercase()),
            Tok::Ident(s) => format!("identifier '{s}'"),
            Tok::Sys(s) => format!("'${s}'"),
            Tok::Bracketed(s) => format!("'[{s}]'"),
            Tok::LParen => "'('".to_string(),
            Tok::RParen => "')'".to_string(),
            Tok::LBracket => "'['".to_string(),
            Tok::RBracket => "']'".to_string(),
            Tok::Comma => "','".to_string(),
            Tok::Dot => "'.'".to_string(),
            Tok::Op(_, symbol) => format!("'{symbol}'"),
            Tok::End => "end of condition".to_string(),
        }
    }
}

fn is_keyword(word: &str) -> bool {
    ["and", "or", "not", "true", "false", "null"]
        .iter()
        .any(|k| k.eq_ignore_ascii_case(word))
}

#[derive(Debug, Clone, PartialEq)]
struct Token {
    tok: Tok,
    /// Character offset of the token's first character.
    pos: usize,
}

/// A `[` continues a `$body`/`$twin` path after `$name`, `]` or `.field`; anywhere else it
/// opens a bracketed application property name.
fn bracket_is_index(tokens: &[Token]) -> bool {
    let mut last = tokens.iter().rev().map(|t| &t.tok);
    matches!(
        (last.next(), last.next()),
        (Some(Tok::Sys(_) | Tok::RBracket), _) | (Some(Tok::Ident(_)), Some(Tok::Dot))
    )
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    tokens: Vec<Token>,
}

impl Lexer {
    /// The tokens of `text`, always ending with `Tok::End`.
    fn tokenize(text: &str) -> Result<Vec<Token>, QueryError> {
        let mut lexer = Lexer {
            chars: text.chars().collect(),
            at: 0,
            tokens: Vec::new(),
        };
        while let Some(c) = lexer.peek(0) {
            if c.is_whitespace() {
                lexer.at += 1;
                continue;
            }
            let pos = lexer.at;
            let tok = lexer.token(c)?;
            lexer.tokens.push(Token { tok, pos });
        }
        lexer.tokens.push(Token {
            tok: Tok::End,
            pos: lexer.chars.len(),
        });
        Ok(lexer.tokens)
    }

    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn take_while(&mut self, keep: impl Fn(char) -> bool) -> String {
        let mut taken = String::new();
        while let Some(c) = self.peek(0).filter(|&c| keep(c)) {
            taken.push(c);
            self.at += 1;
        }
        taken
    }

    fn token(&mut self, c: char) -> Result<Tok, QueryError> {
        match c {
            '\'' | '"' => self.string(c),
            '0'..='9' => self.number(),
            '$' => self.system_name(),
            '[' if !bracket_is_index(&self.tokens) => self.bracketed_name(),
            c if c.is_alphabetic() || c == '_' => Ok(Tok::Ident(
                self.take_while(|c| c.is_alphanumeric() || c == '_'),
            )),
            _ => self.punctuation(c),
        }
    }

    fn punctuation(&mut self, c: char) -> Result<Tok, QueryError> {
        let (tok, len) = match (c, self.peek(1)) {
            ('(', _) => (Tok::LParen, 1),
            (')', _) => (Tok::RParen, 1),
            ('[', _) => (Tok::LBracket, 1),
            (']', _) => (Tok::RBracket, 1),
            (',', _) => (Tok::Comma, 1),
            ('.', _) => (Tok::Dot, 1),
            ('=', _) => (Tok::Op(BinOp::Eq, "="), 1),
            ('!', Some('=')) => (Tok::Op(BinOp::Ne, "!="), 2),
            ('<', Some('>')) => (Tok::Op(BinOp::Ne, "<>"), 2),
            ('<', Some('=')) => (Tok::Op(BinOp::Le, "<="), 2),
            ('<', _) => (Tok::Op(BinOp::Lt, "<"), 1),
            ('>', Some('=')) => (Tok::Op(BinOp::Ge, ">="), 2),
            ('>', _) => (Tok::Op(BinOp::Gt, ">"), 1),
            ('+', _) => (Tok::Op(BinOp::Add, "+"), 1),
            ('-', _) => (Tok::Op(BinOp::Sub, "-"), 1),
            ('|', Some('|')) => (Tok::Op(BinOp::Concat, "||"), 2),
            ('*', _) => (Tok::Op(BinOp::Mul, "*"), 1),
            ('/', _) => (Tok::Op(BinOp::Div, "/"), 1),
            ('%', _) => (Tok::Op(BinOp::Rem, "%"), 1),
            _ => {
                return Err(QueryError::UnexpectedChar {
                    pos: self.at,
                    found: c,
                })
            }
        };
        self.at += len;
        Ok(tok)
    }

    fn string(&mut self, quote: char) -> Result<Tok, QueryError> {
        let start = self.at;
        self.at += 1;
        let mut text = String::new();
        loop {
            let Some(c) = self.peek(0) else {
                return Err(QueryError::UnterminatedString { pos: start });
            };
            self.at += 1;
            match c {
                '\\' => text.push(self.escape(start)?),
                c if c == quote => return Ok(Tok::Str(text)),
                c => text.push(c),
            }
        }
    }

    /// The character of the escape whose `\` was just consumed.
    fn escape(&mut self, string_start: usize) -> Result<char, QueryError> {
        let pos = self.at - 1;
        let Some(c) = self.peek(0) else {
            return Err(QueryError::UnterminatedString { pos: string_start });
        };
        self.at += 1;
        Ok(match c {
            '\'' | '"' | '\\' | '/' => c,
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'u' => {
                let hex: String = self.chars.iter().skip(self.at).take(4).collect();
                let code = Some(&hex)
                    .filter(|h| h.len() == 4 && h.chars().all(|c| c.is_ascii_hexdigit()))
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32)
                    .ok_or(QueryError::InvalidEscape { pos, found: 'u' })?;
                self.at += 4;
                code
            }
            found => return Err(QueryError::InvalidEscape { pos, found }),
        })
    }

    fn skip_digits(&mut self) {
        while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
    }

    fn number(&mut self) -> Result<Tok, QueryError> {
        let start = self.at;
        self.skip_digits();
        let mut integer = true;
        if self.peek(0) == Some('.') && self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
            integer = false;
            self.at += 1;
            self.skip_digits();
        }
        if matches!(self.peek(0), Some('e' | 'E')) {
            integer = false;
            self.at += 1;
            if matches!(self.peek(0), Some('+' | '-')) {
                self.at += 1;
            }
            if !self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
                return Err(self.invalid_number(start));
            }
            self.skip_digits();
        }
        if self
            .peek(0)
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            return Err(self.invalid_number(start));
        }
        let text: String = self.chars[start..self.at].iter().collect();
        match parse_number(&text, integer) {
            Some(n) => Ok(Tok::Num(n)),
            None => Err(QueryError::InvalidNumber { pos: start, text }),
        }
    }

    fn invalid_number(&mut self, start: usize) -> QueryError {
        self.take_while(|c| c.is_alphanumeric() || c == '_' || c == '.');
        QueryError::InvalidNumber {
            pos: start,
            text: self.chars[start..self.at].iter().collect(),
        }
    }

    fn system_name(&mut self) -> Result<Tok, QueryError> {
        let start = self.at;
        self.at += 1;
        let name = self.take_while(|c| c.is_alphanumeric() || c == '-' || c == '_');
        if name.is_empty() {
            return Err(QueryError::MissingPropertyName { pos: start });
        }
        Ok(Tok::Sys(name))
    }

    fn bracketed_name(&mut self) -> Result<Tok, QueryError> {
        let start = self.at;
        self.at += 1;
        let name = self.take_while(|c| c != ']');
        if self.peek(0).is_none() {
            return Err(QueryError::UnterminatedName { pos: start });
        }
        self.at += 1;
        if name.trim().is_empty() {
            return Err(QueryError::EmptyName { pos: start });
        }
        Ok(Tok::Bracketed(name))
    }
}

/// Integers stay exact when they fit in i64/u64; anything non-finite is refused.
fn parse_number(text: &str, integer: bool) -> Option<Number> {
    if integer {
        if let Ok(i) = text.parse::<i64>() {
            return Some(i.into());
        }
        if let Ok(u) = text.parse::<u64>() {
            return Some(u.into());
        }
    }
    text.parse::<f64>().ok().and_then(Number::from_f64)
}

// ---------------------------------------------------------------------------------------------
// Syntax tree and parser
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
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
    fn lookup(name: &str) -> Option<Func> {
        FUNCTIONS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, f)| f)
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

    fn check_arity(self, given: usize, pos: usize) -> Result<(), QueryError> {
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
            function: self.name(),
            expected,
            given,
        })
    }
}

#[derive(Debug, Clone)]
enum Expr {
    Literal(Value),
    /// `$name`, by its canonical name.
    System(String),
    /// An application property.
    App(String),
    Body(Vec<Step>),
    /// `$twin`: the leading field names go to [`MessageView::twin`], the rest (from the first
    /// array index on) is walked in the value it returns.
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
}

fn canonical_system_name(name: &str) -> String {
    SYSTEM_PROPERTIES
        .iter()
        .find(|known| known.eq_ignore_ascii_case(name))
        .map_or_else(|| name.to_string(), |known| (*known).to_string())
}

fn unexpected(token: &Token, expected: &str) -> QueryError {
    QueryError::Expected {
        pos: token.pos,
        expected: expected.to_string(),
        found: token.tok.describe(),
    }
}

type Parsed<T> = Result<T, QueryError>;

struct Parser {
    /// Never empty: the last token is `Tok::End`.
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn new(tokens: Vec<Token>) -> Parser {
        Parser {
            tokens,
            at: 0,
            depth: 0,
        }
    }

    fn peek(&self) -> &Token {
        &self.tokens[self.at.min(self.tokens.len() - 1)]
    }

    /// The current token; stays on `End` once there.
    fn advance(&mut self) -> Token {
        let token = self.peek().clone();
        if self.at + 1 < self.tokens.len() {
            self.at += 1;
        }
        token
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        let found = self.peek().tok == *tok;
        if found {
            self.advance();
        }
        found
    }

    fn expect(&mut self, tok: &Tok, expected: &str) -> Parsed<()> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(unexpected(self.peek(), expected))
        }
    }

    fn at_keyword(&self, keyword: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(word) if word.eq_ignore_ascii_case(keyword))
    }

    fn eat_keyword(&mut self, keyword: &str) -> bool {
        let found = self.at_keyword(keyword);
        if found {
            self.advance();
        }
        found
    }

    /// Runs `inner` one nesting level deeper, refusing to go past [`MAX_DEPTH`].
    fn nested<T>(&mut self, pos: usize, inner: impl FnOnce(&mut Self) -> Parsed<T>) -> Parsed<T> {
        if self.depth >= MAX_DEPTH {
            return Err(QueryError::TooDeep {
                pos,
                max: MAX_DEPTH,
            });
        }
        self.depth += 1;
        let result = inner(self);
        self.depth -= 1;
        result
    }

    fn condition(mut self) -> Parsed<Expr> {
        let expr = self.or()?;
        let token = self.peek();
        match token.tok {
            Tok::End => Ok(expr),
            Tok::RParen => Err(QueryError::UnmatchedParen { pos: token.pos }),
            _ => Err(unexpected(token, "an operator or end of condition")),
        }
    }

    fn or(&mut self) -> Parsed<Expr> {
        let first = self.and()?;
        if !self.at_keyword("or") {
            return Ok(first);
        }
        let mut terms = vec![first];
        while self.eat_keyword("or") {
            terms.push(self.and()?);
        }
        Ok(Expr::Or(terms))
    }

    fn and(&mut self) -> Parsed<Expr> {
        let first = self.not()?;
        if !self.at_keyword("and") {
            return Ok(first);
        }
        let mut terms = vec![first];
        while self.eat_keyword("and") {
            terms.push(self.not()?);
        }
        Ok(Expr::And(terms))
    }

    fn not(&mut self) -> Parsed<Expr> {
        if !self.at_keyword("not") {
            return self.chain(BinOp::is_comparison, Self::additive);
        }
        let pos = self.advance().pos;
        let inner = self.nested(pos, Self::not)?;
        Ok(Expr::Not(Box::new(inner)))
    }

    fn additive(&mut self) -> Parsed<Expr> {
        self.chain(BinOp::is_additive, Self::multiplicative)
    }

    fn multiplicative(&mut self) -> Parsed<Expr> {
        self.chain(BinOp::is_multiplicative, Self::unary)
    }

    /// `operand (op operand)*` for the operators `accepts` takes.
    fn chain(
        &mut self,
        accepts: fn(BinOp) -> bool,
        operand: fn(&mut Self) -> Parsed<Expr>,
    ) -> Parsed<Expr> {
        let first = operand(self)?;
        let mut rest = Vec::new();
        while let Tok::Op(op, _) = self.peek().tok {
            if !accepts(op) {
                break;
            }
            self.advance();
            rest.push((op, operand(self)?));
        }
        Ok(if rest.is_empty() {
            first
        } else {
            Expr::Chain(Box::new(first), rest)
        })
    }

    fn unary(&mut self) -> Parsed<Expr> {
        if !matches!(self.peek().tok, Tok::Op(BinOp::Sub, _)) {
            return self.primary();
        }
        let pos = self.advance().pos;
        let inner = self.nested(pos, Self::unary)?;
        // Fold negative literals so `-5` is a constant.
        if let Expr::Literal(value @ Value::Number(_)) = &inner {
            if let Some(negated) = negate(value) {
                return Ok(Expr::Literal(negated));
            }
        }
        Ok(Expr::Neg(Box::new(inner)))
    }

    fn primary(&mut self) -> Parsed<Expr> {
        let token = self.advance();
        match token.tok {
            Tok::Str(s) => Ok(Expr::Literal(Value::String(s))),
            Tok::Num(n) => Ok(Expr::Literal(Value::Number(n))),
            Tok::Sys(name) => self.reference(&name),
            Tok::Bracketed(name) => Ok(Expr::App(name)),
            Tok::Ident(name) => self.identifier(name, token.pos),
            Tok::LParen => self.nested(token.pos, |p| {
                let inner = p.or()?;
                p.expect(&Tok::RParen, "')'")?;
                Ok(inner)
            }),
            _ => Err(unexpected(&token, "an expression")),
        }
    }

    fn identifier(&mut self, name: String, pos: usize) -> Parsed<Expr> {
        match name.to_ascii_lowercase().as_str() {
            "true" => return Ok(Expr::Literal(Value::Bool(true))),
            "false" => return Ok(Expr::Literal(Value::Bool(false))),
            "null" => return Ok(Expr::Literal(Value::Null)),
            "and" | "or" | "not" => {
                let token = Token {
                    tok: Tok::Ident(name),
                    pos,
                };
                return Err(unexpected(&token, "an expression"));
            }
            _ => {}
        }
        if self.peek().tok == Tok::LParen {
            self.call(name, pos)
        } else {
            Ok(Expr::App(name))
        }
    }

    fn call(&mut self, name: String, pos: usize) -> Parsed<Expr> {
        let func = Func::lookup(&name).ok_or(QueryError::UnknownFunction { pos, name })?;
        self.advance(); // '('
        let args = self.nested(pos, Self::arguments)?;
        func.check_arity(args.len(), pos)?;
        Ok(Expr::Call(func, args))
    }

    /// Comma-separated arguments after the `(`, through the `)`.
    fn arguments(&mut self) -> Parsed<Vec<Expr>> {
        let mut args = Vec::new();
        if self.eat(&Tok::RParen) {
            return Ok(args);
        }
        loop {
            args.push(self.or()?);
            if !self.eat(&Tok::Comma) {
                self.expect(&Tok::RParen, "',' or ')'")?;
                return Ok(args);
            }
        }
    }

    fn reference(&mut self, name: &str) -> Parsed<Expr> {
        if name.eq_ignore_ascii_case("body") {
            return Ok(Expr::Body(self.path()?));
        }
        if name.eq_ignore_ascii_case("twin") {
            let mut steps = self.path()?;
            let split = steps
                .iter()
                .position(|s| matches!(s, Step::Index(_)))
                .unwrap_or(steps.len());
            let rest = steps.split_off(split);
            let names = steps
                .into_iter()
                .filter_map(|s| match s {
                    Step::Field(name) => Some(name),
                    Step::Index(_) => None,
                })
                .collect();
            return Ok(Expr::Twin { names, rest });
        }
        Ok(Expr::System(canonical_system_name(name)))
    }

    /// `.field`, `["field"]` and `[index]` steps after `$body` / `$twin`.
    fn path(&mut self) -> Parsed<Vec<Step>> {
        let mut steps = Vec::new();
        loop {
            if self.eat(&Tok::Dot) {
                let token = self.advance();
                match token.tok {
                    Tok::Ident(name) => steps.push(Step::Field(name)),
                    _ => return Err(unexpected(&token, "a field name after '.'")),
                }
            } else if self.eat(&Tok::LBracket) {
                let token = self.advance();
                let step = match &token.tok {
                    Tok::Str(name) => Step::Field(name.clone()),
                    Tok::Num(n) => n
                        .as_u64()
                        .and_then(|i| usize::try_from(i).ok())
                        .map(Step::Index)
                        .ok_or_else(|| unexpected(&token, "a non-negative integer index"))?,
                    _ => return Err(unexpected(&token, "a quoted field name or array index")),
                };
                steps.push(step);
                self.expect(&Tok::RBracket, "']'")?;
            } else {
                return Ok(steps);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Evaluation: `None` is undefined
// ---------------------------------------------------------------------------------------------

type Eval<'a> = Option<Cow<'a, Value>>;

fn owned<'a>(value: Option<Value>) -> Eval<'a> {
    value.map(Cow::Owned)
}

impl Expr {
    fn eval<'a>(&'a self, m: &'a dyn MessageView) -> Eval<'a> {
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

/// By value: exactly for two integers, as f64 otherwise (so `1 = 1.0`).
fn compare_numbers(a: &Number, b: &Number) -> Option<Ordering> {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return Some(x.cmp(&y));
    }
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return Some(x.cmp(&y));
    }
    a.as_f64()?.partial_cmp(&b.as_f64()?)
}

fn float_value(x: f64) -> Option<Value> {
    Number::from_f64(x).map(Value::Number)
}

/// Exact on integers when the result fits, f64 otherwise; division by zero is undefined.
fn arithmetic(op: BinOp, a: &Number, b: &Number) -> Option<Value> {
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

fn negate(value: &Value) -> Option<Value> {
    let n = value.as_number()?;
    if let Some(negated) = n.as_i64().and_then(i64::checked_neg) {
        return Some(negated.into());
    }
    float_value(-n.as_f64()?)
}

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
    fn apply(self, args: &[Eval<'_>]) -> Option<Value> {
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
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    /// A message as the router would present it.
    #[derive(Default)]
    struct TestMessage {
        system: HashMap<String, Value>,
        app: HashMap<String, Value>,
        body: Option<Value>,
        twin: Option<Value>,
    }

    impl TestMessage {
        fn sys(mut self, name: &str, value: impl Into<Value>) -> Self {
            self.system.insert(name.to_string(), value.into());
            self
        }

        fn app(mut self, name: &str, value: impl Into<Value>) -> Self {
            self.app.insert(name.to_string(), value.into());
            self
        }

        fn body(mut self, body: Value) -> Self {
            self.body = Some(body);
            self
        }

        fn twin(mut self, twin: Value) -> Self {
            self.twin = Some(twin);
            self
        }
    }

    impl MessageView for TestMessage {
        fn system_property(&self, name: &str) -> Option<Value> {
            self.system.get(name).cloned()
        }

        fn application_property(&self, name: &str) -> Option<Value> {
            self.app.get(name).cloned()
        }

        fn body(&self) -> Option<&Value> {
            self.body.as_ref()
        }

        fn twin(&self, path: &[String]) -> Option<Value> {
            let mut value = self.twin.as_ref()?;
            for name in path {
                value = value.get(name.as_str())?;
            }
            Some(value.clone())
        }
    }

    fn sample() -> TestMessage {
        TestMessage::default()
            .sys("contentType", "application/json")
            .sys("contentEncoding", "utf-8")
            .sys("messageId", "m-1")
            .sys("connectionDeviceId", "thermo-1")
            .sys("iothub-connection-device-id", "thermo-1")
            .app("level", "critical")
            .app("temp", "35")
            .app("iothub-message-schema", "temperature")
            .app("Empty", "")
            .body(json!({
                "temperature": 31.5,
                "humidity": 40,
                "count": 3,
                "ok": true,
                "nothing": null,
                "name": "  Sensor Ünit  ",
                "weather": {"wind": {"speed": 12}, "sky": "clear"},
                "readings": [10, 20, {"v": 30}],
                "odd keys": {"key with space": "yes"},
            }))
            .twin(json!({
                "tags": {"location": "west", "floor": 3},
                "properties": {"reported": {"fw": "1.2.0", "sensors": ["a", "b"]}},
            }))
    }

    fn parse(text: &str) -> Condition {
        Condition::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    fn eval(text: &str, message: &TestMessage) -> Option<Value> {
        let condition = parse(text);
        condition.expr.eval(message).map(Cow::into_owned)
    }

    fn error(text: &str) -> String {
        match Condition::parse(text) {
            Ok(c) => panic!("{text:?} should not parse, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[track_caller]
    fn assert_all(message: &TestMessage, matching: &[&str], not_matching: &[&str]) {
        for text in matching {
            assert!(parse(text).matches(message), "{text:?} should match");
        }
        for text in not_matching {
            assert!(!parse(text).matches(message), "{text:?} should not match");
        }
    }

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
    fn keywords_functions_and_system_names_are_case_insensitive() {
        assert_all(
            &sample(),
            &[
                "level = 'critical' and TRUE",
                "level = 'x' oR True",
                "not FALSE",
                "Not level = 'x' AnD $body.nothing = NULL",
                "is_defined(level)",
                "Starts_With(level, 'c')",
                "length(level) = 8",
                "$contenttype = 'application/json'",
                "$CONTENTTYPE = 'application/json'",
                "$ConnectionDeviceID = 'thermo-1'",
                "$IOTHUB-CONNECTION-DEVICE-ID = 'thermo-1'",
                "$BODY.count = 3",
                "$Twin.tags.location = 'west'",
            ],
            &["LEVEL = 'critical'"],
        );
        assert!(matches!(parse("$contenttype").expr, Expr::System(ref n) if n == "contentType"));
        assert!(matches!(parse("$customThing").expr, Expr::System(ref n) if n == "customThing"));
    }

    #[test]
    fn bracketed_application_property_names() {
        let m = sample()
            .app("a", 5)
            .app("b", 2)
            .app("and", "kw")
            .app("with space", "s");
        assert_all(
            &m,
            &[
                "[iothub-message-schema] = 'temperature'",
                "[level] = 'critical'",
                "[and] = 'kw'",
                "[with space] = 's'",
                "NOT [missing-name] = 'x' OR true",
                "CONCAT([level], [iothub-message-schema]) = 'criticaltemperature'",
                "a-b = 3",
                "a - b = 3",
            ],
            &[
                "[iothub-message-schema] = 'humidity'",
                "[Level] = 'critical'",
            ],
        );
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

    #[test]
    fn string_literals_and_escapes() {
        let m = TestMessage::default();
        assert_eq!(eval(r#"'it\'s'"#, &m), Some(json!("it's")));
        assert_eq!(eval(r#""say \"hi\"""#, &m), Some(json!("say \"hi\"")));
        assert_eq!(eval(r#"'back\\slash'"#, &m), Some(json!("back\\slash")));
        assert_eq!(eval(r#"'"' = "\"""#, &m), Some(json!(true)));
        assert_eq!(eval(r#"'a\nb\tc\u00e9'"#, &m), Some(json!("a\nb\tcé")));
        assert_eq!(eval("'ünï 💥'", &m), Some(json!("ünï 💥")));
    }

    #[test]
    fn text_is_kept() {
        let text = "  level = 'critical'  ";
        assert_eq!(parse(text).text(), text);
    }

    #[test]
    fn condition_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<Condition>();
        assert_send_sync::<QueryError>();
    }

    #[test]
    fn parse_errors_name_the_position() {
        let cases = [
            // Empty input.
            ("", "at 0: the condition is empty"),
            (" \t\n ", "at 0: the condition is empty"),
            // Unbalanced parentheses.
            (
                "(level = 'a'",
                "at 12: expected ')' but found end of condition",
            ),
            ("((true)", "at 7: expected ')' but found end of condition"),
            ("level = 'a')", "at 11: found ')' without a matching '('"),
            ("()", "at 1: expected an expression but found ')'"),
            // Unterminated strings.
            (
                "level = 'abc",
                "at 8: unterminated string literal (expected a closing quote)",
            ),
            (
                "level = \"abc",
                "at 8: unterminated string literal (expected a closing quote)",
            ),
            (
                "level = 'abc\\'",
                "at 8: unterminated string literal (expected a closing quote)",
            ),
            (
                "level = 'abc\\",
                "at 8: unterminated string literal (expected a closing quote)",
            ),
            ("'a\\qb'", "at 2: invalid escape sequence '\\q' in string"),
            ("'\\u12'", "at 1: invalid escape sequence '\\u' in string"),
            // Trailing tokens.
            (
                "level = 'a' level",
                "at 12: expected an operator or end of condition but found identifier 'level'",
            ),
            (
                "true false",
                "at 5: expected an operator or end of condition but found keyword FALSE",
            ),
            (
                "$contentType.x = 1",
                "at 12: expected an operator or end of condition but found '.'",
            ),
            // Missing operands.
            (
                "level =",
                "at 7: expected an expression but found end of condition",
            ),
            ("= 'a'", "at 0: expected an expression but found '='"),
            ("level == 'a'", "at 7: expected an expression but found '='"),
            (
                "level = 'a' AND",
                "at 15: expected an expression but found end of condition",
            ),
            (
                "AND true",
                "at 0: expected an expression but found keyword AND",
            ),
            (
                "NOT",
                "at 3: expected an expression but found end of condition",
            ),
            (
                "1 = NOT 1",
                "at 4: expected an expression but found keyword NOT",
            ),
            (
                "-",
                "at 1: expected an expression but found end of condition",
            ),
            ("1 + * 2", "at 4: expected an expression but found '*'"),
            // Unknown functions and bad arity.
            ("FOO(level)", "at 0: unknown function 'FOO'"),
            (
                "true AND is_definedd(x)",
                "at 9: unknown function 'is_definedd'",
            ),
            (
                "STARTS_WITH(level)",
                "at 0: STARTS_WITH takes 2 arguments but was given 1",
            ),
            (
                "lower('a', 'b')",
                "at 0: LOWER takes 1 argument but was given 2",
            ),
            ("LENGTH()", "at 0: LENGTH takes 1 argument but was given 0"),
            (
                "CONCAT('a')",
                "at 0: CONCAT takes at least 2 arguments but was given 1",
            ),
            (
                "SUBSTRING('a', 1)",
                "at 0: SUBSTRING takes 3 arguments but was given 2",
            ),
            (
                "LENGTH('a' 'b')",
                "at 11: expected ',' or ')' but found string \"b\"",
            ),
            (
                "LENGTH('a',)",
                "at 11: expected an expression but found ')'",
            ),
            // A bare `$`.
            ("$ = 'a'", "at 0: expected a property name after '$'"),
            ("true AND $", "at 9: expected a property name after '$'"),
            ("$.x = 1", "at 0: expected a property name after '$'"),
            // Paths, bracketed names, characters and numbers.
            (
                "$body. = 1",
                "at 7: expected a field name after '.' but found '='",
            ),
            (
                "$body.a[-1] = 1",
                "at 8: expected a quoted field name or array index but found '-'",
            ),
            (
                "$body.a[1.5] = 1",
                "at 8: expected a non-negative integer index but found number 1.5",
            ),
            ("$body.a[0 = 1", "at 10: expected ']' but found '='"),
            (
                "[iothub-schema = 'a'",
                "at 0: expected ']' to close the property name but found end of condition",
            ),
            ("[] = 'a'", "at 0: the bracketed property name is empty"),
            ("level = #", "at 8: unexpected character '#'"),
            ("a | b", "at 2: unexpected character '|'"),
            ("a ! b", "at 2: unexpected character '!'"),
            ("12abc = 1", "at 0: invalid number '12abc'"),
            ("1e = 1", "at 0: invalid number '1e'"),
            ("1e999 = 1", "at 0: invalid number '1e999'"),
        ];
        for (text, expected) in cases {
            assert_eq!(error(text), expected, "{text:?}");
        }
    }

    #[test]
    fn nesting_and_length_are_capped() {
        let nested = |n: usize| format!("{}true{}", "(".repeat(n), ")".repeat(n));
        assert!(parse(&nested(MAX_DEPTH)).matches(&sample()));
        assert_eq!(
            error(&nested(MAX_DEPTH + 1)),
            "at 64: the condition is nested more than 64 levels deep"
        );
        assert!(error(&"NOT ".repeat(200)).contains("nested more than 64 levels"));
        assert!(error(&format!("{}1", "-".repeat(100))).contains("nested more than 64 levels"));
        assert!(error(&"ABS(".repeat(100)).contains("nested more than 64 levels"));
        assert!(error(&"(".repeat(9_000)).contains("nested more than 64 levels"));

        let longest = format!("true{}", " ".repeat(MAX_LEN - 4));
        assert!(parse(&longest).matches(&sample()));
        assert_eq!(
            error(&format!("{longest} ")),
            "at 10000: the condition is longer than 10000 characters"
        );
        assert!(error(&"(".repeat(1_000_000)).contains("longer than 10000"));

        // Long flat chains are iterative, not deep.
        let ors = vec!["level = 'x'"; 600].join(" OR ") + " OR level = 'critical'";
        assert!(parse(&ors).matches(&sample()));
        let ands = vec!["true"; 1_000].join(" AND ");
        assert!(parse(&ands).matches(&sample()));
        let sum = vec!["1"; 4_000].join("+") + " = 4000";
        assert!(parse(&sum).matches(&sample()));
    }

    /// xorshift64*: deterministic, no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }
    }

    const SEEDS: &[&str] = &[
        "$contentType = 'application/json' AND $body.temperature > 30",
        "level = \"critical\" OR NOT (IS_DEFINED($body.x) AND $body.a.b[2].c != 1)",
        "STARTS_WITH([iothub-message-schema], 'temp') AND LENGTH(CONCAT(a, b, 'c')) >= 3",
        "SUBSTRING($body.name, 1, 3) || 'x' <> UPPER(LOWER(TRIM('  y ')))",
        "$twin.properties.reported.sensors[0] = 'a' AND -$body.count * 2 % 5 / 1.5e-3 < 4",
        "ABS(-1) + CEILING(1.2) - FLOOR(2.7) = ROUND(SQRT(POWER(2, 4))) * SIGN(SQUARE(3))",
        "$body[\"odd keys\"]['key with space'] = 'it\\'s' AND null = null",
    ];

    const PIECES: &[&str] = &[
        "(",
        ")",
        "[",
        "]",
        "'",
        "\"",
        "\\",
        "$",
        "$body",
        "$twin",
        ".",
        ",",
        "AND",
        "or",
        "NOT",
        "=",
        "!=",
        "<>",
        "<=",
        ">",
        "||",
        "|",
        "!",
        "+",
        "-",
        "*",
        "/",
        "%",
        "0",
        "2.5e3",
        "1e",
        "99999999999999999999999",
        "1e999",
        "abc",
        "IS_DEFINED(",
        "CONCAT(",
        "SUBSTRING(",
        "INDEX_OF(",
        "FOO(",
        "é",
        "💥",
        " ",
        "\t",
        "\0",
        "[x-y]",
        "true",
        "null",
        "\\u",
        "\\u00",
        "[0]",
        "[-1]",
        "['k']",
        "..",
        "$$",
        "#",
    ];

    fn mutate(rng: &mut Rng, text: &str) -> String {
        let mut chars: Vec<char> = text.chars().collect();
        for _ in 0..=rng.below(4) {
            let at = rng.below(chars.len() + 1);
            match rng.below(5) {
                0 => {
                    let piece = rng.pick(PIECES);
                    chars.splice(at..at, piece.chars());
                }
                1 if at < chars.len() => {
                    let end = (at + 1 + rng.below(6)).min(chars.len());
                    chars.drain(at..end);
                }
                2 if at < chars.len() => {
                    let random = char::from_u32((rng.next() % 0x11_0000) as u32).unwrap_or('?');
                    chars[at] = random;
                }
                3 => chars.truncate(at),
                _ => {
                    let end = (at + rng.below(10)).min(chars.len());
                    let copy: Vec<char> = chars[at..end].to_vec();
                    chars.splice(at..at, copy);
                }
            }
        }
        chars.into_iter().collect()
    }

    fn soup(rng: &mut Rng) -> String {
        (0..rng.below(30))
            .map(|_| rng.pick(PIECES))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn random_and_mutated_input_never_panics() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let with_body = sample();
        let without_body = TestMessage::default();
        let mut parsed = 0;
        for seed in SEEDS {
            assert!(Condition::parse(seed).is_ok(), "seed {seed:?} should parse");
        }
        for i in 0..3_000 {
            let seed = rng.pick(SEEDS);
            let text = match i % 3 {
                0 => mutate(&mut rng, seed),
                1 => soup(&mut rng),
                _ => {
                    let spliced = format!("{seed} {}", soup(&mut rng));
                    mutate(&mut rng, &spliced)
                }
            };
            let outcome = std::panic::catch_unwind(|| match Condition::parse(&text) {
                Ok(condition) => {
                    condition.matches(&with_body);
                    condition.matches(&without_body);
                    true
                }
                Err(e) => {
                    assert!(e.to_string().starts_with("at "), "{e}");
                    false
                }
            });
            match outcome {
                Ok(ok) => parsed += usize::from(ok),
                Err(_) => panic!("panicked on {text:?}"),
            }
        }
        // The mutations should leave a fair share valid, so evaluation is exercised too.
        assert!(parsed > 100, "only {parsed} inputs parsed");
    }
}
