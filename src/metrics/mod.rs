//! Metric names and help texts, all declared here, and the Prometheus
//! recorder behind `GET /metrics`.

mod rule;

pub use rule::RuleCounters;

use std::cell::RefCell;
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Histogram,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Counter of answered requests, by `route` and `decision`.
pub const REQUESTS: &str = "tollgate_requests_total";
/// Counter of window-store calls that failed or timed out.
pub const STORE_ERRORS: &str = "tollgate_store_errors_total";
/// Histogram of window-store call durations, in seconds.
pub const STORE_SECONDS: &str = "tollgate_store_seconds";
/// Counter of subjects the in-process store evicted to stay within
/// `store.memory_limit`.
pub const STORE_EVICTIONS: &str = "tollgate_store_evictions_total";
/// Counter of requests an allow or block list matched, by `list`, `kind`
/// (ip, phone, user) and `action`.
pub const LIST_MATCHES: &str = "tollgate_list_matches_total";
/// Gauge of stored list rows out of force: a value no version since reads
/// (`GET /admin/api/lists`' `unreadable`), as of the last refresh.
pub const LIST_UNREADABLE: &str = "tollgate_list_unreadable_entries";
/// Gauge: when the stored list entries were last read (Unix seconds).
pub const LISTS_READ: &str = "tollgate_lists_read_timestamp_seconds";
/// Counter of audit events by `outcome`: queued, written, spooled (left to
/// the journal for a replay), replayed, unjournaled (answered without a
/// journal line: the journal was full or failing), dropped (neither the
/// journal nor memory could keep it), expired (older than `audit.retention`
/// when it reached the writer: not inserted).
pub const AUDIT_EVENTS: &str = "tollgate_audit_events_total";
/// Counter of the batch writer's inserts of fresh events (transactions, a
/// replay's aside): `written` over it is the rows per transaction.
pub const AUDIT_BATCHES: &str = "tollgate_audit_batches_total";
/// Counter of audit rows removed by `audit.retention`, by `how`:
/// `partition` (a day's partition dropped, PostgreSQL; rows as the
/// database's estimate) or `delete` (SQLite, exact).
pub const AUDIT_RETENTION_ROWS: &str = "tollgate_audit_retention_rows_total";
/// Gauge of how long the last retention cut took, in seconds.
pub const AUDIT_RETENTION_SECONDS: &str = "tollgate_audit_retention_seconds";
/// Gauge of the audit journal's bytes on disk (bounded by
/// `audit.journal_max_bytes`).
pub const AUDIT_JOURNAL_BYTES: &str = "tollgate_audit_journal_bytes";
/// Counter of audit journal failures, by `op`: append, sync, read, delete,
/// adopt, and `parse` (a line a replay could not read, set aside).
pub const AUDIT_JOURNAL_ERRORS: &str = "tollgate_audit_journal_errors_total";
/// Counter of requests from a trusted proxy whose client address fell back
/// to the proxy's, by `reason`: `not_forwarded` (no `client_ip_header`)
/// or `unusable` (it names no address where one was needed).
pub const CLIENT_IP_FALLBACKS: &str = "tollgate_client_ip_fallbacks_total";
/// Counter of calls from a backend that named no client (`ip`), by
/// `route`: its address is counted in no per-address window.
pub const BACKEND_WITHOUT_CLIENT_IP: &str = "tollgate_backend_without_client_ip_total";
/// Counter of `/sms/verify` tries from a backend that named no client
/// (`ip`), kept beside `BACKEND_WITHOUT_CLIENT_IP` for dashboards made
/// before that one.
pub const SMS_VERIFY_WITHOUT_CLIENT_IP: &str = "tollgate_sms_verify_without_client_ip_total";
/// Counter of admin requests with a wrong token or password.
pub const ADMIN_AUTH_FAILURES: &str = "tollgate_admin_auth_failures_total";
/// Counter of admin requests refused 429 because their address failed
/// `server.admin_auth_limit` times.
pub const ADMIN_AUTH_THROTTLED: &str = "tollgate_admin_auth_throttled_total";
/// Counter of captcha tokens, by `outcome`: what the provider said
/// (`passed`, `refused`, `unanswered`; `mismatched`, passed but refused for
/// `captcha.min_score`, `hostnames` or the route's actions), or not asked:
/// `throttled` when the address had `captcha.failed_token_limit` refused,
/// `paused` while the provider throttles (429).
pub const CAPTCHA_CHECKS: &str = "tollgate_captcha_checks_total";
/// Counter of SMS sends that reached delivery, by `outcome`
/// ([`SmsDelivery`]).
pub const SMS_DELIVERIES: &str = "tollgate_sms_deliveries_total";
/// Counter of SMS sends the pumping guard refused (403
/// `pumping_suspected`): its number prefix or its country is blocked.
pub const PUMPING_REFUSALS: &str = "tollgate_pumping_refusals_total";
/// Counter of email copies (one per recipient), by `kind` (`lock_notice`,
/// `alert_digest`) and `outcome` ([`EmailOutcome`]): the logs say one line
/// per interval of a queue that drops them, and a lock notice lost is
/// otherwise seen by no one.
pub const EMAILS: &str = "tollgate_emails_total";
/// Counter of fetches of the OpenID provider's signing keys (JWKS), by
/// `outcome`: `ok` or `failed`.
pub const ADMIN_JWKS_FETCHES: &str = "tollgate_admin_jwks_fetches_total";
/// Counter of configuration reloads (SIGHUP, a changed file), by `outcome`:
/// `applied`, or `rejected` (the old settings stay in force).
pub const CONFIG_RELOADS: &str = "tollgate_config_reloads_total";
/// Gauge: 1 after start-up and after a reload that was applied (keys that
/// wait for a restart aside), 0 after a reload was rejected: the file on
/// disk is not what runs (a restart would fail, or run other settings).
pub const CONFIG_LAST_RELOAD_SUCCESSFUL: &str = "tollgate_config_last_reload_successful";
/// Gauge: how many parts of the config file in force wait for a restart
/// (`[server]`, `[admin]`, `sms.code_secret`, …): a reload that revokes a
/// leaked API or admin token is applied to nothing until then.
pub const CONFIG_RESTART_PENDING: &str = "tollgate_config_restart_pending";
/// Histogram of HTTP request durations, in seconds, by `route` (the matched
/// pattern, `unmatched` for none), `method` and `status`.
pub const HTTP_SECONDS: &str = "tollgate_http_request_duration_seconds";
/// Gauge of open connections, by `listener` (public, admin).
pub const CONNECTIONS_OPEN: &str = "tollgate_connections_open";
/// Counter of connections closed at accept, by `listener` and `reason`
/// (`per_ip`: the address holds its share already: on the public listener
/// `server.max_connections_per_ip`, on the admin one
/// `server.admin_max_connections_per_ip`).
pub const CONNECTIONS_REFUSED: &str = "tollgate_connections_refused_total";
/// Counter of connections closed because their next request did not arrive,
/// or their answer was not read, within `server.request_timeout`, by `listener`.
pub const CONNECTIONS_STALLED: &str = "tollgate_connections_stalled_total";

// Per-rule counters, as Envoy's ratelimit service keeps them (`total_hits`,
// `over_limit`, `near_limit`, `within_limit`, `shadow_mode`), each by
// `action` and `rule` (the rule's name, `phone 1/1m`). What a hit is for each
// kind of rule: docs/operations.md, "Metrics".

/// Counter of requests a rule was evaluated on, with the count the store
/// returned.
pub const RULE_HITS: &str = "tollgate_rule_hits_total";
/// Counter of hits that found the rule's count at its limit (the rule
/// refused, asked for a captcha, or would have in shadow).
pub const RULE_OVER_LIMIT: &str = "tollgate_rule_over_limit_total";
/// Counter of hits within the limit at or above 80% of it (Envoy's
/// `NEAR_LIMIT_RATIO`).
pub const RULE_NEAR_LIMIT: &str = "tollgate_rule_near_limit_total";
/// Counter of hits within the limit.
pub const RULE_WITHIN_LIMIT: &str = "tollgate_rule_within_limit_total";
/// Counter of over-limit hits that were let through because the rule or its
/// section is in shadow mode.
pub const RULE_SHADOWED: &str = "tollgate_rule_shadowed_total";

/// Envoy's `NEAR_LIMIT_RATIO` as a fraction: a hit is near the limit from
/// `limit * 4 / 5` (rounded down) hits before it.
pub const NEAR_LIMIT_RATIO: (u64, u64) = (4, 5);

/// Bounds of [`HTTP_SECONDS`]: most answers take about a millisecond, those
/// that call an SMS or captcha provider up to its timeout (5 s by default).
const HTTP_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Install the process-wide recorder once (several apps in one test process
/// share it) and keep its histograms trimmed.
pub fn install() -> Option<PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(STORE_SECONDS.into()),
                    &[
                        0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    ],
                )
                .ok()?
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(HTTP_SECONDS.into()),
                    &HTTP_BUCKETS,
                )
                .ok()?
                .install_recorder()
                .map_err(|e| tracing::warn!(error = %e, "metrics recorder not installed"))
                .ok()?;
            describe();
            zeroes();
            let upkeep = handle.clone();
            std::thread::spawn(move || loop {
                std::thread::sleep(Duration::from_secs(5));
                upkeep.run_upkeep();
            });
            Some(handle)
        })
        .clone()
}

fn describe() {
    describe_counter!(REQUESTS, "Requests answered, by route and decision");
    describe_counter!(
        ADMIN_JWKS_FETCHES,
        "Fetches of the OpenID provider's signing keys, by outcome (ok, failed)"
    );
    describe_counter!(
        STORE_ERRORS,
        "Window-store calls that failed, by kind: timeout, unavailable, refused (an error answer: a set-up to mend)"
    );
    describe_counter!(
        LIST_MATCHES,
        "Requests an allow list exempted or a block list refused, by list, kind and action"
    );
    describe_gauge!(
        LIST_UNREADABLE,
        "Stored list entries out of force: a value this version cannot read (listed as unreadable by GET /admin/api/lists)"
    );
    describe_gauge!(
        LISTS_READ,
        "When the stored list entries were last read (Unix seconds); absent without an audit database or before the first read"
    );
    describe_histogram!(STORE_SECONDS, "Duration of window-store calls");
    describe_counter!(
        STORE_EVICTIONS,
        "Subjects the in-process store evicted (least recently touched first) to stay within store.memory_limit"
    );
    describe_counter!(
        CLIENT_IP_FALLBACKS,
        "Requests from a trusted proxy counted under its address, by reason: not_forwarded, unusable"
    );
    describe_counter!(
        BACKEND_WITHOUT_CLIENT_IP,
        "Calls from a backend that named no client address (ip), by route: counted in no per-address window"
    );
    describe_counter!(
        SMS_VERIFY_WITHOUT_CLIENT_IP,
        "Verify tries from a backend that named no client address (ip), not counted per address"
    );
    describe_counter!(
        ADMIN_AUTH_FAILURES,
        "Admin requests with a wrong token or password"
    );
    describe_counter!(
        ADMIN_AUTH_THROTTLED,
        "Admin requests refused because their address failed too often"
    );
    describe_counter!(
        SMS_DELIVERIES,
        "SMS sends that reached delivery, by outcome: delivered, refused_number (counts against the asking address), declined (the request's pick, given back within the address's budget), dropped (no whole answer once the request went out, within the same budget), over_budget (declined or dropped past it, or naming no client: counts), failed (given back), timed_out (counts)"
    );
    describe_counter!(
        PUMPING_REFUSALS,
        "SMS sends refused because the pumping guard blocked their number prefix or country"
    );
    describe_counter!(
        EMAILS,
        "Email copies (one per recipient), by kind (lock_notice, alert_digest) and outcome: sent, refused (5xx: not tried again), failed (every try failed, or not built or rendered), dropped (never tried: the queue was full or the mail task had stopped)"
    );
    describe_counter!(
        CAPTCHA_CHECKS,
        "Captcha tokens, by outcome: passed, refused, mismatched, unanswered (the provider's word), throttled or paused (not asked)"
    );
    describe_audit();
    describe_histogram!(
        HTTP_SECONDS,
        "Duration of HTTP requests, by route pattern, method and status"
    );
    describe_gauge!(CONNECTIONS_OPEN, "Open connections, by listener");
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections closed at accept, by listener and reason"
    );
    describe_counter!(
        CONNECTIONS_STALLED,
        "Connections closed for not sending a request or not reading an answer in time, by listener"
    );
    describe_rules();
    describe_config();
}

/// The series the shipped alerts watch, there from start-up: the failure
/// counters (store errors, pumping refusals, spooled, unjournaled and
/// refused audit events, unreadable journal segments) from 0, as a series
/// that first appears at 1 hides its first failure from `rate` and
/// `increase`, and the last reload's outcome at 1. (The busy series the
/// other alerts read exist after the first requests.)
fn zeroes() {
    for kind in StoreFailure::ALL {
        counter!(STORE_ERRORS, "kind" => kind.as_str()).increment(0);
    }
    counter!(PUMPING_REFUSALS).increment(0);
    for outcome in SmsDelivery::ALL {
        counter!(SMS_DELIVERIES, "outcome" => outcome.as_str()).increment(0);
    }
    for outcome in ["spooled", "unjournaled", "refused"] {
        counter!(AUDIT_EVENTS, "outcome" => outcome).increment(0);
    }
    counter!(AUDIT_JOURNAL_ERRORS, "op" => "read").increment(0);
    counter!(AUDIT_JOURNAL_ERRORS, "op" => "parse").increment(0);
    counter!(AUDIT_JOURNAL_ERRORS, "op" => "adopt").increment(0);
    gauge!(CONFIG_LAST_RELOAD_SUCCESSFUL).set(1.0);
    gauge!(CONFIG_RESTART_PENDING).set(0.0);
}

/// The per-rule series.
fn describe_rules() {
    describe_counter!(
        RULE_HITS,
        "Requests a rule was evaluated on, by action and rule"
    );
    describe_counter!(
        RULE_OVER_LIMIT,
        "Rule hits that found the rule at its limit, by action and rule"
    );
    describe_counter!(
        RULE_NEAR_LIMIT,
        "Rule hits within the limit at 80% of it or more, by action and rule"
    );
    describe_counter!(
        RULE_WITHIN_LIMIT,
        "Rule hits within the limit, by action and rule"
    );
    describe_counter!(
        RULE_SHADOWED,
        "Over-limit rule hits let through by shadow mode, by action and rule"
    );
}

/// The configuration's series.
fn describe_config() {
    describe_counter!(
        CONFIG_RELOADS,
        "Configuration reloads (SIGHUP, a changed file), applied or rejected"
    );
    describe_gauge!(
        CONFIG_LAST_RELOAD_SUCCESSFUL,
        "1 while the settings in force are the config file's, 0 after a rejected reload"
    );
    describe_gauge!(
        CONFIG_RESTART_PENDING,
        "Parts of the config file applied by the last reload that wait for a restart"
    );
}

/// The audit trail's series.
fn describe_audit() {
    describe_counter!(
        AUDIT_EVENTS,
        "Audit events by outcome: queued, written, spooled, replayed, unjournaled, dropped, expired"
    );
    describe_counter!(
        AUDIT_BATCHES,
        "Transactions the audit writer inserted fresh events in (written / batches = rows per transaction)"
    );
    describe_counter!(
        AUDIT_RETENTION_ROWS,
        "Audit rows removed by audit.retention, by how: partition (estimate) or delete"
    );
    describe_gauge!(
        AUDIT_RETENTION_SECONDS,
        "Seconds the last audit retention cut took"
    );
    describe_gauge!(
        AUDIT_JOURNAL_BYTES,
        "Bytes of the audit journal on disk (audit.spool_dir), at most audit.journal_max_bytes"
    );
    describe_counter!(
        AUDIT_JOURNAL_ERRORS,
        "Audit journal failures (audit.spool_dir), by op: append, sync, read, delete"
    );
}

/// How a store call failed: the `kind` of `tollgate_store_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFailure {
    /// No answer within `store.timeout`.
    Timeout,
    /// The store could not be reached, refused the credentials, or does
    /// not serve for now (`LOADING`, `BUSY`, a failover).
    Unavailable,
    /// The store answered with another error (`NOPERM`, `CROSSSLOT`,
    /// `OOM`, a script's error) or an answer not understood: a set-up to
    /// mend, which waiting will not.
    Refused,
}

impl StoreFailure {
    const ALL: [StoreFailure; 3] = [Self::Timeout, Self::Unavailable, Self::Refused];

    fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
            Self::Refused => "refused",
        }
    }
}

/// Count one failed store call.
pub fn store_error(kind: StoreFailure) {
    counter!(STORE_ERRORS, "kind" => kind.as_str()).increment(1);
}

/// Count subjects the in-process store evicted.
pub fn store_evictions(n: u64) {
    counter!(STORE_EVICTIONS).increment(n);
}

/// Record how long one store call took.
pub fn store_call(elapsed: Duration) {
    with_handles(|handles| {
        handles
            .store_seconds
            .get_or_insert_with(|| histogram!(STORE_SECONDS))
            .record(elapsed.as_secs_f64());
    })
    .unwrap_or_else(|| histogram!(STORE_SECONDS).record(elapsed.as_secs_f64()));
}

/// Count one audit event queued for the database: every refused request's,
/// so by handle (`count` in `audit::writer` looks the series up each time).
pub fn audit_queued() {
    let series = || counter!(AUDIT_EVENTS, "outcome" => "queued");
    with_handles(|handles| handles.audit_queued.get_or_insert_with(series).increment(1))
        .unwrap_or_else(|| series().increment(1));
}

/// The handles of the series every request adds to, per thread.
/// `counter!` and `histogram!` build their key and look it up in the
/// registry at every call (about 2,000 instructions a login); a handle only
/// adds to an atomic.
#[derive(Default)]
struct Handles {
    /// By `Route` and `Outcome`, at their index in `ALL` (a variant left
    /// out of `ALL` is counted without a handle).
    requests: [[Option<Counter>; Outcome::ALL.len()]; Route::ALL.len()],
    store_seconds: Option<Histogram>,
    audit_queued: Option<Counter>,
    /// By `SmsDelivery`, at its index in `ALL` (as `requests`): one a send.
    sms_deliveries: [Option<Counter>; SmsDelivery::ALL.len()],
}

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::new(Handles::default());
}

/// Run `f` on this thread's handles once the recorder is installed; `None`
/// before (a handle made then would stay a no-op for good).
fn with_handles<T>(f: impl FnOnce(&mut Handles) -> T) -> Option<T> {
    RECORDER.get()?.as_ref()?;
    HANDLES.with(|handles| f(&mut handles.borrow_mut())).into()
}

/// The routes whose answers are counted (the `route` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /sms/send`.
    SmsSend,
    /// `POST /sms/verify`.
    SmsVerify,
    /// `POST /login/check`.
    LoginCheck,
    /// `POST /login/attempt`.
    LoginAttempt,
}

impl Route {
    /// Every route, each at its `as usize` index.
    const ALL: [Route; 4] = [
        Route::SmsSend,
        Route::SmsVerify,
        Route::LoginCheck,
        Route::LoginAttempt,
    ];

    /// The `route` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::SmsSend => "sms_send",
            Route::SmsVerify => "sms_verify",
            Route::LoginCheck => "login_check",
            Route::LoginAttempt => "login_attempt",
        }
    }
}

/// What a counted request came to (the `decision` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Let through: a code sent, a code accepted, a login allowed.
    Allow,
    /// Asked to pass a captcha first.
    Challenge,
    /// Refused (a full window, a list, a blocked region, a wrong code, …).
    Deny,
    /// The request failed (a store or delivery error).
    Error,
}

impl Outcome {
    /// Every outcome, each at its `as usize` index.
    const ALL: [Outcome; 4] = [
        Outcome::Allow,
        Outcome::Challenge,
        Outcome::Deny,
        Outcome::Error,
    ];

    /// The `decision` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Challenge => "challenge",
            Outcome::Deny => "deny",
            Outcome::Error => "error",
        }
    }
}

/// Count one request whose client address fell back to its proxy's.
pub fn client_ip_fallback(reason: &'static str) {
    counter!(CLIENT_IP_FALLBACKS, "reason" => reason).increment(1);
}

/// Count one call from a backend that named no client.
pub fn backend_without_client_ip(route: Route) {
    counter!(BACKEND_WITHOUT_CLIENT_IP, "route" => route.as_str()).increment(1);
    if route == Route::SmsVerify {
        counter!(SMS_VERIFY_WITHOUT_CLIENT_IP).increment(1);
    }
}

/// Count one failed admin authentication.
pub fn admin_auth_failure() {
    counter!(ADMIN_AUTH_FAILURES).increment(1);
}

/// Count one fetch of the OpenID provider's keys.
pub fn admin_jwks_fetch(ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    counter!(ADMIN_JWKS_FETCHES, "outcome" => outcome).increment(1);
}

/// Count one configuration reload, applied or rejected.
pub fn config_reload(applied: bool) {
    let outcome = if applied { "applied" } else { "rejected" };
    counter!(CONFIG_RELOADS, "outcome" => outcome).increment(1);
    gauge!(CONFIG_LAST_RELOAD_SUCCESSFUL).set(f64::from(u8::from(applied)));
}

/// How many parts of the reloaded config file wait for a restart.
pub fn config_restart_pending(parts: usize) {
    gauge!(CONFIG_RESTART_PENDING).set(parts as f64);
}

/// Count one captcha token: the provider's verdict, `mismatched`, `throttled` or `paused`.
pub fn captcha_check(outcome: &'static str) {
    counter!(CAPTCHA_CHECKS, "outcome" => outcome).increment(1);
}

/// What came of an SMS send's delivery: the `outcome` of
/// `tollgate_sms_deliveries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmsDelivery {
    /// The provider took it.
    Delivered,
    /// The provider refused to text the number; the send still counts in
    /// the asking address's windows, or, counted in none (naming no
    /// client, or from an allow-listed address), in every other window.
    RefusedNumber,
    /// Any other failure (a wrong set-up, the provider's throttling or
    /// outage, a template that did not render), given back whole.
    Failed,
    /// No answer in time: the send counts, as the SMS may arrive.
    TimedOut,
    /// A failure the request picked (`DeliveryError::Declined`), or a
    /// connection dropped once the request went out (`Dropped`), past its
    /// address's budget (`sms.failed_delivery_limit`) or its network's,
    /// one that names no client (it has no budget), or one the store could
    /// not count in them: the send counts.
    OverBudget,
    /// A failure the request picked within those budgets: given back whole.
    Declined,
    /// A connection closed or reset once the request went out
    /// (`DeliveryError::Dropped`), within the same budgets: given back whole.
    Dropped,
}

impl SmsDelivery {
    /// Every outcome, each at its `as usize` index.
    const ALL: [SmsDelivery; 7] = [
        SmsDelivery::Delivered,
        SmsDelivery::RefusedNumber,
        SmsDelivery::Failed,
        SmsDelivery::TimedOut,
        SmsDelivery::OverBudget,
        SmsDelivery::Declined,
        SmsDelivery::Dropped,
    ];

    /// The `outcome` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            SmsDelivery::Delivered => "delivered",
            SmsDelivery::RefusedNumber => "refused_number",
            SmsDelivery::Failed => "failed",
            SmsDelivery::TimedOut => "timed_out",
            SmsDelivery::OverBudget => "over_budget",
            SmsDelivery::Declined => "declined",
            SmsDelivery::Dropped => "dropped",
        }
    }
}

/// Count one SMS send's delivery, by what came of it.
pub fn sms_delivery(outcome: SmsDelivery) {
    let series = || counter!(SMS_DELIVERIES, "outcome" => outcome.as_str());
    let counted = with_handles(|handles| {
        let slot = handles.sms_deliveries.get_mut(outcome as usize)?;
        slot.get_or_insert_with(series).increment(1);
        Some(())
    });
    if counted.flatten().is_none() {
        series().increment(1);
    }
}

/// What became of an email copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmailOutcome {
    /// The SMTP server took it.
    Sent,
    /// The server refused it for good (`5xx`): not tried again.
    Refused,
    /// Every try failed (no connection, no answer, `4xx`), or it could not
    /// be built or rendered, or its address parsed.
    Failed,
    /// Never tried: its queue was full (a wave of locks), or the mail task
    /// had stopped.
    Dropped,
}

impl EmailOutcome {
    const ALL: [EmailOutcome; 4] = [
        EmailOutcome::Sent,
        EmailOutcome::Refused,
        EmailOutcome::Failed,
        EmailOutcome::Dropped,
    ];

    /// The `outcome` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            EmailOutcome::Sent => "sent",
            EmailOutcome::Refused => "refused",
            EmailOutcome::Failed => "failed",
            EmailOutcome::Dropped => "dropped",
        }
    }
}

/// Export `kind`'s email series at 0, each outcome: the mailer does at its
/// start, so that an alert's `increase` sees the first lost email.
pub fn emails_from_zero(kind: &'static str) {
    for outcome in EmailOutcome::ALL {
        counter!(EMAILS, "kind" => kind, "outcome" => outcome.as_str()).increment(0);
    }
}

/// Count `copies` email copies of `kind` by what became of them.
pub fn emails(kind: &'static str, outcome: EmailOutcome, copies: usize) {
    counter!(EMAILS, "kind" => kind, "outcome" => outcome.as_str()).increment(copies as u64);
}

/// Count one SMS send the pumping guard refused.
pub fn pumping_refusal() {
    counter!(PUMPING_REFUSALS).increment(1);
}

/// Count one admin request refused while its address is throttled.
pub fn admin_auth_throttled() {
    counter!(ADMIN_AUTH_THROTTLED).increment(1);
}

/// Count one answered request.
pub fn request(route: Route, outcome: Outcome) {
    let series = || counter!(REQUESTS, "route" => route.as_str(), "decision" => outcome.as_str());
    let counted = with_handles(|handles| {
        let slot = handles
            .requests
            .get_mut(route as usize)?
            .get_mut(outcome as usize)?;
        slot.get_or_insert_with(series).increment(1);
        Some(())
    });
    if counted.flatten().is_none() {
        series().increment(1);
    }
}

/// How many stored list rows the lists hold out of force.
pub fn list_unreadable_entries(rows: usize) {
    gauge!(LIST_UNREADABLE).set(rows as f64);
}

/// The stored list entries were read now.
pub fn lists_read() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    gauge!(LISTS_READ).set(now);
}

/// Count one request an allow or block list matched.
pub fn list_match(
    list: crate::lists::ListName,
    kind: crate::lists::EntryKind,
    action: crate::domain::Action,
) {
    counter!(
        LIST_MATCHES,
        "list" => list.as_str(),
        "kind" => kind.as_str(),
        "action" => action.as_str()
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every series this module names has its row in operations.md's
    /// metrics table: read off this file, so that a new one cannot be left
    /// out.
    #[test]
    fn every_series_is_in_the_operations_table() {
        let table = include_str!("../../docs/operations.md");
        let names: Vec<&str> = include_str!("mod.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("pub const ")?.split('"').nth(1))
            .filter(|name| name.starts_with("tollgate_"))
            .collect();
        assert!(names.len() >= 24, "{names:?}");
        for name in names {
            assert!(
                table.contains(&format!("| `{name}` |")),
                "{name} has no row in docs/operations.md"
            );
        }
    }

    /// On a recorder of its own: the process-wide one may have counted
    /// failures already.
    #[test]
    fn the_watched_failure_counters_start_at_zero() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, zeroes);
        let text = handle.render();
        for line in [
            "tollgate_store_errors_total{kind=\"timeout\"} 0",
            "tollgate_store_errors_total{kind=\"unavailable\"} 0",
            "tollgate_store_errors_total{kind=\"refused\"} 0",
            "tollgate_audit_events_total{outcome=\"spooled\"} 0",
            "tollgate_audit_events_total{outcome=\"unjournaled\"} 0",
            "tollgate_audit_events_total{outcome=\"refused\"} 0",
            "tollgate_audit_journal_errors_total{op=\"read\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from:\n{text}"
            );
        }
    }

    #[test]
    fn the_handle_tables_index_every_variant_at_its_place() {
        for (i, route) in Route::ALL.into_iter().enumerate() {
            assert_eq!(route as usize, i, "{route:?}");
        }
        for (i, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, i, "{outcome:?}");
        }
        for (i, outcome) in SmsDelivery::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, i, "{outcome:?}");
        }
    }

    /// Each route and outcome counted a different number of times, half on
    /// one thread and half on another (each with its own handles), lands in
    /// its own series: no request in this test binary counts otherwise.
    #[test]
    fn every_route_and_outcome_counts_in_its_own_series() {
        let handle = install().expect("the recorder installs");
        let times = |r: usize, o: usize| 1 + r * Outcome::ALL.len() + o;
        let count_half = |second: bool| {
            for (r, route) in Route::ALL.into_iter().enumerate() {
                for (o, outcome) in Outcome::ALL.into_iter().enumerate() {
                    let n = times(r, o);
                    let mine = if second { n / 2 } else { n - n / 2 };
                    for _ in 0..mine {
                        request(route, outcome);
                    }
                }
            }
        };
        std::thread::scope(|s| {
            s.spawn(|| count_half(false));
        });
        std::thread::scope(|s| {
            s.spawn(|| count_half(true));
        });
        let text = handle.render();
        for (r, route) in Route::ALL.into_iter().enumerate() {
            for (o, outcome) in Outcome::ALL.into_iter().enumerate() {
                let series = format!(
                    "{REQUESTS}{{route=\"{}\",decision=\"{}\"}} ",
                    route.as_str(),
                    outcome.as_str()
                );
                let value = text
                    .lines()
                    .find_map(|l| l.strip_prefix(&series))
                    .unwrap_or_else(|| panic!("{series} missing from\n{text}"));
                assert_eq!(value, times(r, o).to_string(), "{series}");
            }
        }
    }

    /// Each delivery outcome counted a different number of times, on two
    /// threads, lands in its own series (no send runs in this test binary).
    #[test]
    fn every_sms_delivery_outcome_counts_in_its_own_series() {
        let handle = install().expect("the recorder installs");
        for thread in 0..2 {
            std::thread::scope(|s| {
                s.spawn(|| {
                    for (i, outcome) in SmsDelivery::ALL.into_iter().enumerate() {
                        for _ in 0..(i + 1 + thread) {
                            sms_delivery(outcome);
                        }
                    }
                });
            });
        }
        let text = handle.render();
        for (i, outcome) in SmsDelivery::ALL.into_iter().enumerate() {
            let series = format!("{SMS_DELIVERIES}{{outcome=\"{}\"}} ", outcome.as_str());
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(&series))
                .unwrap_or_else(|| panic!("{series} missing from\n{text}"));
            assert_eq!(value, (2 * i + 3).to_string(), "{series}");
        }
    }
}
