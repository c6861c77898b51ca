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

mod offline {
    use super::ferrohub;
    use ferrohub_engine::hub::HubSettings;
    use ferrohub_engine::model::{IdentitySpec, IfMatch, UnixMillis};
    use ferrohub_engine::twin::store::TwinWrite;
    use ferrohub_engine::{Store, StoreConfig};
    use std::path::Path;

    const T0: UnixMillis = UnixMillis(1_700_000_000_000);

    fn make_hub(dir: &Path, devices: usize) {
        let store = Store::open(&dir.join("db"), StoreConfig::default()).unwrap();
        store
            .initialise_hub(HubSettings {
                hub_name: "h1".into(),
                host_name: "h1.example".into(),
                other_host_names: Vec::new(),
                policies: HubSettings::default_policies(),
                created: T0,
                provisioning: None,
            })
            .unwrap();
        for i in 0..devices {
            let id = format!("d{i:03}");
            store
                .create_device(&id, &IdentitySpec::default(), T0)
                .unwrap();
            let tags = serde_json::json!({"n": i}).as_object().cloned();
            store
                .update_twin(
                    &id,
                    None,
                    &TwinWrite {
                        tags,
                        desired: None,
                    },
                    &IfMatch::Any,
                    T0,
                )
                .unwrap();
        }
        store
            .create_module("d001", "m", &IdentitySpec::default(), T0)
            .unwrap();
        store.close().unwrap();
    }

    fn run(args: &[&str], dirs: &[&Path]) -> (bool, String) {
        let mut cmd = ferrohub();
        cmd.args(args);
        for d in dirs {
            cmd.arg(d);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn uri(p: &Path) -> String {
        format!("file://{}", p.display())
    }

    #[test]
    fn export_restore_round_trip_and_refusals() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, dst, exp) = (
            tmp.path().join("src"),
            tmp.path().join("dst"),
            tmp.path().join("exp"),
        );
        make_hub(&src, 30);
        let (ok, err) = run(&["export", "--to", &uri(&exp), "--data-dir"], &[&src]);
        assert!(ok, "{err}");
        assert!(
            err.contains("export: 30/30 (100%)"),
            "plain progress lines off a terminal: {err}"
        );
        let lines = std::fs::read_to_string(exp.join("devices.txt")).unwrap();
        assert_eq!(lines.lines().count(), 31, "30 devices and one module");
        let (ok, err) = run(&["restore", "--from", &uri(&exp), "--data-dir"], &[&dst]);
        assert!(ok, "{err}");
        let (a, b) = (
            Store::open_read_only(&src.join("db")).unwrap(),
            Store::open_read_only(&dst.join("db")).unwrap(),
        );
        assert_eq!(a.hub_settings().unwrap(), b.hub_settings().unwrap());
        assert_eq!(
            a.registry_statistics().unwrap(),
            b.registry_statistics().unwrap()
        );
        for i in 0..30 {
            let id = format!("d{i:03}");
            assert_eq!(a.get_device(&id).unwrap(), b.get_device(&id).unwrap());
            assert_eq!(
                a.get_twin(&id, None).unwrap().record,
                b.get_twin(&id, None).unwrap().record
            );
        }
        assert_eq!(
            a.get_module("d001", "m").unwrap(),
            b.get_module("d001", "m").unwrap()
        );
        drop((a, b));
        // A directory that holds a hub is not restored over.
        let (ok, err) = run(&["restore", "--from", &uri(&exp), "--data-dir"], &[&dst]);
        assert!(!ok);
        assert!(err.contains("already holds a hub"), "{err}");
        // An export without keys cannot be restored, and says why (with the line).
        let nokeys = tmp.path().join("nokeys");
        let (ok, err) = run(
            &[
                "export",
                "--exclude-keys",
                "--to",
                &uri(&nokeys),
                "--data-dir",
            ],
            &[&src],
        );
        assert!(ok, "{err}");
        let (ok, err) = run(
            &["restore", "--from", &uri(&nokeys), "--data-dir"],
            &[&tmp.path().join("x")],
        );
        assert!(!ok);
        assert!(
            err.contains("line 1") && err.contains("excludeKeysInExport"),
            "{err}"
        );
        // Not an export at all.
        let (ok, err) = run(
            &[
                "restore",
                "--from",
                &uri(&tmp.path().join("empty")),
                "--data-dir",
            ],
            &[&tmp.path().join("y")],
        );
        assert!(!ok);
        assert!(err.contains("hub.json"), "{err}");
    }

    #[test]
    fn a_data_dir_in_use_is_refused_and_backup_copies_everything() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        make_hub(&src, 3);
        {
            // Holding the database open stands for a running hub.
            let _held = Store::open(&src.join("db"), StoreConfig::default()).unwrap();
            for args in [
                vec![
                    "export".to_string(),
                    "--to".into(),
                    uri(&tmp.path().join("e")),
                ],
                vec![
                    "backup".to_string(),
                    "--to".into(),
                    tmp.path().join("b").display().to_string(),
                ],
            ] {
                let args: Vec<&str> = args
                    .iter()
                    .map(String::as_str)
                    .chain(["--data-dir"])
                    .collect();
                let (ok, err) = run(&args, &[&src]);
                assert!(!ok);
                assert!(err.contains("in use by a running hub"), "{err}");
            }
        }
        std::fs::create_dir_all(src.join("tls")).unwrap();
        std::fs::write(src.join("tls/ca.pem"), b"ca").unwrap();
        let backup = tmp.path().join("backup");
        let (ok, err) = run(
            &["backup", "--data-dir"],
            &[&src, Path::new("--to"), &backup],
        );
        assert!(ok, "{err}");
        assert_eq!(std::fs::read(backup.join("tls/ca.pem")).unwrap(), b"ca");
        let copy = Store::open_read_only(&backup.join("db")).unwrap();
        assert_eq!(copy.registry_statistics().unwrap().total_device_count, 3);
        assert_eq!(
            copy.get_module("d001", "m").unwrap().module_id.as_deref(),
            Some("m")
        );
        // A backup never overwrites.
        let (ok, err) = run(
            &["backup", "--data-dir"],
            &[&src, Path::new("--to"), &backup],
        );
        assert!(!ok);
        assert!(err.contains("exists"), "{err}");
    }
}
