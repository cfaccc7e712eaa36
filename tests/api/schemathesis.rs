//! schemathesis (`--checks all`) over every route of the OpenAPI document,
//! against the real binary on Redis and PostgreSQL: what the document
//! accepts is accepted, what it rejects is answered 4xx, and no answer is a
//! 5xx or strays from its documented status, headers and schema.
//!
//! `scripts/test.sh` installs schemathesis from PyPI into a virtualenv
//! outside the clone and names it in `TOLLGATE_SCHEMATHESIS`. The run is
//! seeded (`TOLLGATE_SCHEMATHESIS_SEED` picks another seed, `…_EXAMPLES`
//! more cases), so CI repeats it exactly.

use std::time::Duration;

use tollgate::domain::PhoneNumber;

use crate::support::app::{redis_url, with_redis_prefix, ADMIN_TOKEN, API_KEY};
use crate::support::audit_db::{DbKind, TestDb};
use crate::support::process::Tollgate;

fn schemathesis() -> String {
    std::env::var("TOLLGATE_SCHEMATHESIS").unwrap_or_else(|_| {
        panic!(
            "TOLLGATE_SCHEMATHESIS names no schemathesis: run the tests with scripts/test.sh, \
             which installs it, or point the variable at one (`pip install schemathesis`)"
        )
    })
}

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Every region's example numbers, as `PhoneNumber` takes them: the values
/// schemathesis draws for `format: phone`, which no pattern can describe.
fn valid_numbers() -> Vec<String> {
    let mut numbers: Vec<String> = phonenumber::metadata::DATABASE
        .iter()
        .flat_map(|meta| {
            let d = meta.descriptors();
            let code = meta.country_code();
            [d.fixed_line(), d.mobile(), d.toll_free(), d.voip()]
                .into_iter()
                .flatten()
                .filter_map(|desc| desc.example())
                .map(move |national| format!("+{code}{national}"))
                .collect::<Vec<_>>()
        })
        .filter(|raw| PhoneNumber::parse(raw).is_ok())
        .collect();
    numbers.sort();
    numbers.dedup();
    numbers
}

/// The service's config: Redis under `prefix`, the audit trail in
/// PostgreSQL, an API key and an admin token.
fn config(dir: &std::path::Path, prefix: &str, database_url: &str) -> std::path::PathBuf {
    let path = dir.join("tollgate.toml");
    let config = format!(
        r#"
[server]
bind = "127.0.0.1:0"
api_keys = ["{API_KEY}"]
admin_tokens = ["{ADMIN_TOKEN}"]
# Its negative cases send wrong tokens on purpose: not a guesser to throttle.
admin_auth_limit = {{ limit = 100000, window = "1m" }}

[store]
backend = "redis"
redis_url = "{redis}"
key_prefix = "{prefix}"
timeout = "2s"

[audit]
database_url = "{database_url}"
spool_dir = "{spool}"

[sms]
code_secret = "schemathesis-code-secret"
"#,
        redis = redis_url(),
        spool = dir.join("spool").display(),
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// schemathesis's own config: each bearer scheme's credential, and no
/// values taken from answers. Those would put the masked phone of a `200`
/// (`+86138****8000`, a field named `phone`) into the next request's
/// `phone`, which the document does not say is a phone number.
const SCHEMATHESIS_TOML: &str = r#"
[auth.openapi.api_key]
bearer = "${TOLLGATE_API_KEY}"

[auth.openapi.admin_token]
bearer = "${TOLLGATE_ADMIN_TOKEN}"

[phases.examples.extra-data-sources]
responses = false

[phases.coverage.extra-data-sources]
responses = false

[phases.fuzzing.extra-data-sources]
responses = false

"#;

/// Registers `format: phone`: a number drawn from every region's examples.
const HOOKS: &str = r#"
import json
import os

import schemathesis
from hypothesis import strategies as st

with open(os.environ["TOLLGATE_PHONES"]) as f:
    NUMBERS = json.load(f)

schemathesis.openapi.format("phone", st.sampled_from(NUMBERS))
schemathesis.openapi.format(
    "cidr", st.sampled_from(["203.0.113.0/24", "198.51.100.7", "2001:db8::/32", "10.0.0.0/8"])
)
schemathesis.openapi.format("phone-entry", st.sampled_from(NUMBERS + ["+88213*", "+1*"]))

"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_keeps_to_its_openapi_document() {
    let schemathesis = schemathesis();
    let db = TestDb::new(DbKind::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("tgst{}", uuid::Uuid::new_v4().simple());
    let config = config(dir.path(), &prefix, &db.url);
    std::fs::write(dir.path().join("schemathesis.toml"), SCHEMATHESIS_TOML).unwrap();
    std::fs::write(dir.path().join("tollgate_hooks.py"), HOOKS).unwrap();
    let phones = dir.path().join("phones.json");
    let numbers = valid_numbers();
    assert!(numbers.len() > 300, "{} example numbers", numbers.len());
    std::fs::write(&phones, serde_json::to_string(&numbers).unwrap()).unwrap();

    with_redis_prefix(&redis_url(), &prefix, async {
        let server = Tollgate::start(&config).await;
        let run = tokio::process::Command::new(&schemathesis)
            .current_dir(dir.path())
            .args(["run", &format!("{}/openapi.json", server.address)])
            .args(["--checks", "all"])
            // One worker: CPython 3.11's parser is not safe for
            // hypothesis's lambda descriptions on two threads.
            .args(["--workers", "1"])
            .args([
                "--max-examples",
                &setting("TOLLGATE_SCHEMATHESIS_EXAMPLES", "40"),
            ])
            .args(["--seed", &setting("TOLLGATE_SCHEMATHESIS_SEED", "20261122")])
            .args(["--generation-database", "none", "--no-color"])
            .args(["--report", "junit", "--report-dir", "report"])
            .env("SCHEMATHESIS_HOOKS", "tollgate_hooks")
            .env("PYTHONPATH", dir.path())
            .env("TOLLGATE_PHONES", &phones)
            .env("TOLLGATE_API_KEY", API_KEY)
            .env("TOLLGATE_ADMIN_TOKEN", ADMIN_TOKEN)
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(600), run)
            .await
            .expect("schemathesis finishes within 10 minutes")
            .unwrap_or_else(|e| panic!("{schemathesis} runs: {e}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "schemathesis found failures ({}):\n{stdout}\n{stderr}",
            output.status
        );
        // A run that tested nothing would pass too: every operation of the
        // document (`Selected: 26/26`) is tested.
        let figure = |label: &str| {
            stdout
                .lines()
                .find_map(|l| l.trim().strip_prefix(label))
                .map(|rest| rest.trim().to_string())
        };
        let selected = figure("Selected:").expect("a Selected: line");
        let total = selected.rsplit('/').next().unwrap_or_default().to_string();
        assert!(
            total.parse::<u32>().is_ok_and(|n| n >= 26),
            "all operations selected: {selected}\n{stdout}"
        );
        assert_eq!(
            figure("Tested:").as_deref(),
            Some(total.as_str()),
            "every operation is tested:\n{stdout}"
        );
        let errors: Vec<String> = server
            .log
            .lock()
            .iter()
            .filter(|l| l.contains("\"ERROR\""))
            .cloned()
            .collect();
        assert!(errors.is_empty(), "the service logged errors: {errors:#?}");
    })
    .await;
}
