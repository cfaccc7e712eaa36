//! The request-wide operations ([`WindowStore::reserve`], [`WindowStore::login`])
//! built from the per-subject ones, for a backend whose subjects cannot be
//! changed in one atomic call: the in-process store (one lock per subject,
//! and these steps one request at a time) and a Redis Cluster (one slot per
//! subject). Calls go out concurrently where nothing depends on an earlier
//! answer; what a refusal makes unwanted is taken back, so on a cluster a
//! race can refuse too much but never admit too much on a window. A send is
//! offered to the caller's own subjects (its address, its network) before
//! the others, so that a caller they refuse never holds a slot in anyone
//! else's windows, not even for the moment before it is taken back. The
//! pumping guard's conversions are the exception: they are checked before
//! the send is counted, so sends racing to a range at the threshold may all
//! pass, a few past it (docs/pumping.md).

use futures::future::join_all;

use super::{
    ConversionOutcome, HitOutcome, HitRequest, HitVerdict, IpFailures, LoginAttemptRequest,
    LoginOutcome, LoginRequest, ReserveOutcome, ReserveRequest, RollBack, StoreError,
    SubjectWindows, WindowSpec, WindowStore,
};

pub(super) async fn reserve<S: WindowStore + ?Sized>(
    store: &S,
    req: ReserveRequest<'_>,
) -> Result<ReserveOutcome, StoreError> {
    // The conversions first: a block refuses before any window is touched
    // (a challenge lets them be read, so that a rate limit answers first).
    // They count nothing yet, so that requests refused meanwhile (however
    // many race) never count towards a block.
    let checks = req
        .conversions
        .iter()
        .map(|hit| store.conversion_hit(*hit, req.force));
    let mut conversions = join_all(checks)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    if conversions.iter().any(ConversionOutcome::blocks) && !req.force {
        return Ok(ReserveOutcome {
            outcomes: req
                .subjects
                .iter()
                .map(|s| HitOutcome::open(s.windows.len()))
                .collect(),
            conversions,
            recorded: false,
            by_fallback: false,
        });
    }

    let results = offer_in_waves(store, &req).await;

    let mut added = Vec::new();
    let mut outcomes = Vec::with_capacity(results.len());
    let mut error = None;
    for (subject, result) in req.subjects.iter().zip(results) {
        match result {
            Ok(outcome) => {
                if outcome.added {
                    added.push((subject.key, subject.windows));
                }
                outcomes.push(outcome);
            }
            Err(e) => error = Some(e),
        }
    }
    let refused = outcomes.iter().any(|o| o.verdict != HitVerdict::Allowed)
        || conversions.iter().any(|c| c.refuses(req.gate_open));
    let mut recorded = error.is_none() && (req.force || !refused);
    if recorded {
        if let Some(code) = req.code {
            if let Err(e) = store.otp_put(code, true).await {
                error = Some(e);
                recorded = false;
            }
        }
    }
    if !recorded {
        undo_all(store, &added, req.member).await;
    }
    if let Some(e) = error {
        return Err(e);
    }
    if recorded {
        count_conversions(store, &req, &mut conversions).await;
    }
    for outcome in &mut outcomes {
        outcome.added = recorded;
    }
    Ok(ReserveOutcome {
        outcomes,
        conversions,
        recorded,
        by_fallback: false,
    })
}

/// `req`'s event offered to every subject, the answers in request order:
/// the caller's own subjects first, the others once those admitted it.
/// Were every subject offered at once, a caller its own address refuses
/// would hold a slot in a victim phone's windows until taken back, and a
/// flood of such sends would keep the phone refused for its owner.
/// Refused there, the others are read without writing, so that the
/// answer's refusal is the one an atomic store would give.
async fn offer_in_waves<S: WindowStore + ?Sized>(
    store: &S,
    req: &ReserveRequest<'_>,
) -> Vec<Result<HitOutcome, StoreError>> {
    let wave = |own: bool| req.subjects.iter().filter(move |s| s.callers_own == own);
    let own = join_all(wave(true).map(|subject| store.hit(offer(subject, req)))).await;
    let admitted = own
        .iter()
        .all(|r| r.as_ref().is_ok_and(|o| o.verdict == HitVerdict::Allowed));
    let others = if admitted || req.force {
        join_all(wave(false).map(|subject| store.hit(offer(subject, req)))).await
    } else {
        join_all(wave(false).map(|subject| async move {
            let peek = store.peek(subject.key, subject.windows).await?;
            Ok(HitOutcome::peeked(subject.windows, peek, req.gate_open))
        }))
        .await
    };
    // Back in request order: each wave kept it among its own.
    let (mut own, mut others) = (own.into_iter(), others.into_iter());
    req.subjects
        .iter()
        .filter_map(|subject| match subject.callers_own {
            true => own.next(),
            false => others.next(),
        })
        .collect()
}

/// `req`'s event offered to one of its subjects.
fn offer<'a>(subject: &SubjectWindows<'a>, req: &ReserveRequest<'a>) -> HitRequest<'a> {
    HitRequest {
        key: subject.key,
        windows: subject.windows,
        member: req.member,
        gate_open: req.gate_open,
        force: req.force,
    }
}

/// Count a recorded event in every conversion. A failure leaves it
/// uncounted (logged): the request is recorded and its code stored by now,
/// and one send fewer only delays a block.
async fn count_conversions<S: WindowStore + ?Sized>(
    store: &S,
    req: &ReserveRequest<'_>,
    outcomes: &mut [ConversionOutcome],
) {
    let counts = req
        .conversions
        .iter()
        .map(|hit| store.conversion_count(hit.key, hit.policy));
    for (outcome, result) in outcomes.iter_mut().zip(join_all(counts).await) {
        match result {
            Ok(slice) => outcome.counted_in = slice,
            Err(e) => {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not count a send")
            }
        }
    }
}

/// [`WindowStore::roll_back`] by way of `store`'s `undo` and
/// `conversion_undo`.
pub(super) async fn roll_back<S: WindowStore + ?Sized>(store: &S, roll_back: &RollBack<'_>) {
    let undos = roll_back
        .subjects
        .iter()
        .map(|s| store.undo(s.key, roll_back.member, s.windows));
    let uncounts = roll_back
        .conversions
        .iter()
        .map(|&(key, slice)| store.conversion_undo(key, slice));
    let (undone, uncounted) = futures::join!(join_all(undos), join_all(uncounts));
    for result in undone.into_iter().chain(uncounted) {
        if let Err(e) = result {
            tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not roll back a reservation");
        }
    }
}

/// Take an event back from every key that recorded it. A failure leaves the
/// event counted until its window passes: stricter, never looser.
pub(super) async fn undo_all<S: WindowStore + ?Sized>(
    store: &S,
    keys: &[(&str, &[WindowSpec])],
    member: &str,
) {
    let undos = keys
        .iter()
        .map(|(key, windows)| store.undo(key, member, windows));
    for result in join_all(undos).await {
        if let Err(e) = result {
            tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not take back a recorded event");
        }
    }
}

pub(super) async fn login<S: WindowStore + ?Sized>(
    store: &S,
    req: LoginRequest<'_>,
) -> Result<LoginOutcome, StoreError> {
    let network = network_first(store, &req).await?;
    let ip_windows: Vec<WindowSpec> = req.ip.map(|ip| ip.windows().to_vec()).unwrap_or_default();
    let ip = match ip_first(store, &req, &ip_windows).await {
        Ok(ip) => ip,
        Err(e) => {
            network.settle(store, &req, false).await;
            return Err(e);
        }
    };
    let user = store
        .login_attempt(LoginAttemptRequest {
            window_key: req.window_key,
            lock_key: req.lock_key,
            policy: req.policy,
            success: req.success,
            captcha_passed: req.captcha_passed,
            captcha_demanded: req
                .ip
                .zip(ip.failures)
                .is_some_and(|(window, seen)| seen.count >= window.limits.captcha_after)
                || network.demands_captcha(&req),
            ip_blocked: ip
                .failures
                .is_some_and(|seen| seen.blocked_retry_after_ms.is_some()),
            member: req.member,
            shadow: req.shadow,
            pair: req.pair,
        })
        .await;
    let user = match user {
        Ok(user) => user,
        Err(e) => {
            ip.settle(store, &req, &ip_windows, false).await;
            network.settle(store, &req, false).await;
            return Err(e);
        }
    };
    let outcome = LoginOutcome {
        user,
        ip: ip.failures,
        network: network.count,
    };
    let recorded = outcome.recorded(req.shadow);
    ip.settle(store, &req, &ip_windows, recorded).await;
    network.settle(store, &req, recorded).await;
    Ok(outcome)
}

/// What a login's IP window saw, and whether the attempt's failure went
/// into it.
#[derive(Debug, Clone, Copy, Default)]
struct IpSeen {
    failures: Option<IpFailures>,
    added: bool,
}

impl IpSeen {
    /// Take the failure back from the IP when the attempt was not recorded.
    async fn settle<S: WindowStore + ?Sized>(
        self,
        store: &S,
        req: &LoginRequest<'_>,
        windows: &[WindowSpec],
        recorded: bool,
    ) {
        if let (Some(ip), true, false) = (req.ip, self.added, recorded) {
            undo_all(store, &[(ip.key, windows)], req.member).await;
        }
    }
}

/// The IP before the user: the user's side depends on its block and captcha
/// tier. A failure is recorded at once (when the IP admits it) so that the IP's
/// count stays exact under concurrency, and taken back by
/// [`IpSeen::settle`] when the user's side refuses.
async fn ip_first<S: WindowStore + ?Sized>(
    store: &S,
    req: &LoginRequest<'_>,
    windows: &[WindowSpec],
) -> Result<IpSeen, StoreError> {
    let Some(ip) = &req.ip else {
        return Ok(IpSeen::default());
    };
    let (count, blocked, added) = if req.success {
        let peek = store.peek(ip.key, windows).await?;
        let count = peek.counts.first().copied().unwrap_or(0);
        let retry = peek.retry_after_ms.get(1).copied().unwrap_or(0);
        (
            count,
            (count >= ip.limits.block_after).then_some(retry),
            false,
        )
    } else {
        let hit: HitOutcome = store
            .hit(HitRequest {
                key: ip.key,
                windows,
                member: req.member,
                gate_open: req.captcha_passed,
                force: req.shadow,
            })
            .await?;
        let blocked = match hit.verdict {
            HitVerdict::Denied { retry_after_ms, .. } => Some(retry_after_ms),
            _ => None,
        };
        (hit.counts.first().copied().unwrap_or(0), blocked, hit.added)
    };
    Ok(IpSeen {
        failures: Some(IpFailures {
            count,
            blocked_retry_after_ms: blocked,
        }),
        added,
    })
}

/// What an IPv6 login's network window saw, and what its failure did there.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct NetworkSeen {
    /// The network's failures before this attempt; `None` without its
    /// window.
    pub count: Option<u32>,
    /// The failure went into the window at once (below the tier).
    added: bool,
    /// The tier is full and the attempt passed a captcha: its failure goes
    /// in once the attempt is recorded.
    deferred: bool,
}

impl NetworkSeen {
    /// Whether the network's captcha tier is full.
    pub fn demands_captcha(&self, req: &LoginRequest<'_>) -> bool {
        req.network
            .zip(self.count)
            .is_some_and(|(network, count)| network.demands_captcha(count))
    }

    /// Settle the network's window with the attempt's fate: take back a
    /// failure counted before the attempt was refused (or its call failed),
    /// and count one the full tier let through with a captcha once the
    /// attempt was recorded.
    pub async fn settle<S: WindowStore + ?Sized>(
        self,
        store: &S,
        req: &LoginRequest<'_>,
        recorded: bool,
    ) {
        let Some(network) = req.network else {
            return;
        };
        let windows = network.windows();
        if self.added && !recorded {
            undo_all(store, &[(network.key, &windows[..])], req.member).await;
        }
        if self.deferred && recorded {
            let hit = store.hit(HitRequest {
                key: network.key,
                windows: &windows,
                member: req.member,
                gate_open: true,
                force: true,
            });
            if let Err(e) = hit.await {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not count a login failure in its network");
            }
        }
    }
}

/// The network's window, in a call of its own (on a cluster its key is in a
/// slot of its own), before the IP's and the user's. Below the tier a
/// failure is recorded at once, so that the count stays exact under
/// concurrency, and taken back by [`NetworkSeen::settle`] when the IP's or
/// the user's side refuses the attempt. A full tier records nothing now,
/// even for an attempt with a captcha: the window keeps only the tier's
/// newest failures, so a failure added there would push out an older one
/// that taking it back could not return; `settle` adds it once the attempt
/// is recorded. A success is only counted against the tier; in shadow mode
/// every failure is recorded at once (nothing is refused).
pub(super) async fn network_first<S: WindowStore + ?Sized>(
    store: &S,
    req: &LoginRequest<'_>,
) -> Result<NetworkSeen, StoreError> {
    let Some(network) = req.network else {
        return Ok(NetworkSeen::default());
    };
    let windows = network.windows();
    if req.success {
        let peek = store.peek(network.key, &windows).await?;
        return Ok(NetworkSeen {
            count: Some(peek.counts.first().copied().unwrap_or(0)),
            ..NetworkSeen::default()
        });
    }
    let hit = store
        .hit(HitRequest {
            key: network.key,
            windows: &windows,
            member: req.member,
            gate_open: false,
            force: req.shadow,
        })
        .await?;
    let count = hit.counts.first().copied().unwrap_or(0);
    Ok(NetworkSeen {
        count: Some(count),
        added: hit.added,
        deferred: !hit.added && req.captcha_passed && network.demands_captcha(count),
    })
}
