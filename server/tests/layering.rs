//! The server's layers stack: a module may use only modules of a lower layer (see the crate
//! docs and `docs/architecture.md`). Read from the sources, so an upward import fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Layer of each top-level module of `server/src`; higher layers may use lower ones only.
const LAYERS: &[(&str, u8)] = &[
    ("main", 9),
    ("lib", 9),
    ("node", 8),
    ("offline", 9),
    ("control", 7),
    ("transport", 7),
    ("console", 7),
    ("fuzz", 7),
    ("mqtt", 6),
    ("amqp", 6),
    ("rest", 6),
    ("hub", 5),
    ("error_codes", 4),
    ("backup", 4),
    ("cluster", 4),
    ("routing", 3),
    ("auth", 3),
    ("telemetry", 3),
    ("c2d_message", 3),
    ("x509", 2),
    ("tls", 3),
    ("config", 2),
    ("clock", 1),
    ("latency", 1),
    ("blob", 1),
    ("ids", 1),
    ("layout", 1),
];

fn layer(module: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, l)| *l)
        .unwrap_or_else(|| panic!("module {module} has no layer: add it to LAYERS"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a file names through `crate::`, comments and tests left out.
fn crate_references(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = Vec::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or_default();
        for (i, _) in line.match_indices("crate::") {
            let name: String = line[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn every_import_goes_down_a_layer() {
    let src = manifest_dir().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let module = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|c| c.trim_end_matches(".rs").to_string())
            .expect("a module");
        let text = std::fs::read_to_string(file).expect("readable file");
        for used in crate_references(&text) {
            if used != module && layer(&used) >= layer(&module) {
                upward
                    .entry(relative.display().to_string())
                    .or_default()
                    .push(used);
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that do not go down a layer: {upward:#?}"
    );
}

#[test]
fn the_check_sees_an_upward_import() {
    assert_eq!(
        crate_references(
            "use crate::hub::HubContext; // crate::rest\nfn f() { crate::clock::iso7(x) }"
        ),
        vec!["hub".to_string(), "clock".to_string()]
    );
}

/// The package directory of the tree under test, read when the test runs: a compile-time path
/// would point at whichever checkout first built this binary into the shared target directory.
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
