//! Lock tokens: GUID-shaped strings that name one lock of one message.
//!
//! The first 8 bytes are the message's sequence number, so a token finds its message with one
//! point read; the last 8 are random per lock, so a token from an earlier lock of the same
//! message (expired, abandoned) never matches the current one.

use std::fmt::Write;

/// A parsed lock token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockToken {
    pub sequence: u64,
    pub nonce: u64,
}

impl LockToken {
    pub(crate) fn new(sequence: u64) -> Self {
        LockToken {
            sequence,
            nonce: rand::random(),
        }
    }

    /// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase hex.
    pub(crate) fn render(&self) -> String {
        let mut hex = String::with_capacity(32);
        for b in self
            .sequence
            .to_be_bytes()
            .iter()
            .chain(self.nonce.to_be_bytes().iter())
        {
            let _ = write!(hex, "{b:02x}");
        }
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    /// Parses a token as rendered (hyphens optional, any case, surrounding quotes ignored).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let hex: String = text
            .trim()
            .trim_matches('"')
            .chars()
            .filter(|c| *c != '-')
            .collect();
        if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let sequence = u64::from_str_radix(&hex[..16], 16).ok()?;
        let nonce = u64::from_str_radix(&hex[16..], 16).ok()?;
        Some(LockToken { sequence, nonce })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_differ_per_lock() {
        let t = LockToken::new(42);
        let text = t.render();
        assert_eq!(text.len(), 36);
        assert_eq!(LockToken::parse(&text), Some(t));
        assert_eq!(
            LockToken::parse(&format!("\"{}\"", text.to_uppercase())),
            Some(t)
        );
        assert_ne!(LockToken::new(42).nonce, t.nonce);
        assert_eq!(LockToken::parse("not-a-token"), None);
        assert_eq!(LockToken::parse(""), None);
    }
}
