//! Siteverify's answer, and what a passed one must also say
//! (`captcha.min_score`, `hostnames`, `actions` or the route's own
//! `sms_actions` and `login_actions`): a solved captcha proves a
//! person only on the operator's site, in the operator's flow, and, for
//! reCAPTCHA v3, with a score above the line, since v3 answers `success`
//! for every well-formed token, bots' included.

use serde::{Deserialize, Deserializer};

use crate::domain::Action;
use crate::settings::{CaptchaKind, CaptchaSettings};

/// All three providers answer `{"success": bool, "error-codes": [...], ...}`;
/// the other fields are each provider's own, read only where a check asks
/// for them, and one of an unexpected type is taken as missing: a field no
/// check reads must not make a good answer unreadable.
#[derive(Deserialize)]
pub(super) struct SiteverifyAnswer {
    pub success: bool,
    #[serde(rename = "error-codes", default, deserialize_with = "texts")]
    pub error_codes: Vec<String>,
    /// reCAPTCHA v3's score; hCaptcha Enterprise's risk score has the same
    /// name and the opposite sense, so it is read only for reCAPTCHA.
    #[serde(default, deserialize_with = "number_or_none")]
    score: Option<f64>,
    #[serde(default, deserialize_with = "text_or_none")]
    hostname: Option<String>,
    #[serde(default, deserialize_with = "text_or_none")]
    action: Option<String>,
}

fn number_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Ok(serde_json::Value::deserialize(d)?.as_f64())
}

/// The strings of a list; anything else is no codes.
fn texts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Array(items) => items
            .into_iter()
            .filter_map(|item| match item {
                serde_json::Value::String(text) => Some(text),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    })
}

fn text_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(text) => Some(text),
        _ => None,
    })
}

/// What a passed token's answer must also say.
#[derive(Debug, Default)]
pub(super) struct Expected {
    /// Only for `kind = "recaptcha"`.
    min_score: Option<f64>,
    /// Compared without case; empty takes any.
    hostnames: Vec<String>,
    /// For a send: `sms_actions`, else `actions`. Empty takes any.
    sms_actions: Vec<String>,
    /// For a login attempt: `login_actions`, else `actions`.
    login_actions: Vec<String>,
}

/// Why a token the provider passed is refused all the same.
#[derive(Debug, PartialEq)]
pub(super) enum Mismatch {
    /// reCAPTCHA's score for a bot.
    Score(f64),
    /// Solved on a site not listed, or the answer names none.
    Hostname(Option<String>),
    /// For an action not listed, or the answer names none.
    Action(Option<String>),
}

impl Mismatch {
    /// A low score is the sender's; a hostname or action not listed is as
    /// likely the operator's list as a token from elsewhere, and is logged
    /// louder for it.
    pub fn may_be_the_settings(&self) -> bool {
        !matches!(self, Mismatch::Score(_))
    }
}

impl Expected {
    pub fn new(settings: &CaptchaSettings) -> Self {
        Self {
            min_score: (settings.kind == CaptchaKind::Recaptcha).then(|| settings.min_score.get()),
            hostnames: settings.hostnames.clone(),
            sms_actions: own_or_shared(&settings.sms_actions, &settings.actions),
            login_actions: own_or_shared(&settings.login_actions, &settings.actions),
        }
    }

    /// The actions a token for `action`'s route must name.
    fn actions_for(&self, action: Action) -> &[String] {
        match action {
            Action::SmsSend => &self.sms_actions,
            // Only sends and login attempts take tokens.
            Action::LoginAttempt | Action::SmsVerify | Action::Admin => &self.login_actions,
        }
    }

    /// Whether a `success: true` answer is also one this site asked for. An
    /// answer that leaves out a field being checked fails it (a v2 key
    /// names no action, an Android one no hostname); one without a score
    /// (v2) passes `min_score`, as v2 and v3 keys have secrets of their own.
    pub fn check(&self, answer: &SiteverifyAnswer, action: Action) -> Result<(), Mismatch> {
        if let (Some(min), Some(score)) = (self.min_score, answer.score) {
            if score < min {
                return Err(Mismatch::Score(score));
            }
        }
        if !self.hostnames.is_empty() {
            let listed = answer
                .hostname
                .as_deref()
                .is_some_and(|h| self.hostnames.iter().any(|e| e.eq_ignore_ascii_case(h)));
            if !listed {
                return Err(Mismatch::Hostname(clipped(&answer.hostname)));
            }
        }
        let actions = self.actions_for(action);
        if !actions.is_empty() {
            let listed = answer
                .action
                .as_deref()
                .is_some_and(|a| actions.iter().any(|e| e == a));
            if !listed {
                return Err(Mismatch::Action(clipped(&answer.action)));
            }
        }
        Ok(())
    }
}

/// The first characters of what an answer named, for the log: the answer
/// may be up to a megabyte, and its fields are whatever the provider (or
/// whatever `verify_url` points at) wrote.
fn clipped(named: &Option<String>) -> Option<String> {
    const SHOWN: usize = 100;
    named
        .as_ref()
        .map(|text| text.chars().take(SHOWN).collect())
}

/// A route's own list where it has one, else the one both routes share.
fn own_or_shared(own: &[String], shared: &[String]) -> Vec<String> {
    if own.is_empty() { shared } else { own }.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(json: &str) -> SiteverifyAnswer {
        serde_json::from_str(json).unwrap()
    }

    impl Expected {
        fn check_login(&self, answer: &SiteverifyAnswer) -> Result<(), Mismatch> {
            self.check(answer, Action::LoginAttempt)
        }
    }

    fn expected(kind: CaptchaKind, min_score: f64, hosts: &[&str], actions: &[&str]) -> Expected {
        let settings = CaptchaSettings {
            kind,
            min_score: crate::settings::Fraction::new(min_score).unwrap(),
            hostnames: hosts.iter().map(|h| h.to_string()).collect(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
            ..crate::settings::Settings::defaults().unwrap().captcha
        };
        Expected::new(&settings)
    }

    #[test]
    fn a_recaptcha_score_below_min_score_is_refused_and_other_kinds_read_none() {
        let v3 = expected(CaptchaKind::Recaptcha, 0.5, &[], &[]);
        assert_eq!(
            v3.check_login(&answer(r#"{"success": true, "score": 0.1}"#)),
            Err(Mismatch::Score(0.1))
        );
        assert_eq!(
            v3.check_login(&answer(r#"{"success": true, "score": 0.5}"#)),
            Ok(())
        );
        assert_eq!(
            v3.check_login(&answer(r#"{"success": true, "score": 0.9}"#)),
            Ok(())
        );
        // A v2 key's answers carry no score.
        assert_eq!(v3.check_login(&answer(r#"{"success": true}"#)), Ok(()));
        let off = expected(CaptchaKind::Recaptcha, 0.0, &[], &[]);
        assert_eq!(
            off.check_login(&answer(r#"{"success": true, "score": 0.0}"#)),
            Ok(())
        );
        // hCaptcha's enterprise score is a risk: 0.9 is a bot, 0.1 a person.
        let hcaptcha = expected(CaptchaKind::Hcaptcha, 0.5, &[], &[]);
        assert_eq!(
            hcaptcha.check_login(&answer(r#"{"success": true, "score": 0.1}"#)),
            Ok(())
        );
    }

    #[test]
    fn hostnames_and_actions_are_checked_only_when_listed() {
        let any = expected(CaptchaKind::Turnstile, 0.5, &[], &[]);
        let elsewhere = answer(r#"{"success": true, "hostname": "evil.example", "action": "x"}"#);
        assert_eq!(any.check_login(&elsewhere), Ok(()));

        let ours = expected(
            CaptchaKind::Turnstile,
            0.5,
            &["WWW.Example.com"],
            &["login"],
        );
        let good = answer(r#"{"success": true, "hostname": "www.example.COM", "action": "login"}"#);
        assert_eq!(ours.check_login(&good), Ok(()));
        assert_eq!(
            ours.check_login(&elsewhere),
            Err(Mismatch::Hostname(Some("evil.example".into())))
        );
        assert_eq!(
            ours.check_login(&answer(r#"{"success": true, "action": "login"}"#)),
            Err(Mismatch::Hostname(None))
        );
        assert_eq!(
            ours.check_login(&answer(
                r#"{"success": true, "hostname": "www.example.com", "action": "Login"}"#
            )),
            Err(Mismatch::Action(Some("Login".into())))
        );
        assert_eq!(
            ours.check_login(&answer(
                r#"{"success": true, "hostname": "www.example.com"}"#
            )),
            Err(Mismatch::Action(None))
        );
    }

    #[test]
    fn a_field_of_an_unexpected_type_is_missing_not_unreadable() {
        let odd = answer(
            r#"{"success": true, "score": "high", "hostname": 5, "action": ["login"], "credit": false}"#,
        );
        assert!(odd.success);
        assert_eq!((odd.score, odd.hostname, odd.action), (None, None, None));
        // Missing where checked is refused; where not checked, passed.
        let odd = answer(r#"{"success": true, "score": "high", "hostname": 5}"#);
        assert_eq!(
            expected(CaptchaKind::Turnstile, 0.5, &[], &[]).check_login(&odd),
            Ok(())
        );
        assert_eq!(
            expected(CaptchaKind::Turnstile, 0.5, &["a.example"], &[]).check_login(&odd),
            Err(Mismatch::Hostname(None))
        );
    }

    #[test]
    fn error_codes_of_an_unexpected_type_are_no_codes() {
        for json in [
            r#"{"success": true, "error-codes": null}"#,
            r#"{"success": true, "error-codes": "x"}"#,
            r#"{"success": true, "error-codes": [1, {}]}"#,
        ] {
            let read = answer(json);
            assert!(read.success && read.error_codes.is_empty(), "{json}");
        }
        let mixed = answer(r#"{"success": false, "error-codes": [7, "invalid-input-response"]}"#);
        assert_eq!(mixed.error_codes, ["invalid-input-response"]);
    }

    #[test]
    fn error_codes_are_optional_in_the_answer() {
        let answer: SiteverifyAnswer = serde_json::from_str(r#"{"success": true}"#).unwrap();
        assert!(answer.success && answer.error_codes.is_empty());
        let answer: SiteverifyAnswer = serde_json::from_str(
            r#"{"success": false, "error-codes": ["invalid-input-response"]}"#,
        )
        .unwrap();
        assert_eq!(answer.error_codes, ["invalid-input-response"]);
    }

    /// A token made on one route's page does not pass the other where
    /// that route has its own list; a route without one takes `actions`.
    #[test]
    fn a_route_with_its_own_actions_takes_only_those() {
        let of = |list: &[&str]| list.iter().map(|a| a.to_string()).collect();
        let settings = |shared: &[&str], sms: &[&str], login: &[&str]| CaptchaSettings {
            kind: CaptchaKind::Recaptcha,
            actions: of(shared),
            sms_actions: of(sms),
            login_actions: of(login),
            ..crate::settings::Settings::defaults().unwrap().captcha
        };
        let made_for = |action: &str| {
            answer(&format!(
                r#"{{"success": true, "score": 0.9, "action": "{action}"}}"#
            ))
        };
        let split = Expected::new(&settings(&["login", "sms"], &["sms"], &["login"]));
        assert_eq!(split.check(&made_for("sms"), Action::SmsSend), Ok(()));
        assert_eq!(
            split.check(&made_for("login"), Action::LoginAttempt),
            Ok(())
        );
        assert_eq!(
            split.check(&made_for("login"), Action::SmsSend),
            Err(Mismatch::Action(Some("login".into())))
        );
        assert_eq!(
            split.check(&made_for("sms"), Action::LoginAttempt),
            Err(Mismatch::Action(Some("sms".into())))
        );

        let sms_only = Expected::new(&settings(&["login", "sms"], &["sms"], &[]));
        assert_eq!(
            sms_only.check(&made_for("sms"), Action::LoginAttempt),
            Ok(())
        );
        assert_eq!(
            sms_only.check(&made_for("login"), Action::SmsSend),
            Err(Mismatch::Action(Some("login".into())))
        );

        let login_only = Expected::new(&settings(&[], &[], &["login"]));
        assert_eq!(
            login_only.check(&made_for("anything"), Action::SmsSend),
            Ok(())
        );
        assert_eq!(
            login_only.check(&made_for("sms"), Action::LoginAttempt),
            Err(Mismatch::Action(Some("sms".into())))
        );
    }

    #[test]
    fn a_long_name_in_an_answer_is_clipped_for_the_log() {
        let ours = expected(
            CaptchaKind::Turnstile,
            0.5,
            &["www.example.com"],
            &["login"],
        );
        let long = "é".repeat(100_000);
        let far = answer(&format!(r#"{{"success": true, "hostname": "{long}"}}"#));
        let Err(Mismatch::Hostname(Some(shown))) = ours.check_login(&far) else {
            panic!("the hostname is not listed")
        };
        assert_eq!(shown.chars().count(), 100);
        let odd = answer(&format!(
            r#"{{"success": true, "hostname": "www.example.com", "action": "{long}"}}"#
        ));
        let Err(Mismatch::Action(Some(shown))) = ours.check_login(&odd) else {
            panic!("the action is not listed")
        };
        assert_eq!(shown, "é".repeat(100));
    }
}
