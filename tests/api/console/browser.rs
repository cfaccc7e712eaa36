//! The console in a real browser: Debian's Chromium, headless, driven
//! through chromedriver over WebDriver (fantoccini). An admin signs in,
//! reads the overview, switches the period, filters the event table, opens
//! a locked user from the overview and unblocks it, unblocks a blocked IP
//! with the overview's own button, and sees both leave the list; the store
//! then lets them through. Screenshots of each step are saved (their paths
//! are printed) under the cargo target directory.
//!
//! `scripts/test.sh` installs `chromium` and `chromium-driver` when they are
//! missing; run elsewhere without them, this test fails saying so.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::{DateTime, Duration as Span, Utc};
use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tollgate::audit::{AuditDecision, AuditEvent};
use tollgate::domain::{Action, Subject, SubjectKind};

use super::db_app;
use crate::support::app::{free_port, TestApp, ADMIN_TOKEN};
use crate::support::audit_db::{DbKind, TestDb};

/// What Chromium needs to run headless here: as root (no sandbox), without
/// a GPU, and without reaching out to the network on its own (which a
/// closed network makes it wait for).
const CHROMIUM_FLAGS: [&str; 11] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1240",
    "--hide-scrollbars",
    // Names other than the loopback's fail at once (the OpenID provider's
    // development login page imports a web font); 127.0.0.2 plays another
    // site.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE 127.0.0.2",
];

/// The executable `name` on `PATH`, or a failure that says how to get it.
fn installed(name: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is not installed: the console's browser test needs Debian's \
                 `{package}` (scripts/test.sh installs chromium and chromium-driver; \
                 or apt-get install chromium chromium-driver)"
            )
        })
}

/// A chromedriver of our own on a free port; killed when dropped.
pub(super) struct Chromedriver {
    _process: Child,
    url: String,
}

impl Chromedriver {
    /// Started, and ready once it says so on its standard output.
    pub(super) async fn start() -> Self {
        let binary = installed("chromedriver", "chromium-driver");
        let port = free_port();
        let mut process = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let stdout = process.stdout.take().expect("a piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let ready = async {
            while let Some(line) = lines.next_line().await.expect("chromedriver's output") {
                if line.contains("started successfully") {
                    return true;
                }
            }
            false
        };
        let ready = tokio::time::timeout(Duration::from_secs(20), ready).await;
        assert_eq!(ready, Ok(true), "chromedriver did not say it was ready");
        // Keep reading, so that its output never fills the pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            _process: process,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// A new headless Chromium with an empty profile in `profile`.
    pub(super) async fn browser(&self, profile: &Path) -> Client {
        let chromium = installed("chromium", "chromium");
        let mut args: Vec<String> = CHROMIUM_FLAGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": chromium, "args": args }),
        );
        // Plain HTTP to a local chromedriver: no TLS.
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("chromedriver starts a Chromium session")
    }
}

/// Where the screenshots go: beside the build, never into the clone.
fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("a screenshot directory");
    dir
}

pub(super) async fn screenshot(browser: &Client, name: &str) -> PathBuf {
    let png = browser.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "{name} is a PNG");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).expect("the screenshot is saved");
    // Past the test harness's capture: the paths are the point.
    let _ = writeln!(std::io::stderr(), "console screenshot: {}", path.display());
    path
}

/// A deterministic stream of small numbers, for data that looks real.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below.max(1)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.roll(from.len() as u64) as usize]
    }
}

/// A day of refusals as a busy service sees them: a steady trickle of SMS
/// sends and verifies over their limits, a toll-fraud run on one number
/// range 14 to 17 hours ago, and a password-guessing wave 4 to 7 hours ago.
fn a_day_of_refusals(now: DateTime<Utc>) -> Vec<AuditEvent> {
    use Action::{LoginAttempt, SmsSend, SmsVerify};
    use AuditDecision::{Challenge, Deny};
    const PHONES: [&str; 6] = [
        "+8613800138000",
        "+8613912345678",
        "+447700900123",
        "+14155550142",
        "+8613800138111",
        "+4915112345678",
    ];
    const FRAUD: [&str; 4] = [
        "+2348031110001",
        "+2348031110002",
        "+2348031110003",
        "+2348031110004",
    ];
    const USERS: [&str; 5] = ["alice", "bob", "carol", "dmitri", "eve"];
    const IPS: [&str; 6] = [
        "203.0.113.7",
        "198.51.100.23",
        "203.0.113.42",
        "2001:db8:1:2::17",
        "192.0.2.10",
        "198.51.100.99",
    ];
    let (mut dice, mut minutes) = (Dice(11), Dice(7));
    let mut rows = Vec::new();
    let mut add = |hours_ago: i64, action, decision, kind, id: &str, ip: &str| {
        let mut e = AuditEvent::new(action, decision, "rate_limited", &Subject::new(kind, id));
        let minute = minutes.roll(60) as i64;
        e.occurred_at = now - Span::hours(hours_ago) - Span::minutes(minute);
        e.ip = Some(ip.to_string());
        e.user_agent = Some("Mozilla/5.0 (X11; Linux x86_64)".into());
        rows.push(e);
    };
    let (phone, user) = (SubjectKind::Phone, SubjectKind::User);
    for h in 0..24 {
        for _ in 0..2 + dice.roll(5) {
            add(h, SmsSend, Deny, phone, dice.pick(&PHONES), dice.pick(&IPS));
        }
        for _ in 0..dice.roll(3) {
            add(
                h,
                SmsVerify,
                Deny,
                phone,
                dice.pick(&PHONES),
                dice.pick(&IPS),
            );
        }
        if (14..=17).contains(&h) {
            for _ in 0..8 + dice.roll(6) {
                add(h, SmsSend, Deny, phone, dice.pick(&FRAUD), "192.0.2.66");
            }
            add(
                h,
                SmsSend,
                Deny,
                SubjectKind::Prefix,
                "+2348031",
                "192.0.2.66",
            );
        }
        if (4..=7).contains(&h) {
            for _ in 0..6 + dice.roll(8) {
                add(
                    h,
                    LoginAttempt,
                    Challenge,
                    user,
                    dice.pick(&USERS),
                    "198.51.100.23",
                );
            }
            for _ in 0..2 + dice.roll(3) {
                add(
                    h,
                    LoginAttempt,
                    Deny,
                    user,
                    dice.pick(&USERS),
                    "198.51.100.23",
                );
            }
        }
    }
    rows
}

/// Ten failures of `user` from `ip`: the (user, IP) pair locks (the
/// defaults: `login.lock_after = 10`, `lock_scope = "user_ip"`).
pub(super) async fn lock(app: &TestApp, user: &str, ip: &str) {
    for _ in 0..10 {
        app.login_attempt(
            json!({ "user": user, "ip": ip, "success": false, "captcha_passed": true }),
        )
        .await;
    }
}

/// Waits until the page `old` (its `<html>` element) has given way to a
/// new one that has loaded: a click on a link or a form's button may
/// return as soon as the navigation starts.
pub(super) async fn loaded_after(browser: &Client, old: Element) -> Result<(), CmdError> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // A stale element: the document it belonged to is gone.
        if old.tag_name().await.is_err() {
            let state = browser
                .execute("return document.readyState", vec![])
                .await?;
            if state == "complete" {
                return Ok(());
            }
        }
        assert!(Instant::now() < deadline, "the next page did not load");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Clicks what `target` finds and waits for the page it leads to.
pub(super) async fn open(browser: &Client, target: Locator<'_>) -> Result<(), CmdError> {
    let old = browser.find(Locator::Css("html")).await?;
    browser.find(target).await?.click().await?;
    loaded_after(browser, old).await
}

/// Whether the overview's table of locked subjects lists `id`.
async fn listed(browser: &Client, id: &str) -> Result<bool, CmdError> {
    let link = format!("//table[@class='locks']//a[text()='{id}']");
    Ok(!browser.find_all(Locator::XPath(&link)).await?.is_empty())
}

#[tokio::test]
async fn an_admin_signs_in_reads_the_overview_and_unblocks_in_chromium() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let now = tollgate::audit::now_ms();
    db.connect()
        .await
        .insert(&a_day_of_refusals(now), 7)
        .await
        .unwrap();
    let app = db_app(&db, |s| s.login.ip_block_after = 20).await;
    // mallory is locked from one address; 192.0.2.200's failures block it.
    lock(&app, "mallory", "203.0.113.66").await;
    lock(&app, "trent", "192.0.2.200").await;
    lock(&app, "peggy", "192.0.2.200").await;
    app.flush_audit().await;

    let driver = Chromedriver::start().await;
    let profile = tempfile::tempdir().expect("a profile directory");
    let browser = driver.browser(profile.path()).await;
    let origin = app.address.clone();
    let run = async {
        // Sign in: without credentials the console asks for them.
        browser.goto(&format!("{origin}/admin/overview")).await?;
        // Headless Chromium shows no prompt: the page stays empty.
        let refused = browser.source().await?;
        assert!(!refused.contains("tollgate admin"), "{refused}");
        let signed_in = origin.replacen("http://", &format!("http://admin:{ADMIN_TOKEN}@"), 1);
        browser.goto(&format!("{signed_in}/admin/overview")).await?;
        assert_eq!(browser.title().await?, "Overview · tollgate admin");
        screenshot(&browser, "overview").await;
        for id in ["mallory", "192.0.2.200", "trent", "peggy"] {
            assert!(listed(&browser, id).await?, "{id} is listed");
        }
        let chart = browser
            .find(Locator::Css(
                "svg[aria-labelledby='by-decision-title by-decision-desc']",
            ))
            .await?;
        let bars = chart.find_all(Locator::Css("rect")).await?;
        assert!(bars.len() > 24, "a day of stacked bars: {}", bars.len());

        // Another period, then the event table filtered from the overview.
        open(&browser, Locator::LinkText("7d")).await?;
        let url = browser.current_url().await?;
        assert!(url.as_str().ends_with("/admin/overview?period=7d"), "{url}");
        let heading = browser.find(Locator::Css("h1")).await?.text().await?;
        assert_eq!(heading, "Overview · last 7 days");
        open(&browser, Locator::LinkText("1h")).await?;
        screenshot(&browser, "overview-1h").await;
        open(&browser, Locator::LinkText("24h")).await?;
        let top_ip = "//section[h2='Top IPs']//tbody/tr[1]";
        let ip = browser
            .find(Locator::XPath(&format!("{top_ip}/td[1]")))
            .await?
            .text()
            .await?;
        open(&browser, Locator::XPath(&format!("{top_ip}/td[2]/a"))).await?;
        assert_eq!(browser.current_url().await?.path(), "/admin");
        let cells = browser.find_all(Locator::XPath("//tbody/tr/td[6]")).await?;
        assert!(!cells.is_empty(), "{ip} has refusals");
        for cell in cells {
            assert_eq!(cell.text().await?, ip, "every row is from the top IP");
        }
        // And the filter form itself: every lock of the period.
        let form = browser.form(Locator::Css("form.filters")).await?;
        form.set(Locator::Css("select[name='decision']"), "lock")
            .await?;
        form.set(Locator::Css("input[name='ip']"), "").await?;
        let old = browser.find(Locator::Css("html")).await?;
        form.submit().await?;
        loaded_after(&browser, old).await?;
        let decisions = browser.find_all(Locator::XPath("//tbody/tr/td[3]")).await?;
        assert_eq!(decisions.len(), 4, "the locks made above");
        for cell in decisions {
            assert_eq!(cell.text().await?, "lock");
        }
        screenshot(&browser, "events-filtered").await;

        // A locked user, opened from the overview, unblocked on its page.
        open(&browser, Locator::LinkText("Overview")).await?;
        open(
            &browser,
            Locator::XPath("//table[@class='locks']//a[text()='mallory']"),
        )
        .await?;
        let url = browser.current_url().await?;
        assert!(
            url.as_str().ends_with("/admin/subjects/user/mallory"),
            "{url}"
        );
        let pairs = browser
            .find(Locator::XPath(
                "//h2[text()='Locks per IP']/following-sibling::table[1]",
            ))
            .await?
            .text()
            .await?;
        assert!(pairs.contains("203.0.113.66"), "{pairs}");
        screenshot(&browser, "subject-locked").await;
        open(&browser, Locator::XPath("//form[@class='unblock']//button")).await?;
        let notice = browser.find(Locator::Css("p.notice")).await?.text().await?;
        assert!(notice.starts_with("Unblocked"), "{notice}");
        screenshot(&browser, "subject-unblocked").await;

        // A blocked IP, unblocked with the overview's own button.
        open(&browser, Locator::LinkText("Overview")).await?;
        assert!(!listed(&browser, "mallory").await?);
        open(
            &browser,
            Locator::XPath("//table[@class='locks']//tr[.//a[text()='192.0.2.200']]//button"),
        )
        .await?;
        let url = browser.current_url().await?;
        assert!(
            url.as_str()
                .ends_with("/admin/overview?period=24h&unblocked=1"),
            "{url}"
        );
        let notice = browser.find(Locator::Css("p.notice")).await?.text().await?;
        assert!(notice.starts_with("Unblocked"), "{notice}");
        assert!(!listed(&browser, "192.0.2.200").await?);
        for id in ["trent", "peggy"] {
            assert!(listed(&browser, id).await?, "{id}'s own lock stays");
        }
        screenshot(&browser, "overview-after-unblock").await;
        Ok::<_, CmdError>(())
    };
    let outcome = run.await;
    let _ = browser.close().await;
    outcome.expect("the browser does what the admin asks");

    // The store agrees: neither is refused any more.
    let mallory = app
        .login_attempt(json!({ "user": "mallory", "ip": "203.0.113.66", "success": true }))
        .await;
    assert_eq!(mallory.body["decision"], "allow", "{}", mallory.body);
    let state = app.admin_get("/admin/api/subjects/ip/192.0.2.200").await;
    assert_eq!(
        state.body["locked_until"],
        serde_json::Value::Null,
        "{}",
        state.body
    );
}
