//! Who an admin is and what they may do: the roles (`viewer`, `operator`,
//! `auditor`), the one table of what each role allows, and the actor name
//! audit rows carry.
//!
//! The table, and why:
//!
//! | permission      | viewer | operator | auditor |
//! |-----------------|--------|----------|---------|
//! | read            | yes    | yes      | yes     |
//! | unblock         |        | yes      |         |
//! | edit lists      |        | yes      |         |
//! | export CSV      |        |          | yes     |
//!
//! Every role reads (an auditor must see what it exports, an operator what
//! it unblocks). Export is its own role and not part of `operator`: it hands
//! out personal data in bulk (a day of phone numbers), which lifting a block
//! does not. An admin may hold several roles; what they may do is the union.
//! A plain-string `server.admin_tokens` entry holds `operator` and
//! `auditor`: every right a token had before roles existed.

use serde::{Deserialize, Serialize};

/// A role an admin holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads events, subjects, the overview, stats and lists.
    Viewer,
    /// Reads, unblocks and edits the allow and block lists.
    Operator,
    /// Reads and exports the trail as CSV.
    Auditor,
}

impl Role {
    /// Every role, in the order they are written.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Auditor];

    /// The name in config files, sessions and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Auditor => "auditor",
        }
    }

    /// The role `as_str` names.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// What an admin asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Read the trail, subjects, the overview, stats, lists.
    Read,
    /// Lift a subject's blocks.
    Unblock,
    /// Add or delete allow and block entries.
    EditLists,
    /// Export the trail as CSV.
    ExportCsv,
}

impl Permission {
    /// How audit rows and refusals name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Read => "read",
            Permission::Unblock => "unblock",
            Permission::EditLists => "edit_lists",
            Permission::ExportCsv => "export_csv",
        }
    }
}

/// The table above: whether `role` allows `permission`.
pub fn allows(role: Role, permission: Permission) -> bool {
    use Permission::*;
    match role {
        Role::Viewer => matches!(permission, Read),
        Role::Operator => matches!(permission, Read | Unblock | EditLists),
        Role::Auditor => matches!(permission, Read | ExportCsv),
    }
}

/// The roles one admin holds: a small set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Roles(u8);

impl Roles {
    /// No role: such an admin may do nothing and is not let in.
    pub const NONE: Roles = Roles(0);

    /// Exactly `roles`.
    pub fn of(roles: &[Role]) -> Self {
        Self(roles.iter().fold(0, |bits, r| bits | r.bit()))
    }

    /// What a plain-string admin token holds: every right a token had
    /// before roles (operator and auditor).
    pub fn legacy_token() -> Self {
        Self::of(&[Role::Operator, Role::Auditor])
    }

    /// These and `role`.
    pub fn with(self, role: Role) -> Self {
        Self(self.0 | role.bit())
    }

    /// Whether none is held.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether `role` is held.
    pub fn contains(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    /// The roles held, in `Role::ALL` order.
    pub fn iter(self) -> impl Iterator<Item = Role> {
        Role::ALL.into_iter().filter(move |r| self.contains(*r))
    }

    /// Whether one of the roles allows `permission`.
    pub fn allow(self, permission: Permission) -> bool {
        self.iter().any(|r| allows(r, permission))
    }

    /// `operator,auditor`: how a session row stores them.
    pub fn to_list(self) -> String {
        self.iter().map(Role::as_str).collect::<Vec<_>>().join(",")
    }

    /// Reads `to_list`'s text; unknown names are skipped.
    pub fn from_list(list: &str) -> Self {
        list.split(',')
            .filter_map(|r| Role::parse(r.trim()))
            .fold(Self::NONE, Self::with)
    }

    /// The least role that allows `permission`, for the refusal's wording.
    pub fn needed_for(permission: Permission) -> Role {
        Role::ALL
            .into_iter()
            .find(|r| allows(*r, permission))
            .unwrap_or(Role::Operator)
    }
}

/// The admin an audit row names: `token:<name>` for a static token,
/// `oidc:<email or sub>` for a single-sign-on user or a JWT bearer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Actor(String);

/// Actor names are cut to this many characters (a claim is outside input).
const MAX_ACTOR: usize = 200;

impl Actor {
    /// A static token's admin.
    pub fn token(name: &str) -> Self {
        Self::cut(format!("token:{name}"))
    }

    /// A single-sign-on admin, by verified email or subject.
    pub fn oidc(name: &str) -> Self {
        Self::cut(format!("oidc:{name}"))
    }

    /// An actor read back from a session row.
    pub fn stored(name: String) -> Self {
        Self::cut(name)
    }

    /// At most [`MAX_ACTOR`] characters, each that could disguise the name
    /// (a control, a bidirectional override, a zero-width character)
    /// shown as U+FFFD: a provider's `sub` of `ann\u{200b}@example.com`
    /// must not read as `ann@example.com` in the console or a CSV export.
    fn cut(name: String) -> Self {
        let clean: String = name
            .chars()
            .take(MAX_ACTOR)
            .map(|c| {
                if super::text::disguises(c) {
                    char::REPLACEMENT_CHARACTER
                } else {
                    c
                }
            })
            .collect();
        Self(clean)
    }

    /// The text in the `actor` column.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_as_documented() {
        use Permission::*;
        let table = [
            (Role::Viewer, [true, false, false, false]),
            (Role::Operator, [true, true, true, false]),
            (Role::Auditor, [true, false, false, true]),
        ];
        for (role, row) in table {
            for (permission, allowed) in [Read, Unblock, EditLists, ExportCsv].into_iter().zip(row)
            {
                assert_eq!(allows(role, permission), allowed, "{role:?} {permission:?}");
            }
        }
    }

    #[test]
    fn a_plain_token_keeps_every_right_and_roles_add_up() {
        use Permission::*;
        let legacy = Roles::legacy_token();
        for p in [Read, Unblock, EditLists, ExportCsv] {
            assert!(legacy.allow(p), "{p:?}");
        }
        assert!(!Roles::NONE.allow(Read));
        let viewer = Roles::of(&[Role::Viewer]);
        assert!(viewer.allow(Read) && !viewer.allow(Unblock) && !viewer.allow(ExportCsv));
        assert_eq!(Roles::needed_for(Unblock), Role::Operator);
        assert_eq!(Roles::needed_for(ExportCsv), Role::Auditor);
        assert_eq!(legacy.to_list(), "operator,auditor");
        assert_eq!(Roles::from_list("operator,auditor"), legacy);
        assert_eq!(Roles::from_list("nobody, viewer"), viewer);
    }

    #[test]
    fn actor_names_are_prefixed_and_cleaned() {
        assert_eq!(Actor::token("oncall").as_str(), "token:oncall");
        assert_eq!(
            Actor::oidc("ann@example.com").as_str(),
            "oidc:ann@example.com"
        );
        assert_eq!(Actor::oidc("a\nb\u{7}").as_str(), "oidc:a\u{fffd}b\u{fffd}");
        assert_eq!(
            Actor::oidc("ann\u{200b}@example.com\u{202e}").as_str(),
            "oidc:ann\u{fffd}@example.com\u{fffd}"
        );
        assert_eq!(
            Actor::stored("oidc:a\u{fffd}".into()).as_str(),
            "oidc:a\u{fffd}"
        );
        assert_eq!(Actor::oidc(&"x".repeat(500)).as_str().len(), MAX_ACTOR);
    }
}
