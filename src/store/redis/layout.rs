//! Where a subject's windows live on Redis: its logs in one ZSET (score =
//! event time in ms, member = the event's id), and its meters either in a
//! hash beside it (`Keys::meter_of`) or, when its logs are small enough to
//! be read whole, in that same ZSET.
//!
//! Why the ZSET: a subject with both (an IP's `gcra` limit and its captcha
//! tier, always a log) cost a send six commands on two keys: ZRANGE, HMGET,
//! ZADD, PEXPIRE, HSET and PEXPIRE. With its meters as members of the log
//! it costs three (ZRANGE, one ZADD of the event and the meters, PEXPIRE):
//! some 20 k of Redis's 323 k instructions a send (docs/benchmarks.md).
//!
//! A meter in the ZSET is two members: `m:<limit>/<length>` scored
//! `-1 - level` and `m:<limit>/<length>:t` scored `-1 - when it was set`
//! (ms). Every event's score is a time, 0 or more, so the meters are the
//! set's lowest members and no count of a window (`ZCOUNT` from a time,
//! a read from the newest) ever meets them; a trim counts its ranks from
//! the newest. Scores are doubles: a level below 2⁵³ (start-up's bound)
//! and a time in ms are exact.
//!
//! The in-process store keeps its meters beside its logs whatever their
//! size: this is Redis's layout, not the semantics.

use crate::store::{Keys, WindowSpec};

/// A log whose largest limit is at most this is read whole with one
/// `ZRANGE`, a larger one counted per window.
pub(super) const SMALL: u32 = 32;

/// The largest limit of the subject's logs, if it has any.
pub(super) fn log_keep(windows: &[WindowSpec]) -> Option<u32> {
    windows
        .iter()
        .filter(|w| !w.is_meter())
        .map(|w| w.limit)
        .max()
}

/// The subject's logs are read whole (and it has logs).
pub(super) fn log_read_whole(windows: &[WindowSpec]) -> bool {
    log_keep(windows).is_some_and(|keep| keep <= SMALL)
}

/// The subject's meters are members of its log ZSET.
pub(super) fn meters_in_log(windows: &[WindowSpec]) -> bool {
    log_read_whole(windows) && windows.iter().any(WindowSpec::is_meter)
}

/// The meter hash beside `window_key`, when the subject has meters and
/// they are not in its log.
pub(super) fn meter_hash(window_key: &str, windows: &[WindowSpec]) -> Option<String> {
    if meters_in_log(windows) {
        None
    } else {
        Keys::meter_for(window_key, windows)
    }
}

/// The member holding a meter's level in its subject's log ZSET; its
/// stamp's is this with `:t` appended.
pub(super) fn meter_member(window: &WindowSpec) -> String {
    format!("m:{}", window.meter_field())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter(limit: u32, window_ms: u64) -> WindowSpec {
        WindowSpec::meter(limit, window_ms)
    }

    #[test]
    fn meters_join_a_log_read_whole_and_only_such_a_log() {
        let gate = WindowSpec::gate(3, 3_600_000);
        let big_log = WindowSpec::enforce(SMALL + 1, 60_000);
        let cases = [
            (vec![gate, meter(20, 3_600_000)], true),
            (vec![meter(20, 3_600_000)], false),
            (vec![gate], false),
            (vec![gate, big_log, meter(20, 3_600_000)], false),
            (
                vec![WindowSpec::enforce(SMALL, 60_000), meter(9, 1_000)],
                true,
            ),
        ];
        for (windows, in_log) in cases {
            assert_eq!(meters_in_log(&windows), in_log, "{windows:?}");
            let hash = meter_hash("tg:{ip:192.0.2.7}:sms_send", &windows);
            let has_meter = windows.iter().any(WindowSpec::is_meter);
            assert_eq!(hash.is_some(), has_meter && !in_log, "{windows:?}");
        }
        assert_eq!(meter_member(&meter(20, 3_600_000)), "m:20/3600000");
    }
}
