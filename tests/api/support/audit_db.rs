//! Audit databases for tests: a fresh PostgreSQL database or SQLite file per
//! test, dropped afterwards; and a TCP proxy the test can cut or freeze.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use sqlx::Connection;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate::audit::AuditDb;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Postgres,
    Sqlite,
}

pub fn postgres_admin_url() -> String {
    std::env::var("TOLLGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The PostgreSQL pool of `audit`, for a test that runs on PostgreSQL only.
pub fn pg_pool(audit: &AuditDb) -> &sqlx::PgPool {
    match audit {
        AuditDb::Postgres(pool) => pool,
        AuditDb::Sqlite(_) => panic!("a PostgreSQL test was given SQLite"),
    }
}

/// Runs each named `async fn name(db: DbKind)` once per audit database.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod on_postgres {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::support::audit_db::DbKind::Postgres).await
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $name() {
                super::$name($crate::support::audit_db::DbKind::Sqlite).await
            })*
        }
    };
}

pub struct TestDb {
    pub url: String,
    pg_name: Option<String>,
    /// Holds the SQLite file and the spool directory; removed on drop.
    pub dir: tempfile::TempDir,
}

impl TestDb {
    pub async fn new(kind: DbKind) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        match kind {
            DbKind::Postgres => {
                let name = format!("tgtest_{}", uuid::Uuid::new_v4().simple());
                let mut admin = sqlx::PgConnection::connect(&postgres_admin_url())
                    .await
                    .expect("PostgreSQL is reachable (scripts/services.sh starts it)");
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut admin)
                    .await
                    .expect("a test database is created");
                let base = postgres_admin_url();
                let url = match base.rfind('/') {
                    Some(i) => format!("{}/{name}", &base[..i]),
                    None => format!("{base}/{name}"),
                };
                Self {
                    url,
                    pg_name: Some(name),
                    dir,
                }
            }
            DbKind::Sqlite => {
                let url = format!(
                    "sqlite://{}?mode=rwc",
                    dir.path().join("audit.db").display()
                );
                Self {
                    url,
                    pg_name: None,
                    dir,
                }
            }
        }
    }

    pub fn spool_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("spool")
    }

    /// A pool of its own, migrated, for direct inserts and checks.
    pub async fn connect(&self) -> AuditDb {
        let db = AuditDb::connect_lazy(&self.url).expect("a valid URL");
        db.migrate().await.expect("migrations apply");
        db
    }

    /// A pool of its own with the migrations older than `version` applied,
    /// as an older tollgate left the database.
    pub async fn migrated_before(&self, version: i64) -> AuditDb {
        let dir = match self.pg_name {
            Some(_) => "migrations/postgres",
            None => "migrations/sqlite",
        };
        let path = format!("{}/{dir}", env!("CARGO_MANIFEST_DIR"));
        let mut migrator = sqlx::migrate::Migrator::new(std::path::Path::new(&path))
            .await
            .expect("the migrations are readable");
        let before: Vec<_> = migrator
            .migrations
            .iter()
            .filter(|m| m.version < version)
            .cloned()
            .collect();
        assert!(before.len() < migrator.migrations.len());
        migrator.migrations = before.into();
        let audit = AuditDb::connect_lazy(&self.url).expect("a valid URL");
        match &audit {
            AuditDb::Postgres(pool) => migrator.run(pool).await.expect("old migrations apply"),
            AuditDb::Sqlite(pool) => migrator.run(pool).await.expect("old migrations apply"),
        }
        audit
    }

    /// Every row `app` has written to it, newest first (its queue flushed
    /// first).
    pub async fn trail(
        &self,
        app: &crate::support::app::TestApp,
    ) -> Vec<tollgate::audit::AuditEvent> {
        app.flush_audit().await;
        self.connect()
            .await
            .page(&Default::default(), None, 500)
            .await
            .unwrap()
    }

    /// The same database through another host:port (the fault proxy).
    pub fn url_via(&self, port: u16) -> String {
        self.url
            .replace("127.0.0.1:5432", &format!("127.0.0.1:{port}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(name) = self.pg_name.take() else {
            return;
        };
        super::run_detached(move || async move {
            if let Ok(mut admin) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await;
            }
        });
    }
}

/// A TCP proxy to an upstream address that the test can cut (every open
/// connection dropped, new ones refused) and restore, or freeze: every
/// connection stays open and new ones are taken, but no byte moves, as
/// from a database that hangs or behind a network that drops packets.
pub struct FaultProxy {
    pub port: u16,
    open: Arc<AtomicBool>,
    frozen: Frozen,
    trigger: Trigger,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

/// Whether bytes are held; a held pump waits for it to turn false.
type Frozen = Arc<watch::Sender<bool>>;

/// Bytes whose passage towards the upstream freezes the proxy, once.
type Trigger = Arc<Mutex<Option<Vec<u8>>>>;

impl FaultProxy {
    pub async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let frozen = Frozen::new(watch::Sender::new(false));
        let trigger = Trigger::default();
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let upstream = upstream.to_string();
        let accept = {
            let open = open.clone();
            let frozen = frozen.clone();
            let trigger = trigger.clone();
            let connections = connections.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let relay = relay(client, upstream.clone(), frozen.clone(), trigger.clone());
                    connections.lock().push(tokio::spawn(relay));
                }
            })
        };
        Self {
            port,
            open,
            frozen,
            trigger,
            connections,
            accept,
        }
    }

    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for task in self.connections.lock().drain(..) {
            task.abort();
        }
    }

    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// Stop moving bytes; every connection stays open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Freeze as soon as a client sends bytes containing `pattern`: they
    /// reach the upstream, its answer does not.
    pub fn freeze_after(&self, pattern: &[u8]) {
        *self.trigger.lock() = Some(pattern.to_vec());
    }

    /// Whether bytes are held now (a [`FaultProxy::freeze_after`] fired).
    pub fn frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// End a freeze as a failover would: the held connections are dropped,
    /// new ones go through.
    pub fn thaw(&self) {
        self.trigger.lock().take();
        for task in self.connections.lock().drain(..) {
            task.abort();
        }
        self.frozen.send_replace(false);
    }

    /// End a freeze as a network that comes back would: what was held goes
    /// on both ways, in order, and so do the connections taken meanwhile.
    pub fn resume(&self) {
        self.trigger.lock().take();
        self.frozen.send_replace(false);
    }
}

/// One client's connection: relayed both ways until either side ends it;
/// while frozen, held open with nothing moving.
async fn relay(mut client: TcpStream, upstream: String, frozen: Frozen, trigger: Trigger) {
    // Taken while frozen: the client's socket stays open, unanswered.
    thawed(&frozen).await;
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let (mut client_in, mut client_out) = client.split();
    let (mut server_in, mut server_out) = server.split();
    tokio::select! {
        () = pump(&mut client_in, &mut server_out, &frozen, Some(&trigger)) => {}
        () = pump(&mut server_in, &mut client_out, &frozen, None) => {}
    }
}

/// Copy `from` to `to` until either ends. Frozen, it holds what comes
/// until the freeze ends. Bytes that hold the armed trigger freeze the
/// proxy before they go on, so that their answer is the first thing held.
async fn pump(
    from: &mut (impl AsyncRead + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    frozen: &Frozen,
    trigger: Option<&Trigger>,
) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            // A close is held by a freeze too.
            Ok(0) | Err(_) => {
                thawed(frozen).await;
                return;
            }
            Ok(n) => n,
        };
        let bytes = &buf[..n];
        if trigger.is_some_and(|trigger| fired(trigger, bytes)) {
            frozen.send_replace(true);
        } else {
            thawed(frozen).await;
        }
        if to.write_all(bytes).await.is_err() {
            return;
        }
    }
}

/// Once the proxy is not frozen (at once if it is not).
async fn thawed(frozen: &Frozen) {
    // Cannot fail: the caller holds the sender.
    let _ = frozen.subscribe().wait_for(|held| !held).await;
}

/// Whether `bytes` hold the armed pattern; disarms it if so.
fn fired(trigger: &Trigger, bytes: &[u8]) -> bool {
    let mut armed = trigger.lock();
    let hit = armed
        .as_deref()
        .is_some_and(|pattern| bytes.windows(pattern.len()).any(|w| w == pattern));
    if hit {
        armed.take();
    }
    hit
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
