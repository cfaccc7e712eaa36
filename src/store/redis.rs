//! The Redis window store: one Lua script call per operation (see `lua/`), so
//! each is atomic per subject and timed by the server's clock.
//!
//! Connections: each HTTP worker thread gets a `fred` client of its own
//! ([`RedisStore::connect_this_thread`]), driven by that thread's runtime, so a
//! request's script call never hops to another thread and back; every other
//! caller shares the start-up client. Within a client, fred pipelines concurrent commands on its
//! connection, and Redis runs scripts one at a time anyway, so more connections
//! would add sockets without adding throughput (the benchmark runs 64 calls in
//! flight on this one client). Against a cluster the client holds a connection
//! per primary and routes each script by its keys' hash tag.
//!
//! Start-up never waits on Redis: [`RedisStore::connect`] returns once the first
//! connection is up or after `timeout`, whichever is first, and fred keeps
//! reconnecting in the background. While disconnected every call fails at once
//! with [`StoreError::Unavailable`] instead of queueing, so `/readyz` can say so.
//!
//! A connection that stops answering without closing (a peer gone behind a
//! firewall that drops, a host that died) is found by its calls timing out:
//! the first timeout of a client starts a `PING` on it, and a `PING`
//! unanswered within four connect timeouts (2 s at least: what fred's own
//! `unresponsive` check allowed) reconnects that client. That check kept a
//! timer and read the clock at every turn of the connection's task, for
//! every request; this costs nothing until a call times out.

use std::cell::RefCell;
use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::interfaces::EventInterface;
use fred::prelude::{
    Client, ClientLike, ClusterInterface, Config, Error as FredError, ErrorKind, KeysInterface,
    ReconnectPolicy,
};
use fred::types::{ClusterHash, CustomCommand, Value};
use futures::{StreamExt, TryStreamExt};

use super::StoreError;

mod deadline;
mod glob;
mod layout;
mod login_script;
mod reserve_policy;
mod reserve_subjects;
mod scripts;
mod window_store;

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(0);

/// The longest the reconnect policy below waits before the first attempt
/// (its 100 ms delay plus up to 100 ms of jitter).
const FIRST_ATTEMPT_DELAY: Duration = Duration::from_millis(200);

/// The bound of one walk of the keyspace (`delete_prefix`, `keys_with_prefix`:
/// tests and benchmarks).
const KEYSPACE_WALK_TIMEOUT: Duration = Duration::from_secs(120);

thread_local! {
    /// Per-thread clients, by store id (a process may hold several stores).
    static THREAD_CLIENTS: RefCell<Vec<(u64, Client)>> = const { RefCell::new(Vec::new()) };
}

pub use self::login_script::{render_login_attempt, LoginShape};
pub use self::scripts::unpack_answer;

use self::deadline::{time_ms, Reading, RedisClock, Sample, LATE};
use self::glob::glob_escape;
use self::scripts::Scripts;
use crate::settings::redis_url::fred_url;

/// The store on Redis or Redis Cluster, shared by every instance.
pub struct RedisStore {
    /// The start-up client: used by every thread without a client of its own.
    client: Client,
    /// Makes the per-thread clients, with the start-up client's settings.
    builder: fred::types::Builder,
    /// Tells this store's per-thread clients from another store's.
    id: u64,
    timeout: Duration,
    /// How long a probe's `PING` may take before its client reconnects.
    probe_timeout: Duration,
    /// The ids of the clients being probed after a call timed out.
    probing: Arc<Mutex<HashSet<String>>>,
    /// Where Redis's clock is against this process's: the counting
    /// scripts' deadlines (`deadline`).
    clock: Arc<RedisClock>,
    scripts: Scripts,
}

impl RedisStore {
    /// Connect to `redis://[user:pass@]host:port[/db]` or
    /// `redis-cluster://[user:pass@]h1:p1,h2:p2` (fred's own
    /// `redis-cluster://h1:p1?node=h2:p2` form works too).
    ///
    /// Fails only on a malformed URL. An unreachable Redis is not an error: the
    /// store is returned after at most `timeout`, answers
    /// [`StoreError::Unavailable`] until a background reconnection succeeds,
    /// then works. Every call is bounded by `timeout`.
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisStore, StoreError> {
        let mut config = Config::from_url(&fred_url(url))
            .map_err(|e| StoreError::Unavailable(format!("invalid Redis URL: {}", e.details())))?;
        // Keep retrying a first connection that fails instead of giving up.
        config.fail_fast = false;
        let connect_timeout = timeout.max(Duration::from_millis(500));
        // Calls are bounded by `run_on`'s timeout alone: a second timer per
        // call inside fred would only cost.
        let builder = fred::types::Builder::from_config(config)
            .with_connection_config(|conn| {
                conn.connection_timeout = connect_timeout;
                conn.internal_command_timeout = connect_timeout;
                // A script is not idempotent (an OTP try, a lock decision): never
                // replay one on a new connection after the caller gave up on it.
                conn.max_command_attempts = 1;
                // No `unresponsive` check: a call that times out probes its
                // connection instead (`RedisStore::probe`).
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2))
            .clone();
        let client = builder
            .build()
            .map_err(|e| StoreError::Unavailable(format!("Redis client: {}", e.details())))?;

        // Why a connection fails (refused, a TLS certificate not trusted, bad
        // credentials) is otherwise only in fred's debug lines; say it at warn,
        // once per attempt of the start-up client (backing off to 5 s).
        let _errors = client.on_error(|(error, server)| async move {
            let server = server.map(|s| s.to_string()).unwrap_or_default();
            tracing::warn!(error = %error.details(), %server, "Redis connection error");
            Ok(())
        });
        // Subscribed before connecting, so the first attempt's failure is seen.
        let mut first_error = client.error_rx();
        // The task that drives the connection and reconnects; it runs until the
        // client quits (see `Drop`).
        let _connection = client.connect();

        let store = RedisStore {
            client,
            builder,
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            timeout,
            probe_timeout: connect_timeout * 4,
            probing: Arc::default(),
            clock: Arc::new(RedisClock::new()),
            scripts: Scripts::new(),
        };
        // Wait for the first attempt's outcome, not for `timeout`: the
        // reconnect policy delays even the first attempt by 100-200 ms, so a
        // 100 ms wait warned at every start-up, Redis up or not.
        let first = tokio::time::timeout(connect_timeout + FIRST_ATTEMPT_DELAY, async {
            tokio::select! {
                connected = store.client.wait_for_connect() => {
                    connected.map_err(|e| e.details().to_string())
                }
                failed = first_error.recv() => {
                    Err(failed.map(|(e, _)| e.details().to_string()).unwrap_or_default())
                }
            }
        })
        .await;
        match first {
            Ok(Ok(())) => {
                if let Err(error) = store.load_scripts().await {
                    tracing::warn!(%error, "could not preload the Lua scripts; they load on first use");
                }
                if let (_, Some(sample)) = store.clock.deadline_ms(timeout) {
                    sample_clock(store.client.clone(), sample, timeout).await;
                }
            }
            Ok(Err(error)) => tracing::warn!(
                %error,
                "Redis is not reachable yet; reconnecting in the background"
            ),
            Err(_) => tracing::warn!(
                waited_ms = (connect_timeout + FIRST_ATTEMPT_DELAY).as_millis() as u64,
                "Redis is not reachable yet; reconnecting in the background"
            ),
        }
        Ok(store)
    }

    /// `SCRIPT LOAD` every script (on every primary of a cluster). Optional:
    /// calls load a missing script themselves on `NOSCRIPT`.
    pub async fn load_scripts(&self) -> Result<(), StoreError> {
        for script in self.scripts.all() {
            self.run(script.load(&self.client)).await?;
        }
        Ok(())
    }

    /// Delete every key that starts with `prefix:` (`SCAN` + `DEL`); returns how
    /// many were deleted. For tests and benchmarks that use a throw-away key
    /// prefix: it walks the whole keyspace.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        let keys = self.scan_prefix(prefix).await?;
        let deleted = keys.len() as u64;
        self.delete_keys(keys).await?;
        Ok(deleted)
    }

    /// The names of every key that starts with `prefix:` (`SCAN`), for
    /// tests that look at what a deployment leaves in Redis. It walks the
    /// whole keyspace.
    pub async fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let keys = self.scan_prefix(prefix).await?;
        Ok(keys
            .iter()
            .map(|k| String::from_utf8_lossy(k.as_bytes()).into_owned())
            .collect())
    }

    /// A walk of the whole keyspace is many calls, not one: it is bounded by
    /// `KEYSPACE_WALK_TIMEOUT`, not by the per-call timeout (a shared Redis
    /// holding millions of other keys took longer than 2 s under a loaded CI).
    async fn scan_prefix(&self, prefix: &str) -> Result<Vec<fred::types::Key>, StoreError> {
        let pattern = format!("{}:*", glob_escape(prefix));
        let walk = async {
            if self.client.is_clustered() {
                let scan = self.client.scan_cluster_buffered(pattern, Some(1000), None);
                scan.try_collect().await
            } else {
                let scan = self.client.scan_buffered(pattern, Some(1000), None);
                scan.try_collect().await
            }
        };
        if !self.client.is_connected() {
            return Err(StoreError::Unavailable(
                "not connected to Redis (reconnecting)".into(),
            ));
        }
        match tokio::time::timeout(KEYSPACE_WALK_TIMEOUT, walk).await {
            Err(_) => Err(StoreError::Timeout),
            Ok(result) => result.map_err(store_error),
        }
    }

    /// One `DEL` per key, pipelined: the keys may be in different slots.
    async fn delete_keys(&self, keys: Vec<fred::types::Key>) -> Result<(), StoreError> {
        let client = &self.client_here();
        let dels = futures::stream::iter(keys)
            .map(|key| client.del::<i64, _>(key))
            .buffer_unordered(64)
            .try_collect::<Vec<i64>>();
        self.run_on(client, dels).await.map(|_| ())
    }

    /// Give the calling thread a client of its own, connected in the
    /// background by the thread's runtime (call it inside one, on each HTTP
    /// worker thread as it starts). Until it is connected, and on threads
    /// without one, calls use the start-up client.
    pub fn connect_this_thread(&self) {
        THREAD_CLIENTS.with(|clients| {
            let mut clients = clients.borrow_mut();
            if clients.iter().any(|(id, _)| *id == self.id) {
                return;
            }
            match self.builder.build() {
                Ok(client) => {
                    let _connection = client.connect();
                    clients.push((self.id, client));
                    keep_timer_floor(self.timeout);
                }
                Err(e) => {
                    tracing::warn!(error = %e.details(), "no Redis client for this thread; it shares the start-up client")
                }
            }
        });
    }

    /// The calling thread's own client when it has a connected one, else
    /// the start-up client.
    fn client_here(&self) -> Client {
        THREAD_CLIENTS
            .with(|clients| {
                clients
                    .borrow()
                    .iter()
                    .find(|(id, client)| *id == self.id && client.is_connected())
                    .map(|(_, client)| client.clone())
            })
            .unwrap_or_else(|| self.client.clone())
    }

    /// The deadline a counting script is handed (`deadline`), in Redis's
    /// ms, 0 for none; starts a sample of Redis's clock when one is due.
    fn script_deadline(&self) -> i64 {
        let (deadline, sample) = self.clock.deadline_ms(self.timeout);
        if let (Some(sample), Ok(runtime)) = (sample, tokio::runtime::Handle::try_current()) {
            runtime.spawn(sample_clock(self.client_here(), sample, self.timeout));
        }
        deadline
    }

    /// A script that found its deadline passed changed nothing and answered
    /// `late` (`otp_check.lua` and `otp_put.lua` their answer 3). Its caller still waited, so the offset may be wrong
    /// (a clock stepped): calls carry no deadline until the next sample, and
    /// this one answers as a timeout would.
    fn refuse_late(&self, answer: &[u8]) -> Result<(), StoreError> {
        if answer != LATE {
            return Ok(());
        }
        Err(self.late())
    }

    /// The error of a call whose script answered `late` (`refuse_late`).
    fn late(&self) -> StoreError {
        tracing::debug!("a script answered after its deadline; sampling Redis's clock again");
        self.clock.forget();
        StoreError::Timeout
    }

    /// Fail fast while disconnected, bound the call by the timeout, map errors.
    async fn run<T>(
        &self,
        call: impl Future<Output = Result<T, FredError>>,
    ) -> Result<T, StoreError> {
        self.run_on(&self.client, call).await
    }

    async fn run_on<T>(
        &self,
        client: &Client,
        call: impl Future<Output = Result<T, FredError>>,
    ) -> Result<T, StoreError> {
        if !client.is_connected() {
            return Err(StoreError::Unavailable(
                "not connected to Redis (reconnecting)".into(),
            ));
        }
        match tokio::time::timeout(self.timeout, call).await {
            Err(_) => {
                self.probe(client);
                Err(StoreError::Timeout)
            }
            Ok(result) => result.map_err(store_error),
        }
    }

    /// A call on `client` timed out: unless its connection is already being
    /// probed, `PING` it, and reconnect when the `PING` goes unanswered too.
    /// A Redis stalled for less than `probe_timeout` (a fork, a slow
    /// script) answers the `PING` behind what it was doing, and keeps its
    /// connection.
    fn probe(&self, client: &Client) {
        let id = client.id().to_string();
        let probing = &self.probing;
        if !probing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone())
        {
            return;
        }
        let (client, probing, wait) = (client.clone(), self.probing.clone(), self.probe_timeout);
        tokio::spawn(async move {
            let ping = tokio::time::timeout(wait, client.ping::<String>(None)).await;
            if ping.is_err() {
                tracing::warn!(
                    waited_ms = wait.as_millis() as u64,
                    "a Redis connection stopped answering; reconnecting"
                );
                // Bounded: a reconnection that hangs must not keep the
                // client marked as probed for ever.
                let _ = tokio::time::timeout(wait, client.force_reconnection()).await;
            }
            probing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        });
    }
}

/// Take `sample`: Redis's `TIME` read on `client`, on a cluster on every
/// primary at once (see [`deadline`] for why the one furthest ahead).
async fn sample_clock(client: Client, sample: Sample, budget: Duration) {
    let readings = read_clocks(&client, &sample, budget).await;
    sample.finish(readings.into_iter().flatten(), budget);
}

/// `TIME` on the one server, or on every primary of a cluster (when the
/// cluster's map is not known yet, on any one node).
async fn read_clocks(client: &Client, sample: &Sample, budget: Duration) -> Vec<Option<Reading>> {
    let primaries = if client.is_clustered() {
        client
            .cached_cluster_state()
            .map(|state| state.unique_primary_nodes())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    if primaries.is_empty() {
        return vec![read_time(client, sample, budget).await];
    }
    let reads = primaries.into_iter().map(|node| async move {
        read_time(&client.with_cluster_node(node), sample, budget).await
    });
    futures::future::join_all(reads).await
}

/// One node's `TIME` (the one `ClusterHash::Random` picks) with this
/// clock's reading before and after.
async fn read_time<C: ClientLike>(
    client: &C,
    sample: &Sample,
    budget: Duration,
) -> Option<Reading> {
    let clock = sample.clock();
    let sent_ms = clock.local_ms();
    let time = CustomCommand::new_static("TIME", ClusterHash::Random, false);
    let answer = tokio::time::timeout(
        budget,
        client.custom::<Vec<String>, Value>(time, Vec::new()),
    )
    .await;
    let received_ms = clock.local_ms();
    let redis_ms = answer.ok().and_then(Result::ok).and_then(|a| time_ms(&a))?;
    Some(Reading {
        sent_ms,
        redis_ms,
        received_ms,
    })
}

/// Keep a timer in this thread's runtime that always fires before any call's
/// timeout would. tokio wakes its own driver (a write to its eventfd, then
/// one more epoll round) whenever a new timer fires before every timer it
/// holds; each call's timeout did so on about one login in five under load,
/// when the calls before it had all been answered. A timer re-armed every
/// half timeout costs two wake-ups per timeout instead.
fn keep_timer_floor(timeout: Duration) {
    let period = (timeout / 2).max(Duration::from_millis(1));
    actix_web::rt::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
        }
    });
}

impl Drop for RedisStore {
    /// Stop the background connection task (it would reconnect forever).
    fn drop(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            runtime.spawn(async move { client.quit().await });
        }
    }
}

fn store_error(error: FredError) -> StoreError {
    match error.kind() {
        ErrorKind::Timeout => StoreError::Timeout,
        ErrorKind::IO
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Backpressure
        | ErrorKind::Auth
        | ErrorKind::Sentinel => StoreError::Unavailable(error.to_string()),
        // fred reads these replies as `Unknown`; waiting mends them (a
        // restart's load, a failover, a busy script), unlike `NOPERM` or
        // `CROSSSLOT`, so they count as an outage, not a refusal.
        _ if error
            .details()
            .split_whitespace()
            .next()
            .is_some_and(|word| PASSING_REPLIES.contains(&word)) =>
        {
            StoreError::Unavailable(error.to_string())
        }
        _ => StoreError::Protocol(error.to_string()),
    }
}

/// Error replies of a Redis that serves again by itself.
/// (`CLUSTERDOWN` fred already reads as a cluster error: unavailable.)
const PASSING_REPLIES: [&str; 5] = ["LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN", "READONLY"];

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies that pass with time count as an outage; a refusal that
    /// stays (an ACL's, a slot's, memory's) as refused.
    #[test]
    fn replies_that_pass_are_an_outage_and_the_others_a_refusal() {
        // As fred reads an error reply it has no kind for.
        let reply = |text: &str| store_error(FredError::new(ErrorKind::Unknown, text.to_string()));
        for passing in [
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script.",
            "READONLY You can't write against a read only replica.",
            "MASTERDOWN Link with MASTER is down",
        ] {
            assert!(
                matches!(reply(passing), StoreError::Unavailable(_)),
                "{passing}"
            );
        }
        for staying in [
            "NOPERM User tg has no permissions to run the 'evalsha' command",
            "CROSSSLOT Keys in request don't hash to the same slot",
            "BUSYKEY Target key name already exists.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ERR Error running script",
        ] {
            assert!(
                matches!(reply(staying), StoreError::Protocol(_)),
                "{staying}"
            );
        }
    }
    use crate::store::{ReserveRequest, SubjectWindows, WindowSpec, WindowStore};

    /// A `late` answer that comes while its caller still waits (the clock's
    /// mapping wrong, as after a step) fails that call as a timeout, having
    /// counted nothing; the next call carries no deadline and counts, and
    /// Redis's clock is read again.
    #[tokio::test]
    async fn a_late_answer_fails_one_call_and_the_clock_is_read_again() {
        let url = std::env::var("TOLLGATE_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let store = RedisStore::connect(&url, Duration::from_secs(2))
            .await
            .expect("a valid URL");
        let prefix = format!("tgunit-{}", uuid::Uuid::new_v4().simple());
        let key = format!("{prefix}:{{phone:1}}:sms_send");
        let windows = [WindowSpec::enforce(1, 60_000)];
        let subjects = [SubjectWindows {
            key: &key,
            windows: &windows,
            callers_own: false,
        }];
        let reserve = |member| {
            store.reserve(ReserveRequest {
                subjects: &subjects,
                conversions: &[],
                member,
                gate_open: false,
                force: false,
                code: None,
            })
        };
        assert_ne!(
            store.script_deadline(),
            0,
            "Redis's clock was read at start-up"
        );

        // Every deadline handed out now has passed in Redis's clock.
        store.clock.misjudge_by(-60_000);
        let late = reserve("late").await;
        assert!(matches!(late, Err(StoreError::Timeout)), "{late:?}");
        let next = reserve("next").await.expect("Redis answers");
        assert!(next.recorded, "the late call took no place: {next:?}");
        let full = reserve("full").await.expect("Redis answers");
        assert!(!full.recorded, "the window of one holds one: {full:?}");

        // The next sample is due a second after the last one tried.
        let mut read_again = false;
        for _ in 0..300 {
            if store.script_deadline() != 0 {
                read_again = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(read_again, "Redis's clock is read again");
        store.delete_prefix(&prefix).await.expect("Redis answers");
    }

    /// On a cluster each primary's clock is read (the deadline follows the
    /// one furthest ahead: `deadline::tests`).
    #[tokio::test]
    async fn every_primary_of_a_cluster_has_its_clock_read() {
        let url = std::env::var("TOLLGATE_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
            "redis-cluster://127.0.0.1:17000,127.0.0.1:17001,127.0.0.1:17002".into()
        });
        let store = RedisStore::connect(&url, Duration::from_secs(2))
            .await
            .expect("the cluster answers (scripts/redis-cluster.sh)");
        let clock = Arc::new(RedisClock::new());
        let sample = clock
            .deadline_ms(Duration::from_secs(2))
            .1
            .expect("none taken yet");
        let readings = read_clocks(&store.client, &sample, Duration::from_secs(2)).await;
        assert_eq!(readings.len(), 3, "{readings:?}");
        assert!(readings.iter().all(Option::is_some), "{readings:?}");
    }
}
