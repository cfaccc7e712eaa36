//! panva's oidc-provider, started by a test: `tests/oidc/provider.mjs` run
//! by Node from the directory its npm packages are installed in
//! (`TOLLGATE_OIDC_PROVIDER`, default `~/.cache/tollgate-oidc-provider`;
//! `scripts/test.sh` installs them from `tests/oidc/package-lock.json`).
//! One process per test, killed when dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The resource server (audience) tollgate's admin API is.
pub const API: &str = "https://tollgate.test/admin/api";
/// Another resource server of the same provider.
pub const OTHER_API: &str = "https://other.test/api";
/// The `tollgate` client's secret, as the script registers it.
pub const CLIENT_SECRET: &str = "tollgate-client-secret-0123456789";

fn install_dir() -> PathBuf {
    std::env::var_os("TOLLGATE_OIDC_PROVIDER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/tollgate-oidc-provider")
        })
}

/// A running provider.
pub struct OidcProvider {
    _process: Child,
    /// `http://127.0.0.1:<port>`.
    pub issuer: String,
    client: reqwest::Client,
}

impl OidcProvider {
    /// Started and ready: it has printed its issuer.
    pub async fn start() -> Self {
        let dir = install_dir();
        assert!(
            dir.join("node_modules/oidc-provider").is_dir(),
            "oidc-provider is not installed in {}: run scripts/test.sh, which installs it \
             (npm ci of tests/oidc/package-lock.json; needs node and npm)",
            dir.display()
        );
        // ESM resolves packages from the script's own directory: the script
        // runs from beside them, written there under a name of its own.
        let script = include_str!("../../oidc/provider.mjs");
        let path = dir.join(format!("provider-{}.mjs", uuid::Uuid::new_v4().simple()));
        std::fs::write(&path, script).expect("the provider script is written");
        let mut process = Command::new("node")
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("node cannot be started ({e}): the OpenID provider tests need Node.js 20+")
            });
        let stdout = process.stdout.take().expect("a piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
        let _ = std::fs::remove_file(&path);
        let line = match first {
            Ok(Ok(Some(line))) => line,
            other => panic!("the OpenID provider did not start: {other:?}"),
        };
        let issuer = serde_json::from_str::<Value>(&line).expect("a JSON line")["issuer"]
            .as_str()
            .expect("the issuer")
            .to_string();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self {
            _process: process,
            issuer,
            client: reqwest::Client::new(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.client
            .post(format!("{}{path}", self.issuer))
            .json(&body)
            .send()
            .await
            .expect("the provider answers")
            .json()
            .await
            .expect("JSON")
    }

    /// Register tollgate's callback for the `tollgate` client.
    pub async fn configure(&self, redirect_uri: &str) {
        self.post(
            "/test/configure",
            json!({ "redirect_uris": [redirect_uri] }),
        )
        .await;
    }

    /// Replace the signing key; the new key's id.
    pub async fn rotate(&self) -> String {
        self.post("/test/rotate", json!({})).await["kid"]
            .as_str()
            .expect("a kid")
            .to_string()
    }

    /// A JWT with `claims`, signed with the provider's current key
    /// (`header` may add fields or name another `kid`).
    pub async fn sign(&self, header: Value, claims: Value) -> String {
        self.post("/test/sign", json!({ "header": header, "claims": claims }))
            .await["token"]
            .as_str()
            .expect("a token")
            .to_string()
    }

    /// How often the key set was fetched, and the current key's id.
    pub async fn stats(&self) -> (u64, String) {
        let stats: Value = self
            .client
            .get(format!("{}/test/stats", self.issuer))
            .send()
            .await
            .expect("the provider answers")
            .json()
            .await
            .expect("JSON");
        (
            stats["jwks_fetches"].as_u64().expect("a count"),
            stats["kid"].as_str().expect("a kid").to_string(),
        )
    }

    /// A JWT access token of the machine client `client` (client
    /// credentials grant) for `resource`.
    pub async fn access_token(&self, client: &str, resource: &str) -> String {
        let answer: Value = self
            .client
            .post(format!("{}/token", self.issuer))
            .basic_auth(client, Some(format!("{client}-secret-0123456789")))
            .form(&[
                ("grant_type", "client_credentials"),
                ("resource", resource),
                ("scope", "admin"),
            ])
            .send()
            .await
            .expect("the provider answers")
            .json()
            .await
            .expect("JSON");
        answer["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access token: {answer}"))
            .to_string()
    }
}
