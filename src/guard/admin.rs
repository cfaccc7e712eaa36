//! What admins see of a subject's live state, and lifting its blocks.

use chrono::{DateTime, SubsecRound, Utc};
use serde::Serialize;

use super::{GuardContext, Policy, RequestInfo, SubjectRules};
use crate::audit::{AuditDecision, AuditEvent};
use crate::domain::{Action, Reason, Rule, Subject, SubjectKind};
use crate::store::{Keys, RuleWindow, StoreError, WindowMode, WindowSpec};

/// One window of a subject: its live count against its rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(example = json!({"action": "login_attempt", "rule": "user 10/1h", "count": 3, "limit": 10, "window_ms": 3600000}))]
pub struct WindowState {
    /// The action whose events the window counts.
    pub action: Action,
    /// `<subject kind> <limit>/<window>`.
    pub rule: String,
    /// Events in the window now.
    pub count: u32,
    /// The rule's limit: the window is full at this count.
    pub limit: u32,
    /// The window's length in milliseconds.
    pub window_ms: u64,
    /// The rule is on trial (`shadow = true`): counted and audited, never
    /// enforced. Present only when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(default = false)]
    pub shadow: bool,
}

/// A subject's live state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SubjectState {
    /// Which kind of subject `id` names.
    pub kind: SubjectKind,
    /// The normalised subject id.
    #[schema(example = "alice")]
    pub id: String,
    /// When the user's lock (or the IP's block) ends; null when there is none.
    #[schema(required = true)]
    pub locked_until: Option<DateTime<Utc>>,
    /// Whether one of the subject's captcha thresholds is reached
    /// (`sms.captcha_after`, `login.captcha_after`, `login.ip_captcha_after`).
    pub captcha_required: bool,
    /// Every window the subject is counted in, per action.
    pub windows: Vec<WindowState>,
}

/// A subject's live state for the admin API and console, and unblocking it.
pub struct SubjectAdmin {
    ctx: GuardContext,
}

/// The windows an admin sees for one (subject, action): enforced rules and
/// captcha tiers, each with the rule that defines it.
struct Watched {
    action: Action,
    rules: Vec<(Rule, WindowSpec)>,
}

fn watched(policy: &Policy, kind: SubjectKind) -> Vec<Watched> {
    let sms = |rules: &SubjectRules| Watched {
        action: Action::SmsSend,
        rules: rules.pairs().collect(),
    };
    match kind {
        SubjectKind::Phone => vec![sms(&policy.sms_phone)],
        SubjectKind::Prefix => vec![sms(&policy.sms_prefix)],
        SubjectKind::Global => vec![sms(&policy.sms_global)],
        SubjectKind::Ip => vec![
            sms(&policy.sms_ip),
            Watched {
                action: Action::LoginAttempt,
                rules: vec![
                    (policy.ip_captcha, policy.ip_captcha.gate()),
                    (policy.ip_block, policy.ip_block.enforce()),
                ],
            },
        ],
        // A user's windows come with its lock from one `login_state` call;
        // a country has no windows, only the pumping guard's counts.
        SubjectKind::User | SubjectKind::Country => Vec::new(),
    }
}

/// The actions whose windows a subject kind can have.
fn actions(kind: SubjectKind) -> &'static [Action] {
    match kind {
        SubjectKind::Phone | SubjectKind::Prefix | SubjectKind::Global => &[Action::SmsSend],
        SubjectKind::Ip => &[Action::SmsSend, Action::LoginAttempt],
        SubjectKind::User => &[Action::LoginAttempt],
        SubjectKind::Country => &[],
    }
}

impl SubjectAdmin {
    /// Over the store, keys, audit sink and policy the guards share.
    pub fn new(ctx: GuardContext) -> Self {
        Self { ctx }
    }

    /// What the store holds for `subject` now; reads only, counts nothing.
    pub async fn state(&self, subject: &Subject) -> Result<SubjectState, StoreError> {
        let policy = self.ctx.policy.current();
        let keys = &self.ctx.keys;
        let now = Utc::now();
        let until = |retry_ms: u64| {
            (now + chrono::Duration::milliseconds(retry_ms as i64)).trunc_subsecs(3)
        };
        let window = |action: Action, rule: &Rule, count: u32| WindowState {
            action,
            rule: rule.name(),
            count,
            limit: rule.limit,
            window_ms: rule.window_ms(),
            shadow: rule.shadow,
        };
        let mut state = SubjectState {
            kind: subject.kind,
            id: subject.id.clone(),
            locked_until: None,
            captcha_required: false,
            windows: Vec::new(),
        };

        if subject.kind == SubjectKind::User {
            let window_key = keys.subject_window(subject, Action::LoginAttempt);
            let lock_key = keys.subject_lock(subject);
            let login = self
                .ctx
                .store
                .login_state(&window_key, &lock_key, &policy.login_store)
                .await?;
            state.windows = vec![
                window(Action::LoginAttempt, &policy.user_captcha, login.failures),
                window(
                    Action::LoginAttempt,
                    &policy.user_lock,
                    login.lock_window_failures,
                ),
            ];
            state.captcha_required = login.failures >= policy.user_captcha.limit;
            state.locked_until = login.locked_retry_after_ms.map(until);
            return Ok(state);
        }

        let watched = watched(&policy, subject.kind);
        let peeks = futures::future::try_join_all(watched.iter().map(|w| {
            let key = keys.subject_window(subject, w.action);
            let specs: Vec<WindowSpec> = w.rules.iter().map(|(_, spec)| *spec).collect();
            async move { self.ctx.store.peek(&key, &specs).await }
        }))
        .await?;
        for (w, peek) in watched.iter().zip(&peeks) {
            for (i, (rule, spec)) in w.rules.iter().enumerate() {
                let count = peek.counts.get(i).copied().unwrap_or(0);
                let full = count >= rule.limit;
                if full && spec.mode == WindowMode::Gate {
                    state.captcha_required = true;
                }
                // An IP is blocked while its login failures fill the block window.
                if full && w.action == Action::LoginAttempt && *rule == policy.ip_block {
                    state.locked_until =
                        Some(until(peek.retry_after_ms.get(i).copied().unwrap_or(0)));
                }
                state.windows.push(window(w.action, rule, count));
            }
        }
        Ok(state)
    }

    /// Clear every window and the lock of a subject (a phone's pending or burnt
    /// code too); audited as `unblock`.
    pub async fn unblock(
        &self,
        subject: &Subject,
        info: &RequestInfo,
    ) -> Result<SubjectState, StoreError> {
        let keys = &self.ctx.keys;
        // Each window's log and the meters beside it (GCRA windows).
        let mut doomed: Vec<String> = actions(subject.kind)
            .iter()
            .map(|action| keys.subject_window(subject, *action))
            .flat_map(|key| [Keys::meter_of(&key), key])
            .collect();
        doomed.push(keys.subject_lock(subject));
        if subject.kind == SubjectKind::Phone {
            doomed.push(keys.subject_code(subject));
        }
        self.ctx.store.delete(&doomed).await?;
        let event = AuditEvent::new(
            Action::Admin,
            AuditDecision::Unblock,
            Reason::AdminUnblock,
            subject,
        );
        self.ctx.audit(info, event);
        self.state(subject).await
    }
}
