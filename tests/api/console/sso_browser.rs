//! Single sign-on in a real browser (Chromium over WebDriver, as
//! `browser`), against a real OpenID provider (`crate::oidc::provider`):
//! a viewer signs in through the provider's login form, sees the console
//! without an Unblock button, fails to unblock (403, audited), signs out;
//! an operator signs in, unblocks, and finds their own name on the row.

use fantoccini::error::CmdError;
use fantoccini::{Client, Locator};
use serde_json::json;

use super::browser::{loaded_after, lock, open, screenshot, Chromedriver};
use crate::oidc::{sso_app, SsoApp};
use crate::support::audit_db::DbKind;

/// From a page that sent the browser to the provider: sign in there as
/// `user` and wait for the console page it returns to.
async fn sign_in_at_provider(browser: &Client, user: &str) -> Result<(), CmdError> {
    let login = browser.find(Locator::Css("input[name='login']")).await?;
    login.send_keys(user).await?;
    browser
        .find(Locator::Css("input[name='password']"))
        .await?
        .send_keys("any password")
        .await?;
    open(browser, Locator::Css("button[type='submit']")).await?;
    // Through the callback to the console: it has tollgate's header.
    browser
        .wait()
        .for_element(Locator::Css("header .me"))
        .await?;
    Ok(())
}

async fn text(browser: &Client, css: &str) -> Result<String, CmdError> {
    browser.find(Locator::Css(css)).await?.text().await
}

#[tokio::test]
async fn a_viewer_cannot_unblock_and_an_operator_can_signed_in_through_the_provider_in_chromium() {
    let SsoApp { app, provider, db } = sso_app(DbKind::Sqlite, |_| {}).await;
    lock(&app, "mallory", "203.0.113.66").await;
    app.flush_audit().await;

    let driver = Chromedriver::start().await;
    let profile = tempfile::tempdir().expect("a profile directory");
    let browser = driver.browser(profile.path()).await;
    let subject = format!("{}/admin/subjects/user/mallory", app.address);
    let run = async {
        // No session: the console sends the browser to the provider.
        browser.goto(&subject).await?;
        let at = browser.current_url().await?;
        assert!(at.as_str().starts_with(&provider.issuer), "{at}");
        screenshot(&browser, "sso-provider-login").await;
        sign_in_at_provider(&browser, "vera").await?;
        assert_eq!(browser.current_url().await?.as_str(), subject);
        assert_eq!(
            text(&browser, "header .me .actor").await?,
            "oidc:vera@example.com"
        );
        assert_eq!(text(&browser, "header .me .roles").await?, "(viewer)");
        let buttons = browser
            .find_all(Locator::Css("form.unblock button"))
            .await?;
        assert!(buttons.is_empty(), "a viewer sees no Unblock button");
        screenshot(&browser, "sso-viewer-subject").await;

        // The viewer posts an unblock anyway (as a hand-made form would).
        let old = browser.find(Locator::Css("html")).await?;
        browser
            .execute(
                "const f = document.createElement('form'); f.method = 'post'; \
                 f.action = location.pathname + '/unblock'; \
                 const c = document.createElement('input'); c.name = 'csrf'; c.value = 'made-up'; \
                 f.appendChild(c); document.body.appendChild(f); f.submit();",
                vec![],
            )
            .await?;
        loaded_after(&browser, old).await?;
        assert_eq!(text(&browser, "h1").await?, "Forbidden");
        let why = text(&browser, "p.error").await?;
        assert!(why.contains("your role may not unblock"), "{why}");
        screenshot(&browser, "sso-viewer-forbidden").await;

        // Sign out; the provider would sign vera in again by its own
        // session, so the next person starts from a clean browser.
        browser.goto(&subject).await?;
        open(&browser, Locator::Css("header .me button")).await?;
        assert_eq!(text(&browser, "h1").await?, "Signed out");
        browser.delete_all_cookies().await?;

        // The operator.
        browser.goto(&subject).await?;
        sign_in_at_provider(&browser, "olga").await?;
        assert_eq!(
            text(&browser, "header .me .actor").await?,
            "oidc:olga@example.com"
        );
        open(&browser, Locator::Css("form.unblock button")).await?;
        let notice = text(&browser, "p.notice").await?;
        assert!(notice.starts_with("Unblocked"), "{notice}");
        screenshot(&browser, "sso-operator-unblocked").await;

        // The trail names her on the row, filtered by her name.
        open(&browser, Locator::LinkText("Audit events")).await?;
        let form = browser.form(Locator::Css("form.filters")).await?;
        form.set(Locator::Css("input[name='actor']"), "oidc:olga@example.com")
            .await?;
        form.set(Locator::Css("select[name='decision']"), "unblock")
            .await?;
        let old = browser.find(Locator::Css("html")).await?;
        form.submit().await?;
        loaded_after(&browser, old).await?;
        let rows = browser.find_all(Locator::XPath("//tbody/tr")).await?;
        assert_eq!(rows.len(), 1, "one unblock by olga");
        let cells = rows[0].find_all(Locator::Css("td")).await?;
        assert_eq!(cells[2].text().await?, "unblock");
        assert_eq!(cells[4].text().await?, "user mallory");
        assert_eq!(cells[11].text().await?, "oidc:olga@example.com");
        screenshot(&browser, "sso-events-by-actor").await;
        Ok::<_, CmdError>(())
    };
    let outcome = run.await;
    let _ = browser.close().await;
    outcome.expect("the browser does what the admins ask");

    // The store agrees, and the trail has vera's refusal as hers.
    let state = app
        .login_check(json!({ "user": "mallory", "ip": "203.0.113.66" }))
        .await;
    assert_eq!(state.body["decision"], "allow", "{}", state.body);
    app.flush_audit().await;
    let rows = db
        .connect()
        .await
        .page(&Default::default(), None, 100)
        .await
        .unwrap();
    let refused: Vec<_> = rows.iter().filter(|e| e.reason == "forbidden").collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].actor.as_deref(), Some("oidc:vera@example.com"));
    assert_eq!(refused[0].subject, "mallory");
}
