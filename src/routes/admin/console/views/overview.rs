//! The overview page: what the period's refusals add up to (two charts and
//! three top lists) and the subjects locked or blocked now, each with an
//! Unblock button.

use askama::Template;
use askama_web::WebTemplate;
use chrono::{DateTime, Utc};

use super::chart::{Chart, Column, SeriesSpec};
use super::{events_href, page_href, subject_href, unblock_href, until};
use crate::admin::period::Period;
use crate::audit::query::EventFilter;
use crate::audit::stats::{BucketCount, Overview, Ranked, Span};
use crate::audit::AuditDecision;
use crate::domain::{ClientIp, Subject, SubjectKind};

/// The decision chart's series, colours as the badges have them.
const DECISIONS: [SeriesSpec; 3] = [
    SeriesSpec {
        name: "deny",
        color: "#cf222e",
    },
    SeriesSpec {
        name: "challenge",
        color: "#d4a72c",
    },
    SeriesSpec {
        name: "lock",
        color: "#8250df",
    },
];

/// The action chart's series (`admin` rows are unblocks, never refusals, but
/// a row that says otherwise is still drawn).
const ACTIONS: [SeriesSpec; 4] = [
    SeriesSpec {
        name: "sms_send",
        color: "#0969da",
    },
    SeriesSpec {
        name: "sms_verify",
        color: "#1a7f37",
    },
    SeriesSpec {
        name: "login_attempt",
        color: "#bc4c00",
    },
    SeriesSpec {
        name: "admin",
        color: "#6e7781",
    },
];

/// A period the page offers.
pub struct PeriodLink {
    /// `24h`.
    pub label: &'static str,
    /// The overview of that period.
    pub href: String,
    /// The page shows this period.
    pub current: bool,
}

/// The overview of `period`.
pub fn overview_href(period: Period) -> String {
    format!("/admin/overview?period={}", period.as_str())
}

/// One entry of a top list.
pub struct RankRow {
    /// The subject kind's wire name; empty in the IP and prefix lists.
    pub kind: &'static str,
    /// The subject, address or prefix.
    pub label: String,
    /// Its subject page, when it names one.
    pub href: Option<String>,
    /// Its refusals in the period.
    pub count: u64,
    /// The event table showing them, when a filter can select them.
    pub events_href: Option<String>,
}

/// A top list with its headings.
pub struct TopList {
    /// `Top IPs`.
    pub title: &'static str,
    /// The first column's heading.
    pub heading: &'static str,
    /// The entries, most refused first.
    pub rows: Vec<RankRow>,
    /// `None`: the counts are exact. Otherwise how many refusals each count
    /// may lack at most (the list comes from bounded summaries).
    pub error: Option<u64>,
}

/// A subject locked or blocked now.
pub struct LockRow {
    /// The kind's wire name.
    pub kind: &'static str,
    /// The subject id.
    pub id: String,
    /// Its subject page.
    pub href: String,
    /// `2026-11-01 12:00:00.000 UTC (in 14m 59s)`.
    pub until: String,
    /// What is locked: `account`, `from 203.0.113.7`, `login block`, …
    pub scope: String,
    /// The store confirmed the lock; otherwise it is what the trail says.
    pub confirmed: bool,
    /// Where its Unblock form posts.
    pub unblock_href: String,
    /// The form's CSRF token, issued for this subject.
    pub csrf: String,
}

impl LockRow {
    /// The row of `subject`, locked until `end`.
    pub fn new(
        subject: &Subject,
        end: DateTime<Utc>,
        scope: String,
        confirmed: bool,
        csrf: String,
        now: DateTime<Utc>,
    ) -> Self {
        let href = subject_href(subject.kind, &subject.id);
        Self {
            kind: subject.kind.as_str(),
            id: subject.id.clone(),
            unblock_href: unblock_href(subject.kind, &subject.id),
            href,
            until: until(end, now),
            scope,
            confirmed,
            csrf,
        }
    }
}

/// The subjects locked or blocked now.
#[derive(Default)]
pub struct LockList {
    /// Latest-ending first.
    pub rows: Vec<LockRow>,
    /// Why the rows are unconfirmed, when the store did not answer.
    pub message: Option<String>,
    /// When the trail has more open locks than were checked: how many were.
    pub more: Option<usize>,
}

/// `GET /admin/overview`.
#[derive(Template, WebTemplate)]
#[template(path = "admin/overview.html")]
pub struct OverviewPage {
    /// The periods to switch to.
    pub periods: Vec<PeriodLink>,
    /// The period shown, as the query string names it.
    pub period: &'static str,
    /// The period in words (`last 24 hours`).
    pub words: &'static str,
    /// Where the first column starts (`2026-11-21 11:00 UTC`).
    pub since: String,
    /// Refusals in the period.
    pub total: u64,
    /// By decision, then by action.
    pub charts: Vec<Chart>,
    /// Top subjects, IPs and prefixes.
    pub tops: Vec<TopList>,
    /// Locked or blocked now.
    pub locks: LockList,
    /// The event table's lock rows of the period.
    pub lock_events_href: String,
    /// An unblock from this page just happened (`?unblocked=1`).
    pub unblocked: bool,
    /// The event table from the period's start.
    pub events_href: String,
    /// The Unblock buttons are shown.
    pub can_unblock: bool,
    /// Who is signed in.
    pub me: Option<super::Me>,
}

impl OverviewPage {
    /// The page of `overview`, counted over `span` for `period`, with the
    /// subjects locked now.
    pub fn new(
        period: Period,
        span: &Span,
        overview: &Overview,
        locks: LockList,
        unblocked: bool,
    ) -> Self {
        Self {
            periods: period_links(period),
            period: period.as_str(),
            words: period.words(),
            since: minute(span.start),
            total: overview.buckets.iter().map(|b| b.count).sum(),
            charts: charts(period, span, &overview.buckets),
            tops: tops(overview, span.start),
            locks,
            lock_events_href: events_since(
                EventFilter {
                    decision: Some(AuditDecision::Lock),
                    ..EventFilter::default()
                },
                span.start,
            ),
            unblocked,
            events_href: events_since(EventFilter::default(), span.start),
            can_unblock: false,
            me: None,
        }
    }
}

/// The period links, `current` marked.
fn period_links(current: Period) -> Vec<PeriodLink> {
    Period::ALL
        .into_iter()
        .map(|p| PeriodLink {
            label: p.as_str(),
            href: overview_href(p),
            current: p == current,
        })
        .collect()
}

/// The two charts of `buckets`: stacked by decision, then by action.
fn charts(period: Period, span: &Span, buckets: &[BucketCount]) -> Vec<Chart> {
    let columns = |series: &[SeriesSpec], name: fn(&BucketCount) -> &'static str| {
        (0..span.buckets)
            .map(|i| {
                let start = span.bucket_start(i);
                let counts = series
                    .iter()
                    .map(|s| {
                        let of_series = |b: &&BucketCount| b.bucket == i && name(b) == s.name;
                        buckets.iter().filter(of_series).map(|b| b.count).sum()
                    })
                    .collect();
                Column {
                    title: period.column_title(start, span.bucket_start(i + 1)),
                    label: period.label(start),
                    counts,
                }
            })
            .collect::<Vec<_>>()
    };
    let title = |by: &str| {
        format!(
            "Refusals {} by {by}, {}",
            period.per_column(),
            period.words()
        )
    };
    vec![
        Chart::stacked(
            "by-decision",
            title("decision"),
            &DECISIONS,
            &columns(&DECISIONS, |b| b.decision.as_str()),
        ),
        Chart::stacked(
            "by-action",
            title("action"),
            &ACTIONS,
            &columns(&ACTIONS, |b| b.action.as_str()),
        ),
    ]
}

/// Events since `since` that `filter` selects.
fn events_since(filter: EventFilter, since: DateTime<Utc>) -> String {
    let filter = EventFilter {
        since: Some(since),
        ..filter
    };
    events_href(&filter, None, None)
}

/// The three top lists of `overview`, counted since `since`.
fn tops(overview: &Overview, since: DateTime<Utc>) -> Vec<TopList> {
    vec![
        TopList {
            title: "Top subjects",
            heading: "Subject",
            rows: subject_rows(&overview.subjects, since),
            error: (overview.errors.subjects > 0).then_some(overview.errors.subjects),
        },
        TopList {
            title: "Top IPs",
            heading: "Client IP",
            rows: ip_rows(&overview.ips, since),
            error: (overview.errors.ips > 0).then_some(overview.errors.ips),
        },
        TopList {
            title: "Top phone prefixes",
            heading: "Prefix",
            rows: prefix_rows(&overview.prefixes),
            error: (overview.errors.prefixes > 0).then_some(overview.errors.prefixes),
        },
    ]
}

/// The top subjects, each linking to its page and its events.
fn subject_rows(ranked: &[Ranked<Subject>], since: DateTime<Utc>) -> Vec<RankRow> {
    ranked
        .iter()
        .map(|r| RankRow {
            kind: r.key.kind.as_str(),
            label: r.key.id.clone(),
            href: page_href(r.key.kind, &r.key.id),
            count: r.count,
            events_href: Some(events_since(
                EventFilter {
                    subject_kind: Some(r.key.kind),
                    subject: Some(r.key.id.clone()),
                    ..EventFilter::default()
                },
                since,
            )),
        })
        .collect()
}

/// The top client addresses, each linking to its IP subject's page (an
/// IPv6 address to its /64) and its events.
fn ip_rows(ranked: &[Ranked<String>], since: DateTime<Utc>) -> Vec<RankRow> {
    ranked
        .iter()
        .map(|r| {
            let ip = ClientIp::parse(&r.key);
            RankRow {
                kind: "",
                label: r.key.clone(),
                href: ip.map(|ip| subject_href(SubjectKind::Ip, &ip.subject_id())),
                count: r.count,
                events_href: ip.map(|ip| {
                    let filter = EventFilter {
                        ip: Some(ip.to_string()),
                        ..EventFilter::default()
                    };
                    events_since(filter, since)
                }),
            }
        })
        .collect()
}

/// The top prefixes, each linking to its prefix subject's page. The event
/// table cannot select a prefix's phones, so the count links nowhere.
fn prefix_rows(ranked: &[Ranked<String>]) -> Vec<RankRow> {
    ranked
        .iter()
        .map(|r| RankRow {
            kind: "",
            label: r.key.clone(),
            href: Some(subject_href(SubjectKind::Prefix, &r.key)),
            count: r.count,
            events_href: None,
        })
        .collect()
}

/// `2026-11-21 11:00 UTC`.
fn minute(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}
