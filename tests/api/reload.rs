//! SIGHUP swaps the decision settings in; a bad file keeps the old ones.

use std::time::Duration;

use serde_json::json;
use tollgate::guard::{Policy, PolicyCell};
use tollgate::reload::reload_into;
use tollgate::settings::Settings;

use crate::audit::eventually;
use crate::process::Tollgate;

fn config(dir: &std::path::Path, phone_limit: u32, lock_after: u32) -> std::path::PathBuf {
    let path = dir.join("tollgate.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[server]
bind = "127.0.0.1:0"
[audit]
database_url = "sqlite://{}?mode=rwc"
spool_dir = "{}"
[sms]
phone_limits = [{{ limit = {phone_limit}, window = "1h" }}]
[login]
lock_after = {lock_after}
account_lock_after = 100
[lists]
block_users = ["mallory-{phone_limit}"]
"#,
            dir.join("audit.db").display(),
            dir.join("spool").display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_reload_swaps_the_decision_settings_and_a_bad_file_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cell = PolicyCell::new(Policy::from_settings(&Settings::defaults().unwrap()).unwrap());
    let lists = tollgate::lists::Lists::new(&Default::default(), None);
    assert_eq!(cell.current().sms_phone.rules[0].limit, 1);

    let blocked = |user: &str| {
        let request = tollgate::lists::ListRequest {
            user: Some(user),
            ..Default::default()
        };
        lists.current().check(request) != tollgate::lists::Listed::No
    };
    assert!(!blocked("mallory-3"));

    let file = config(dir.path(), 3, 7);
    reload_into(&cell, &lists, Some(&file)).unwrap();
    assert_eq!(cell.current().sms_phone.rules[0].limit, 3);
    assert_eq!(cell.current().pair_lock.map(|rule| rule.limit), Some(7));
    assert!(blocked("mallory-3"), "the file's list entries are in force");

    let bad = config(dir.path(), 4, 0);
    let error = reload_into(&cell, &lists, Some(&bad))
        .unwrap_err()
        .to_string();
    assert!(error.contains("login.lock_after"), "{error}");
    assert_eq!(
        cell.current().sms_phone.rules[0].limit,
        3,
        "the old settings stay"
    );
    assert!(
        blocked("mallory-3") && !blocked("mallory-4"),
        "and the old lists"
    );
}

#[tokio::test]
async fn sighup_reloads_a_running_server_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), 1, 10);
    let server = Tollgate::start(&file).await;
    let client = reqwest::Client::new();
    let send = || async {
        client
            .post(format!("{}/sms/send", server.address))
            .json(&json!({ "phone": "+8613800138000" }))
            .send()
            .await
            .unwrap()
    };
    assert_eq!(send().await.status(), 200);
    assert_eq!(send().await.status(), 429);

    config(dir.path(), 3, 10);
    server.signal("-HUP");
    eventually("the new phone limit", Duration::from_secs(10), || async {
        send().await.status() == 200
    })
    .await;
    assert_eq!(send().await.status(), 200, "3 per hour now");
    let limited = send().await;
    assert_eq!(limited.status(), 429);
    let body: serde_json::Value = limited.json().await.unwrap();
    assert_eq!(body["rule"], "phone 3/1h");

    // A bad file is refused; the server keeps serving with the last good settings.
    config(dir.path(), 50, 0);
    server.signal("-HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = send().await;
    assert_eq!(still.status(), 429);
    let body: serde_json::Value = still.json().await.unwrap();
    assert_eq!(body["rule"], "phone 3/1h");
}
