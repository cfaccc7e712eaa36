//! SIGHUP swaps the decision settings in; a bad file keeps the old ones.

use std::time::Duration;

use serde_json::json;
use tollgate::delivery::{Templates, TemplatesCell};
use tollgate::guard::{Policy, PolicyCell};
use tollgate::reload::Reloadable;
use tollgate::settings::Settings;

use crate::support::process::Tollgate;
use crate::support::wait::eventually;

fn config(dir: &std::path::Path, phone_limit: u32, lock_after: u32) -> std::path::PathBuf {
    let path = dir.join("tollgate.toml");
    std::fs::write(&path, config_text(dir, phone_limit, lock_after, true)).unwrap();
    path
}

/// A config whose phone limit (and blocked user) says which version of the
/// file is in force.
fn config_text(dir: &std::path::Path, phone_limit: u32, lock_after: u32, watch: bool) -> String {
    format!(
        r#"
[server]
bind = "127.0.0.1:0"
watch_config = {watch}
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
    )
}

/// What a reload swaps, in force on the defaults; no SMS provider to remake.
fn on_defaults() -> Reloadable {
    Reloadable {
        policy: std::sync::Arc::new(PolicyCell::new(
            Policy::from_settings(&Settings::defaults().unwrap()).unwrap(),
        )),
        lists: std::sync::Arc::new(tollgate::lists::Lists::new(Vec::new(), None)),
        templates: std::sync::Arc::new(TemplatesCell::new(Templates::compiled())),
        sender: None,
    }
}

#[test]
fn a_reload_swaps_the_decision_settings_and_a_bad_file_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let reloadable = on_defaults();
    let (cell, lists) = (&reloadable.policy, &reloadable.lists);
    assert_eq!(cell.current().sms.phone.rules[0].limit, 1);

    let blocked = |user: &str| {
        let request = tollgate::lists::ListRequest {
            user: Some(user),
            ..Default::default()
        };
        lists.current().check(request) != tollgate::lists::Listed::No
    };
    assert!(!blocked("mallory-3"));

    let file = config(dir.path(), 3, 7);
    reloadable.reload(Some(&file)).unwrap();
    assert_eq!(cell.current().sms.phone.rules[0].limit, 3);
    assert_eq!(
        cell.current().login.pair_lock.map(|rule| rule.limit),
        Some(7)
    );
    assert!(blocked("mallory-3"), "the file's list entries are in force");

    let bad = config(dir.path(), 4, 0);
    let error = reloadable.reload(Some(&bad)).unwrap_err().to_string();
    assert!(error.contains("login.lock_after"), "{error}");
    assert_eq!(
        cell.current().sms.phone.rules[0].limit,
        3,
        "the old settings stay"
    );
    assert!(
        blocked("mallory-3") && !blocked("mallory-4"),
        "and the old lists"
    );

    // A file truncated in place (or only comments) would reset everything
    // to the defaults, lifting the file's block list: refused.
    for empty in ["", "\n  \n", "# being rewritten\n"] {
        std::fs::write(&bad, empty).unwrap();
        let error = reloadable.reload(Some(&bad)).unwrap_err().to_string();
        assert!(error.contains("is empty"), "{empty:?}: {error}");
        assert_eq!(cell.current().sms.phone.rules[0].limit, 3, "{empty:?}");
        assert!(blocked("mallory-3"), "{empty:?}: the block list stays");
    }
}

/// `sms.prefix_digits` and `sms.network_bits` wait for a restart, as the
/// log says: the prefix windows and the pumping guard keep cutting phones
/// where the audit rollups do, and every network window keeps its subjects.
#[test]
fn a_reload_keeps_the_running_prefix_digits_and_network_bits_until_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let reloadable = on_defaults();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(
        &file,
        "[sms]\nprefix_digits = 4\nnetwork_bits = 56\nmax_verify_attempts = 3\n",
    )
    .unwrap();
    let read = reloadable.reload(Some(&file)).unwrap();
    assert_eq!(read.sms.prefix_digits, 4, "read, to be named as waiting");
    assert_eq!(read.sms.network_bits, 56, "read, to be named as waiting");
    let policy = reloadable.policy.current();
    assert_eq!(policy.sms.settings.prefix_digits, 7, "the running value");
    assert_eq!(policy.sms.settings.network_bits, 48, "the running value");
    assert_eq!(
        policy.sms.settings.max_verify_attempts, 3,
        "the rest applies"
    );
}

#[tokio::test]
async fn sighup_reloads_a_running_server_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), 1, 10);
    let server = Tollgate::start(&file).await;
    let client = reqwest::Client::new();
    let send = || send_code(&server, &client);
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
    eventually(
        "the rejection in the log",
        Duration::from_secs(10),
        || async { rejected(&server, "login.lock_after", "Hangup") },
    )
    .await;
    let still = send().await;
    assert_eq!(still.status(), 429);
    let body: serde_json::Value = still.json().await.unwrap();
    assert_eq!(body["rule"], "phone 3/1h");
    // Each reload is counted, for an alert on a rejected one (a watched
    // file's change may reload it once more beside the signal).
    let metrics = server.metrics(&client).await;
    let value = |series: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    let applied = value(r#"tollgate_config_reloads_total{outcome="applied"}"#);
    let rejected = value(r#"tollgate_config_reloads_total{outcome="rejected"}"#);
    assert!(applied >= Some(1.0) && rejected >= Some(1.0), "{metrics}");
    assert_eq!(
        value("tollgate_config_last_reload_successful"),
        Some(0.0),
        "{metrics}"
    );
}

/// A `/sms/send` to the one phone the reload tests use.
async fn send_code(server: &Tollgate, client: &reqwest::Client) -> reqwest::Response {
    client
        .post(format!("{}/sms/send", server.address))
        .json(&json!({ "phone": "+8613800138000" }))
        .send()
        .await
        .unwrap()
}

/// Whether version `n` of the config is in force: each version blocks the
/// user `mallory-<n>` (a `/login/check` counts nothing).
async fn in_force(server: &Tollgate, client: &reqwest::Client, n: u32) -> bool {
    let response = client
        .post(format!("{}/login/check", server.address))
        .json(&json!({ "user": format!("mallory-{n}") }))
        .send()
        .await
        .unwrap();
    response.status() == 403
}

/// Whether the log holds the rejection of a config naming `key`, reloaded
/// for `cause` (`Hangup` or `FileChanged`).
/// The config with a phone limit of `phone_limit` saved the way editors
/// do: a new file renamed over the old one.
fn save_as_editors_do(dir: &std::path::Path, file: &std::path::Path, phone_limit: u32) {
    let saved = dir.join(".tollgate.toml.new");
    std::fs::write(&saved, config_text(dir, phone_limit, 10, true)).unwrap();
    std::fs::rename(&saved, file).unwrap();
}

fn rejected(server: &Tollgate, key: &str, cause: &str) -> bool {
    server
        .log
        .lock()
        .iter()
        .any(|l| l.contains("config rejected") && l.contains(key) && l.contains(cause))
}

#[tokio::test]
async fn a_changed_config_file_is_reloaded_without_a_signal_and_a_bad_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), 1, 10);
    let server = Tollgate::start(&file).await;
    let client = reqwest::Client::new();
    assert!(in_force(&server, &client, 1).await);

    save_as_editors_do(dir.path(), &file, 30);
    eventually("the new phone limit", Duration::from_secs(10), || async {
        in_force(&server, &client, 30).await
    })
    .await;

    // Written in place, with a mistake: refused, logged, the old settings stay.
    std::fs::write(&file, config_text(dir.path(), 2, 0, true)).unwrap();
    eventually(
        "the rejection in the log",
        Duration::from_secs(10),
        || async { rejected(&server, "login.lock_after", "FileChanged") },
    )
    .await;
    assert!(in_force(&server, &client, 30).await && !in_force(&server, &client, 2).await);
    let reloads = |server: &Tollgate| {
        server
            .log
            .lock()
            .iter()
            .filter(|l| l.contains("settings reloaded") && l.contains("FileChanged"))
            .count()
    };
    // The rejection is logged after the reload before it, by the same task.
    assert_eq!(reloads(&server), 1, "{:?}", server.log.lock());

    // Audit writes beside the config and a touch of the file reload nothing.
    let touched = std::fs::File::options().append(true).open(&file).unwrap();
    drop(touched);
    std::fs::write(dir.path().join("notes.txt"), "unrelated").unwrap();
    // Changes are handled in order: once a real change after them is in
    // force, a reload the touch or the other file caused would be logged.
    std::fs::write(&file, config_text(dir.path(), 31, 10, true)).unwrap();
    eventually("the next phone limit", Duration::from_secs(10), || async {
        in_force(&server, &client, 31).await
    })
    .await;
    // The new settings are in force before their reload is logged, and a
    // task drains the log: a SIGHUP's reload, logged after every earlier
    // one by the same task, marks the point where all of them are read.
    server.signal("-HUP");
    eventually(
        "the SIGHUP's reload in the log",
        Duration::from_secs(10),
        || async {
            server
                .lines("settings reloaded")
                .iter()
                .any(|l| l.contains("Hangup"))
        },
    )
    .await;
    assert_eq!(reloads(&server), 2, "{:?}", server.log.lock());
}

/// A FIFO renamed over the config file (a botched deploy) is refused at
/// once, not waited on: the next good file is reloaded, and SIGTERM still
/// stops the server. Opened as a file, the FIFO held the reload, every
/// later one, and the shutdown that waits for it, for good.
#[tokio::test]
async fn a_fifo_in_the_config_files_place_is_refused_and_reloads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), 1, 10);
    let mut server = Tollgate::start(&file).await;
    let client = reqwest::Client::new();
    assert!(in_force(&server, &client, 1).await);

    let fifo = dir.path().join(".tollgate.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::rename(&fifo, &file).unwrap();
    eventually(
        "the FIFO's rejection in the log",
        Duration::from_secs(10),
        || async { rejected(&server, "not a regular file", "FileChanged") },
    )
    .await;

    save_as_editors_do(dir.path(), &file, 30);
    eventually("the new phone limit", Duration::from_secs(10), || async {
        in_force(&server, &client, 30).await
    })
    .await;

    server.signal("-TERM");
    let status = tokio::time::timeout(Duration::from_secs(15), server.child.wait())
        .await
        .expect("stopped within 15 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
}

/// A file written in place by a writer that pauses (a slow pipe, an
/// editor flushing in parts) is read once it is closed, not after the
/// first quiet moment: a valid prefix (here without `[lists]` and with the
/// default `lock_after`) would be put in force, and locks it made outlive
/// the good reload.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_file_written_in_place_is_read_once_it_is_closed() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), 1, 10);
    let server = Tollgate::start(&file).await;
    let client = reqwest::Client::new();
    assert!(in_force(&server, &client, 1).await);

    let text = config_text(dir.path(), 2, 10, true);
    let (head, tail) = text.split_at(text.find("[login]").expect("a [login] table"));
    let mut writer = std::fs::File::create(&file).unwrap();
    writer.write_all(head.as_bytes()).unwrap();
    writer.flush().unwrap();
    // Five times the watch's quiet time, the file open and half written.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        in_force(&server, &client, 1).await,
        "the half-written file was put in force: {:?}",
        server.log.lock()
    );
    writer.write_all(tail.as_bytes()).unwrap();
    drop(writer);
    eventually("the whole new file", Duration::from_secs(10), || async {
        in_force(&server, &client, 2).await
    })
    .await;
}

/// A mounted Kubernetes ConfigMap: `tollgate.toml` is a link through
/// `..data`, and an update swaps `..data` to a new directory with a rename;
/// the file itself is never written.
#[cfg(unix)]
#[tokio::test]
async fn a_configmap_update_swapping_the_data_link_is_reloaded() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let mount = dir.path().join("config");
    let version = |name: &str, phone_limit: u32| {
        let data = mount.join(name);
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(
            data.join("tollgate.toml"),
            config_text(dir.path(), phone_limit, 10, true),
        )
        .unwrap();
    };
    version("..2026_11_23_00_00_00.1", 1);
    symlink("..2026_11_23_00_00_00.1", mount.join("..data")).unwrap();
    symlink("..data/tollgate.toml", mount.join("tollgate.toml")).unwrap();
    let server = Tollgate::start(&mount.join("tollgate.toml")).await;
    let client = reqwest::Client::new();
    assert!(in_force(&server, &client, 1).await);

    // What the kubelet does: a new directory, a new link, renamed over `..data`.
    version("..2026_11_23_00_05_00.2", 40);
    symlink("..2026_11_23_00_05_00.2", mount.join("..data_tmp")).unwrap();
    std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
    std::fs::remove_dir_all(mount.join("..2026_11_23_00_00_00.1")).unwrap();
    eventually(
        "the swapped-in phone limit",
        Duration::from_secs(10),
        || async { in_force(&server, &client, 40).await && !in_force(&server, &client, 1).await },
    )
    .await;
}

#[tokio::test]
async fn with_watch_config_off_only_sighup_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(&file, config_text(dir.path(), 1, 10, false)).unwrap();
    let server = Tollgate::start(&file).await;
    let client = reqwest::Client::new();
    std::fs::write(&file, config_text(dir.path(), 25, 10, false)).unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(in_force(&server, &client, 1).await);
    server.signal("-HUP");
    eventually("the new phone limit", Duration::from_secs(10), || async {
        in_force(&server, &client, 25).await
    })
    .await;
}

/// A SIGHUP while the service is still starting (here: its audit database
/// takes seconds to answer) is held for the running service, not the
/// signal's default action, which would end it: a service manager may send
/// a reload as soon as the process exists.
#[tokio::test]
async fn a_sighup_during_start_up_neither_kills_nor_is_lost() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    // A "database" that accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let text = config_text(dir.path(), 1, 10, true).replace(
        &format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("audit.db").display()
        ),
        &format!("postgres://postgres@127.0.0.1:{port}/none"),
    );
    assert!(text.contains("postgres://"), "{text}");
    std::fs::write(&file, &text).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--config")
        .arg(&file)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Start-up waits 5 s for the silent database: signal inside that wait.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pid = child.id().expect("still running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let mut seen: Vec<String> = Vec::new();
    let reloaded = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            seen.push(line.clone());
            if line.contains("settings reloaded") && line.contains("Hangup") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(reloaded, "{seen:?}");
    assert!(child.try_wait().unwrap().is_none(), "still running");
    // The signal came while it was starting: before it listened.
    let position = |needle: &str| {
        seen.iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in {seen:?}"))
    };
    assert!(
        position("events spool until") < position("tollgate listening"),
        "{seen:?}"
    );
    drop(silent);
}

/// A reload that loosens protection (shadow mode on, a block-list entry
/// removed, an allow-list entry added) is warned of by name, not only
/// logged as a routine reload; a reload after it that changes nothing of
/// that says nothing of it.
#[tokio::test]
async fn a_reload_that_loosens_protection_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let write = |rest: &str| crate::support::process::config_file(dir.path(), "", rest);
    let file = write("[lists]\nblock_ips = [\"198.51.100.0/24\"]");
    let server = Tollgate::start(&file).await;
    assert!(server.lines("a reload loosened protection").is_empty());

    write("[sms]\nshadow = true\n[lists]\nallow_users = [\"ops\"]");
    server.signal("-HUP");
    let looser = server.logged("a reload loosened protection").await;
    let line = looser.first().expect("a warning");
    for part in [
        "sms.shadow turned on",
        "1 block-list entries removed",
        "1 allow-list entries added",
        "WARN",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }

    // The same file again: loosening nothing further, said nothing more.
    write("[sms]\nshadow = true\n[lists]\nallow_users = [\"ops\"]\n# again");
    server.signal("-HUP");
    let reloads = |server: &Tollgate| {
        server
            .lines("settings reloaded")
            .iter()
            .filter(|l| l.contains("Hangup"))
            .count()
    };
    crate::support::wait::eventually(
        "the second reload",
        std::time::Duration::from_secs(10),
        || async { reloads(&server) >= 2 },
    )
    .await;
    assert_eq!(server.lines("a reload loosened protection").len(), 1);
}

/// A reload puts a new `[sms.provider]` in force (a ConfigMap's placeholder
/// URL mended, a token rotated) in a running server, but not `log` in
/// place of a real one; a change it cannot apply (here `[server]`) is
/// logged as waiting for the next start.
#[tokio::test]
async fn a_reload_swaps_the_sms_provider_and_names_what_waits_for_a_restart() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let (first, second) = (MockServer::start().await, MockServer::start().await);
    for provider in [&first, &second] {
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200))
            .mount(provider)
            .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let write = |provider: &MockServer, server: &str| {
        crate::support::process::config_file(
            dir.path(),
            server,
            &format!(
                "[sms]\nphone_limits = [{{ limit = 100, window = \"1h\" }}]\n\
                 [sms.provider]\nkind = \"webhook\"\nurl = \"{}/sms\"",
                provider.uri()
            ),
        )
    };
    let file = write(&first, "");
    let server = Tollgate::start(&file).await;
    let client = reqwest::Client::new();
    let send = || async { send_code(&server, &client).await.status() };
    assert_eq!(send().await, 200);
    async fn received(provider: &MockServer) -> usize {
        provider.received_requests().await.unwrap_or_default().len()
    }
    assert_eq!((received(&first).await, received(&second).await), (1, 0));
    assert!(server.lines("restart_needed").is_empty());

    write(&second, "trusted_proxies = [\"10.0.0.0/8\"]");
    server.signal("-HUP");
    let waiting = server.logged("restart_needed").await;
    assert!(
        waiting.iter().any(|line| line.contains("[server]")),
        "{waiting:?}"
    );
    // A gauge an alert can watch: the file is not all in force.
    let metrics = server.metrics(&client).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "tollgate_config_restart_pending 1"),
        "{metrics}"
    );
    assert_eq!(send().await, 200);
    assert_eq!((received(&first).await, received(&second).await), (1, 1));

    // A file that leaves `[sms.provider]` out would switch to `log` (its
    // default): every code to the log, every send still 200. Refused.
    crate::support::process::config_file(
        dir.path(),
        "",
        "[sms]\nphone_limits = [{ limit = 100, window = \"1h\" }]",
    );
    server.signal("-HUP");
    eventually("the refusal", Duration::from_secs(10), || async {
        rejected(&server, "sms.provider.kind", "Hangup")
    })
    .await;
    assert_eq!(send().await, 200);
    assert_eq!((received(&first).await, received(&second).await), (1, 2));
}
