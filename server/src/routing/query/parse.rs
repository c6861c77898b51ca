//! Parser: tokens to an expression tree, by recursive descent with one function per
//! precedence level (lowest first).
//!
//! ```text
//! expression := or
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
//! [`parse_expression`] parses one `expression` from a [`Cursor`] and stops at the first token
//! that cannot continue it (`)`, `,`, `]`, the end, or a word other than `AND`/`OR`), leaving
//! the cursor on it. A statement grammar reuses it that way: the twin query language's
//! `SELECT … FROM devices WHERE … GROUP BY …` would call it for each expression and claim its
//! own keywords in between with [`Cursor::eat_keyword`] / [`Cursor::expect`].
//! [`parse_condition`] is the routing condition: one expression that must use up the text.
//!
//! Invariants:
//! - Recursion is bounded: every rule that nests (parentheses, calls, `NOT`, unary minus) goes
//!   through `Cursor::nested`, which refuses more than [`MAX_DEPTH`] levels, and a run of one
//!   precedence level (`a OR b OR …`, `1 + 1 + …`) is a loop, so no input can exhaust the stack.
//! - Names are resolved once, here: `$name` to its canonical system property, function names
//!   to a [`Func`] with the arity checked, and a `$twin` path split into the field names the
//!   view is asked for and the rest. Evaluation never meets an unknown function or a wrong
//!   argument count.
//! - An error names the position of the token that stopped the parse.

use serde_json::Value;

use super::ast::{Expr, Func, Step};
use super::lex::{tokenize, tokenize_twin, BinOp, Tok, Token};
use super::value::negate;
use super::QueryError;

/// Deepest nesting of parentheses, function calls, `NOT` and unary minus.
pub(crate) const MAX_DEPTH: usize = 64;

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

/// A routing condition: one expression that must use up the text.
///
/// # Errors
/// The first lexical or syntax error; a `)` left over is reported as unmatched.
pub(crate) fn parse_condition(text: &str) -> Parsed<Expr> {
    let mut cursor = Cursor::new(text)?;
    let expr = parse_expression(&mut cursor)?;
    let token = cursor.peek();
    match token.tok {
        Tok::End => Ok(expr),
        Tok::RParen => Err(QueryError::UnmatchedParen { pos: token.pos }),
        _ => Err(unexpected(token, "an operator or end of condition")),
    }
}

/// Parses one expression starting at the cursor's token and leaves the cursor on the first
/// token after it that it does not own (see the module doc).
///
/// # Errors
/// A syntax error inside the expression, or an expression nested deeper than [`MAX_DEPTH`].
pub(crate) fn parse_expression(cursor: &mut Cursor) -> Parsed<Expr> {
    cursor.or()
}

fn canonical_system_name(name: &str) -> String {
    SYSTEM_PROPERTIES
        .iter()
        .find(|known| known.eq_ignore_ascii_case(name))
        .map_or_else(|| name.to_string(), |known| (*known).to_string())
}

/// "expected `expected` but found <token>", at the token.
pub(crate) fn unexpected(token: &Token, expected: &str) -> QueryError {
    QueryError::Expected {
        pos: token.pos,
        expected: expected.to_string(),
        found: token.tok.describe(),
    }
}

pub(crate) type Parsed<T> = Result<T, QueryError>;

/// A position in a lexed text, and how deeply the expression being parsed is nested.
pub(crate) struct Cursor {
    /// Never empty: the last token is `Tok::End`.
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
    /// The twin query dialect: dotted document paths, `IN`/`NIN`, `STARTSWITH`.
    twin: bool,
}

impl Cursor {
    /// Lexes `text` into a cursor on its first token.
    ///
    /// # Errors
    /// A lexical error ([`tokenize`]).
    pub(crate) fn new(text: &str) -> Parsed<Cursor> {
        Ok(Cursor {
            tokens: tokenize(text)?,
            at: 0,
            depth: 0,
            twin: false,
        })
    }

    /// Lexes a twin query: a bare name starts a document path (`tags.location`,
    /// `properties.reported.$metadata`, `a[0]`, `configurations.[[my id]].status`), which
    /// parses to a `Body` path rooted at the row; `x IN [..]` / `x NIN [..]` take constants.
    ///
    /// # Errors
    /// A lexical error.
    pub(crate) fn twin(text: &str) -> Parsed<Cursor> {
        Ok(Cursor {
            tokens: tokenize_twin(text)?,
            at: 0,
            depth: 0,
            twin: true,
        })
    }

    /// Whether the current token is `tok`.
    pub(crate) fn at(&self, tok: &Tok) -> bool {
        self.peek().tok == *tok
    }

    /// Whether the token after the current one is `tok`.
    pub(crate) fn next_is(&self, tok: &Tok) -> bool {
        self.tokens.get(self.at + 1).is_some_and(|t| t.tok == *tok)
    }

    /// The current token, not consumed; `End` once the tokens are used up.
    pub(crate) fn peek(&self) -> &Token {
        &self.tokens[self.at.min(self.tokens.len() - 1)]
    }

    /// The current token, consumed; stays on `End` once there.
    pub(crate) fn advance(&mut self) -> Token {
        let token = self.peek().clone();
        if self.at + 1 < self.tokens.len() {
            self.at += 1;
        }
        token
    }

    /// Consumes the current token if it is `tok`.
    pub(crate) fn eat(&mut self, tok: &Tok) -> bool {
        let found = self.peek().tok == *tok;
        if found {
            self.advance();
        }
        found
    }

    /// Consumes `tok`, or fails naming `expected` and what was found instead.
    pub(crate) fn expect(&mut self, tok: &Tok, expected: &str) -> Parsed<()> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(unexpected(self.peek(), expected))
        }
    }

    /// Whether the current token is the (case-insensitive) word `keyword`.
    pub(crate) fn at_keyword(&self, keyword: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(word) if word.eq_ignore_ascii_case(keyword))
    }

    /// Consumes the word `keyword` if it is the current token.
    pub(crate) fn eat_keyword(&mut self, keyword: &str) -> bool {
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
            let compared = self.chain(BinOp::is_comparison, Self::additive)?;
            if self.twin && (self.at_keyword("in") || self.at_keyword("nin")) {
                let negated = self.at_keyword("nin");
                self.advance();
                let list = self.array_constant()?;
                return Ok(Expr::In {
                    expr: Box::new(compared),
                    list,
                    negated,
                });
            }
            return Ok(compared);
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
            "select" | "from" | "where" | "group" | "by" | "as" | "top" | "in" | "nin"
                if self.twin =>
            {
                let token = Token {
                    tok: Tok::Ident(name),
                    pos,
                };
                return Err(unexpected(&token, "an expression"));
            }
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
        } else if self.twin {
            let mut steps = vec![Step::Field(name)];
            self.document_path(&mut steps)?;
            Ok(Expr::Body(steps))
        } else {
            Ok(Expr::App(name))
        }
    }

    /// The rest of a twin query path: `.name`, `.$name`, `.[[any name]]`, `[index]`.
    fn document_path(&mut self, steps: &mut Vec<Step>) -> Parsed<()> {
        loop {
            if self.eat(&Tok::Dot) {
                let token = self.advance();
                steps.push(Step::Field(match token.tok {
                    Tok::Ident(name) | Tok::Bracketed(name) => name,
                    Tok::Sys(name) => format!("${name}"),
                    _ => return Err(unexpected(&token, "a field name after '.'")),
                }));
            } else if self.eat(&Tok::LBracket) {
                steps.push(self.bracket_step()?);
            } else {
                return Ok(());
            }
        }
    }

    /// `"field"]` or `index]` after a path's `[`.
    fn bracket_step(&mut self) -> Parsed<Step> {
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
        self.expect(&Tok::RBracket, "']'")?;
        Ok(step)
    }

    /// `[constant, ...]` after `IN` / `NIN`.
    fn array_constant(&mut self) -> Parsed<Vec<Value>> {
        self.expect(&Tok::LBracket, "'[' opening a list of constants")?;
        let mut list = Vec::new();
        if self.eat(&Tok::RBracket) {
            return Ok(list);
        }
        loop {
            let token = self.peek().clone();
            match self.unary()? {
                Expr::Literal(value) => list.push(value),
                _ => return Err(unexpected(&token, "a constant")),
            }
            if !self.eat(&Tok::Comma) {
                self.expect(&Tok::RBracket, "',' or ']'")?;
                return Ok(list);
            }
        }
    }

    fn call(&mut self, name: String, pos: usize) -> Parsed<Expr> {
        let func = if self.twin {
            Func::lookup_twin(&name)
        } else {
            Func::lookup(&name)
        };
        let func = func.ok_or(QueryError::UnknownFunction { pos, name })?;
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
                steps.push(self.bracket_step()?);
            } else {
                return Ok(steps);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::query::condition::MAX_LEN;
    use crate::routing::query::test_support::*;

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
    fn expression_stops_at_a_token_it_does_not_own() {
        let mut cursor = Cursor::new("a = 1 OR b, NOT c FROM devices)").expect("lexes");
        assert!(matches!(parse_expression(&mut cursor), Ok(Expr::Or(_))));
        assert!(cursor.eat(&Tok::Comma));
        assert!(matches!(parse_expression(&mut cursor), Ok(Expr::Not(_))));
        assert!(cursor.eat_keyword("from"));
        assert!(matches!(parse_expression(&mut cursor), Ok(Expr::App(ref n)) if n == "devices"));
        assert_eq!(cursor.advance().tok, Tok::RParen);
        assert_eq!(cursor.advance().tok, Tok::End);
        assert_eq!(cursor.advance().tok, Tok::End, "stays on End");
    }
}
