//! What start-up says about Redis: a warning when it is not reachable, and
//! none when it is (the wait used to end before the first attempt began, so
//! the warning came at every start-up).

use crate::support::app::{free_port, redis_url};
use crate::support::process::{config_file, Tollgate};

fn warned(server: &Tollgate) -> Vec<String> {
    server
        .log
        .lock()
        .iter()
        .filter(|l| l.contains("Redis is not reachable yet"))
        .cloned()
        .collect()
}

#[tokio::test]
async fn start_up_warns_about_redis_only_when_it_is_not_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("tgtest-{}", uuid::Uuid::new_v4().simple());
    let store = |url: &str| {
        format!(
            "[store]\nbackend = \"redis\"\nredis_url = \"{url}\"\nkey_prefix = \"{prefix}\"\n\
             [sms]\ncode_secret = \"redis-start-code-secret\"\n"
        )
    };
    // The default `store.timeout` (100 ms), as shipped.
    let reachable = Tollgate::start(&config_file(dir.path(), "", &store(&redis_url()))).await;
    assert_eq!(warned(&reachable), Vec::<String>::new());

    let dead = format!("redis://127.0.0.1:{}", free_port());
    let other = tempfile::tempdir().unwrap();
    let unreachable = Tollgate::start(&config_file(other.path(), "", &store(&dead))).await;
    let lines = warned(&unreachable);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("Connection refused"), "{}", lines[0]);
}
