//! What a reload makes looser than the settings it replaces: a shadow
//! mode turned on (all of it, or the SMS or login rules'), block-list entries removed, allow-list entries added.
//! Whoever can write the config file (or a mistaken edit, or a deploy of
//! an old file) lifts protection so, and a line at `info` among the
//! routine reloads is easy to miss: these are warned of, by name.

use std::collections::BTreeSet;

use crate::lists::{ListEntry, ListName};
use crate::settings::Settings;

/// What `after` loosens of `before`, as the log names it.
pub fn loosened(before: &Settings, after: &Settings) -> Vec<String> {
    let mut found = Vec::new();
    let switches = before.shadow_switches().into_iter();
    for ((key, was), (_, is)) in switches.zip(after.shadow_switches()) {
        if is && !was {
            found.push(format!("{key} turned on"));
        }
    }
    let entries = |settings: &Settings, list: ListName| -> BTreeSet<(String, String)> {
        settings
            .lists
            .entries()
            .into_iter()
            .filter(|entry: &ListEntry| entry.list == list)
            .map(|entry| (entry.kind.as_str().to_string(), entry.value))
            .collect()
    };
    let removed = entries(before, ListName::Block)
        .difference(&entries(after, ListName::Block))
        .count();
    if removed > 0 {
        found.push(format!("{removed} block-list entries removed"));
    }
    let added = entries(after, ListName::Allow)
        .difference(&entries(before, ListName::Allow))
        .count();
    if added > 0 {
        found.push(format!("{added} allow-list entries added"));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_settings_loosen_nothing() {
        let settings = Settings::defaults().unwrap();
        assert!(loosened(&settings, &settings.clone()).is_empty());
    }

    #[test]
    fn shadow_mode_a_block_removed_and_an_allow_added_are_named() {
        let mut before = Settings::defaults().unwrap();
        let net = |text: &str| text.parse::<ipnet::IpNet>().unwrap();
        before.lists.block_ips = vec![net("198.51.100.0/24"), net("203.0.113.9/32")];
        let mut after = before.clone();
        after.shadow.enabled = true;
        after.sms.shadow = true;
        after.lists.block_ips = vec![net("203.0.113.9/32")];
        after.lists.allow_users = vec!["ops".into()];
        assert_eq!(
            loosened(&before, &after),
            [
                "shadow.enabled turned on",
                "sms.shadow turned on",
                "1 block-list entries removed",
                "1 allow-list entries added"
            ]
        );
        // The other way round tightens: nothing to warn of.
        assert!(loosened(&after, &before).is_empty());
    }
}
