//! Lexer: condition text to tokens, each with the character offset it starts at.
//!
//! Invariants:
//! - The token list always ends with one [`Tok::End`] whose position is the text's length in
//!   characters, so the parser never runs off the end and "end of condition" has a position.
//! - Positions are 0-based *character* offsets (not bytes), as every [`QueryError`] reports.
//! - Keywords are not tokens of their own: `AND`, `NOT`, `true`, ... are [`Tok::Ident`]s that
//!   the parser recognises case-insensitively, so a later grammar (twin queries' `SELECT`,
//!   `FROM`, `WHERE`, `GROUP BY`) can claim more words without touching the lexer.
//! - `[` is context-sensitive, and the one place the lexer looks back: after `$name`, `]` or
//!   `.field` it continues a `$body`/`$twin` path ([`Tok::LBracket`]); anywhere else it opens
//!   a bracketed application property name, read up to the next `]` ([`Tok::Bracketed`]).
//!   In the twin query dialect ([`tokenize_twin`]) `[` is always [`Tok::LBracket`] (an index
//!   or an array constant) and `[[name]]` is a quoted field name ([`Tok::Bracketed`]).

use serde_json::Number;

use super::QueryError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinOp {
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
    pub(crate) fn is_comparison(self) -> bool {
        matches!(
            self,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
        )
    }

    pub(crate) fn is_additive(self) -> bool {
        matches!(self, BinOp::Add | BinOp::Sub | BinOp::Concat)
    }

    pub(crate) fn is_multiplicative(self) -> bool {
        matches!(self, BinOp::Mul | BinOp::Div | BinOp::Rem)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
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
    /// How an error message names the token.
    pub(crate) fn describe(&self) -> String {
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
pub(crate) struct Token {
    pub(crate) tok: Tok,
    /// Character offset of the token's first character.
    pub(crate) pos: usize,
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
    twin: bool,
}

/// The tokens of `text`, always ending with [`Tok::End`].
///
/// # Errors
/// The first character that starts no token, or a malformed string, number or name.
pub(crate) fn tokenize(text: &str) -> Result<Vec<Token>, QueryError> {
    Lexer::tokenize(text, false)
}

/// The tokens of a twin query (see the module doc for how `[` differs).
///
/// # Errors
/// As [`tokenize`].
pub(crate) fn tokenize_twin(text: &str) -> Result<Vec<Token>, QueryError> {
    Lexer::tokenize(text, true)
}

impl Lexer {
    fn tokenize(text: &str, twin: bool) -> Result<Vec<Token>, QueryError> {
        let mut lexer = Lexer {
            chars: text.chars().collect(),
            at: 0,
            tokens: Vec::new(),
            twin,
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
            '[' if self.twin && self.peek(1) == Some('[') => self.quoted_name(),
            '[' if !self.twin && !bracket_is_index(&self.tokens) => self.bracketed_name(),
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

impl Lexer {
    /// `[[name]]`: a field name that need not be an identifier (twin dialect).
    fn quoted_name(&mut self) -> Result<Tok, QueryError> {
        let start = self.at;
        self.at += 2;
        let mut name = String::new();
        loop {
            match (self.peek(0), self.peek(1)) {
                (Some(']'), Some(']')) => break,
                (Some(c), _) => {
                    name.push(c);
                    self.at += 1;
                }
                (None, _) => return Err(QueryError::UnterminatedName { pos: start }),
            }
        }
        self.at += 2;
        if name.is_empty() {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::routing::query::test_support::*;

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
}
