//! Rollups of the trail, computed from each batch of rows as it is written
//! and stored in the same transaction (`db::rollups`), so that the overview
//! and `/admin/api/stats` cost the same whatever the trail holds:
//!
//! - **counts**: rows per 5-minute bucket, action, decision and shadow flag,
//!   exact;
//! - **top summaries**: for each 5-minute, hour and day (UTC) stretch, the refused
//!   subjects, client IPs and phone prefixes as a Misra-Gries summary of at
//!   most [`TOP_CAPACITY`] keys (up to twice that between prunes) and its
//!   error `dropped`. A key's stored count never exceeds its true count, and
//!   falls short of it by at most `dropped`, which is at most the stretch's
//!   refusals / (`TOP_CAPACITY` + 1). A stretch with no more than
//!   `TOP_CAPACITY` distinct keys is exact (`dropped` = 0).
//!
//! Summaries merge by adding counts; when a merged summary holds more than
//! `TOP_CAPACITY` keys, the (`TOP_CAPACITY`+1)-th largest count is taken
//! off every key (those left at zero or below go) and added to `dropped`.
//! That subtraction hits at least `TOP_CAPACITY`+1 keys each time, which is
//! what bounds the error (Agarwal et al., "Mergeable summaries", 2012).

use std::collections::{BTreeMap, HashMap};

use super::{AuditDecision, AuditEvent};
use crate::domain::SubjectKind;

/// Width of a count bucket, and of the finest top summary: 5 minutes.
pub const BUCKET_MS: i64 = 5 * 60_000;
/// Width of the middle top summary: an hour.
pub const HOUR_MS: i64 = 60 * 60_000;
/// Width of the coarsest top summary: a day (UTC).
pub const DAY_MS: i64 = 24 * HOUR_MS;
/// The widths top summaries are kept at, finest first: a period's list reads
/// the coarsest that fit, so that 7 days read about 7 + 48 summaries, not
/// 168 or 2,016.
pub const TOP_WIDTHS: [i64; 3] = [BUCKET_MS, HOUR_MS, DAY_MS];
/// How long top summaries of each width are kept: only as long as a period
/// (at most 7 days, its edges on 6-hour boundaries) can read them. A 5-minute
/// summary is read only at the edges of the last hour's span and of now, an
/// hour's or a day's within the last 7 days and a quarter. Past these, the
/// summaries are trimmed hourly, so that the table stays the size of a week
/// whatever `audit.retention` is (the counts are kept for all of it).
pub const TOP_KEPT_MS: [(i64, i64); 3] = [
    (BUCKET_MS, 2 * DAY_MS),
    (HOUR_MS, 8 * DAY_MS),
    (DAY_MS, 8 * DAY_MS),
];

/// Keys a top summary keeps after a prune.
pub const TOP_CAPACITY: usize = 100;
/// A stored summary is pruned once it holds more keys than this.
pub const PRUNE_ABOVE: usize = 2 * TOP_CAPACITY;

/// What a top summary ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TopList {
    /// Subjects other than IPs and prefixes, keyed `kind:id`.
    Subject,
    /// Client addresses.
    Ip,
    /// Phone prefixes (a phone cut at `sms.prefix_digits`) and prefix
    /// subjects.
    Prefix,
}

impl TopList {
    /// Every list.
    pub const ALL: [TopList; 3] = [TopList::Subject, TopList::Ip, TopList::Prefix];

    /// The `list` column's value.
    pub fn as_str(self) -> &'static str {
        match self {
            TopList::Subject => "subject",
            TopList::Ip => "ip",
            TopList::Prefix => "prefix",
        }
    }
}

/// Where `t_ms` falls in stretches of `width_ms`.
pub fn floor_to(t_ms: i64, width_ms: i64) -> i64 {
    t_ms.div_euclid(width_ms) * width_ms
}

/// One row of `audit_counts` (a delta, before it is added).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CountKey {
    /// Start of the 5-minute bucket, ms since 1970.
    pub bucket_ms: i64,
    /// `Action::as_str`.
    pub action: &'static str,
    /// `AuditDecision::as_str`.
    pub decision: &'static str,
    /// Written in shadow mode.
    pub shadow: bool,
}

/// Which summary: its width, where it starts and what it ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SummaryKey {
    /// [`BUCKET_MS`], [`HOUR_MS`] or [`DAY_MS`].
    pub width_ms: i64,
    /// Start of its stretch, ms since 1970.
    pub start_ms: i64,
    /// What it ranks.
    pub list: TopList,
}

/// A bounded summary: keys with counts (lower bounds) and the error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Keys and their counts, largest first (ties by key).
    pub keys: Vec<(String, i64)>,
    /// What any key's count may lack, at most.
    pub dropped: i64,
}

impl Summary {
    /// The Misra-Gries summary of exact counts: all of them when they are at
    /// most `capacity` keys, else the `capacity`+1-th count taken off every
    /// key.
    pub fn of_counts(counts: HashMap<String, i64>, capacity: usize) -> Self {
        let mut keys: Vec<(String, i64)> = counts.into_iter().collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let dropped = keys.get(capacity).map_or(0, |(_, n)| *n);
        if dropped > 0 {
            keys.retain_mut(|(_, n)| {
                *n -= dropped;
                *n > 0
            });
        }
        Self { keys, dropped }
    }
}

/// What one batch adds to the rollups.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Deltas {
    /// Rows per count bucket.
    pub counts: BTreeMap<CountKey, i64>,
    /// Summaries of the batch's refusals, per stretch and list, already cut
    /// to [`TOP_CAPACITY`] keys.
    pub tops: BTreeMap<SummaryKey, Summary>,
}

/// The key a refused event adds to `list`, if any. `prefix_digits` cuts
/// phones as `PhoneNumber::prefix` does (the plus and that many digits).
fn list_key(list: TopList, event: &AuditEvent, prefix_digits: u32) -> Option<String> {
    match list {
        TopList::Subject => match event.subject_kind {
            SubjectKind::Ip | SubjectKind::Prefix => None,
            kind => Some([kind.as_str(), ":", &event.subject].concat()),
        },
        TopList::Ip => event.ip.clone(),
        TopList::Prefix => match event.subject_kind {
            SubjectKind::Phone => {
                let end = event
                    .subject
                    .char_indices()
                    .nth(prefix_digits as usize + 1)
                    .map_or(event.subject.len(), |(i, _)| i);
                Some(event.subject[..end].to_string())
            }
            SubjectKind::Prefix => Some(event.subject.clone()),
            _ => None,
        },
    }
}

/// Whether an event counts as a refusal in the top lists: one refusing a
/// subject, not an admin's own request refused in its name (`forbidden`,
/// with an `actor`). A viewer refused an unblock of `user:alice` would
/// otherwise move alice up the lists at will; such rows are in the counts,
/// under action `admin`. The admin throttle's locks of an address (no
/// actor) rank as any guard's.
pub fn is_refusal(event: &AuditEvent) -> bool {
    !event.shadow && event.actor.is_none() && AuditDecision::REFUSALS.contains(&event.decision)
}

/// The rollup deltas of rows just inserted.
///
/// Refusals are counted once, per 5-minute stretch and list; an hour's or a
/// day's counts are the sums of its stretches'. A batch seldom spans more
/// than one stretch, so its wider summaries are usually the 5-minute one
/// again, and each refusal costs one map entry instead of one per width.
pub fn deltas<'a>(events: impl IntoIterator<Item = &'a AuditEvent>, prefix_digits: u32) -> Deltas {
    let mut counts = BTreeMap::new();
    let mut finest: BTreeMap<(i64, TopList), HashMap<String, i64>> = BTreeMap::new();
    for event in events {
        let t = event.occurred_at.timestamp_millis();
        let bucket_ms = floor_to(t, BUCKET_MS);
        *counts
            .entry(CountKey {
                bucket_ms,
                action: event.action.as_str(),
                decision: event.decision.as_str(),
                shadow: event.shadow,
            })
            .or_insert(0) += 1;
        if !is_refusal(event) {
            continue;
        }
        for list in TopList::ALL {
            if let Some(key) = list_key(list, event, prefix_digits) {
                *finest
                    .entry((bucket_ms, list))
                    .or_default()
                    .entry(key)
                    .or_insert(0) += 1;
            }
        }
    }
    Deltas {
        counts,
        tops: summaries(finest),
    }
}

/// Every width's summaries of exact 5-minute counts.
fn summaries(
    finest: BTreeMap<(i64, TopList), HashMap<String, i64>>,
) -> BTreeMap<SummaryKey, Summary> {
    // Each wider stretch and the starts of the batch's 5-minute stretches
    // it holds.
    let mut parts: BTreeMap<SummaryKey, Vec<i64>> = BTreeMap::new();
    for &(start_ms, list) in finest.keys() {
        for width_ms in &TOP_WIDTHS[1..] {
            let summary = SummaryKey {
                width_ms: *width_ms,
                start_ms: floor_to(start_ms, *width_ms),
                list,
            };
            parts.entry(summary).or_default().push(start_ms);
        }
    }
    let mut tops = BTreeMap::new();
    // Over two or more, the sum of their exact counts, taken before the
    // 5-minute counts are cut (summing cut summaries would lose more).
    for (summary, starts) in &parts {
        if starts.len() > 1 {
            let mut sum: HashMap<String, i64> = HashMap::new();
            let counts = starts
                .iter()
                .filter_map(|s| finest.get(&(*s, summary.list)));
            for (key, n) in counts.flatten() {
                *sum.entry(key.clone()).or_insert(0) += n;
            }
            tops.insert(*summary, Summary::of_counts(sum, TOP_CAPACITY));
        }
    }
    for ((start_ms, list), counts) in finest {
        let summary = SummaryKey {
            width_ms: BUCKET_MS,
            start_ms,
            list,
        };
        tops.insert(summary, Summary::of_counts(counts, TOP_CAPACITY));
    }
    // Over one, that one's summary: the same counts, cut the same way.
    for (summary, starts) in parts {
        if let [start_ms] = starts[..] {
            let finer = SummaryKey {
                width_ms: BUCKET_MS,
                start_ms,
                list: summary.list,
            };
            if let Some(same) = tops.get(&finer).cloned() {
                tops.insert(summary, same);
            }
        }
    }
    tops
}

/// Which summaries tile `[start_ms, end_ms)` (both on 5-minute
/// boundaries): `(width_ms, first start, end)` ranges of summary starts, the
/// coarsest width that fits in the middle and finer ones towards the edges.
pub fn tiles(start_ms: i64, end_ms: i64) -> Vec<(i64, i64, i64)> {
    let mut widths = TOP_WIDTHS;
    widths.reverse();
    tile(start_ms, end_ms, &widths)
}

fn tile(start_ms: i64, end_ms: i64, widths: &[i64]) -> Vec<(i64, i64, i64)> {
    let Some((&width, finer)) = widths.split_first() else {
        return Vec::new();
    };
    if start_ms >= end_ms {
        return Vec::new();
    }
    if finer.is_empty() {
        return vec![(width, start_ms, end_ms)];
    }
    let first = floor_to(start_ms + width - 1, width);
    let last = floor_to(end_ms, width);
    if first >= last {
        return tile(start_ms, end_ms, finer);
    }
    let mut tiles = tile(start_ms, first, finer);
    tiles.push((width, first, last));
    tiles.extend(tile(last, end_ms, finer));
    tiles
}

/// The count to take off every key of a stored summary of `counts` (largest
/// first) that has grown past [`PRUNE_ABOVE`]: its `TOP_CAPACITY`+1-th.
pub fn prune_cut(counts_desc: &[i64]) -> Option<i64> {
    (counts_desc.len() > PRUNE_ABOVE).then(|| counts_desc[TOP_CAPACITY])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditDecision;
    use crate::domain::{Action, Subject};

    fn refused(kind: SubjectKind, id: &str, ip: &str) -> AuditEvent {
        let mut e = AuditEvent::new(
            Action::SmsSend,
            AuditDecision::Deny,
            "rate_limited",
            &Subject::new(kind, id),
        );
        e.ip = Some(ip.into());
        e
    }

    #[test]
    fn a_summary_of_few_keys_is_exact() {
        let counts = HashMap::from([("a".to_string(), 3), ("b".to_string(), 1)]);
        let s = Summary::of_counts(counts, 2);
        assert_eq!(s.dropped, 0);
        assert_eq!(s.keys, vec![("a".into(), 3), ("b".into(), 1)]);
    }

    #[test]
    fn a_summary_past_its_capacity_loses_the_next_count_from_every_key() {
        let counts = HashMap::from([
            ("a".to_string(), 10),
            ("b".to_string(), 4),
            ("c".to_string(), 2),
            ("d".to_string(), 1),
        ]);
        let s = Summary::of_counts(counts, 2);
        // The third count (2) comes off each key: a 8, b 2; c and d go.
        assert_eq!(s.dropped, 2);
        assert_eq!(s.keys, vec![("a".into(), 8), ("b".into(), 2)]);
        // Each true count lies within [stored, stored + dropped].
        for (key, truth) in [("a", 10), ("b", 4), ("c", 2), ("d", 1)] {
            let stored = s.keys.iter().find(|k| k.0 == key).map_or(0, |k| k.1);
            assert!(stored <= truth && truth <= stored + s.dropped, "{key}");
        }
    }

    #[test]
    fn spread_refusals_leave_only_an_error_bound() {
        let counts = (0..1000).map(|i| (format!("u{i}"), 1)).collect();
        let s = Summary::of_counts(counts, TOP_CAPACITY);
        assert!(s.keys.is_empty());
        assert_eq!(s.dropped, 1);
    }

    #[test]
    fn deltas_count_every_row_and_rank_only_refusals() {
        let phone = refused(SubjectKind::Phone, "+8613800138000", "203.0.113.9");
        let user = refused(SubjectKind::User, "alice", "203.0.113.9");
        let mut shadowed = refused(SubjectKind::User, "bob", "198.51.100.1");
        shadowed.shadow = true;
        let mut unblock = refused(SubjectKind::User, "carol", "198.51.100.2");
        unblock.decision = AuditDecision::Unblock;
        let mut forbidden = refused(SubjectKind::User, "alice", "198.51.100.3");
        forbidden.action = Action::Admin;
        forbidden.actor = Some("token:dashboards".into());
        let d = deltas([&phone, &user, &shadowed, &unblock, &forbidden], 7);

        assert_eq!(d.counts.values().sum::<i64>(), 5);
        let top = |list| {
            let key = SummaryKey {
                width_ms: HOUR_MS,
                start_ms: floor_to(phone.occurred_at.timestamp_millis(), HOUR_MS),
                list,
            };
            d.tops.get(&key).cloned().unwrap_or_default().keys
        };
        assert_eq!(
            top(TopList::Subject),
            vec![("phone:+8613800138000".into(), 1), ("user:alice".into(), 1)]
        );
        assert_eq!(top(TopList::Ip), vec![("203.0.113.9".into(), 2)]);
        assert_eq!(top(TopList::Prefix), vec![("+8613800".into(), 1)]);
        assert_eq!(d.tops.len(), 9, "three lists at three widths");
    }

    /// Every refusal counted at every width directly: what `deltas` must
    /// give, however it gets there.
    fn tops_counted_at_every_width(events: &[AuditEvent]) -> BTreeMap<SummaryKey, Summary> {
        let mut exact: BTreeMap<SummaryKey, HashMap<String, i64>> = BTreeMap::new();
        for event in events.iter().filter(|e| is_refusal(e)) {
            let t = event.occurred_at.timestamp_millis();
            for list in TopList::ALL {
                let Some(key) = list_key(list, event, 7) else {
                    continue;
                };
                for width_ms in TOP_WIDTHS {
                    let summary = SummaryKey {
                        width_ms,
                        start_ms: floor_to(t, width_ms),
                        list,
                    };
                    *exact
                        .entry(summary)
                        .or_default()
                        .entry(key.clone())
                        .or_insert(0) += 1;
                }
            }
        }
        exact
            .into_iter()
            .map(|(k, counts)| (k, Summary::of_counts(counts, TOP_CAPACITY)))
            .collect()
    }

    #[test]
    fn wider_summaries_sum_the_five_minute_stretches_of_a_batch() {
        // Refusals from 22:55 to 01:10 across the end of 1969 (times below
        // zero too): hours of one, twelve, twelve and two 5-minute
        // stretches, days of 13 and 14; keys enough that every summary is
        // cut, 5-minute ones too, and some keys in many stretches.
        let mut events = Vec::new();
        for i in 0..8_000_i64 {
            let mut e = refused(
                SubjectKind::Phone,
                &format!("+86138{:08}", (i * 7_919) % 1_000),
                &format!("203.0.113.{}", i % 150),
            );
            let offset_s = (i * 53) % 8_100 - 3_900;
            e.occurred_at = chrono::DateTime::from_timestamp(offset_s, 0).expect("time");
            if i % 11 == 0 {
                e.decision = AuditDecision::Unblock;
            }
            events.push(e);
        }
        let d = deltas(&events, 7);
        let stretches = |width| d.tops.keys().filter(|k| k.width_ms == width).count();
        assert_eq!(stretches(BUCKET_MS), 27 * 3);
        assert_eq!(stretches(HOUR_MS), 4 * 3);
        assert_eq!(stretches(DAY_MS), 2 * 3);
        let cut = |width| {
            d.tops
                .iter()
                .any(|(k, s)| k.width_ms == width && k.list == TopList::Subject && s.dropped > 0)
        };
        assert!(cut(BUCKET_MS) && cut(HOUR_MS) && cut(DAY_MS));
        assert_eq!(d.tops, tops_counted_at_every_width(&events));

        // A batch within one 5-minute stretch, more keys than a summary keeps.
        let one: Vec<AuditEvent> = events
            .iter()
            .filter(|e| (0..BUCKET_MS).contains(&e.occurred_at.timestamp_millis()))
            .cloned()
            .collect();
        let d = deltas(&one, 7);
        assert!(d.tops.values().any(|s| s.dropped > 0));
        assert_eq!(d.tops.len(), 3 * 3);
        assert_eq!(d.tops, tops_counted_at_every_width(&one));
    }

    #[test]
    fn hours_tile_the_middle_of_a_span_and_five_minutes_its_edges() {
        let (m5, h) = (BUCKET_MS, HOUR_MS);
        // 09:05 to 12:10: 09:05-10:00 by 5 minutes, 10:00-12:00 by hours, then 12:00-12:10.
        let tiles = tiles(9 * h + m5, 12 * h + 2 * m5);
        assert_eq!(
            tiles,
            vec![
                (m5, 9 * h + m5, 10 * h),
                (h, 10 * h, 12 * h),
                (m5, 12 * h, 12 * h + 2 * m5)
            ]
        );
        // Within one hour: 5-minute stretches only.
        assert_eq!(
            super::tiles(9 * h + m5, 9 * h + 4 * m5),
            vec![(m5, 9 * h + m5, 9 * h + 4 * m5)]
        );
        // Whole hours: hours only.
        assert_eq!(super::tiles(9 * h, 11 * h), vec![(h, 9 * h, 11 * h)]);
        // Seven days from 12:00: half a day by hours, six days, then the
        // last day's hours and 5 minutes.
        let d = DAY_MS;
        let now = 20 * d + 10 * h + 2 * m5;
        assert_eq!(
            super::tiles(13 * d + 12 * h, now),
            vec![
                (h, 13 * d + 12 * h, 14 * d),
                (d, 14 * d, 20 * d),
                (h, 20 * d, 20 * d + 10 * h),
                (m5, 20 * d + 10 * h, now),
            ]
        );
    }

    #[test]
    fn a_stored_summary_is_cut_only_past_twice_its_capacity() {
        let small: Vec<i64> = (0..PRUNE_ABOVE as i64).rev().collect();
        assert_eq!(prune_cut(&small), None);
        let big: Vec<i64> = (0..=PRUNE_ABOVE as i64).rev().collect();
        assert_eq!(prune_cut(&big), Some(big[TOP_CAPACITY]));
    }
}
