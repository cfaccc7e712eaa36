//! What the console's templates show: the page structs (askama, compiled in
//! from `templates/admin/`) and the plain values they print. Everything is
//! escaped by the templates; nothing here builds HTML.

use askama::Template;
use askama_web::WebTemplate;
use chrono::{DateTime, Utc};

use super::super::request::EventsQuery;
use crate::audit::query::EventFilter;
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, Subject, SubjectKind};
use crate::guard::admin::SubjectState;
pub use crate::routes::admin::pages::Me;

mod chart;
pub mod overview;
mod pairs;
mod pumping;

pub use pairs::PairRow;
pub use pumping::{BlockList, PumpingView};

/// An `<option>` of a filter `<select>`.
pub struct Opt {
    /// The value, also shown as the label.
    pub value: &'static str,
    /// Whether the form's current filter has this value.
    pub selected: bool,
}

fn options(values: impl IntoIterator<Item = &'static str>, current: &str) -> Vec<Opt> {
    values
        .into_iter()
        .map(|value| Opt {
            value,
            selected: value == current,
        })
        .collect()
}

/// The filter form as the admin filled it in, to show it again.
pub struct FilterForm {
    /// The `subject_kind` choices.
    pub subject_kinds: Vec<Opt>,
    /// The `action` choices.
    pub actions: Vec<Opt>,
    /// The `decision` choices.
    pub decisions: Vec<Opt>,
    /// The `subject` filter as typed, trimmed.
    pub subject: String,
    /// The `ip` filter as typed, trimmed.
    pub ip: String,
    /// The `actor` filter as typed, trimmed.
    pub actor: String,
    /// The `since` filter as typed, trimmed.
    pub since: String,
    /// The `until` filter as typed, trimmed.
    pub until: String,
    /// The page size as typed, trimmed.
    pub limit: String,
}

impl FilterForm {
    /// The form as `query` fills it in, refused or not.
    pub fn new(query: &EventsQuery) -> Self {
        let text = |v: &Option<String>| v.as_deref().unwrap_or_default().trim().to_string();
        Self {
            subject_kinds: options(
                SubjectKind::ALL.map(SubjectKind::as_str),
                &text(&query.subject_kind),
            ),
            actions: options(Action::ALL.map(Action::as_str), &text(&query.action)),
            decisions: options(
                AuditDecision::ALL.map(AuditDecision::as_str),
                &text(&query.decision),
            ),
            subject: text(&query.subject),
            ip: text(&query.ip),
            actor: text(&query.actor),
            since: text(&query.since),
            until: text(&query.until),
            limit: text(&query.limit),
        }
    }
}

/// A path segment with everything but RFC 3986 unreserved bytes
/// percent-encoded (`+8613800138000` → `%2B8613800138000`, `/64` → `%2F64`).
fn path_segment(raw: &str) -> String {
    raw.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A subject's console page, the id percent-encoded as one path segment;
/// or, for an id a browser cannot send as one, the look-up form's URL,
/// which shows the page in place.
pub fn subject_href(kind: SubjectKind, id: &str) -> String {
    if is_dot_segment(id) {
        format!("/admin/subjects?{}", subject_query(kind, id))
    } else {
        format!("/admin/subjects/{}/{}", kind.as_str(), path_segment(id))
    }
}

/// A subject's page, where it has one: an admin row's subject
/// (`global/lists`, `global/events.csv`) is not one a page shows.
pub fn page_href(kind: SubjectKind, id: &str) -> Option<String> {
    Subject::parse(kind.as_str(), id)
        .is_ok()
        .then(|| subject_href(kind, id))
}

/// Where a subject's Unblock form posts.
pub fn unblock_href(kind: SubjectKind, id: &str) -> String {
    if is_dot_segment(id) {
        format!("/admin/subjects/unblock?{}", subject_query(kind, id))
    } else {
        format!("{}/unblock", subject_href(kind, id))
    }
}

/// A subject's page with the note that it was just unblocked.
pub fn unblocked_href(kind: SubjectKind, id: &str) -> String {
    let href = subject_href(kind, id);
    let joint = if href.contains('?') { '&' } else { '?' };
    format!("{href}{joint}unblocked=1")
}

/// Whether `id` is a dot segment (`.` or `..`, a login name anyone can
/// type): a browser removes those from a URL's path before it asks for it
/// (RFC 3986 §5.2.4; `%2E` is no escape, the URL standard decodes it
/// first), so such a subject's page and form go by the query instead.
pub fn is_dot_segment(id: &str) -> bool {
    id == "." || id == ".."
}

/// `kind=user&id=..`, the look-up form's query for a subject.
fn subject_query(kind: SubjectKind, id: &str) -> String {
    format!("kind={}&id={}", kind.as_str(), path_segment(id))
}

/// `/admin?…` for a filter (and a page size and cursor), empty values left out.
pub fn events_href(filter: &EventFilter, limit: Option<usize>, cursor: Option<&str>) -> String {
    let time = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    let (since, until) = (filter.since.map(time), filter.until.map(time));
    let limit = limit.map(|n| n.to_string());
    let pairs = [
        ("subject_kind", filter.subject_kind.map(SubjectKind::as_str)),
        ("subject", filter.subject.as_deref()),
        ("action", filter.action.map(Action::as_str)),
        ("decision", filter.decision.map(AuditDecision::as_str)),
        ("ip", filter.ip.as_deref()),
        ("actor", filter.actor.as_deref()),
        ("since", since.as_deref()),
        ("until", until.as_deref()),
        ("limit", limit.as_deref()),
        ("cursor", cursor),
    ];
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if let Some(value) = value {
            query.append_pair(name, value);
        }
    }
    let query = query.finish();
    if query.is_empty() {
        "/admin".to_string()
    } else {
        format!("/admin?{query}")
    }
}

fn timestamp(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

fn duration_ms(ms: u64) -> String {
    // Whole seconds read better than `14m 59s 998ms`.
    let secs = ms.div_ceil(1000);
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// One audit event as the table shows it.
pub struct Row {
    /// UTC, to the millisecond (`2026-11-01 12:00:00.000`).
    pub occurred_at: String,
    /// The action's wire name (`sms_send`).
    pub action: &'static str,
    /// The decision's wire name (`deny`).
    pub decision: &'static str,
    /// The audit `reason`.
    pub reason: String,
    /// The subject kind's wire name (`phone`).
    pub subject_kind: &'static str,
    /// The subject id.
    pub subject: String,
    /// The subject's console page; none for a subject that has no page
    /// (an admin row's `global/lists` or `global/events.csv`).
    pub subject_href: Option<String>,
    /// The client IP; empty when unknown.
    pub ip: String,
    /// The rule's name; empty when none.
    pub rule: String,
    /// `count / limit`, or as much of it as the row has.
    pub observed: String,
    /// The wait, in whole seconds (`15m`); empty when none.
    pub retry_after: String,
    /// Empty when the row has none.
    pub request_id: String,
    /// Empty when the row has none.
    pub user_agent: String,
    /// Recorded in shadow mode: nothing was refused.
    pub shadow: bool,
    /// The admin who acted; empty on other rows.
    pub actor: String,
}

impl From<&AuditEvent> for Row {
    fn from(e: &AuditEvent) -> Self {
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        let observed = match (e.observed, e.limit) {
            (Some(seen), Some(limit)) => format!("{seen} / {limit}"),
            (Some(seen), None) => seen.to_string(),
            (None, Some(limit)) => format!("– / {limit}"),
            (None, None) => String::new(),
        };
        Self {
            occurred_at: timestamp(&e.occurred_at),
            action: e.action.as_str(),
            decision: e.decision.as_str(),
            reason: e.reason.clone(),
            subject_kind: e.subject_kind.as_str(),
            subject: e.subject.clone(),
            subject_href: page_href(e.subject_kind, &e.subject),
            ip: text(&e.ip),
            rule: text(&e.rule),
            observed,
            retry_after: e
                .retry_after_ms
                .filter(|ms| *ms > 0)
                .map(|ms| duration_ms(ms as u64))
                .unwrap_or_default(),
            request_id: text(&e.request_id),
            user_agent: text(&e.user_agent),
            shadow: e.shadow,
            actor: text(&e.actor),
        }
    }
}

/// The table rows of `events`, in their order.
pub fn rows(events: &[AuditEvent]) -> Vec<Row> {
    events.iter().map(Row::from).collect()
}

/// `GET /admin`: the filter form and a page of the event table.
#[derive(Template, WebTemplate)]
#[template(path = "admin/events.html")]
pub struct EventsPage {
    /// The number ranges the pumping guard blocks now.
    pub blocks: BlockList,
    /// The filters, shown again.
    pub form: FilterForm,
    /// Why the filters were refused, or why no rows could be read.
    pub message: Option<String>,
    /// This page's events, newest first.
    pub rows: Vec<Row>,
    /// The first page with the same filters, when this is a later one.
    pub first_href: Option<String>,
    /// The next page, when there is one.
    pub next_href: Option<String>,
    /// The same filters as CSV, for an admin who may export.
    pub export_href: Option<String>,
    /// Who is signed in.
    pub me: Option<Me>,
}

/// One window of a subject, as the subject page shows it.
pub struct WindowRow {
    /// The action whose events the window counts.
    pub action: &'static str,
    /// The rule's name (`user 10/1h`).
    pub rule: String,
    /// Events in the window now.
    pub count: u32,
    /// The rule's limit.
    pub limit: u32,
    /// The window's length (`1h`).
    pub window: String,
    /// Whether the count has reached the limit.
    pub full: bool,
    /// The rule is on trial: counted, not enforced.
    pub shadow: bool,
}

/// `2026-11-01 12:00:00.000 UTC (in 14m 59s)`.
fn until(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let left = (t - now).num_milliseconds().max(0) as u64;
    format!("{} UTC (in {})", timestamp(&t), duration_ms(left))
}

/// A subject's page: its live state, the Unblock form and its recent events.
#[derive(Template, WebTemplate)]
#[template(path = "admin/subject.html")]
pub struct SubjectPage {
    /// The subject's kind, by its wire name.
    pub kind: &'static str,
    /// The subject id.
    pub id: String,
    /// `2026-11-01 12:00:00.000 UTC (in 14m 59s)`, or empty when not locked.
    pub locked_until: String,
    /// Whether one of the subject's captcha thresholds is reached.
    pub captcha_required: bool,
    /// Every window the subject is counted in.
    pub windows: Vec<WindowRow>,
    /// A user's (user, IP) pairs with failures or a lock.
    pub pairs: Vec<PairRow>,
    /// For a prefix or country: the pumping guard's counts and block.
    pub pumping: Option<PumpingView>,
    /// What Unblock clears, in words.
    pub clears: &'static str,
    /// Where the Unblock form posts.
    pub unblock_href: String,
    /// The Unblock form's CSRF token.
    pub csrf: String,
    /// The Unblock form is shown.
    pub can_unblock: bool,
    /// Who is signed in.
    pub me: Option<Me>,
    /// An unblock just happened (`?unblocked=1`): say so.
    pub unblocked: bool,
    /// The subject's recent events, newest first.
    pub rows: Vec<Row>,
    /// Why the recent events are missing, when they are.
    pub events_message: Option<String>,
    /// The event table filtered to this subject.
    pub all_events_href: String,
}

impl SubjectPage {
    /// When the lock ends and how long that is from `now`; empty when there is
    /// none.
    pub fn locked_until(state: &SubjectState, now: DateTime<Utc>) -> String {
        until_text(state.locked_until, now)
    }

    /// What Unblock clears for a subject of `kind`.
    pub fn clears(kind: SubjectKind) -> &'static str {
        match kind {
            SubjectKind::Phone => "every window and the lock of this subject, and its pending code",
            SubjectKind::Prefix => "every window of this prefix, its pumping counts and its block",
            SubjectKind::Country => {
                "the pumping counts, the normal, the captcha and the block of this country"
            }
            SubjectKind::User => "every window and the lock of this user, and its locks per IP",
            SubjectKind::Network => "every window of this network",
            _ => "every window and the lock of this subject",
        }
    }

    /// The state's windows as table rows, an address's refused captcha
    /// tokens last.
    pub fn windows(state: &SubjectState) -> Vec<WindowRow> {
        let windows = state.windows.iter().map(|w| WindowRow {
            action: w.action.as_str(),
            rule: w.rule.clone(),
            count: w.count,
            limit: w.limit,
            window: duration_ms(w.window_ms),
            full: w.count >= w.limit,
            shadow: w.shadow,
        });
        let tokens = state.refused_captcha_tokens.iter().map(|t| WindowRow {
            action: "captcha_token",
            rule: t.rule.clone(),
            count: t.count,
            limit: t.limit,
            window: duration_ms(t.window_ms),
            full: t.count >= t.limit,
            shadow: false,
        });
        windows.chain(tokens).collect()
    }
}

/// [`until`], or empty for `None`.
pub(super) fn until_text(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    at.map(|t| until(t, now)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_links_encode_what_a_path_segment_cannot_hold() {
        assert_eq!(
            subject_href(SubjectKind::Phone, "+8613800138000"),
            "/admin/subjects/phone/%2B8613800138000"
        );
        assert_eq!(
            subject_href(SubjectKind::Ip, "2001:db8::/64"),
            "/admin/subjects/ip/2001%3Adb8%3A%3A%2F64"
        );
        assert_eq!(
            subject_href(SubjectKind::User, "<b>é"),
            "/admin/subjects/user/%3Cb%3E%C3%A9"
        );
    }

    #[test]
    fn only_subjects_a_page_shows_are_linked() {
        for (kind, id) in [
            (SubjectKind::Phone, "+8613800138000"),
            (SubjectKind::Ip, "2001:db8::/64"),
            (SubjectKind::Ip, "203.0.113.7"),
            (SubjectKind::Network, "2001:db8:1::/48"),
            (SubjectKind::User, ".."),
            (SubjectKind::Prefix, "+86138"),
            (SubjectKind::Country, "CN"),
            (SubjectKind::Global, "sms_send"),
        ] {
            assert_eq!(page_href(kind, id), Some(subject_href(kind, id)), "{id}");
        }
        for id in ["lists", "events.csv"] {
            assert_eq!(page_href(SubjectKind::Global, id), None, "{id}");
        }
    }

    #[test]
    fn event_links_carry_only_the_filters_given() {
        assert_eq!(events_href(&EventFilter::default(), None, None), "/admin");
        let filter = EventFilter {
            subject_kind: Some(SubjectKind::Phone),
            subject: Some("+86 1&2".into()),
            ..EventFilter::default()
        };
        assert_eq!(
            events_href(&filter, Some(20), Some("ab")),
            "/admin?subject_kind=phone&subject=%2B86+1%262&limit=20&cursor=ab"
        );
    }

    #[test]
    fn a_dot_segment_goes_by_the_query_which_a_browser_keeps() {
        for id in [".", ".."] {
            let query = format!("kind=user&id={id}");
            assert_eq!(
                subject_href(SubjectKind::User, id),
                format!("/admin/subjects?{query}")
            );
            assert_eq!(
                unblock_href(SubjectKind::User, id),
                format!("/admin/subjects/unblock?{query}")
            );
            assert_eq!(
                unblocked_href(SubjectKind::User, id),
                format!("/admin/subjects?{query}&unblocked=1")
            );
        }
        assert_eq!(
            unblock_href(SubjectKind::User, "..."),
            "/admin/subjects/user/.../unblock"
        );
        assert_eq!(
            unblocked_href(SubjectKind::User, "a.b"),
            "/admin/subjects/user/a.b?unblocked=1"
        );
    }

    #[test]
    fn an_addresss_refused_captcha_tokens_are_its_last_window_row() {
        use crate::guard::admin::RefusedTokens;
        let state = SubjectState {
            kind: SubjectKind::Ip,
            id: "203.0.113.7".into(),
            locked_until: None,
            captcha_required: false,
            windows: Vec::new(),
            pairs: Vec::new(),
            pumping: None,
            refused_captcha_tokens: Some(RefusedTokens {
                rule: "failed_captcha 20/10m".into(),
                count: 20,
                limit: 20,
                window_ms: 600_000,
            }),
        };
        let rows = SubjectPage::windows(&state);
        let row = rows.last().expect("a row");
        assert_eq!(
            (
                row.action,
                row.rule.as_str(),
                row.count,
                row.window.as_str(),
                row.full
            ),
            ("captcha_token", "failed_captcha 20/10m", 20, "10m", true)
        );
    }
}
