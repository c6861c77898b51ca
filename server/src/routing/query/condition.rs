//! A route condition: parsed once, when the route is stored, and evaluated per message.
//!
//! Invariants:
//! - A `Condition` is immutable and `Send + Sync`; the routing table shares it across every
//!   connection's task.
//! - Only a condition that evaluates to exactly `true` matches: undefined, `false` and
//!   non-boolean results do not.
//! - The text is checked against [`MAX_LEN`] before it is lexed, so the lexer and parser only
//!   ever see bounded input.

use serde_json::Value;

use super::ast::Expr;
use super::eval::MessageView;
use super::parse::parse_condition;
use super::QueryError;

/// Longest condition accepted, in characters.
pub(crate) const MAX_LEN: usize = 10_000;

/// A parsed route condition.
#[derive(Debug, Clone)]
pub struct Condition {
    text: String,
    pub(super) expr: Expr,
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
        let expr = parse_condition(text)?;
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

    /// Whether evaluating it may read the device's twin (`$twin…`).
    pub fn reads_twin(&self) -> bool {
        self.expr.reads_twin()
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::query::test_support::*;

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
