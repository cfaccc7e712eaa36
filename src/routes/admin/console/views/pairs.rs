//! A user's (user, IP) pairs on its subject page.

use chrono::{DateTime, Utc};

use super::{subject_href, until_text, SubjectPage};
use crate::domain::SubjectKind;
use crate::guard::admin::SubjectState;
use crate::guard::login::UNKNOWN_IP;

/// One (user, IP) pair of a user, as the subject page shows it.
pub struct PairRow {
    /// The IP (an IPv6 /64), or `unknown`.
    pub ip: String,
    /// The IP's own subject page; none for `unknown`.
    pub ip_href: Option<String>,
    /// The pair's lock rule (`user_ip 10/1h`).
    pub rule: String,
    /// The pair's failures in the lock window.
    pub count: u32,
    /// The rule's limit.
    pub limit: u32,
    /// When the pair's lock ends and how long that is; empty when unlocked.
    pub locked_until: String,
}

impl SubjectPage {
    /// The state's (user, IP) pairs as table rows.
    pub fn pairs(state: &SubjectState, now: DateTime<Utc>) -> Vec<PairRow> {
        state
            .pairs
            .iter()
            .map(|p| PairRow {
                ip: p.ip.clone(),
                ip_href: (p.ip != UNKNOWN_IP).then(|| subject_href(SubjectKind::Ip, &p.ip)),
                rule: p.rule.clone(),
                count: p.count,
                limit: p.limit,
                locked_until: until_text(p.locked_until, now),
            })
            .collect()
    }
}
