//! The window operations on one subject: the in-process twins of
//! `reserve.lua`'s share of one subject, `window_peek.lua` and `undo.lua`,
//! run under the subject's lock. The event log itself is `window.rs`, the
//! meters `meter.rs`.

use super::entry::Subject;
use super::meter::Meters;
use super::window::Window;
use crate::store::{
    HitOutcome, HitRequest, HitVerdict, Keys, PeekOutcome, StoreError, WindowMode, WindowSpec,
};

/// `WindowStore::hit` on one subject, as `reserve.lua` decides a subject.
pub(super) fn hit(
    subject: &mut Subject,
    req: &HitRequest<'_>,
    now: u64,
) -> Result<HitOutcome, StoreError> {
    let specs = req.windows;
    if specs.is_empty() {
        return Err(no_windows());
    }
    let logs = || specs.iter().filter(|w| !w.is_meter());
    let longest_log = logs().map(|w| w.window_ms).max();
    let keep = logs().map(|w| w.limit).max().unwrap_or(0) as usize;
    let longest_meter = specs
        .iter()
        .filter(|w| w.is_meter())
        .map(|w| w.window_ms)
        .max();
    let meter_key = Keys::meter_for(req.key, specs);

    let mut meters = match &meter_key {
        Some(key) => subject.meters(key, now)?,
        None => Meters::default(),
    };
    let outcome = subject.change_window(req.key, now, |window| {
        if let Some(longest) = longest_log {
            window.prune(now, longest);
        }
        let count = |window: &Window, meters: &Meters, w| count_of(window, meters, w, now);
        let wait = |window: &Window, meters: &Meters, w| wait_of(window, meters, w, now);
        let counts: Vec<u32> = specs.iter().map(|w| count(window, &meters, w)).collect();
        let verdict = HitVerdict::of(specs, &counts, req.gate_open, |i| {
            wait(window, &meters, &specs[i])
        });
        // Before the event is added: the wait it would have met.
        let observed_waits = if specs.iter().any(|w| w.mode == WindowMode::Observe) {
            specs
                .iter()
                .zip(&counts)
                .map(|(w, count)| match w.mode {
                    WindowMode::Observe if *count >= w.limit => wait(window, &meters, w),
                    _ => 0,
                })
                .collect()
        } else {
            Vec::new()
        };
        let added = verdict == HitVerdict::Allowed || req.force;
        if added {
            if longest_log.is_some() {
                window.add(now, req.member);
            }
            for w in specs.iter().filter(|w| w.is_meter()) {
                meters.add(w, now);
            }
        }
        window.trim(keep);
        let next_retry_after_ms = specs
            .iter()
            .filter(|w| w.mode == WindowMode::Enforce)
            .map(|w| wait(window, &meters, w))
            .max()
            .unwrap_or(0);
        // As in Redis, only a recorded event moves the key's expiry.
        let expires_at = longest_log.filter(|_| added).map(|longest| now + longest);
        let outcome = HitOutcome {
            verdict,
            added,
            counts,
            next_retry_after_ms,
            observed_waits,
        };
        (outcome, expires_at)
    })?;
    if let (Some(key), Some(longest), true) = (&meter_key, longest_meter, outcome.added) {
        subject.put_meters(key, meters, Some(now + longest));
    }
    Ok(outcome)
}

/// `WindowStore::peek` on one subject, as `window_peek.lua` counts.
pub(super) fn peek(
    subject: &mut Subject,
    key: &str,
    windows: &[WindowSpec],
    now: u64,
) -> Result<PeekOutcome, StoreError> {
    if windows.is_empty() {
        return Err(no_windows());
    }
    let meter_key = Keys::meter_for(key, windows);

    let meters = match &meter_key {
        Some(key) => subject.meters(key, now)?,
        None => Meters::default(),
    };
    subject.read_window(key, now, |window| PeekOutcome {
        counts: windows
            .iter()
            .map(|w| count_of(window, &meters, w, now))
            .collect(),
        retry_after_ms: windows
            .iter()
            .map(|w| wait_of(window, &meters, w, now))
            .collect(),
    })
}

/// `WindowStore::undo` on one subject, as `undo.lua` takes an event back.
pub(super) fn undo(
    subject: &mut Subject,
    key: &str,
    member: &str,
    windows: &[WindowSpec],
    now: u64,
) -> Result<(), StoreError> {
    let meter_key = Keys::meter_for(key, windows);

    if let Some(meter_key) = &meter_key {
        if subject.live(meter_key, now).is_some() {
            let mut meters = subject.meters(meter_key, now)?;
            for w in windows.iter().filter(|w| w.is_meter()) {
                meters.remove(w);
            }
            subject.put_meters(meter_key, meters, None);
        }
    }
    if subject.live(key, now).is_none() {
        return Ok(());
    }
    subject.change_window(key, now, |window| {
        window.remove(member);
        ((), None)
    })
}

/// A window's count now: from the log, or from the subject's meters.
fn count_of(window: &Window, meters: &Meters, w: &WindowSpec, now: u64) -> u32 {
    if w.is_meter() {
        meters.count(w, now)
    } else {
        window.count(now, w.window_ms)
    }
}

/// How long until a window admits one more event (0: at once).
fn wait_of(window: &Window, meters: &Meters, w: &WindowSpec, now: u64) -> u64 {
    if w.is_meter() {
        meters.wait(w, now)
    } else {
        window.wait(now, w.limit, w.window_ms)
    }
}

fn no_windows() -> StoreError {
    StoreError::Protocol("a window call needs at least one window".into())
}
