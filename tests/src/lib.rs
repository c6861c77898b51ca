//! Testkits: [`TestHub`] starts the real `ferrohub` binary on ephemeral loopback ports in a
//! temporary data directory and gives its addresses and owner credentials; [`inproc`] runs the
//! hub's services inside the test, on a clock the test can pause.

pub mod inproc;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The `ferrohub` binary: `FERROHUB_BIN`, or next to this test executable's `deps/` folder.
pub fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("FERROHUB_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target profile directory")
        .join("ferrohub")
}

/// A running hub; killed on drop.
pub struct TestHub {
    pub dir: tempfile::TempDir,
    pub child: Child,
    pub https_port: u16,
    pub mqtt_port: u16,
    pub owner: String,
}

impl TestHub {
    pub fn start() -> TestHub {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(binary())
            .args(["serve", "--data-dir"])
            .arg(dir.path().join("hub"))
            .args(["--https-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0"])
            .args([
                "--amqp-addr",
                "127.0.0.1:0",
                "--mqtt-quic-addr",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary().display()));
        let stdout = child.stdout.take().expect("stdout");
        let (mut https_port, mut mqtt_port, mut owner) = (0, 0, String::new());
        let mut lines = BufReader::new(stdout).lines();
        for line in lines.by_ref() {
            let line = line.expect("hub output");
            let port = |l: &str| {
                l.rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("HostName=") && line.contains("SharedAccessKeyName=iothubowner") {
                owner = line.clone();
            } else if line.starts_with("listening mqtt=") {
                mqtt_port = port(&line);
            } else if line.starts_with("listening https=") {
                https_port = port(&line);
                break;
            }
        }
        assert!(
            https_port > 0 && mqtt_port > 0 && !owner.is_empty(),
            "hub did not start"
        );
        // Keep draining stdout so the hub never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        TestHub {
            dir,
            child,
            https_port,
            mqtt_port,
            owner,
        }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("hub/tls/ca.pem")
    }

    /// A token for `policy` at hub scope, valid for an hour.
    pub fn token(&self, policy: &str) -> String {
        let key = self
            .owner
            .split("SharedAccessKey=")
            .nth(1)
            .expect("owner key");
        assert_eq!(
            policy, "iothubowner",
            "the testkit knows the owner key only"
        );
        let expiry = chrono::Utc::now().timestamp() as u64 + 3600;
        ferrohub_server::auth::sas::sign("localhost", key, expiry, Some(policy)).expect("token")
    }
}

impl Drop for TestHub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
