//! `reserve.lua` is a template: a request's policy (its conversions, whether
//! the event is counted in them, whether a code is stored) is written into it
//! as Lua literals, and its subjects' windows as Lua code
//! (`reserve_subjects`), one script per shape of request, loaded once and
//! called by its SHA. Only what changes from call to
//! call (the event's id, the captcha and shadow flags, the code) travels as
//! arguments: parsing some 60 policy arguments at every call cost Redis more
//! CPU than the rest of an SMS send's script (docs/benchmarks.md).
//!
//! Nothing a client sends reaches the rendered text: it holds integers from
//! the configuration and strings made of them; keys and codes stay in
//! `KEYS`/`ARGV`.

use std::cell::RefCell;
use std::fmt::Write as _;

use fred::types::scripts::Script;

use super::reserve_subjects::{
    render_answer, render_decide, render_locals, render_record, SubjectPlan,
};
use crate::store::{ConversionHit, SubjectWindows, WindowMode, WindowSpec};

const TEMPLATE: &str = include_str!("../../../lua/reserve.lua");
const POLICY_LINE: &str = "\n--@POLICY@\n";
const DECIDE_LINE: &str = "\n--@DECIDE@\n";
const RECORD_LINE: &str = "\n--@RECORD@\n";
const ANSWER_LINE: &str = "\n--@ANSWER@\n";
const CONVERSIONS_LINE: &str = "\n--@CONVERSIONS@\n";
const COUNT_LINE: &str = "\n--@COUNT@\n";
/// `lua/otp_keep.lua`'s `kept_after`, which the scripts that write a code
/// share (`reserve.lua` when it stores one, and `otp_put.lua`), in place of
/// their KEEP line.
pub(super) const KEPT_AFTER: &str = include_str!("../../../lua/otp_keep.lua");
pub(super) const KEEP_LINE: &str = "\n--@KEEP@\n";
/// A configuration has a handful of shapes (per action, shadow or not, a
/// captcha passed or not); more than this on a thread means reloads piled
/// them up, and its cache starts over.
const MAX_SHAPES: usize = 64;

/// Write into `shape` every number a request's script depends on: what its
/// policy renders.
fn shape_of(
    shape: &mut Vec<u64>,
    subjects: &[SubjectWindows<'_>],
    conversions: &[ConversionHit<'_>],
    req: Render,
) {
    shape.clear();
    shape.extend([
        u64::from(req.count),
        u64::from(req.code),
        subjects.len() as u64,
    ]);
    for subject in subjects {
        shape.push(subject.windows.len() as u64);
        for w in subject.windows {
            shape.extend([
                u64::from(w.limit),
                w.window_ms,
                mode(w),
                u64::from(w.is_meter()),
            ]);
        }
    }
    for c in conversions {
        let p = c.policy;
        shape.extend([
            u64::from(p.min_events),
            u64::from(p.min_ratio_ppm),
            p.slice_ms(),
            p.slices(),
            p.block_ms,
        ]);
        match (p.surge, p.bucket_ms()) {
            (Some(s), Some(bucket)) => {
                shape.extend([u64::from(s.factor_milli), bucket, u64::from(s.block)])
            }
            _ => shape.push(0),
        }
    }
}

/// This thread's rendered scripts, by shape, and the buffer a request's
/// shape is written into (no allocation once it has grown).
#[derive(Default)]
struct Rendered {
    scripts: Vec<(Vec<u64>, Script)>,
    scratch: Vec<u64>,
}

thread_local! {
    /// Each HTTP worker keeps its own scripts, found by comparing shapes: a
    /// map shared by the workers had every send hash its shape and bounce a
    /// lock's and the script's reference counts between cores, as the login
    /// scripts did (`login_script_for`).
    static RENDERED: RefCell<Rendered> = RefCell::new(Rendered::default());
}

/// The choices of a call that change its script besides the windows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Render {
    /// Count the event in the conversions when it is recorded.
    pub(super) count: bool,
    /// A code is stored with the event.
    pub(super) code: bool,
}

/// The script for a request of this shape, rendered on this thread's first
/// use of it. The shape fully decides the text, so stores may share it.
pub(super) fn reserve_script_for(
    subjects: &[SubjectWindows<'_>],
    conversions: &[ConversionHit<'_>],
    req: Render,
) -> Script {
    RENDERED.with(|rendered| {
        let mut rendered = rendered.borrow_mut();
        let Rendered { scripts, scratch } = &mut *rendered;
        shape_of(scratch, subjects, conversions, req);
        if let Some((_, script)) = scripts.iter().find(|(shape, _)| shape == scratch) {
            return script.clone();
        }
        if scripts.len() >= MAX_SHAPES {
            scripts.clear();
        }
        let script = Script::from_lua(render(subjects, conversions, req));
        scripts.push((scratch.clone(), script.clone()));
        script
    })
}

/// How many integers `reserve.lua` answers: recorded, then per subject 4
/// and a count per window (and a wait per window when it observes), then 6
/// per conversion.
pub(super) fn answer_len(
    subjects: &[SubjectWindows<'_>],
    conversions: &[ConversionHit<'_>],
) -> usize {
    let per_subject: usize = subjects
        .iter()
        .map(|s| {
            let observes = s.windows.iter().any(|w| w.mode == WindowMode::Observe);
            4 + s.windows.len() * if observes { 2 } else { 1 }
        })
        .sum();
    1 + per_subject + 6 * conversions.len()
}

/// A Lua array of the items.
fn array(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    format!("{{{}}}", items.join(", "))
}

fn mode(w: &WindowSpec) -> u64 {
    match w.mode {
        WindowMode::Enforce => 0,
        WindowMode::Gate => 1,
        WindowMode::Observe => 2,
    }
}

/// `reserve.lua` with the policy in place of its `--@POLICY@` line and the
/// subjects' pieces in place of theirs.
fn render(
    subjects: &[SubjectWindows<'_>],
    conversions: &[ConversionHit<'_>],
    req: Render,
) -> String {
    // Writing to a String cannot fail: the `let _ =` in the render steps
    // drop an Ok.
    let (plans, first_conversion_key) = SubjectPlan::all(subjects);
    let key = first_conversion_key + conversions.len();
    let len = answer_len(subjects, conversions);
    let conv_o = len - 6 * conversions.len();
    let mut reads = String::with_capacity(256);
    let mut counts = String::with_capacity(256);
    for (i, c) in conversions.iter().enumerate() {
        let at = ConversionAt {
            i: i + 1,
            key: first_conversion_key + i,
            out: conv_o + 6 * i,
        };
        render_conversion(&mut reads, &mut counts, c, &at, req.count);
    }
    let mut policy = String::with_capacity(1024);
    if req.code {
        let _ = writeln!(policy, "local code_key = KEYS[{key}]");
    } else {
        policy.push_str("local code_key = false\n");
    }
    let windows: usize = subjects.iter().map(|s| s.windows.len()).sum();
    let zeros = |n: usize| array(std::iter::repeat_n("0".to_string(), n));
    let _ = writeln!(
        policy,
        "local level, out = {}, {}\nlocal packing = '<{}'",
        zeros(windows),
        zeros(len),
        "d".repeat(len)
    );
    render_locals(&mut policy, &plans);
    let mut decide = String::with_capacity(2048);
    render_decide(&mut decide, &plans);
    let mut record = String::with_capacity(1024);
    render_record(&mut record, &plans);
    let mut answer = String::with_capacity(1024);
    render_answer(&mut answer, &plans);
    // A script that stores no code does not define what it would not call.
    let keep = if req.code {
        KEPT_AFTER.to_string()
    } else {
        String::new()
    };
    let mut lua = TEMPLATE.to_string();
    for (line, piece) in [
        (POLICY_LINE, policy),
        (CONVERSIONS_LINE, reads),
        (DECIDE_LINE, decide),
        (COUNT_LINE, counts),
        (RECORD_LINE, record),
        (ANSWER_LINE, answer),
        (KEEP_LINE, keep),
    ] {
        lua = lua.replacen(line, &format!("\n{piece}"), 1);
    }
    lua
}

/// Where a conversion is: 1-based for its locals' names, its hash
/// `KEYS[key]`, its answer after `out[out]`.
#[derive(Clone, Copy)]
struct ConversionAt {
    i: usize,
    key: usize,
    out: usize,
}

/// A conversion's `conv_read` call, its policy as literal arguments, and
/// when the event is counted its `conv_count` call, with the locals
/// between them (`cs<i>`, `cf<i>`, `cc<i>`, `cu<i>`, `ce<i>`: its slice,
/// that slice's events field and count, escalation's end and expiry as
/// read).
fn render_conversion(
    reads: &mut String,
    counts: &mut String,
    c: &ConversionHit<'_>,
    at: &ConversionAt,
    count: bool,
) {
    let p = c.policy;
    let (surge, bucket, escalate) = match (p.surge, p.bucket_ms()) {
        (Some(s), Some(bucket)) => (u64::from(s.factor_milli), bucket, s.block),
        _ => (0, 0, false),
    };
    let ConversionAt { i, key, out } = *at;
    if count {
        let _ = write!(reads, "local cs{i}, cf{i}, cc{i}, cu{i}, ce{i} = ");
        let _ = writeln!(
            counts,
            "conv_count({out}, KEYS[{key}], cs{i}, cf{i}, cc{i}, cu{i}, ce{i}, {keep})",
            keep = p.keep_ms()
        );
    }
    let _ = writeln!(
        reads,
        "conv_read({out}, KEYS[{key}], {min}, {ppm}, {slice_ms}, {slices}, {block_ms}, {surge}, \
         {bucket}, {escalate}, {span}, {keep})",
        min = p.min_events,
        ppm = p.min_ratio_ppm,
        slice_ms = p.slice_ms(),
        slices = p.slices(),
        block_ms = p.block_ms,
        span = p.slices() * p.slice_ms(),
        keep = p.keep_ms(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ConversionPolicy;

    fn gcra(limit: u32, window_ms: u64) -> WindowSpec {
        WindowSpec {
            algorithm: crate::domain::Algorithm::Gcra,
            ..WindowSpec::enforce(limit, window_ms)
        }
    }

    #[test]
    fn renders_the_policy_in_place_of_its_line() {
        let phone = [
            WindowSpec::enforce(1, 60_000),
            WindowSpec::enforce(5, 3_600_000),
        ];
        let ip = [gcra(20, 3_600_000)];
        let subjects = [
            SubjectWindows {
                key: "p",
                windows: &phone,
                callers_own: false,
            },
            SubjectWindows {
                key: "i",
                windows: &ip,
                callers_own: false,
            },
        ];
        let policy = ConversionPolicy {
            min_events: 20,
            min_ratio_ppm: 200_000,
            window_ms: 3_600_000,
            block_ms: 43_200_000,
            surge: None,
        };
        let conversions = [ConversionHit {
            key: "c",
            policy: &policy,
        }];
        let lua = render(
            &subjects,
            &conversions,
            Render {
                count: true,
                code: true,
            },
        );
        for line in [
            POLICY_LINE,
            CONVERSIONS_LINE,
            DECIDE_LINE,
            COUNT_LINE,
            RECORD_LINE,
            ANSWER_LINE,
        ] {
            assert_eq!(TEMPLATE.matches(line).count(), 1, "{line}");
            assert!(!lua.contains(line), "{line}");
        }
        // level by window; recorded, 4 per subject, a count per window, 6 per
        // conversion; the conversion's answer after 1 + 6 + 5
        assert!(lua.contains(&format!(
            "local level, out = {{0, 0, 0}}, {{{}}}\nlocal packing = '<{}'\n",
            ["0"; 1 + 8 + 3 + 6].join(", "),
            "d".repeat(18)
        )));
        assert!(lua.contains("local sc1, renew2\n"));
        // the phone's 1 per minute, counted from its scores into out[6]; the
        // IP's meter (KEYS[2]: a subject of meters only sends no ZSET key) into out[12]
        assert!(lua.contains("local n, since = 0, now - 60000\n"));
        assert!(lua.contains("out[6] = n end"));
        assert!(
            lua.contains("local m = call('HMGET', KEYS[2], '20/3600000', '20/3600000:t', 'exp')")
        );
        assert!(lua.contains("out[12] = ceil(level[3] / 3600000)"));
        assert!(lua.contains("if out[7] >= 5 then local ww = lwait(sc1, 5, 3600000);"));
        // the meter's level after the event, capped at limit * length
        assert!(lua.contains("fmt('%d', min(level[3] + 3600000, 72000000))"));
        assert!(lua.contains("call('PEXPIRE', KEYS[1], '3600000')"));
        assert!(lua.contains("call('PEXPIRE', KEYS[2], '4050000')"));
        // the conversion read with its policy as arguments, its answer after
        // out[12] (1 + 6 + 5), and counted when the event is recorded
        assert!(lua.contains(
            "local cs1, cf1, cc1, cu1, ce1 = conv_read(12, KEYS[3], 20, 200000, 300000, 12, 43200000, 0, 0, \
             false, 3600000, 3600000)\n"
        ));
        assert!(lua.contains("conv_count(12, KEYS[3], cs1, cf1, cc1, cu1, ce1, 3600000)\n"));
        assert!(lua.contains("local code_key = KEYS[4]\n"));
    }

    #[test]
    fn one_script_per_shape() {
        let a = [WindowSpec::enforce(1, 60_000)];
        let b = [WindowSpec::enforce(2, 60_000)];
        let one = |w: &[WindowSpec], code| {
            let subjects = [SubjectWindows {
                key: "k",
                windows: w,
                callers_own: false,
            }];
            reserve_script_for(&subjects, &[], Render { count: true, code })
                .sha1()
                .to_string()
        };
        assert_eq!(one(&a, true), one(&a, true));
        assert_ne!(one(&a, true), one(&b, true));
        assert_ne!(one(&a, true), one(&a, false));
        // Past the bound the cache starts over and still answers right.
        for limit in 0..2 * MAX_SHAPES as u32 {
            let windows = [WindowSpec::enforce(limit, 60_000)];
            let subjects = [SubjectWindows {
                key: "k",
                windows: &windows,
                callers_own: false,
            }];
            let req = Render {
                count: false,
                code: false,
            };
            let expected = Script::from_lua(render(&subjects, &[], req));
            assert_eq!(
                reserve_script_for(&subjects, &[], req).sha1(),
                expected.sha1()
            );
        }
        RENDERED.with(|r| assert!(r.borrow().scripts.len() <= MAX_SHAPES));
    }
}
