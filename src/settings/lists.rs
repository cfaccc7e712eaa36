//! `[lists]`: allow and block entries of the config file. Reloaded on SIGHUP;
//! entries added by admins at run time live in the audit database instead.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration;
use super::parsed;
use crate::lists::{normalise, EntryKind, EntrySource, ListEntry, ListName};

/// `[lists]`: who is never limited and who is always refused.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListSettings {
    /// Client IPs (CIDRs or addresses) never limited, captcha-gated or locked.
    #[serde(with = "parsed::cidrs")]
    pub allow_ips: Vec<ipnet::IpNet>,
    /// Phones (E.164, or a prefix ending in `*`) never limited.
    pub allow_phones: Vec<String>,
    /// Users never captcha-gated or locked.
    pub allow_users: Vec<String>,
    /// Client IPs always refused (`403 blocklisted`).
    #[serde(with = "parsed::cidrs")]
    pub block_ips: Vec<ipnet::IpNet>,
    /// Phones (or prefixes ending in `*`) always refused.
    pub block_phones: Vec<String>,
    /// Users always refused.
    pub block_users: Vec<String>,
    /// How often each instance reads the entries admins stored; default 5 s.
    #[serde(with = "duration", default = "default_refresh")]
    pub refresh_interval: Duration,
}

fn default_refresh() -> Duration {
    Duration::from_secs(5)
}

impl ListSettings {
    /// Every list key with its list, kind and values as written.
    fn keyed(&self) -> [(&'static str, ListName, EntryKind, Vec<String>); 6] {
        let ips = |nets: &[ipnet::IpNet]| nets.iter().map(ToString::to_string).collect();
        [
            (
                "lists.allow_ips",
                ListName::Allow,
                EntryKind::Ip,
                ips(&self.allow_ips),
            ),
            (
                "lists.allow_phones",
                ListName::Allow,
                EntryKind::Phone,
                self.allow_phones.clone(),
            ),
            (
                "lists.allow_users",
                ListName::Allow,
                EntryKind::User,
                self.allow_users.clone(),
            ),
            (
                "lists.block_ips",
                ListName::Block,
                EntryKind::Ip,
                ips(&self.block_ips),
            ),
            (
                "lists.block_phones",
                ListName::Block,
                EntryKind::Phone,
                self.block_phones.clone(),
            ),
            (
                "lists.block_users",
                ListName::Block,
                EntryKind::User,
                self.block_users.clone(),
            ),
        ]
    }

    /// The first value that is not of its kind: its key (`lists.block_phones[1]`)
    /// and why.
    pub fn invalid(&self) -> Option<(String, String)> {
        self.keyed().into_iter().find_map(|(key, _, kind, values)| {
            values.iter().enumerate().find_map(|(i, value)| {
                normalise(kind, value)
                    .err()
                    .map(|why| (format!("{key}[{i}]"), why))
            })
        })
    }

    /// The entries, normalised; values that are not of their kind (refused at
    /// start-up and on reload) are left out.
    pub fn entries(&self) -> Vec<ListEntry> {
        let mut entries = Vec::new();
        for (_, list, kind, values) in self.keyed() {
            for value in values {
                if let Ok(value) = normalise(kind, &value) {
                    entries.push(ListEntry {
                        id: None,
                        list,
                        kind,
                        value,
                        note: String::new(),
                        source: EntrySource::Config,
                        created_at: None,
                    });
                }
            }
        }
        entries
    }
}
