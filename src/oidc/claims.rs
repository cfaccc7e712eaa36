//! Who a verified token names and which roles it grants: the actor
//! (`oidc:<email>` when the email is verified, else `oidc:<sub>`) and the
//! roles its `roles_claim` values map to (`role_map`). The same for an ID
//! token and a JWT access token; pure, so the mapping is tested alone.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::domain::admin_role::{Actor, Role, Roles};

/// An admin the provider vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `oidc:<email or sub>`.
    pub actor: Actor,
    /// What `role_map` grants; may be empty (then the admin is refused).
    pub roles: Roles,
}

/// The claim at a dotted `path` (`realm_access.roles`).
fn claim<'a>(claims: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut value = claims.get(parts.next()?)?;
    for part in parts {
        value = value.as_object()?.get(part)?;
    }
    Some(value)
}

/// The admin `claims` name: a verified email, else the subject. A claim
/// set without either names nobody.
fn actor(claims: &Map<String, Value>) -> Option<Actor> {
    let email = claims.get("email").and_then(Value::as_str);
    match (email, claims.get("sub").and_then(Value::as_str)) {
        // Lower-cased: one person is one actor whatever case the provider keeps.
        (Some(email), _) if email_verified(claims) && !email.is_empty() => {
            Some(Actor::oidc(&email.to_ascii_lowercase()))
        }
        (_, Some(sub)) if !sub.is_empty() => Some(Actor::oidc(sub)),
        _ => None,
    }
}

/// Whether the provider vouches for the `email` claim: a provider that
/// lets people set their own address says `email_verified: false` until
/// they prove it. Amazon Cognito writes the boolean as a string, `"true"`:
/// the token is signed all the same, so that is taken too.
fn email_verified(claims: &Map<String, Value>) -> bool {
    match claims.get("email_verified") {
        Some(Value::Bool(verified)) => *verified,
        Some(Value::String(text)) => text == "true",
        _ => false,
    }
}

/// The roles the values of `roles_claim` (a string or a list of strings)
/// map to. An `email` grants roles only when verified: anyone could else
/// type an operator's address into their own profile and sign in as one.
fn roles(
    claims: &Map<String, Value>,
    roles_claim: &str,
    role_map: &BTreeMap<String, Role>,
) -> Roles {
    if roles_claim == "email" && !email_verified(claims) {
        return Roles::NONE;
    }
    let values: Vec<&str> = match claim(claims, roles_claim) {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    // Addresses are matched without (ASCII) case: providers keep the case
    // people typed (`Ann.Lee@Example.com`), operators write
    // `ann.lee@example.com`; start-up refuses two keys that differ only so.
    let by_email = roles_claim == "email";
    values
        .into_iter()
        .filter_map(|v| {
            if by_email {
                role_map
                    .iter()
                    .find(|(address, _)| address.eq_ignore_ascii_case(v))
                    .map(|(_, role)| *role)
            } else {
                role_map.get(v).copied()
            }
        })
        .fold(Roles::NONE, Roles::with)
}

/// The identity verified `claims` carry; `None` when they name nobody.
pub fn identity(
    claims: &Map<String, Value>,
    roles_claim: &str,
    role_map: &BTreeMap<String, Role>,
) -> Option<Identity> {
    Some(Identity {
        actor: actor(claims)?,
        roles: roles(claims, roles_claim, role_map),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map() -> BTreeMap<String, Role> {
        [
            ("tollgate-viewer".to_string(), Role::Viewer),
            ("tollgate-operator".to_string(), Role::Operator),
            ("auditors".to_string(), Role::Auditor),
        ]
        .into()
    }

    fn of(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn a_verified_email_names_the_admin_else_the_subject() {
        let cases = [
            (
                json!({"sub": "u1", "email": "ann@example.com", "email_verified": true}),
                Some("oidc:ann@example.com"),
            ),
            (
                json!({"sub": "u1", "email": "Ann@Example.COM", "email_verified": true}),
                Some("oidc:ann@example.com"),
            ),
            (
                json!({"sub": "u1", "email": "ann@example.com", "email_verified": false}),
                Some("oidc:u1"),
            ),
            (
                json!({"sub": "u1", "email": "ann@example.com"}),
                Some("oidc:u1"),
            ),
            // Cognito's string form.
            (
                json!({"sub": "u1", "email": "ann@example.com", "email_verified": "true"}),
                Some("oidc:ann@example.com"),
            ),
            (
                json!({"sub": "u1", "email": "ann@example.com", "email_verified": "false"}),
                Some("oidc:u1"),
            ),
            (
                json!({"sub": "u1", "email": "ann@example.com", "email_verified": "yes"}),
                Some("oidc:u1"),
            ),
            (
                json!({"sub": "u1", "email": "ann@example.com", "email_verified": 1}),
                Some("oidc:u1"),
            ),
            (json!({"email": "ann@example.com"}), None),
            (json!({"sub": ""}), None),
        ];
        for (claims, expected) in cases {
            let found = identity(&of(claims.clone()), "roles", &map());
            assert_eq!(
                found.map(|i| i.actor.as_str().to_string()).as_deref(),
                expected,
                "{claims}"
            );
        }
    }

    #[test]
    fn roles_come_from_a_string_a_list_or_a_nested_claim() {
        let roles_of =
            |claims: Value, path: &str| identity(&of(claims), path, &map()).unwrap().roles;
        assert_eq!(
            roles_of(json!({"sub": "a", "roles": "tollgate-viewer"}), "roles"),
            Roles::of(&[Role::Viewer])
        );
        assert_eq!(
            roles_of(
                json!({"sub": "a", "roles": ["auditors", "tollgate-operator", "other", 7]}),
                "roles"
            ),
            Roles::of(&[Role::Operator, Role::Auditor])
        );
        assert_eq!(
            roles_of(
                json!({"sub": "a", "realm_access": {"roles": ["tollgate-operator"]}}),
                "realm_access.roles"
            ),
            Roles::of(&[Role::Operator])
        );
        for claims in [
            json!({"sub": "a"}),
            json!({"sub": "a", "realm_access": {"roles": "Tollgate-Viewer"}}),
            json!({"sub": "a", "roles": {"tollgate-viewer": true}}),
            json!({"sub": "a", "realm_access": "tollgate-viewer"}),
        ] {
            assert_eq!(
                roles_of(claims.clone(), "realm_access.roles"),
                Roles::NONE,
                "{claims}"
            );
        }
    }

    #[test]
    fn group_and_role_names_keep_their_case() {
        let map: BTreeMap<String, Role> = [("ann@example.com".to_string(), Role::Operator)].into();
        let roles_of = |claims: Value, path: &str| identity(&of(claims), path, &map).unwrap().roles;
        assert_eq!(
            roles_of(json!({"sub": "a", "groups": "Ann@Example.com"}), "groups"),
            Roles::NONE
        );
        assert_eq!(
            roles_of(json!({"sub": "a", "groups": "ann@example.com"}), "groups"),
            Roles::of(&[Role::Operator])
        );
        assert_eq!(
            identity(
                &of(json!({"sub": "a", "roles": "Tollgate-Viewer"})),
                "roles",
                &super::tests::map()
            )
            .unwrap()
            .roles,
            Roles::NONE
        );
    }

    /// Google has no role claim, so `roles_claim = "email"` maps addresses;
    /// a provider where people edit their own address marks it unverified.
    #[test]
    fn an_email_grants_a_role_only_when_verified() {
        let map: BTreeMap<String, Role> = [("ann@example.com".to_string(), Role::Operator)].into();
        let roles_of = |claims: Value| identity(&of(claims), "email", &map).unwrap().roles;
        for claims in [
            json!({"sub": "a", "email": "ann@example.com", "email_verified": true}),
            json!({"sub": "a", "email": "Ann@Example.COM", "email_verified": true}),
            json!({"sub": "a", "email": "ann@example.com", "email_verified": "true"}),
        ] {
            assert_eq!(
                roles_of(claims.clone()),
                Roles::of(&[Role::Operator]),
                "{claims}"
            );
        }
        for claims in [
            json!({"sub": "a", "email": "ann@example.com", "email_verified": false}),
            json!({"sub": "a", "email": "ann@example.com", "email_verified": "false"}),
            json!({"sub": "a", "email": "Ann@Example.COM", "email_verified": false}),
            json!({"sub": "a", "email": "ann@example.com"}),
            json!({"sub": "a", "email": "bob@example.com", "email_verified": true}),
        ] {
            assert_eq!(roles_of(claims.clone()), Roles::NONE, "{claims}");
        }
    }
}
