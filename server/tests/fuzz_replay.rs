//! The fuzz targets in CI: every seed (`fuzz/seeds/<target>/`) and every saved finding
//! (`fuzz/regressions/<target>/`) goes through the target's entry point, then a few seconds of
//! mutations of them. Coverage-guided runs are `scripts/fuzz.sh` (nightly, outside CI); this is
//! their smoke, on the stable toolchain, through the same entry points.
//!
//! `FUZZ_SMOKE_SECS` sets the mutation time per target (default 2); `FUZZ_SMOKE_SEED` the seed.
//! An input that panics is written to `$CARGO_TARGET_TMPDIR/fuzz-smoke/` and named in the failure.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn inputs(folder: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join(folder).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

fn entry(target: &str) -> fn(&[u8]) {
    ferrohub_server::fuzz::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, f)| *f)
        .unwrap_or_else(|| panic!("no fuzz target {target}"))
}

/// Runs one input; a panic fails the test naming a file that holds the input.
fn run(target: &str, f: fn(&[u8]), input: &[u8], origin: &str) {
    if catch_unwind(AssertUnwindSafe(|| f(input))).is_err() {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke");
        std::fs::create_dir_all(&dir).ok();
        let path = dir.join(format!("{target}-{:016x}", fnv(input)));
        std::fs::write(&path, input).ok();
        panic!(
            "{target} panicked on {origin}; input saved as {}",
            path.display()
        );
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Bytes that matter to the parsers: delimiters, quotes, escapes, length-ish values.
const INTERESTING: &[u8] = b"\x00\x01\x7f\x80\xff%&=/#+$.{}[]()\"'\\,:;<> \n0123456789AaZz-_";

fn mutate(rng: &mut StdRng, corpus: &[Vec<u8>], input: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..=8) {
        let len = input.len();
        match rng.gen_range(0..7) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                input[i] = INTERESTING[rng.gen_range(0..INTERESTING.len())];
            }
            2 => {
                let i = rng.gen_range(0..=len);
                input.insert(i, rng.gen());
            }
            3 if len > 0 => {
                let i = rng.gen_range(0..len);
                let n = rng.gen_range(1..=(len - i).min(16));
                input.drain(i..i + n);
            }
            4 if len > 0 => {
                let i = rng.gen_range(0..len);
                let n = rng.gen_range(1..=(len - i).min(32));
                let piece = input[i..i + n].to_vec();
                let at = rng.gen_range(0..=len);
                input.splice(at..at, piece);
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[rng.gen_range(0..corpus.len())];
                if !other.is_empty() {
                    let i = rng.gen_range(0..other.len());
                    let n = rng.gen_range(1..=(other.len() - i).min(64));
                    let at = rng.gen_range(0..=len);
                    input.splice(at..at, other[i..i + n].iter().copied());
                }
            }
            _ => {
                let i = rng.gen_range(0..=len);
                let byte = INTERESTING[rng.gen_range(0..INTERESTING.len())];
                input.splice(i..i, std::iter::repeat(byte).take(rng.gen_range(1..64)));
            }
        }
    }
}

fn smoke(target: &str) {
    let f = entry(target);
    let seeds = inputs("seeds", target);
    let regressions = inputs("regressions", target);
    assert!(!seeds.is_empty(), "{target} has no seeds");
    for (path, bytes) in seeds.iter().chain(&regressions) {
        run(target, f, bytes, &path.display().to_string());
    }
    let secs: u64 = std::env::var("FUZZ_SMOKE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let seed: u64 = std::env::var("FUZZ_SMOKE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_123);
    let mut rng = StdRng::seed_from_u64(seed ^ fnv(target.as_bytes()));
    let corpus: Vec<Vec<u8>> = seeds
        .into_iter()
        .chain(regressions)
        .map(|(_, b)| b)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut runs = 0u64;
    while Instant::now() < deadline {
        let mut input = corpus[rng.gen_range(0..corpus.len())].clone();
        mutate(&mut rng, &corpus, &mut input);
        run(target, f, &input, &format!("mutation {runs} (seed {seed})"));
        runs += 1;
    }
    eprintln!(
        "{target}: {} inputs replayed, {runs} mutations",
        corpus.len()
    );
}

macro_rules! smoke_tests {
    ($($target:ident),* $(,)?) => {
        $(#[test] fn $target() { smoke(stringify!($target)); })*

        #[test]
        fn every_target_has_a_smoke_test() {
            let tested = [$(stringify!($target)),*];
            for (name, _) in ferrohub_server::fuzz::TARGETS {
                assert!(tested.contains(name), "{name} has no smoke test here");
            }
        }
    };
}

smoke_tests!(
    mqtt_stream,
    property_bag,
    topics,
    sas_token,
    twin_patch,
    query,
    identity_json,
    config_toml,
    amqp_frames,
    dps_register,
    enrollment_json,
    pnp_patch,
    amqp_device_link,
);
