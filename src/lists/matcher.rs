//! Matching a request against the lists: exact values in hash sets, CIDRs
//! and phone prefixes scanned (lists are short; a scan of a few hundred
//! ranges costs well under a microsecond).

use std::collections::HashSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::{EntryKind, ListEntry, ListName};

/// One list's entries, by kind.
#[derive(Debug, Default)]
struct Side {
    nets: Vec<IpNet>,
    phones: HashSet<String>,
    phone_prefixes: Vec<String>,
    users: HashSet<String>,
}

impl Side {
    fn add(&mut self, entry: &ListEntry) {
        match entry.kind {
            EntryKind::Ip => {
                if let Ok(net) = entry.value.parse() {
                    self.nets.push(net);
                }
            }
            EntryKind::Phone => match entry.value.strip_suffix('*') {
                Some(prefix) => self.phone_prefixes.push(prefix.to_string()),
                None => {
                    self.phones.insert(entry.value.clone());
                }
            },
            EntryKind::User => {
                self.users.insert(entry.value.clone());
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.nets.is_empty()
            && self.phones.is_empty()
            && self.phone_prefixes.is_empty()
            && self.users.is_empty()
    }

    /// The kind of the first entry that matches.
    fn matches(&self, request: &Request<'_>) -> Option<EntryKind> {
        if let Some(ip) = request.ip {
            if self.nets.iter().any(|net| net.contains(&ip)) {
                return Some(EntryKind::Ip);
            }
        }
        if let Some(phone) = request.phone {
            if self.phones.contains(phone)
                || self.phone_prefixes.iter().any(|p| phone.starts_with(p))
            {
                return Some(EntryKind::Phone);
            }
        }
        if let Some(user) = request.user {
            if self.users.contains(user) {
                return Some(EntryKind::User);
            }
        }
        None
    }
}

/// What a request is matched on: its client IP, and its phone (E.164) or
/// user (normalised), when it has them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// The client IP.
    pub ip: Option<IpAddr>,
    /// The phone, in E.164.
    pub phone: Option<&'a str>,
    /// The user name, normalised.
    pub user: Option<&'a str>,
}

/// What the lists say of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// On no list.
    No,
    /// On the allow list (and not on the block list), by an entry of this kind.
    Allowed(EntryKind),
    /// On the block list, by an entry of this kind; the block list wins.
    Blocked(EntryKind),
}

/// Both lists, ready to match.
#[derive(Debug, Default)]
pub struct Matcher {
    allow: Side,
    block: Side,
}

impl Matcher {
    /// Index `entries`.
    pub fn new<'a>(entries: impl IntoIterator<Item = &'a ListEntry>) -> Self {
        let mut matcher = Self::default();
        for entry in entries {
            match entry.list {
                ListName::Allow => matcher.allow.add(entry),
                ListName::Block => matcher.block.add(entry),
            }
        }
        matcher
    }

    /// Whether the allow list names `request`'s phone or user itself, not
    /// by a prefix: an allow-listed address asking for it is a test rig
    /// and its own phone, past every window. A prefix entry (`+86138*`)
    /// would pass a whole range's numbers so.
    pub fn allows_exactly(&self, request: Request<'_>) -> bool {
        request
            .phone
            .is_some_and(|phone| self.allow.phones.contains(phone))
            || request
                .user
                .is_some_and(|user| self.allow.users.contains(user))
    }

    /// What the lists say of `request`; the block list is asked first.
    pub fn check(&self, request: Request<'_>) -> Listed {
        if self.allow.is_empty() && self.block.is_empty() {
            return Listed::No;
        }
        if let Some(kind) = self.block.matches(&request) {
            return Listed::Blocked(kind);
        }
        match self.allow.matches(&request) {
            Some(kind) => Listed::Allowed(kind),
            None => Listed::No,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lists::{normalise, EntrySource};

    fn entry(list: ListName, kind: EntryKind, value: &str) -> ListEntry {
        ListEntry {
            id: None,
            list,
            kind,
            value: normalise(kind, value).unwrap(),
            note: String::new(),
            source: EntrySource::Config,
            created_at: None,
        }
    }

    #[test]
    fn the_block_list_wins_and_prefixes_and_ranges_match() {
        let entries = [
            entry(ListName::Allow, EntryKind::Ip, "10.0.0.0/8"),
            entry(ListName::Block, EntryKind::Ip, "10.6.6.6"),
            entry(ListName::Block, EntryKind::Phone, "+88213*"),
            entry(ListName::Allow, EntryKind::Phone, "+8613800138000"),
            entry(ListName::Allow, EntryKind::User, "Ops"),
        ];
        let m = Matcher::new(&entries);
        let ip = |s: &str| Some(s.parse().unwrap());
        let check = |ip, phone, user| m.check(Request { ip, phone, user });
        assert_eq!(
            check(ip("10.1.2.3"), None, None),
            Listed::Allowed(EntryKind::Ip)
        );
        assert_eq!(
            check(ip("10.6.6.6"), None, None),
            Listed::Blocked(EntryKind::Ip)
        );
        assert_eq!(check(ip("11.0.0.1"), None, None), Listed::No);
        assert_eq!(
            check(ip("10.1.2.3"), Some("+882130001"), None),
            Listed::Blocked(EntryKind::Phone)
        );
        assert_eq!(
            check(None, Some("+8613800138000"), None),
            Listed::Allowed(EntryKind::Phone)
        );
        assert_eq!(check(None, Some("+8613800138001"), None), Listed::No);
        assert_eq!(
            check(None, None, Some("ops")),
            Listed::Allowed(EntryKind::User)
        );
        assert_eq!(Matcher::default().check(Request::default()), Listed::No);
    }

    #[test]
    fn only_an_entry_of_its_own_allows_a_phone_exactly() {
        let entries = [
            entry(ListName::Allow, EntryKind::Phone, "+86138*"),
            entry(ListName::Allow, EntryKind::Phone, "+8613900139000"),
            entry(ListName::Allow, EntryKind::User, "Ops"),
        ];
        let m = Matcher::new(&entries);
        let phone = |p| Request {
            phone: Some(p),
            ..Request::default()
        };
        assert_eq!(
            m.check(phone("+8613800138000")),
            Listed::Allowed(EntryKind::Phone)
        );
        assert!(!m.allows_exactly(phone("+8613800138000")), "a prefix's");
        assert!(m.allows_exactly(phone("+8613900139000")));
        let user = Request {
            user: Some("ops"),
            ..Request::default()
        };
        assert!(m.allows_exactly(user));
        assert!(!m.allows_exactly(Request::default()));
    }
}
