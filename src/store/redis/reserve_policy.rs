//! `reserve.lua` is a template: a request's policy (its subjects' windows,
//! its conversions, whether the event is counted in them, whether a code is
//! stored) is written into it as Lua literals, one script per shape of
//! request, loaded once and called by its SHA. Only what changes from call to
//! call (the event's id, the captcha and shadow flags, the code) travels as
//! arguments: parsing some 60 policy arguments at every call cost Redis more
//! CPU than the rest of an SMS send's script (docs/benchmarks.md).
//!
//! Nothing a client sends reaches the rendered text: it holds integers from
//! the configuration and strings made of them; keys and codes stay in
//! `KEYS`/`ARGV`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::RwLock;

use fred::types::scripts::Script;

use crate::store::{ConversionHit, SubjectWindows, WindowMode, WindowSpec};

const TEMPLATE: &str = include_str!("../../../lua/reserve.lua");
const POLICY_LINE: &str = "\n--@POLICY@\n";
/// A log whose largest limit is at most this is read whole with one ZRANGE
/// (rendered as the subject's `small`), a larger one counted per window.
const SMALL: u32 = 32;
/// A configuration has a handful of shapes (per action, shadow or not, a
/// captcha passed or not); more than this means reloads piled them up, and
/// the cache starts over.
const MAX_SHAPES: usize = 256;

/// What a request's script depends on: every number its policy renders.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Shape(Vec<u64>);

impl Shape {
    fn of(subjects: &[SubjectWindows<'_>], conversions: &[ConversionHit<'_>], req: Render) -> Self {
        let windows: usize = subjects.iter().map(|s| s.windows.len()).sum();
        let mut v = Vec::with_capacity(4 + subjects.len() + 4 * windows + 8 * conversions.len());
        v.extend([
            u64::from(req.count),
            u64::from(req.code),
            subjects.len() as u64,
        ]);
        for subject in subjects {
            v.push(subject.windows.len() as u64);
            for w in subject.windows {
                v.extend([
                    u64::from(w.limit),
                    w.window_ms,
                    mode(w),
                    u64::from(w.is_meter()),
                ]);
            }
        }
        for c in conversions {
            let p = c.policy;
            v.extend([
                u64::from(p.min_events),
                u64::from(p.min_ratio_ppm),
                p.slice_ms(),
                p.slices(),
                p.block_ms,
            ]);
            match (p.surge, p.bucket_ms()) {
                (Some(s), Some(bucket)) => {
                    v.extend([u64::from(s.factor_milli), bucket, u64::from(s.block)])
                }
                _ => v.push(0),
            }
        }
        Self(v)
    }
}

/// The choices of a call that change its script besides the windows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Render {
    /// Count the event in the conversions when it is recorded.
    pub(super) count: bool,
    /// A code is stored with the event.
    pub(super) code: bool,
}

/// The rendered scripts, by shape.
#[derive(Default)]
pub(super) struct ReserveScripts {
    shapes: RwLock<HashMap<Shape, Script>>,
}

impl ReserveScripts {
    /// The script for this request's shape, rendered on first use.
    pub(super) fn for_request(
        &self,
        subjects: &[SubjectWindows<'_>],
        conversions: &[ConversionHit<'_>],
        req: Render,
    ) -> Script {
        let shape = Shape::of(subjects, conversions, req);
        // A poisoned lock only means another thread panicked while inserting
        // a script; the map is still a map.
        if let Some(script) = self
            .shapes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&shape)
        {
            return script.clone();
        }
        let mut shapes = self.shapes.write().unwrap_or_else(|e| e.into_inner());
        if shapes.len() >= MAX_SHAPES {
            shapes.clear();
        }
        let script = Script::from_lua(render(subjects, conversions, req));
        shapes.insert(shape, script.clone());
        script
    }
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

/// How one array of the rendered policy writes a window.
type Column = fn(&WindowSpec) -> String;

/// A Lua array of the items.
fn array(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    format!("{{{}}}", items.join(", "))
}

/// A meter window's field (`suffix` ":t": its stamp's) as a Lua string, or
/// `false` for a log.
fn meter_string(w: &WindowSpec, suffix: &str) -> String {
    if w.is_meter() {
        format!("'{}{suffix}'", w.meter_field())
    } else {
        "false".into()
    }
}

fn mode(w: &WindowSpec) -> u64 {
    match w.mode {
        WindowMode::Enforce => 0,
        WindowMode::Gate => 1,
        WindowMode::Observe => 2,
    }
}

/// `reserve.lua` with the policy in place of its `--@POLICY@` line.
fn render(
    subjects: &[SubjectWindows<'_>],
    conversions: &[ConversionHit<'_>],
    req: Render,
) -> String {
    // Writing to a String cannot fail: the `let _ =` in the render steps
    // drop an Ok.
    let mut policy = String::with_capacity(1024);
    render_columns(&mut policy, subjects);
    let mut key = 1;
    let mut first = 1;
    policy.push_str("local subjects = {\n");
    for subject in subjects {
        let meters = render_subject(&mut policy, subject, key, first);
        key += if meters { 2 } else { 1 };
        first += subject.windows.len();
    }
    policy.push_str("}\nlocal convs = {\n");
    for c in conversions {
        render_conversion(&mut policy, c, key, req.count);
        key += 1;
    }
    policy.push_str("}\n");
    if req.code {
        let _ = writeln!(policy, "local code_key = KEYS[{key}]");
    } else {
        policy.push_str("local code_key = false\n");
    }
    let zeros = |n: usize| array(std::iter::repeat_n("0".to_string(), n));
    let _ = writeln!(
        policy,
        "local count, level, observed = {z}, {z}, {z}",
        z = zeros(first - 1)
    );
    let _ = writeln!(
        policy,
        "local out = {}",
        zeros(answer_len(subjects, conversions))
    );
    TEMPLATE.replacen(POLICY_LINE, &format!("\n{policy}"), 1)
}

/// The windows' columns, one array each, over every subject's windows in order.
fn render_columns(policy: &mut String, subjects: &[SubjectWindows<'_>]) {
    let columns: [(&str, Column); 5] = [
        ("lim", |w| w.limit.to_string()),
        ("len", |w| w.window_ms.to_string()),
        ("mode", |w| mode(w).to_string()),
        ("meter", |w| meter_string(w, "")),
        ("stamp", |w| meter_string(w, ":t")),
    ];
    for (name, value) in columns {
        let all = subjects.iter().flat_map(|s| s.windows.iter());
        let _ = writeln!(policy, "local {name} = {}", array(all.map(value)));
    }
}

/// A subject's row of `subjects` (by reserve.lua's S_ indexes): its key is
/// `KEYS[key]`, its windows start at `first` in the columns. Answers whether
/// it has a meter (whose key follows its own).
fn render_subject(
    policy: &mut String,
    subject: &SubjectWindows<'_>,
    key: usize,
    first: usize,
) -> bool {
    let logs: Vec<&WindowSpec> = subject.windows.iter().filter(|w| !w.is_meter()).collect();
    let meters: Vec<&WindowSpec> = subject.windows.iter().filter(|w| w.is_meter()).collect();
    let keep = logs.iter().map(|w| w.limit).max().unwrap_or(0);
    let longest = logs.iter().map(|w| w.window_ms).max();
    let observes = subject
        .windows
        .iter()
        .any(|w| w.mode == WindowMode::Observe);
    let mkey = if meters.is_empty() {
        "false".to_string()
    } else {
        format!("KEYS[{}]", key + 1)
    };
    // One meter is read and written without a table of its fields.
    let mg = match subject.windows.iter().position(WindowSpec::is_meter) {
        Some(at) if meters.len() == 1 => (first + at).to_string(),
        _ => "false".into(),
    };
    let mfields = if meters.len() > 1 {
        let fields = meters
            .iter()
            .flat_map(|w| [meter_string(w, ""), meter_string(w, ":t")]);
        array(fields.chain(["'exp'".to_string()]))
    } else {
        "false".into()
    };
    let meter_longest = meters.iter().map(|w| w.window_ms).max().unwrap_or(0);
    let _ = writeln!(
        policy,
        "  {{ KEYS[{key}], {first}, {n}, {keep}, '{trim}', {small}, {logs}, {longest}, \
         {observes}, {mkey}, {mg}, {mfields}, {meter_longest}, false, 0, 0, 0, false }},",
        n = subject.windows.len(),
        trim = -(i64::from(keep) + 1),
        small = keep <= SMALL,
        logs = logs.len(),
        longest = longest.map_or("false".into(), |ms| format!("'{ms}'")),
    );
    !meters.is_empty()
}

/// A conversion's row of `convs` (by reserve.lua's C_ indexes), its key `KEYS[key]`.
fn render_conversion(policy: &mut String, c: &ConversionHit<'_>, key: usize, count: bool) {
    let p = c.policy;
    let (surge, bucket, escalate) = match (p.surge, p.bucket_ms()) {
        (Some(s), Some(bucket)) => (u64::from(s.factor_milli), bucket, s.block),
        _ => (0, 0, false),
    };
    let _ = writeln!(
        policy,
        "  {{ KEYS[{key}], {min}, {ppm}, {slice_ms}, {slices}, {block_ms}, {count}, {surge}, \
         {bucket}, {escalate}, {span}, {keep}, -1, 0, 0, false, false, 0, 0, 0, 0 }},",
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
            },
            SubjectWindows {
                key: "i",
                windows: &ip,
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
        assert_eq!(TEMPLATE.matches(POLICY_LINE).count(), 1);
        assert!(!lua.contains(POLICY_LINE));
        assert!(lua.contains("local lim = {1, 5, 20}\n"));
        assert!(lua.contains("local meter = {false, false, '20/3600000'}\n"));
        // the IP: KEYS[2], its windows from 3, one of them, keep 0, ... its meter KEYS[3], g 3
        assert!(lua.contains(
            "{ KEYS[2], 3, 1, 0, '-1', true, 0, false, false, KEYS[3], 3, false, 3600000,"
        ));
        assert!(lua.contains("local count, level, observed = {0, 0, 0}, {0, 0, 0}, {0, 0, 0}\n"));
        // recorded, 4 per subject, a count per window, 6 per conversion
        assert!(lua.contains(&format!(
            "local out = {{{}}}\n",
            ["0"; 1 + 8 + 3 + 6].join(", ")
        )));
        assert!(lua.contains("{ KEYS[4], 20, 200000, 300000, 12, 43200000, true, 0, 0, false,"));
        assert!(lua.contains("local code_key = KEYS[5]\n"));
    }

    #[test]
    fn one_script_per_shape() {
        let scripts = ReserveScripts::default();
        let a = [WindowSpec::enforce(1, 60_000)];
        let b = [WindowSpec::enforce(2, 60_000)];
        let one = |w: &[WindowSpec], code| {
            let subjects = [SubjectWindows {
                key: "k",
                windows: w,
            }];
            scripts
                .for_request(&subjects, &[], Render { count: true, code })
                .sha1()
                .to_string()
        };
        assert_eq!(one(&a, true), one(&a, true));
        assert_ne!(one(&a, true), one(&b, true));
        assert_ne!(one(&a, true), one(&a, false));
    }
}
