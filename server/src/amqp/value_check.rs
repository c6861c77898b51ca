//! A structural check of AMQP-encoded values (AMQP 1.0 §1.6), made before the AMQP library
//! decodes them.
//!
//! The library's decoder trusts lengths (it zero-fills a buffer of a string's announced length
//! before reading it) and recurses once per level of nesting without a bound. This walks the
//! same bytes without allocating and without deep recursion: every length and compound size
//! must fit inside the enclosing value, every format code must be known, compounds and
//! descriptors nest at most [`MAX_DEPTH`] deep, and arrays of zero-width elements are bounded.
//!
//! # Invariants
//! - A value that passes can be walked by the decoder within its bytes and at most
//!   [`MAX_DEPTH`] levels deep; the walk itself recurses at most that deep and loops at most
//!   once per byte (every list element and variable-width array element takes a byte).

/// A value that is not well formed, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed AMQP value: {0}")]
pub struct Malformed(pub &'static str);

/// How deep compounds (lists, maps, arrays, described values) may nest in a performative. The
/// deepest the protocol needs is about six (an attach's source's filter set's described
/// filter); the decoder recurses once per level, so this bounds its stack.
pub const MAX_DEPTH: usize = 32;

/// Most elements of an array whose elements take no bytes (e.g. an array of nulls): the
/// decoder refuses more than this anyway, and each costs memory when decoded.
const MAX_EMPTY_ELEMENTS: usize = 65_536;

/// Checks a whole message: one or more sections (described values) filling `bytes` exactly,
/// each well formed and nested at most [`MAX_DEPTH`] deep.
///
/// # Errors
/// [`Malformed`] naming the first problem.
pub fn check_sections(bytes: &[u8]) -> Result<(), Malformed> {
    if bytes.is_empty() {
        return Err(malformed("a message without sections"));
    }
    let mut at = 0;
    while at < bytes.len() {
        at = value_end(bytes, at, 0)?;
    }
    Ok(())
}

fn malformed(what: &'static str) -> Malformed {
    Malformed(what)
}

/// `n` bytes from `at` are within `b`: the end.
fn need(b: &[u8], at: usize, n: usize) -> Result<usize, Malformed> {
    at.checked_add(n)
        .filter(|end| *end <= b.len())
        .ok_or_else(|| malformed("a value runs past its frame or compound"))
}

fn byte_at(b: &[u8], at: usize) -> Result<usize, Malformed> {
    b.get(at)
        .map(|v| usize::from(*v))
        .ok_or_else(|| malformed("a value runs past its frame or compound"))
}

fn u32_at(b: &[u8], at: usize) -> Result<usize, Malformed> {
    need(b, at, 4)?;
    Ok(u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize)
}

/// Bytes a fixed-width format code's value takes, if the code is fixed-width.
fn fixed_width(code: u8) -> Option<usize> {
    match code {
        0x40..=0x45 => Some(0),
        0x50..=0x56 => Some(1),
        0x60 | 0x61 => Some(2),
        0x70..=0x74 => Some(4),
        0x80..=0x84 => Some(8),
        0x94 | 0x98 => Some(16),
        _ => None,
    }
}

/// Where the value starting at `at` (with its constructor) ends.
pub fn value_end(b: &[u8], at: usize, depth: usize) -> Result<usize, Malformed> {
    let (code, data) = constructor(b, at, depth)?;
    data_end(b, data, code, depth)
}

/// A value's format code (after any descriptor) and where its data starts.
fn constructor(b: &[u8], at: usize, depth: usize) -> Result<(u8, usize), Malformed> {
    let code = byte_at(b, at)? as u8;
    if code != 0x00 {
        return Ok((code, at + 1));
    }
    if depth >= MAX_DEPTH {
        return Err(malformed("values nest too deep"));
    }
    let after_descriptor = value_end(b, at + 1, depth + 1)?;
    // A described value's constructor may itself be described: one more level.
    constructor(b, after_descriptor, depth + 1)
}

/// Where a value's data that starts at `at` ends, given its format code.
fn data_end(b: &[u8], at: usize, code: u8, depth: usize) -> Result<usize, Malformed> {
    if let Some(width) = fixed_width(code) {
        return need(b, at, width);
    }
    match code {
        0xa0 | 0xa1 | 0xa3 => need(b, at + 1, byte_at(b, at)?),
        0xb0 | 0xb1 | 0xb3 => need(b, at + 4, u32_at(b, at)?),
        0xc0 | 0xc1 => Extent::read(b, at, 1, depth)?.list(),
        0xd0 | 0xd1 => Extent::read(b, at, 4, depth)?.list(),
        0xe0 => Extent::read(b, at, 1, depth)?.array(),
        0xf0 => Extent::read(b, at, 4, depth)?.array(),
        _ => Err(malformed("unknown format code")),
    }
}

/// A compound's or array's bytes: its size and count fields are `width` bytes each, the size
/// counting everything after itself.
struct Extent<'b> {
    /// The value's bytes, from the start of the enclosing slice to the value's end.
    inner: &'b [u8],
    /// Where the first element (or an array's element constructor) starts.
    first: usize,
    count: usize,
    end: usize,
    depth: usize,
}

impl<'b> Extent<'b> {
    fn read(b: &'b [u8], at: usize, width: usize, depth: usize) -> Result<Self, Malformed> {
        if depth >= MAX_DEPTH {
            return Err(malformed("values nest too deep"));
        }
        let field = |at| {
            if width == 1 {
                byte_at(b, at)
            } else {
                u32_at(b, at)
            }
        };
        let size = field(at)?;
        if size < width {
            return Err(malformed("a compound's size is smaller than its count"));
        }
        let end = need(b, at + width, size)?;
        let inner = &b[..end];
        let count = if width == 1 {
            byte_at(inner, at + 1)?
        } else {
            u32_at(inner, at + 4)?
        };
        Ok(Extent {
            inner,
            first: at + 2 * width,
            count,
            end,
            depth,
        })
    }

    /// A list or map: `count` values, each with its constructor.
    fn list(self) -> Result<usize, Malformed> {
        let mut at = self.first;
        // Every element has at least its format code, so this loop is bounded by the size.
        for _ in 0..self.count {
            at = value_end(self.inner, at, self.depth + 1)?;
        }
        self.filled(at)
    }

    /// The elements end exactly where the size says: the decoder goes by the count and
    /// ignores the size, so a size that disagrees would have it read other bytes than these.
    fn filled(&self, at: usize) -> Result<usize, Malformed> {
        if at != self.end {
            return Err(malformed("a compound's elements do not fill its size"));
        }
        Ok(self.end)
    }

    /// An array: one element constructor, then `count` elements without constructors.
    fn array(self) -> Result<usize, Malformed> {
        let (code, mut at) = constructor(self.inner, self.first, self.depth + 1)?;
        match fixed_width(code) {
            Some(0) if self.count > MAX_EMPTY_ELEMENTS => {
                Err(malformed("an array of empty elements is too long"))
            }
            Some(w) => {
                let elements_end = self
                    .count
                    .checked_mul(w)
                    .and_then(|n| need(self.inner, at, n).ok())
                    .ok_or_else(|| malformed("an array's elements run past it"))?;
                self.filled(elements_end)
            }
            None => {
                // Variable-width elements take at least one byte each: bounded too.
                for _ in 0..self.count {
                    at = data_end(self.inner, at, code, self.depth + 1)?;
                }
                self.filled(at)
            }
        }
    }
}

/// The fields of the described list at `at` (a performative): each field's format code and
/// where its data starts, in order. The list must be well formed.
///
/// # Errors
/// [`Malformed`] if the value at `at` is not a described list.
pub fn described_list_fields(b: &[u8], at: usize) -> Result<Vec<(u8, usize)>, Malformed> {
    let (code, data) = constructor(b, at, 0)?;
    // (where the size counts from, the size, the count, the first field)
    let (sized, size, count, first) = match code {
        0x45 => return Ok(Vec::new()),
        0xc0 => (data + 1, byte_at(b, data)?, byte_at(b, data + 1)?, data + 2),
        0xd0 => (data + 4, u32_at(b, data)?, u32_at(b, data + 4)?, data + 8),
        _ => return Err(malformed("a performative is not a list")),
    };
    let end = need(b, sized, size)?;
    let inner = &b[..end];
    let mut fields = Vec::new();
    let mut field = first;
    for _ in 0..count {
        let (code, start) = constructor(inner, field, 1)?;
        fields.push((code, start));
        field = data_end(inner, start, code, 1)?;
    }
    Ok(fields)
}

/// A uint field's value (`uint`, `smalluint`, `uint0`), if it is one.
pub fn uint_field(b: &[u8], (code, at): (u8, usize)) -> Option<u32> {
    match code {
        0x43 => Some(0),
        0x52 => b.get(at).map(|v| u32::from(*v)),
        0x70 => b
            .get(at..at + 4)
            .map(|v| u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
        _ => None,
    }
}

/// A boolean field's value; null and absent are `false`, as the performatives default them.
pub fn bool_field(b: &[u8], field: Option<(u8, usize)>) -> bool {
    match field {
        Some((0x41, _)) => true,
        Some((0x56, at)) => b.get(at) == Some(&1),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_values_end_where_they_end() {
        for (bytes, end) in [
            (&b"\x40"[..], 1),
            (b"\xa1\x03abc", 5),
            (b"\xb0\x00\x00\x00\x02ab", 7),
            (b"\xc0\x04\x02\x40\x52\x07", 6),
            (b"\xe0\x05\x03\x50\x01\x02\x03", 7),
            (b"\x00\x53\x77\xa1\x01x", 6),
            (b"\x00\x40\x00\x40\x41", 5),
        ] {
            assert_eq!(value_end(bytes, 0, 0), Ok(end), "{bytes:02x?}");
        }
    }

    #[test]
    fn lengths_past_the_end_and_deep_nesting_are_malformed() {
        for bytes in [
            &b"\xb1\xb1\xb1\xb1\xb1"[..],
            b"\xa1\x05abc",
            b"\xc0\x00\x01",
            b"\xc1\x10\x02\x40\x40",
            b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40",
            b"\x31",
            // A map whose two elements end before its size does (the decoder would read on
            // from where they end, here a str32 announcing 2 GB).
            b"\xc1\x09\x02\xa1\x01k\x40\xb1\x80\xa3\x00",
        ] {
            assert!(value_end(bytes, 0, 0).is_err(), "{bytes:02x?}");
        }
        let deep: Vec<u8> = std::iter::repeat([0x00, 0x40])
            .take(MAX_DEPTH + 1)
            .flatten()
            .chain([0x40])
            .collect();
        assert_eq!(
            value_end(&deep, 0, 0),
            Err(Malformed("values nest too deep"))
        );
        let shallow: Vec<u8> = std::iter::repeat([0x00, 0x40])
            .take(MAX_DEPTH - 2)
            .flatten()
            .chain([0x40])
            .collect();
        assert_eq!(value_end(&shallow, 0, 0), Ok(shallow.len()));
    }
}
