//! Rules: at most a limit of events per window for one subject kind, and
//! the names that responses and audit rows give them (`phone 5/1h`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SubjectKind;

/// How a window counts (`algorithm` on a limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// A log of the window's events: exact, memory grows with the limit. The
    /// default.
    #[default]
    SlidingLog,
    /// A meter (GCRA, the leaky bucket as a meter): `limit` events at once,
    /// then one per `window / limit`; one level per subject, whatever the
    /// limit.
    Gcra,
}

impl Algorithm {
    /// Whether this is the default (a config file need not say it).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// One window of a rule: at most `limit` events per `window` for a subject kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The kind of subject the rule counts.
    pub kind: SubjectKind,
    /// Events allowed in one window.
    pub limit: u32,
    /// How far back the window reaches.
    pub window: Duration,
    /// Counted and audited, never enforced (a rule on trial).
    pub shadow: bool,
    /// How the window counts.
    pub algorithm: Algorithm,
    /// Counted per (subject, client IP) pair rather than per subject; named
    /// `user_ip 10/1h`.
    pub per_client_ip: bool,
}

impl Rule {
    /// At most `limit` events per `window` for one subject of `kind`.
    pub fn new(kind: SubjectKind, limit: u32, window: Duration) -> Self {
        Self {
            kind,
            limit,
            window,
            shadow: false,
            algorithm: Algorithm::SlidingLog,
            per_client_ip: false,
        }
    }

    /// The same rule, counted per (subject, client IP) pair.
    pub fn per_client_ip(self) -> Self {
        Self {
            per_client_ip: true,
            ..self
        }
    }

    /// The same rule, counted by `algorithm`.
    pub fn counted_by(self, algorithm: Algorithm) -> Self {
        Self { algorithm, ..self }
    }

    /// The same rule, on trial when `shadow`: counted and audited, never
    /// enforced.
    pub fn shadowed(self, shadow: bool) -> Self {
        Self { shadow, ..self }
    }

    /// The window in milliseconds, as the store and audit rows take it.
    pub fn window_ms(&self) -> u64 {
        self.window.as_millis() as u64
    }

    /// `phone 5/1h`: the window in the largest unit that divides it exactly;
    /// `user_ip 10/1h` when counted per client IP.
    ///
    /// Written without the formatting machinery: every audit row of a rule
    /// names it, and `format!` twice over cost some 1,600 instructions a row.
    pub fn name(&self) -> String {
        let mut name = String::with_capacity(24);
        name.push_str(self.kind.as_str());
        if self.per_client_ip {
            name.push_str("_ip");
        }
        name.push(' ');
        name.push_str(itoa::Buffer::new().format(self.limit));
        name.push('/');
        push_window(&mut name, self.window_ms());
        name
    }
}

/// `ms` in the largest of `d`, `h`, `m`, `s` that divides it exactly, else
/// in `ms` (`90000` → `90s`, `1500` → `1500ms`).
pub fn format_window(ms: u64) -> String {
    let mut window = String::with_capacity(8);
    push_window(&mut window, ms);
    window
}

fn push_window(out: &mut String, ms: u64) {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    let (count, unit) = UNITS
        .into_iter()
        .find(|&(size, _)| ms > 0 && ms.is_multiple_of(size))
        .map_or((ms, "ms"), |(size, unit)| (ms / size, unit));
    out.push_str(itoa::Buffer::new().format(count));
    out.push_str(unit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_use_the_largest_exact_unit() {
        let cases = [
            (SubjectKind::Phone, 1, 60_000, "phone 1/1m"),
            (SubjectKind::Phone, 10, 86_400_000, "phone 10/1d"),
            (SubjectKind::Ip, 20, 3_600_000, "ip 20/1h"),
            (SubjectKind::User, 3, 900_000, "user 3/15m"),
            (SubjectKind::Global, 1000, 60_000, "global 1000/1m"),
            (SubjectKind::Phone, 2, 1_500, "phone 2/1500ms"),
            (SubjectKind::Prefix, 50, 90_000, "prefix 50/90s"),
            (SubjectKind::User, 3, 5_400_000, "user 3/90m"),
        ];
        for (kind, limit, ms, name) in cases {
            assert_eq!(
                Rule::new(kind, limit, Duration::from_millis(ms)).name(),
                name
            );
        }
        let pair = Rule::new(SubjectKind::User, 10, Duration::from_secs(3600)).per_client_ip();
        assert_eq!(pair.name(), "user_ip 10/1h");
        assert_eq!(format_window(0), "0ms");
        assert_eq!(format_window(u64::MAX), format!("{}ms", u64::MAX));
        assert_eq!(format_window(172_800_000), "2d");
    }
}
