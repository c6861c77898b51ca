//! The `ferrohub` command line without a running hub: help, and clear errors for a data
//! directory that holds no hub. (Also makes `cargo test` build the binary the end-to-end
//! suites run.)

use std::process::Command;

fn ferrohub() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferrohub"))
}

#[test]
fn help_lists_the_commands() {
    let out = ferrohub().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["serve", "connection-string", "ca"] {
        assert!(text.contains(cmd), "{cmd} missing from:\n{text}");
    }
}

#[test]
fn connection_string_for_an_empty_directory_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let out = ferrohub()
        .args(["connection-string", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no database"), "{err}");
}

#[test]
fn invalid_config_is_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[hub]\nhostname = \"typo\"\n").unwrap();
    let out = ferrohub()
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("hostname"));
    assert!(!dir.path().join("data").exists());
}
