//! The real `tollgate` binary as a child process, for what only a process can
//! show: signals, a crash, a restart.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Writes `dir/tollgate.toml` for the binary: a free port, the audit trail
/// in SQLite in `dir`, `server` lines added to `[server]`, then `rest` (more
/// sections).
pub fn config_file(dir: &std::path::Path, server: &str, rest: &str) -> std::path::PathBuf {
    let path = dir.join("tollgate.toml");
    let text = format!(
        "[server]\nbind = \"127.0.0.1:0\"\n{server}\n[audit]\ndatabase_url = \"sqlite://{dir}/audit.db?mode=rwc\"\nspool_dir = \"{dir}/spool\"\n{rest}\n",
        dir = dir.display()
    );
    std::fs::write(&path, text).expect("the config file is written");
    path
}

/// The real binary, as a child process.
pub struct Tollgate {
    pub child: tokio::process::Child,
    pub address: String,
    /// The admin listener's, when `server.admin_bind` is set.
    pub admin_address: Option<String>,
    /// Every line it has logged so far (JSON, stderr).
    pub log: std::sync::Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Tollgate {
    pub async fn start(config: &std::path::Path) -> Self {
        Self::start_with_env(config, &[]).await
    }

    pub async fn start_with_env(config: &std::path::Path, envs: &[(&str, &str)]) -> Self {
        Self::spawn(config, envs, None).await
    }

    /// Under `RLIMIT_NOFILE` `soft`:`hard`, set by util-linux's `prlimit`
    /// (which then execs the binary: the child is tollgate itself).
    pub async fn start_with_nofile(config: &std::path::Path, soft: u64, hard: u64) -> Self {
        Self::spawn(config, &[], Some((soft, hard))).await
    }

    async fn spawn(
        config: &std::path::Path,
        envs: &[(&str, &str)],
        nofile: Option<(u64, u64)>,
    ) -> Self {
        // Run from the config's directory, not the repository: scripts,
        // templates and migrations must come from the binary itself.
        let workdir = config.parent().unwrap_or(std::path::Path::new("/"));
        let mut command = match nofile {
            None => tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate")),
            Some((soft, hard)) => {
                let mut prlimit = tokio::process::Command::new("prlimit");
                prlimit
                    .arg(format!("--nofile={soft}:{hard}"))
                    .arg("--")
                    .arg(env!("CARGO_BIN_EXE_tollgate"));
                prlimit
            }
        };
        let mut child = command
            .current_dir(workdir)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the tollgate binary starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut admin_address = None;
        let address = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(line)) = lines.next_line().await {
                log.lock().push(line.clone());
                let listening = |what: &str| {
                    line.contains(what).then(|| {
                        let log: serde_json::Value =
                            serde_json::from_str(&line).expect("JSON logs off a terminal");
                        log["address"].as_str().unwrap().to_string()
                    })
                };
                if let Some(address) = listening("tollgate admin listening") {
                    admin_address = Some(format!("http://{address}"));
                } else if let Some(address) = listening("tollgate listening") {
                    return address;
                }
            }
            panic!("tollgate exited before listening: {:?}", log.lock());
        })
        .await
        .expect("tollgate listens within 30 s");
        // Keep draining the log so the child never blocks on a full pipe.
        let kept = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().push(line);
            }
        });
        Self {
            child,
            address: format!("http://{address}"),
            admin_address,
            log,
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

    /// The lines logged so far that contain `text`.
    pub fn lines(&self, text: &str) -> Vec<String> {
        self.log
            .lock()
            .iter()
            .filter(|l| l.contains(text))
            .cloned()
            .collect()
    }

    /// The lines that contain `text`, once one is there: a task reads the
    /// log, so a line arrives a moment after the answer it goes with. Empty
    /// when none came within 2 s.
    pub async fn logged(&self, text: &str) -> Vec<String> {
        for _ in 0..100 {
            let lines = self.lines(text);
            if !lines.is_empty() {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Vec::new()
    }

    /// `/metrics` (on the public listener), as Prometheus text.
    pub async fn metrics(&self, client: &reqwest::Client) -> String {
        super::text_of(client.get(format!("{}/metrics", self.address))).await
    }

    /// Asserts `/metrics` (on the public listener) has each of `series` as
    /// a whole line.
    pub async fn assert_metrics(&self, client: &reqwest::Client, series: &[&str]) {
        let metrics = self.metrics(client).await;
        for series in series {
            assert!(
                metrics.lines().any(|l| l == *series),
                "no {series}:\n{metrics}"
            );
        }
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
