//! What one request costs the whole process, for an instruction count under
//! callgrind (repeatable on a busy machine, unlike a time):
//!
//! ```text
//! cargo bench --bench request_cost --no-run
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null <bench binary> sms 0
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null <bench binary> sms 2000
//! ```
//!
//! The difference of the two totals, divided by the requests, is the
//! instructions per request: the server's (in-process store, every route
//! layer, metrics) and the HTTP client's, which stays the same between two
//! builds. `sms N` sends N codes to distinct phones (each allowed: every
//! window counted, nothing audited); `login N` reports N failed logins of
//! distinct users from one address. Limits are raised and the pumping guard
//! is off so that every request does the same work.

use std::time::Duration;

use tollgate::settings::{LimitSetting, Settings, StoreBackend};
use tollgate::startup::Application;

fn settings(dir: &std::path::Path) -> Settings {
    let mut s = Settings::defaults().expect("the embedded defaults are valid");
    s.server.bind = "127.0.0.1:0".parse().expect("an address");
    s.store.backend = StoreBackend::Memory;
    s.audit.database_url =
        tollgate::settings::SecretUrl::new(format!("sqlite://{}/audit.db?mode=rwc", dir.display()));
    s.audit.spool_dir = format!("{}/spool", dir.display());
    let loose = || vec![LimitSetting::new(1_000_000, Duration::from_secs(3600))];
    s.sms.ip_limits = loose();
    s.sms.prefix_limits = loose();
    s.sms.global_limits = loose();
    s.sms.captcha_after = 1_000_000;
    s.sms.pumping.enabled = false;
    s.login.ip_captcha_after = 1_000_000;
    s.login.ip_block_after = 1_000_001;
    s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`: run a short SMS pass then.
    let (what, n) = match (args.get(1).map(String::as_str), args.get(2)) {
        (Some(what @ ("sms" | "login")), Some(n)) => (what.to_string(), n.parse().unwrap_or(0)),
        _ => ("sms".to_string(), 200),
    };
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async move {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let app = Application::build(settings(dir.path()))
            .await
            .expect("the application builds");
        let base = format!("http://127.0.0.1:{}", app.port());
        let handle = app.handle();
        let server = tokio::spawn(app.run_until_stopped());
        let client = reqwest::Client::new();
        let started = std::time::Instant::now();
        for i in 0..n {
            let (path, body) = match what.as_str() {
                "sms" => (
                    "/sms/send",
                    serde_json::json!({ "phone": format!("+86138{i:08}") }),
                ),
                _ => (
                    "/login/attempt",
                    serde_json::json!({ "user": format!("bench-user-{i}"), "success": false }),
                ),
            };
            let response = client
                .post(format!("{base}{path}"))
                .json(&body)
                .send()
                .await
                .expect("an answer");
            assert!(response.status().is_success(), "{}", response.status());
            let _ = response.bytes().await;
        }
        println!(
            "{what}: {n} requests in {:?} (time is not the figure: count instructions)",
            started.elapsed()
        );
        handle.stop(true).await;
        let _ = server.await;
    });
}
