//! The cluster's secret: a key that exists only in a file on each node (`[cluster]
//! secret_file`), never on the NATS servers. What the nodes must share but NATS must not read in
//! clear (the CA's and the server's private keys) is sealed with it before it is published.
//!
//! # Invariants
//! - A sealed value is `MAGIC`, a fresh random nonce and the ChaCha20-Poly1305 ciphertext with
//!   its tag; opening it with another key, or after any byte changed, fails (nothing is
//!   returned that the key's holder did not seal).
//! - The key is exactly 32 bytes, written in the file as 64 hexadecimal digits; anything else
//!   is refused when the node starts, before it reaches NATS.

use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// Opens every sealed value, so a reader of NATS's storage can tell it is not clear text.
pub const MAGIC: &[u8] = b"ferrohub-sealed-v1\0";
const KEY_LEN: usize = 32;

/// Why a secret could not be read or a value not opened.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the cluster secret {path}: {reason}")]
    File { path: String, reason: String },
    #[error(
        "the cluster secret {path} must hold 64 hexadecimal digits (32 random bytes, the same \
         file on every node; make one with `openssl rand -hex 32`)"
    )]
    Format { path: String },
    #[error("the value is not sealed")]
    NotSealed,
    #[error(
        "the value was sealed with another cluster secret, or changed: every node needs the \
         same secret_file"
    )]
    Unopenable,
    #[error("no random bytes for a nonce")]
    Random,
}

/// The key; its bytes never leave this type.
pub struct ClusterSecret {
    key: LessSafeKey,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// Reads the key from `path` (64 hexadecimal digits; surrounding white space ignored).
    ///
    /// # Errors
    /// The file is unreadable or does not hold exactly 32 bytes in hexadecimal.
    pub fn read(path: &Path) -> Result<ClusterSecret, SecretError> {
        let text = std::fs::read_to_string(path).map_err(|e| SecretError::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::from_hex(text.trim()).ok_or_else(|| SecretError::Format {
            path: path.display().to_string(),
        })
    }

    fn from_hex(text: &str) -> Option<ClusterSecret> {
        if text.len() != KEY_LEN * 2 || !text.is_ascii() {
            return None;
        }
        let bytes = (0..KEY_LEN)
            .map(|i| u8::from_str_radix(&text[i * 2..i * 2 + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes).ok()?;
        Some(ClusterSecret {
            key: LessSafeKey::new(key),
        })
    }

    /// `plain`, sealed: [`MAGIC`], nonce, ciphertext and tag.
    ///
    /// # Errors
    /// The system gave no random bytes.
    pub fn seal(&self, plain: &[u8]) -> Result<Vec<u8>, SecretError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SecretError::Random)?;
        let mut body = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(MAGIC),
                &mut body,
            )
            .map_err(|_| SecretError::Random)?;
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE_LEN + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// What [`ClusterSecret::seal`] sealed.
    ///
    /// # Errors
    /// [`SecretError::NotSealed`] for a value without [`MAGIC`] (published before values were
    /// sealed); [`SecretError::Unopenable`] for another key's or a changed value.
    pub fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, SecretError> {
        let rest = sealed.strip_prefix(MAGIC).ok_or(SecretError::NotSealed)?;
        if rest.len() < NONCE_LEN {
            return Err(SecretError::Unopenable);
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SecretError::Unopenable)?;
        let mut body = body.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(MAGIC), &mut body)
            .map_err(|_| SecretError::Unopenable)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const KEY_B: &str = "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_unchanged() {
        let a = ClusterSecret::from_hex(KEY_A).unwrap();
        let b = ClusterSecret::from_hex(KEY_B).unwrap();
        let plain = b"-----BEGIN PRIVATE KEY-----\nabc\n";
        let sealed = a.seal(plain).unwrap();
        assert!(sealed.starts_with(MAGIC));
        assert!(
            !sealed.windows(11).any(|w| w == b"PRIVATE KEY"),
            "no clear text in a sealed value"
        );
        assert_eq!(a.open(&sealed).unwrap(), plain);
        assert!(matches!(b.open(&sealed), Err(SecretError::Unopenable)));
        let mut changed = sealed.clone();
        let last = changed.len() - 1;
        changed[last] ^= 1;
        assert!(matches!(a.open(&changed), Err(SecretError::Unopenable)));
        assert!(matches!(a.open(plain), Err(SecretError::NotSealed)));
        assert_ne!(a.seal(plain).unwrap(), sealed, "a fresh nonce each time");
    }

    #[test]
    fn only_32_bytes_in_hexadecimal_make_a_key() {
        assert!(ClusterSecret::from_hex(KEY_A).is_some());
        assert!(ClusterSecret::from_hex(&KEY_A[2..]).is_none());
        assert!(ClusterSecret::from_hex(&format!("{KEY_A}00")).is_none());
        assert!(ClusterSecret::from_hex(&KEY_A.replace('0', "g")).is_none());
        assert!(ClusterSecret::from_hex(&"é".repeat(32)).is_none());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, format!("{KEY_A}\n")).unwrap();
        assert!(ClusterSecret::read(&file).is_ok());
        std::fs::write(&file, "short\n").unwrap();
        let e = ClusterSecret::read(&file).unwrap_err().to_string();
        assert!(e.contains("openssl rand -hex 32"), "{e}");
        assert!(matches!(
            ClusterSecret::read(&dir.path().join("absent")),
            Err(SecretError::File { .. })
        ));
    }
}
