//! A page an admin visits cannot get the admin's address throttled: in
//! Chromium, a page on another site sends the browser to the console with
//! wrong credentials in the URL (`admin:guess@host`) past the throttle's
//! limit, and the admin's right token still gets in. A browser sends such
//! credentials only in answer to a Basic challenge, which the console does
//! not give to a request another site started; the same URLs typed in (no
//! other site) are answered with it, sent, counted and throttled, which
//! shows the browser would have sent them.

use std::time::Duration;

use fantoccini::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::browser::Chromedriver;
use super::db_app;
use crate::support::app::ADMIN_TOKEN;
use crate::support::audit_db::{DbKind, TestDb};

/// Failed admin authentications an address may make (10 minutes).
const LIMIT: u32 = 3;

/// A page on another site (`127.0.0.2`: another address is another site)
/// that sends the browser to `target` with the password its query names.
async fn another_site(target: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
        .await
        .expect("127.0.0.2 is on the loopback");
    let address = listener.local_addr().unwrap();
    let page = format!(
        "<!doctype html><title>another site</title><script>\
         location.replace({target:?}.replace('PASSWORD', location.search.slice(1)))\
         </script>"
    );
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    format!("http://{address}")
}

/// Waits until the browser shows a page of `origin`; its source.
async fn landed_on(browser: &Client, origin: &str) -> String {
    for _ in 0..100 {
        if let Ok(url) = browser.current_url().await {
            // The URL keeps the credentials it carried: its origin is
            // what tells where the browser is.
            if url.origin().ascii_serialization() == origin {
                if let Ok(source) = browser.source().await {
                    return source;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = browser.current_url().await.map(|u| u.to_string());
    let source = browser.source().await;
    panic!("the browser never reached {origin}: at {url:?}, {source:?}");
}

/// The console's answer to the right token, from this (the browser's) address.
async fn right_token_status(origin: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{origin}/admin/overview"))
        .basic_auth("admin", Some(ADMIN_TOKEN))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn a_page_on_another_site_cannot_throttle_an_admins_address() {
    let db = TestDb::new(DbKind::Sqlite).await;
    let app = db_app(&db, |s| s.server.admin_auth_limit.limit = LIMIT).await;
    let origin = app.address.clone();
    let with_password = origin.replacen("http://", "http://admin:PASSWORD@", 1);
    let attacker = another_site(format!("{with_password}/admin/overview")).await;

    let driver = Chromedriver::start().await;
    let profile = tempfile::tempdir().expect("a profile directory");
    let browser = driver.browser(profile.path()).await;
    let run = async {
        for guess in 0..LIMIT + 2 {
            browser.goto(&format!("{attacker}/?wrong-{guess}")).await?;
            let page = landed_on(&browser, &origin).await;
            assert!(page.contains("came from another site"), "{page}");
        }
        let after_the_other_site = right_token_status(&origin).await;
        // The same wrong credentials typed in: challenged, sent, counted.
        for guess in 0..LIMIT {
            let typed = with_password.replace("PASSWORD", &format!("typed-{guess}"));
            browser.goto(&format!("{typed}/admin/overview")).await?;
            landed_on(&browser, &origin).await;
        }
        Ok::<_, fantoccini::error::CmdError>(after_the_other_site)
    };
    let outcome = run.await;
    let _ = browser.close().await;
    let after_the_other_site = outcome.expect("the browser goes where it is sent");
    assert_eq!(
        after_the_other_site, 200,
        "the admin's right token gets in after the other site's tries"
    );
    assert_eq!(
        right_token_status(&origin).await,
        429,
        "typed in, the browser sent the wrong credentials, and they counted"
    );
}
