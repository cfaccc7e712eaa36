//! The subjects' part of a rendered `reserve.lua`: every window written out
//! as straight-line Lua with its limit, length and mode as literals, and
//! each count, wait and verdict stored at its place in the answer. A loop
//! over tables of the policy cost Redis about 1,800 Lua instructions per SMS
//! send, most of them fetching the same numbers from those tables and
//! calling the same helpers (docs/benchmarks.md); what is written out here
//! does only the arithmetic of the request's own windows.
//!
//! Three pieces go in three places of the template: reading and deciding
//! (`--@DECIDE@`), recording (`--@RECORD@`, inside `if recorded`) and the
//! waits of the answer (`--@ANSWER@`). They share, per subject, `sc<i>`
//! (the scores of a log read whole) and `renew<i>` (its meter hash's expiry
//! falls short), declared before the first piece; a subject whose meters
//! are members of its log (`layout`) keeps them in `mv<i>` (member -> level
//! or stamp) instead of a hash.

use std::fmt::Write as _;

use super::layout::{self, meter_member};
use crate::store::{SubjectWindows, WindowMode, WindowSpec};

/// One subject as the rendered script sees it: where its keys, windows and
/// answer are.
pub(super) struct SubjectPlan<'a> {
    /// 1-based, for the names of its locals.
    i: usize,
    /// Its window ZSET is `KEYS[key]` (when it has logs: a subject of
    /// meters only has no ZSET key).
    key: usize,
    /// Its meter HASH's index in `KEYS`, when it has meters outside its log.
    mkey: Option<usize>,
    /// Its meters are members of its log ZSET (see `layout`).
    meters_in_log: bool,
    /// The index of its first window in `level`.
    first: usize,
    /// Its answer starts after `out[out]`.
    out: usize,
    windows: &'a [WindowSpec],
    /// The largest limit of its logs: how many members its ZSET keeps.
    keep: u32,
    /// Its longest log window, in ms.
    longest: Option<u64>,
    /// Its logs are read whole (and it has logs).
    small: bool,
    /// Its longest meter window, in ms (0 without meters).
    meter_longest: u64,
}

impl<'a> SubjectPlan<'a> {
    /// Every subject's plan, their keys from `KEYS[1]` and their answers from
    /// `out[2]`; answers the plans and the next free index in `KEYS`.
    pub(super) fn all(subjects: &'a [SubjectWindows<'a>]) -> (Vec<Self>, usize) {
        let mut plans = Vec::with_capacity(subjects.len());
        let (mut key, mut first, mut out) = (1, 1, 1);
        for (at, subject) in subjects.iter().enumerate() {
            let logs = subject.windows.iter().filter(|w| !w.is_meter());
            let keep = layout::log_keep(subject.windows);
            let meters = subject.windows.iter().filter(|w| w.is_meter());
            let meter_longest = meters.map(|w| w.window_ms).max().unwrap_or(0);
            let observes = subject
                .windows
                .iter()
                .any(|w| w.mode == WindowMode::Observe);
            let meters_in_log = layout::meters_in_log(subject.windows);
            let hash = subject.windows.iter().any(WindowSpec::is_meter) && !meters_in_log;
            let zset = usize::from(keep.is_some());
            plans.push(Self {
                i: at + 1,
                key,
                mkey: hash.then_some(key + zset),
                meters_in_log,
                first,
                out,
                windows: subject.windows,
                keep: keep.unwrap_or(0),
                longest: logs.map(|w| w.window_ms).max(),
                small: layout::log_read_whole(subject.windows),
                meter_longest,
            });
            key += zset + usize::from(hash);
            first += subject.windows.len();
            out += 4 + subject.windows.len() * if observes { 2 } else { 1 };
        }
        (plans, key)
    }

    /// `out` index of window `p`'s count (0-based `p` among its windows).
    fn count_at(&self, p: usize) -> usize {
        self.out + 5 + p
    }

    /// `out` index of window `p`'s observed wait.
    fn observed_at(&self, p: usize) -> usize {
        self.out + 5 + self.windows.len() + p
    }

    /// A meter's hash lives this long after a write that renews it: its
    /// longest window and an eighth (see reserve.lua's "Expiry").
    fn meter_keep(&self) -> u64 {
        self.meter_longest + self.meter_longest / 8
    }

    /// The Lua expression of meter `p`'s level once this event raised it:
    /// by its length, to at most its limit's worth (a forced event too).
    fn raised(&self, p: usize) -> String {
        let w = &self.windows[p];
        let full = u64::from(w.limit) * w.window_ms;
        format!("min(level[{}] + {}, {full})", self.first + p, w.window_ms)
    }

    /// The Lua expression of window `p`'s wait, its count being at least its
    /// limit; `extra`: how many events more than its level a meter holds.
    fn wait(&self, p: usize, extra: &str) -> String {
        let w = &self.windows[p];
        let (limit, length) = (w.limit, w.window_ms);
        let g = self.first + p;
        if w.is_meter() {
            let level = if extra.is_empty() {
                format!("level[{g}]")
            } else {
                format!("level[{g}] + {extra} * {length}")
            };
            format!("mwait({level}, {limit}, {length})")
        } else if limit == 0 {
            length.to_string()
        } else if self.small {
            format!("lwait(sc{}, {limit}, {length})", self.i)
        } else {
            format!("zwait(KEYS[{}], {limit}, {length})", self.key)
        }
    }
}

/// Locals the three pieces share, declared before the first.
pub(super) fn render_locals(lua: &mut String, plans: &[SubjectPlan<'_>]) {
    let names: Vec<String> = plans
        .iter()
        .flat_map(|s| {
            let sc = s.small.then(|| format!("sc{}", s.i));
            let renew = s.mkey.map(|_| format!("renew{}", s.i));
            let mv = s
                .meters_in_log
                .then(|| [format!("mv{}", s.i), format!("mn{}", s.i)]);
            sc.into_iter().chain(renew).chain(mv.into_iter().flatten())
        })
        .collect();
    if !names.is_empty() {
        let _ = writeln!(lua, "local {}", names.join(", "));
    }
}

/// Read every subject's windows, count them and decide, each verdict into
/// the answer; `all_allowed` false when one refuses. Skipped when `skip`.
pub(super) fn render_decide(lua: &mut String, plans: &[SubjectPlan<'_>]) {
    lua.push_str("if not skip then\n");
    for s in plans {
        let _ = writeln!(lua, "do -- subject {}", s.i);
        read_logs(lua, s);
        read_meters(lua, s);
        lua.push_str("local verdict, window, retry = 0, 0, 0\n");
        for (p, w) in s.windows.iter().enumerate() {
            let full = format!("out[{}] >= {}", s.count_at(p), w.limit);
            match w.mode {
                WindowMode::Observe => {
                    let _ = writeln!(
                        lua,
                        "if {full} then out[{}] = {} end",
                        s.observed_at(p),
                        s.wait(p, "")
                    );
                }
                WindowMode::Enforce => {
                    let _ = writeln!(
                        lua,
                        "if {full} then local ww = {}; if verdict ~= 1 or ww > retry then \
                         verdict, window, retry = 1, {p}, ww end end",
                        s.wait(p, "")
                    );
                }
                WindowMode::Gate => {}
            }
        }
        let gates: Vec<String> = s
            .windows
            .iter()
            .enumerate()
            .filter(|(_, w)| w.mode == WindowMode::Gate)
            .map(|(p, w)| {
                format!(
                    "out[{}] >= {} then verdict, window = 2, {p}\n",
                    s.count_at(p),
                    w.limit
                )
            })
            .collect();
        if !gates.is_empty() {
            let _ = write!(
                lua,
                "if verdict == 0 and not gate_open then\nif {}end\nend\n",
                gates.join("elseif ")
            );
        }
        let _ = writeln!(
            lua,
            "out[{}], out[{}], out[{}] = verdict, window, retry\n\
             if verdict ~= 0 then all_allowed = false end\nend",
            s.out + 1,
            s.out + 2,
            s.out + 3
        );
    }
    lua.push_str("end\n");
}

/// A subject's logs: read whole (scores into `sc<i>`) and counted from the
/// newest, or counted with a ZCOUNT per window.
fn read_logs(lua: &mut String, s: &SubjectPlan<'_>) {
    if s.meters_in_log {
        // The meters' members score below 0 and come first: each goes to
        // `mv` (its value, `-1 - score`; `mn` of them), every event's score
        // to `sc`.
        let _ = writeln!(
            lua,
            "local raw = call('ZRANGE', KEYS[{}], '0', '-1', 'WITHSCORES')\n\
             local sc, n, mv, m = {{}}, 0, EMPTY, 0\n\
             for j = 2, #raw, 2 do local v = raw[j] + 0\n\
             if v >= 0 then n = n + 1; sc[n] = v\n\
             else if mv == EMPTY then mv = {{}} end; mv[raw[j - 1]] = -1 - v; m = m + 1 end end\n\
             sc{i}, mv{i}, mn{i} = sc, mv, m",
            s.key,
            i = s.i
        );
    } else if s.small {
        let _ = writeln!(
            lua,
            "local raw = call('ZRANGE', KEYS[{}], '0', '-1', 'WITHSCORES')\n\
             local sc = {{}}\n\
             for j = 2, #raw, 2 do sc[j / 2] = raw[j] + 0 end\n\
             sc{} = sc",
            s.key, s.i
        );
    }
    for (p, w) in s.windows.iter().enumerate() {
        if w.is_meter() {
            continue;
        }
        let at = s.count_at(p);
        if s.small {
            let _ = writeln!(
                lua,
                "do local n, since = 0, now - {}\n\
                 for j = #sc, 1, -1 do if sc[j] > since then n = n + 1 else break end end\n\
                 out[{at}] = n end",
                w.window_ms
            );
        } else {
            let _ = writeln!(
                lua,
                "out[{at}] = call('ZCOUNT', KEYS[{}], fmt('(%d', now - {}), '+inf')",
                s.key, w.window_ms
            );
        }
    }
}

/// A subject's meters: one HMGET of every field, its stamp and `exp`; each
/// level drained to now into `level`, its count into the answer.
fn read_meters(lua: &mut String, s: &SubjectPlan<'_>) {
    let meters: Vec<(usize, &WindowSpec)> = s
        .windows
        .iter()
        .enumerate()
        .filter(|(_, w)| w.is_meter())
        .collect();
    if s.meters_in_log {
        for (p, w) in &meters {
            let g = s.first + p;
            let m = meter_member(w);
            let _ = writeln!(
                lua,
                "level[{g}] = drained(mv{i}['{m}'], mv{i}['{m}:t'], {}, {})\n\
                 out[{}] = ceil(level[{g}] / {})",
                w.limit,
                w.window_ms,
                s.count_at(*p),
                w.window_ms,
                i = s.i
            );
        }
        return;
    }
    let Some(mkey) = s.mkey else { return };
    let fields: Vec<String> = meters
        .iter()
        .flat_map(|(_, w)| {
            let f = w.meter_field();
            [format!("'{f}'"), format!("'{f}:t'")]
        })
        .collect();
    let _ = writeln!(
        lua,
        "local m = call('HMGET', KEYS[{mkey}], {}, 'exp')\n\
         local exp = m[{e}] and m[{e}] + 0\n\
         renew{} = not exp or exp < now + {}",
        fields.join(", "),
        s.i,
        s.meter_longest,
        e = fields.len() + 1
    );
    for (j, (p, w)) in meters.iter().enumerate() {
        let g = s.first + p;
        let _ = writeln!(
            lua,
            "level[{g}] = drained(m[{}], m[{}], {}, {})\n\
             out[{}] = ceil(level[{g}] / {})",
            2 * j + 1,
            2 * j + 2,
            w.limit,
            w.window_ms,
            s.count_at(*p),
            w.window_ms
        );
    }
}

/// Record the event in every subject: its log (trimmed to `keep` members,
/// expiring after its longest window) and its meters.
pub(super) fn render_record(lua: &mut String, plans: &[SubjectPlan<'_>]) {
    for s in plans {
        if s.meters_in_log {
            record_log_with_meters(lua, s);
            continue;
        }
        if let Some(longest) = s.longest {
            let _ = writeln!(lua, "call('ZADD', KEYS[{}], now_s, member)", s.key);
            let trim = format!(
                "call('ZREMRANGEBYRANK', KEYS[{}], '0', '{}')",
                s.key,
                -(i64::from(s.keep) + 1)
            );
            if s.small {
                let _ = writeln!(
                    lua,
                    "sc{i}[#sc{i} + 1] = now\nif #sc{i} > {} then {trim} end",
                    s.keep,
                    i = s.i
                );
            } else {
                let _ = writeln!(lua, "{trim}");
            }
            let _ = writeln!(lua, "call('PEXPIRE', KEYS[{}], '{longest}')", s.key);
        }
        let Some(mkey) = s.mkey else { continue };
        let fields: Vec<String> = s
            .windows
            .iter()
            .enumerate()
            .filter(|(_, w)| w.is_meter())
            .map(|(p, w)| {
                let f = w.meter_field();
                format!("'{f}', fmt('%d', {}), '{f}:t', now_s", s.raised(p))
            })
            .collect();
        let keep = s.meter_keep();
        let _ = writeln!(
            lua,
            "if renew{i} then\n\
             call('HSET', KEYS[{mkey}], {f}, 'exp', fmt('%d', now + {keep}))\n\
             call('PEXPIRE', KEYS[{mkey}], '{keep}')\n\
             else call('HSET', KEYS[{mkey}], {f}) end",
            i = s.i,
            f = fields.join(", ")
        );
    }
}

/// Record the event in a log that holds its subject's meters: one ZADD of
/// the event and every meter's level and stamp, a trim that counts its
/// ranks from the newest (the meters are the lowest members), and one
/// expiry, the longer of its longest log and its longest meter; first the
/// members of meters the policy no longer has.
fn record_log_with_meters(lua: &mut String, s: &SubjectPlan<'_>) {
    let meters: Vec<String> = s
        .windows
        .iter()
        .enumerate()
        .filter(|(_, w)| w.is_meter())
        .map(|(p, w)| {
            let m = meter_member(w);
            format!("fmt('%d', -1 - {}), '{m}', stamp, '{m}:t'", s.raised(p))
        })
        .collect();
    let expiry = s.longest.unwrap_or(0).max(s.meter_longest);
    // More members below 0 than the policy's meters have: a meter since
    // changed left its two, dropped here (once: the write below makes the
    // policy's all present).
    let names: Vec<String> = s
        .windows
        .iter()
        .filter(|w| w.is_meter())
        .flat_map(|w| {
            let m = meter_member(w);
            [format!("name ~= '{m}'"), format!("name ~= '{m}:t'")]
        })
        .collect();
    let _ = writeln!(
        lua,
        "if mn{i} > {own} then local gone = {{}}\n\
         for name in pairs(mv{i}) do if {} then gone[#gone + 1] = name end end\n\
         call('ZREM', KEYS[{k}], unpack(gone)) end",
        names.join(" and "),
        own = names.len(),
        k = s.key,
        i = s.i
    );
    let _ = writeln!(
        lua,
        "do local stamp = fmt('%d', -1 - now)\n\
         call('ZADD', KEYS[{k}], now_s, member, {})\n\
         sc{i}[#sc{i} + 1] = now\n\
         if #sc{i} > {keep} then call('ZREMRANGEBYRANK', KEYS[{k}], fmt('%d', -#sc{i}), '{}') end\n\
         call('PEXPIRE', KEYS[{k}], '{expiry}') end",
        meters.join(", "),
        -(i64::from(s.keep) + 1),
        k = s.key,
        i = s.i,
        keep = s.keep
    );
}

/// Each subject's next retry: how long until every enforce window admits one
/// more event, after this call (`added` events of it recorded).
pub(super) fn render_answer(lua: &mut String, plans: &[SubjectPlan<'_>]) {
    lua.push_str("if not skip then\nlocal nr, ww\n");
    for s in plans {
        lua.push_str("nr = 0\n");
        for (p, w) in s.windows.iter().enumerate() {
            if w.mode != WindowMode::Enforce {
                continue;
            }
            if w.is_meter() {
                let _ = writeln!(lua, "ww = {}", s.wait(p, "added"));
            } else {
                let _ = writeln!(
                    lua,
                    "ww = out[{}] + added >= {} and {} or 0",
                    s.count_at(p),
                    w.limit,
                    s.wait(p, "added")
                );
            }
            lua.push_str("if ww > nr then nr = ww end\n");
        }
        let _ = writeln!(lua, "out[{}] = nr", s.out + 4);
    }
    lua.push_str("end\n");
}
