//! The real `tollgate` binary as a child process, for what only a process can
//! show: signals, a crash, a restart.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The real binary, as a child process.
pub struct Tollgate {
    pub child: tokio::process::Child,
    pub address: String,
}

impl Tollgate {
    pub async fn start(config: &std::path::Path) -> Self {
        // Run from the config's directory, not the repository: scripts,
        // templates and migrations must come from the binary itself.
        let workdir = config.parent().unwrap_or(std::path::Path::new("/"));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .current_dir(workdir)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the tollgate binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let address = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("tollgate listening") {
                    let log: serde_json::Value =
                        serde_json::from_str(&line).expect("JSON logs off a terminal");
                    return log["address"].as_str().unwrap().to_string();
                }
            }
            panic!("tollgate exited before listening");
        })
        .await
        .expect("tollgate listens within 30 s");
        // Keep draining the log so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            child,
            address: format!("http://{address}"),
        }
    }

    pub async fn refused_send(&self, client: &reqwest::Client, request_id: &str) {
        let response = client
            .post(format!("{}/sms/send", self.address))
            .header("x-request-id", request_id)
            .json(&json!({ "phone": "+8613800138000" }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
    }

    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("still running").to_string();
        let status = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap();
        assert!(status.success());
    }
}
