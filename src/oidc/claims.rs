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
    /// The values of `roles_claim` that granted them: a console session
    /// keeps them, to map them again through the `role_map` of its day.
    pub grants: Grants,
}

/// The values of one claim that granted roles at sign-in.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grants {
    /// The `roles_claim` they were read from.
    pub claim: String,
    /// Its values that `role_map` mapped to a role.
    pub values: Vec<String>,
}

impl Grants {
    /// The roles these values grant under `roles_claim` and `role_map` now:
    /// none when the claim read is another one. A session holds these, so
    /// that an admin taken out of `role_map` (or lowered) loses the roles
    /// with the restart that applies it, not when the session ends.
    pub fn roles_now(&self, roles_claim: &str, role_map: &BTreeMap<String, Role>) -> Roles {
        if self.claim != roles_claim {
            return Roles::NONE;
        }
        self.values
            .iter()
            .filter_map(|v| role_of(v, roles_claim, role_map))
            .fold(Roles::NONE, Roles::with)
    }
}

/// The claim named `path`, else the one at `path` read as dotted
/// (`realm_access.roles`): Auth0's claims are named by URLs
/// (`https://example.com/roles`), whose dots are no path.
fn claim<'a>(claims: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    if let Some(value) = claims.get(path) {
        return Some(value);
    }
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

/// The role one value of `roles_claim` maps to. Addresses are matched
/// without (ASCII) case: providers keep the case people typed
/// (`Ann.Lee@Example.com`), operators write `ann.lee@example.com`;
/// start-up refuses two keys that differ only so.
fn role_of(value: &str, roles_claim: &str, role_map: &BTreeMap<String, Role>) -> Option<Role> {
    if roles_claim == "email" {
        role_map
            .iter()
            .find(|(address, _)| address.eq_ignore_ascii_case(value))
            .map(|(_, role)| *role)
    } else {
        role_map.get(value).copied()
    }
}

/// The values of `roles_claim` (a string or a list of strings) that map
/// to a role. An `email` grants roles only when verified: anyone could
/// else type an operator's address into their own profile and sign in as
/// one.
fn grants(
    claims: &Map<String, Value>,
    roles_claim: &str,
    role_map: &BTreeMap<String, Role>,
) -> Grants {
    let mut grants = Grants {
        claim: roles_claim.to_string(),
        values: Vec::new(),
    };
    if roles_claim == "email" && !email_verified(claims) {
        return grants;
    }
    let values: Vec<&str> = match claim(claims, roles_claim) {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    grants.values = values
        .into_iter()
        .filter(|v| role_of(v, roles_claim, role_map).is_some())
        .map(str::to_string)
        .collect();
    grants
}

/// The identity verified `claims` carry; `None` when they name nobody.
pub fn identity(
    claims: &Map<String, Value>,
    roles_claim: &str,
    role_map: &BTreeMap<String, Role>,
) -> Option<Identity> {
    let actor = actor(claims)?;
    let grants = grants(claims, roles_claim, role_map);
    Some(Identity {
        actor,
        roles: grants.roles_now(roles_claim, role_map),
        grants,
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
        let auth0 = "https://tollgate.example.com/roles";
        assert_eq!(
            roles_of(json!({"sub": "a", auth0: ["tollgate-viewer"]}), auth0),
            Roles::of(&[Role::Viewer])
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

    /// A session keeps the values that granted its roles and maps them
    /// again through the `role_map` of the day: taken out, the admin has
    /// nothing; another `roles_claim` grants nothing.
    #[test]
    fn the_values_that_granted_map_again_through_a_changed_map() {
        let claims = of(json!({"sub": "a", "groups": ["tollgate-operator", "staff"]}));
        let found = identity(&claims, "groups", &map()).unwrap();
        assert_eq!(
            found.grants,
            Grants {
                claim: "groups".into(),
                values: vec!["tollgate-operator".into()]
            }
        );
        assert_eq!(found.roles, Roles::of(&[Role::Operator]));
        assert_eq!(found.grants.roles_now("groups", &map()), found.roles);
        let lowered: BTreeMap<String, Role> =
            [("tollgate-operator".to_string(), Role::Viewer)].into();
        assert_eq!(
            found.grants.roles_now("groups", &lowered),
            Roles::of(&[Role::Viewer])
        );
        let removed: BTreeMap<String, Role> = [("staff".to_string(), Role::Viewer)].into();
        assert_eq!(found.grants.roles_now("groups", &removed), Roles::NONE);
        assert_eq!(found.grants.roles_now("roles", &map()), Roles::NONE);

        let by_email: BTreeMap<String, Role> =
            [("Ann@Example.com".to_string(), Role::Auditor)].into();
        let ann = of(json!({"sub": "a", "email": "ann@example.com", "email_verified": true}));
        let grants = identity(&ann, "email", &by_email).unwrap().grants;
        assert_eq!(
            grants.roles_now("email", &by_email),
            Roles::of(&[Role::Auditor])
        );
        assert_eq!(grants.roles_now("email", &map()), Roles::NONE);
    }
}
