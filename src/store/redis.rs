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

use std::cell::RefCell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use fred::interfaces::EventInterface;
use fred::prelude::{
    Client, ClientLike, Config, Error as FredError, ErrorKind, KeysInterface, ReconnectPolicy,
    SortedSetsInterface, Value,
};
use fred::types::scripts::Script;
use fred::types::FromValue;
use futures::{StreamExt, TryStreamExt};

use super::{
    steps, HitOutcome, HitRequest, HitVerdict, IpFailures, LoginAttemptOutcome,
    LoginAttemptRequest, LoginOutcome, LoginPolicy, LoginRequest, LoginStateOutcome, LoginVerdict,
    OtpOutcome, PeekOutcome, ReserveOutcome, ReserveRequest, StoreError, SubjectWindows,
    WindowMode, WindowSpec, WindowStore,
};

mod url;

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Per-thread clients, by store id (a process may hold several stores).
    static THREAD_CLIENTS: RefCell<Vec<(u64, Client)>> = const { RefCell::new(Vec::new()) };
}

use self::url::{fred_url, glob_escape};

struct Scripts {
    reserve: Script,
    window_peek: Script,
    login_attempt: Script,
    login_state: Script,
    otp_put: Script,
    otp_check: Script,
    get_or_init: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            reserve: Script::from_lua(include_str!("../../lua/reserve.lua")),
            window_peek: Script::from_lua(include_str!("../../lua/window_peek.lua")),
            login_attempt: Script::from_lua(include_str!("../../lua/login_attempt.lua")),
            login_state: Script::from_lua(include_str!("../../lua/login_state.lua")),
            otp_put: Script::from_lua(include_str!("../../lua/otp_put.lua")),
            otp_check: Script::from_lua(include_str!("../../lua/otp_check.lua")),
            get_or_init: Script::from_lua(include_str!("../../lua/get_or_init.lua")),
        }
    }

    fn all(&self) -> [&Script; 7] {
        [
            &self.reserve,
            &self.window_peek,
            &self.login_attempt,
            &self.login_state,
            &self.otp_put,
            &self.otp_check,
            &self.get_or_init,
        ]
    }
}

/// The store on Redis or Redis Cluster, shared by every instance.
pub struct RedisStore {
    /// The start-up client: used by every thread without a client of its own.
    client: Client,
    /// Makes the per-thread clients, with the start-up client's settings.
    builder: fred::types::Builder,
    /// Tells this store's per-thread clients from another store's.
    id: u64,
    timeout: Duration,
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
                // Close half-open connections that stop answering, to reconnect.
                conn.unresponsive.max_timeout = Some(connect_timeout * 4);
                conn.unresponsive.interval = connect_timeout;
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
        // The task that drives the connection and reconnects; it runs until the
        // client quits (see `Drop`).
        let _connection = client.connect();

        let store = RedisStore {
            client,
            builder,
            id: NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed),
            timeout,
            scripts: Scripts::new(),
        };
        let deadline = tokio::time::Instant::now() + timeout;
        while !store.client.is_connected() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if store.client.is_connected() {
            if let Err(error) = store.load_scripts().await {
                tracing::warn!(%error, "could not preload the Lua scripts; they load on first use");
            }
        } else {
            tracing::warn!("Redis is not reachable yet; reconnecting in the background");
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
        let pattern = format!("{}:*", glob_escape(prefix));
        let keys: Vec<fred::types::Key> = if self.client.is_clustered() {
            let scan = self.client.scan_cluster_buffered(pattern, Some(500), None);
            self.run(scan.try_collect()).await?
        } else {
            let scan = self.client.scan_buffered(pattern, Some(500), None);
            self.run(scan.try_collect()).await?
        };
        let deleted = keys.len() as u64;
        self.delete_keys(keys).await?;
        Ok(deleted)
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
            Err(_) => Err(StoreError::Timeout),
            Ok(result) => result.map_err(store_error),
        }
    }

    async fn eval<R: FromValue>(
        &self,
        script: &Script,
        keys: Vec<&str>,
        args: Vec<Value>,
    ) -> Result<R, StoreError> {
        let client = self.client_here();
        self.run_on(
            &client,
            script.evalsha_with_reload::<R, _, _>(&client, keys, args),
        )
        .await
    }

    /// `reserve.lua` over `subjects` (and the code): one call, atomic.
    async fn reserve_script(
        &self,
        subjects: &[SubjectWindows<'_>],
        member: &str,
        gate_open: bool,
        force: bool,
        code: Option<super::CodeToStore<'_>>,
    ) -> Result<ReserveOutcome, StoreError> {
        let windows: usize = subjects.iter().map(|s| s.windows.len()).sum();
        if subjects.is_empty() || subjects.iter().any(|s| s.windows.is_empty()) {
            return Err(no_windows());
        }
        let mut keys = Vec::with_capacity(subjects.len() + 1);
        let mut args = Vec::with_capacity(4 + subjects.len() + 3 * windows + 3);
        args.push(Value::from(member));
        args.push(flag(gate_open));
        args.push(flag(force));
        args.push(int(subjects.len() as u64));
        for subject in subjects {
            keys.push(subject.key);
            args.push(int(subject.windows.len() as u64));
            for w in subject.windows {
                args.push(int(u64::from(w.limit)));
                args.push(int(w.window_ms));
                args.push(flag(w.mode == WindowMode::Gate));
            }
        }
        if let Some(code) = code {
            keys.push(code.key);
            args.push(Value::from(code.mac));
            args.push(int(u64::from(code.attempts)));
            args.push(int(code.ttl_ms));
        }
        let len = 1 + 4 * subjects.len() + windows;
        let out = self
            .eval_ints(&self.scripts.reserve, keys, args, len)
            .await?;
        let recorded = out[0] == 1;
        let mut outcomes = Vec::with_capacity(subjects.len());
        let mut at = 1;
        for subject in subjects {
            let n = subject.windows.len();
            let part = &out[at..at + 4 + n];
            at += 4 + n;
            let verdict = match part[0] {
                0 => HitVerdict::Allowed,
                1 => HitVerdict::Denied {
                    window: window_index(part[1], n)?,
                    retry_after_ms: wait(part[2]),
                },
                2 => HitVerdict::Gated {
                    window: window_index(part[1], n)?,
                },
                v => {
                    return Err(StoreError::Protocol(format!(
                        "bad verdict {v} from reserve"
                    )))
                }
            };
            outcomes.push(HitOutcome {
                verdict,
                added: recorded,
                counts: part[4..]
                    .iter()
                    .map(|c| count(*c))
                    .collect::<Result<_, _>>()?,
                next_retry_after_ms: wait(part[3]),
            });
        }
        Ok(ReserveOutcome { outcomes, recorded })
    }

    /// `login_attempt.lua`: the user's keys, and the IP's window when given.
    async fn login_script(
        &self,
        req: &LoginAttemptRequest<'_>,
        ip: Option<&super::IpFailureWindow<'_>>,
    ) -> Result<(LoginAttemptOutcome, Option<IpFailures>), StoreError> {
        let p = req.policy;
        let mut keys = vec![req.window_key, req.lock_key];
        let mut args = Vec::with_capacity(17);
        args.extend([
            Value::from(req.member),
            flag(req.success),
            flag(req.captcha_passed),
            flag(req.captcha_demanded),
            flag(req.shadow),
            int(u64::from(p.captcha_after)),
            int(p.captcha_window_ms),
            int(u64::from(p.lock_after)),
            int(p.lock_window_ms),
            int(p.lock_ms),
            int(p.lock_max_ms),
            flag(p.reset_on_success),
            int(p.escalation_reset_ms),
            flag(req.ip_blocked),
        ]);
        if let Some(ip) = ip {
            keys.push(ip.key);
            args.extend([
                int(u64::from(ip.captcha_after)),
                int(u64::from(ip.block_after)),
                int(ip.window_ms),
            ]);
        }
        let out = self
            .eval_ints(&self.scripts.login_attempt, keys, args, 7)
            .await?;
        let verdict = match out[0] {
            0 => LoginVerdict::Recorded,
            1 => LoginVerdict::Locked {
                retry_after_ms: wait(out[1]),
            },
            2 => LoginVerdict::Challenged,
            v => {
                return Err(StoreError::Protocol(format!(
                    "bad verdict {v} from login_attempt"
                )))
            }
        };
        let user = LoginAttemptOutcome {
            verdict,
            failures: count(out[2])?,
            captcha_crossed: out[3] == 1,
            locked_for_ms: u64::try_from(out[4]).ok(),
        };
        let ip = match ip {
            Some(_) => Some(IpFailures {
                count: count(out[5])?,
                blocked_retry_after_ms: u64::try_from(out[6]).ok(),
            }),
            None => None,
        };
        Ok((user, ip))
    }

    /// Run a script that answers an array of `len` integers.
    async fn eval_ints(
        &self,
        script: &Script,
        keys: Vec<&str>,
        args: Vec<Value>,
        len: usize,
    ) -> Result<Vec<i64>, StoreError> {
        let out: Vec<i64> = self.eval(script, keys, args).await?;
        if out.len() != len {
            return Err(StoreError::Protocol(format!(
                "expected {len} integers from the script, got {}",
                out.len()
            )));
        }
        Ok(out)
    }
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
        _ => StoreError::Protocol(error.to_string()),
    }
}

fn int(v: u64) -> Value {
    Value::from(i64::try_from(v).unwrap_or(i64::MAX))
}

fn flag(v: bool) -> Value {
    Value::from(i64::from(v))
}

fn count(v: i64) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::Protocol(format!("bad count {v} from the script")))
}

/// A wait in ms; never negative (a clock step on the server could make it so).
fn wait(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn window_index(v: i64, n: usize) -> Result<usize, StoreError> {
    usize::try_from(v)
        .ok()
        .filter(|i| *i < n)
        .ok_or_else(|| StoreError::Protocol(format!("bad window index {v} from the script")))
}

fn no_windows() -> StoreError {
    StoreError::Protocol("a window call needs at least one window".into())
}

#[async_trait]
impl WindowStore for RedisStore {
    async fn hit(&self, req: HitRequest<'_>) -> Result<HitOutcome, StoreError> {
        let subject = [SubjectWindows {
            key: req.key,
            windows: req.windows,
        }];
        let mut outcome = self
            .reserve_script(&subject, req.member, req.gate_open, req.force, None)
            .await?;
        outcome
            .outcomes
            .pop()
            .ok_or_else(|| StoreError::Protocol("reserve answered no subject".into()))
    }

    /// Standalone: one script for every subject and the code. A cluster keeps
    /// each subject in its own slot: one call per subject, then the code.
    async fn reserve(&self, req: ReserveRequest<'_>) -> Result<ReserveOutcome, StoreError> {
        if self.client.is_clustered() {
            return steps::reserve(self, req).await;
        }
        self.reserve_script(req.subjects, req.member, req.gate_open, req.force, req.code)
            .await
    }

    /// Standalone: the user and the IP in one script. A cluster keeps them in
    /// two slots: the IP's call, then the user's (see `steps::login`).
    async fn login(&self, req: LoginRequest<'_>) -> Result<LoginOutcome, StoreError> {
        if self.client.is_clustered() {
            return steps::login(self, req).await;
        }
        let user_req = LoginAttemptRequest {
            window_key: req.window_key,
            lock_key: req.lock_key,
            policy: req.policy,
            success: req.success,
            captcha_passed: req.captcha_passed,
            captcha_demanded: false,
            ip_blocked: false,
            member: req.member,
            shadow: req.shadow,
        };
        let (user, ip) = self.login_script(&user_req, req.ip.as_ref()).await?;
        Ok(LoginOutcome { user, ip })
    }

    async fn peek(&self, key: &str, windows: &[WindowSpec]) -> Result<PeekOutcome, StoreError> {
        let n = windows.len();
        if n == 0 {
            return Err(no_windows());
        }
        let mut args = Vec::with_capacity(1 + 2 * n);
        args.push(int(n as u64));
        for w in windows {
            args.push(int(u64::from(w.limit)));
            args.push(int(w.window_ms));
        }
        let out = self
            .eval_ints(&self.scripts.window_peek, vec![key], args, 2 * n)
            .await?;
        Ok(PeekOutcome {
            counts: out[..n]
                .iter()
                .map(|c| count(*c))
                .collect::<Result<_, _>>()?,
            retry_after_ms: out[n..].iter().map(|w| wait(*w)).collect(),
        })
    }

    async fn undo(&self, key: &str, member: &str) -> Result<(), StoreError> {
        let client = self.client_here();
        self.run_on(&client, client.zrem::<i64, _, _>(key, member))
            .await
            .map(|_| ())
    }

    async fn login_attempt(
        &self,
        req: LoginAttemptRequest<'_>,
    ) -> Result<LoginAttemptOutcome, StoreError> {
        self.login_script(&req, None).await.map(|(user, _)| user)
    }

    async fn login_state(
        &self,
        window_key: &str,
        lock_key: &str,
        policy: &LoginPolicy,
    ) -> Result<LoginStateOutcome, StoreError> {
        let args = vec![int(policy.captcha_window_ms), int(policy.lock_window_ms)];
        let out = self
            .eval_ints(
                &self.scripts.login_state,
                vec![window_key, lock_key],
                args,
                3,
            )
            .await?;
        Ok(LoginStateOutcome {
            locked_retry_after_ms: u64::try_from(out[0]).ok(),
            failures: count(out[1])?,
            lock_window_failures: count(out[2])?,
        })
    }

    async fn otp_put(
        &self,
        key: &str,
        mac: &str,
        attempts: u32,
        ttl_ms: u64,
    ) -> Result<(), StoreError> {
        let args = vec![Value::from(mac), int(u64::from(attempts)), int(ttl_ms)];
        let _: i64 = self.eval(&self.scripts.otp_put, vec![key], args).await?;
        Ok(())
    }

    async fn otp_check(&self, key: &str, mac: &str) -> Result<OtpOutcome, StoreError> {
        let out = self
            .eval_ints(
                &self.scripts.otp_check,
                vec![key],
                vec![Value::from(mac)],
                2,
            )
            .await?;
        Ok(match out[0] {
            0 => OtpOutcome::Valid,
            1 => OtpOutcome::Wrong {
                attempts_left: count(out[1])?,
            },
            2 => OtpOutcome::Burnt {
                retry_after_ms: wait(out[1]),
            },
            3 => OtpOutcome::Missing,
            v => {
                return Err(StoreError::Protocol(format!(
                    "bad outcome {v} from otp_check"
                )))
            }
        })
    }

    async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        self.delete_keys(keys.iter().map(|k| k.as_str().into()).collect())
            .await
    }

    async fn get_or_init(&self, key: &str, candidate: &str) -> Result<String, StoreError> {
        self.eval(
            &self.scripts.get_or_init,
            vec![key],
            vec![Value::from(candidate)],
        )
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.run(self.client.ping::<()>(None)).await
    }
}
