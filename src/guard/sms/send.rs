//! `POST /sms/send` (DESIGN.md §3, in order): the lists and the region,
//! then the pumping guard, every subject's windows and the code in one
//! reservation, then delivery, which gives back what its failure says
//! (`decision::give_back`). `decision` says what the store's answers come
//! to; this file asks and applies.

use std::time::Duration;

use super::decision::{self, Grant, Pass, Region};
use super::{SendRequest, Sent, SmsGuard, SmsRefusal};
use crate::delivery::{DeliveryError, SmsMessage};
use crate::domain::{Action, Locale, PhoneNumber, Subject, SubjectKind};
use crate::guard::reserve::{reserve, Offer, Reservation, SubjectHit};
use crate::guard::{ceil_secs, code, pumping, Lookup, Policy, ProofCheck, RequestInfo};
use crate::metrics::SmsDelivery;
use crate::settings::SmsSettings;
use crate::store::{CodeToStore, StoreError};

/// What a send's reservation counts.
#[derive(Clone, Copy)]
enum Scope<'c> {
    /// Every window and the pumping guard, and the code stored with them.
    Whole(&'c SmsCode),
    /// An allow-listed phone's (`Pass::AskerCounted`): only the asker's
    /// address and network windows; its code is stored apart.
    Asker,
    /// A phone a range's allow entry lists (`Pass::RangeAllowed`): the
    /// phone's own windows and the asker's; its code is stored apart.
    PhoneAndAsker,
    /// An allow-listed address's (`Pass::AddressExempt`): every window but
    /// the asker's, and the pumping guard, with no captcha tier; the code
    /// stored with them.
    AllButTheAsker(&'c SmsCode),
}

/// What a failed delivery may undo: the send's reservation, under the
/// policy it was made with.
#[derive(Clone, Copy)]
struct Undo<'a, 'p> {
    policy: &'a Policy,
    reservation: Option<&'a Reservation<'p>>,
}

/// A send's reservation, and whether the country challenge it started is
/// audited already (before its token went to the provider).
struct Reserved<'p> {
    reservation: Reservation<'p>,
    challenge_audited: bool,
}

impl<'p> Reserved<'p> {
    fn new(reservation: Reservation<'p>) -> Self {
        Self {
            reservation,
            challenge_audited: false,
        }
    }
}

/// A drawn code, sealed for the store: the text goes to the phone, only
/// the MAC is stored.
struct SmsCode {
    text: String,
    mac: String,
    /// `Keys::subject_code` of the phone.
    key: String,
    /// `sms.max_verify_attempts`: wrong tries allowed.
    attempts: u32,
    /// `sms.code_ttl`.
    ttl: Duration,
    /// The asking address's subject id (`SmsGuard::code_client`; `""`
    /// without one): its tries on the code are counted apart from
    /// everyone else's.
    asker: String,
}

impl SmsCode {
    /// The code as the store keeps it.
    fn to_store(&self) -> CodeToStore<'_> {
        CodeToStore {
            key: &self.key,
            mac: &self.mac,
            attempts: self.attempts,
            ttl_ms: self.ttl.as_millis() as u64,
            asker: &self.asker,
        }
    }
}

impl Grant {
    /// The caller's answer once the code is out.
    fn sent(self, phone: &PhoneNumber, sms: &SmsSettings) -> Sent {
        Sent {
            masked_phone: phone.masked(),
            code_ttl_secs: sms.code_ttl.as_secs(),
            resend_after_secs: ceil_secs(self.resend_after_ms),
            captcha_required: self.captcha_required,
            quota: self.quota,
        }
    }
}

impl SmsGuard {
    /// Send a code: screened by the lists and the region, counted (for an
    /// allow-listed phone, only in its asker's windows; for an allow-listed
    /// IP, not at all), then delivered.
    pub async fn send(&self, req: SendRequest, info: &RequestInfo) -> Result<Sent, SmsRefusal> {
        let policy = self.ctx.policy.current();
        let sms = &policy.sms.settings;
        let phone = Subject::new(SubjectKind::Phone, req.phone.e164());
        let subject = (SubjectKind::Phone, req.phone.e164());
        let listing = self
            .ctx
            .listed(Action::SmsSend, info, subject, Lookup::Attempt);
        let names_client = info.client_ip().is_some();
        let region = Region::of(&req.phone, sms);
        let screened = decision::screen(listing, names_client, region, &phone);
        let pass = self.apply(screened, &policy, info).await?;
        // The code is drawn and sealed before the store call, so that it is
        // stored in the same round trip as the reservation.
        let code = self.draw_code(sms, &req.phone, &phone, info).await?;
        let (grant, reservation) = match pass {
            Pass::Exempt => {
                let c = code.to_store();
                let store = self.ctx.store.as_ref();
                // Not counted: nor will its verify be.
                store.otp_put(c, false).await?;
                (Grant::default(), None)
            }
            Pass::Counted => {
                let reserved = self
                    .reserve_send(&policy, &req, Scope::Whole(&code), info)
                    .await?;
                let reservation = reserved.reservation;
                reservation.count_rule_hits(policy.sms.shadow);
                let decided = decision::reserved(&reservation, reserved.challenge_audited);
                (self.apply(decided, &policy, info).await?, Some(reservation))
            }
            Pass::AddressExempt => {
                let scope = Scope::AllButTheAsker(&code);
                let reserved = self.reserve_send(&policy, &req, scope, info).await?;
                let reservation = reserved.reservation;
                reservation.count_rule_hits(policy.sms.shadow);
                let decided = decision::reserved(&reservation, reserved.challenge_audited);
                (self.apply(decided, &policy, info).await?, Some(reservation))
            }
            Pass::AskerCounted | Pass::RangeAllowed => {
                let scope = match pass {
                    Pass::AskerCounted => Scope::Asker,
                    _ => Scope::PhoneAndAsker,
                };
                let reserved = self.reserve_send(&policy, &req, scope, info).await?;
                let reservation = reserved.reservation;
                reservation.count_rule_hits(policy.sms.shadow);
                let decided = decision::reserved(&reservation, reserved.challenge_audited);
                let grant = self.apply(decided, &policy, info).await?;
                // Stored apart and not counted by the pumping guard, nor its
                // verify; the asker's windows give the send back without it.
                let store = self.ctx.store.as_ref();
                if let Err(e) = store.otp_put(code.to_store(), false).await {
                    reservation.roll_back_keeping(store, |_| false).await;
                    return Err(e.into());
                }
                (grant, Some(reservation))
            }
        };
        let undo = Undo {
            policy: &policy,
            reservation: reservation.as_ref(),
        };
        self.deliver_or_undo(&req, &code, undo, info).await?;
        Ok(grant.sent(&req.phone, sms))
    }

    /// A new code for `phone`, sealed with the code secret, asked for by
    /// the request's client IP.
    async fn draw_code(
        &self,
        sms: &SmsSettings,
        number: &PhoneNumber,
        phone: &Subject,
        info: &RequestInfo,
    ) -> Result<SmsCode, StoreError> {
        let text = code::generate(sms.code_length);
        Ok(SmsCode {
            mac: code::mac(self.secret().await?, number.e164(), &text),
            text,
            key: self.ctx.keys.subject_code(phone),
            attempts: sms.max_verify_attempts,
            ttl: sms.code_ttl,
            asker: self.code_client(info),
        })
    }

    /// Deliver the code; when that fails, give the reservation back and
    /// delete the code, so that the failed send costs the caller nothing:
    /// this send's code only, not one a racing send has put since, and the
    /// phone's earlier code comes back as it was (`otp_drop`). A message the
    /// provider refused itself (a number it will not text) still counts in
    /// the client address's windows, so that one address cannot make a
    /// provider call per request with it; a send counted in no address
    /// window (naming no client, or an allow-listed address's) keeps every
    /// other window instead. A send the provider declined for the
    /// request's own reason, or whose connection closed once the message
    /// went out, is given back whole within its address's and network's
    /// budgets, and is kept so past them; one naming no client has none
    /// (`within_failure_budget`). A provider that took the message
    /// and did not answer in time may have delivered it all the same: that
    /// send keeps its windows and its code, so they count it (or a slow
    /// gateway would text a phone without any limit, every send answered
    /// 502) and the code verifies if it arrives; only the pumping guard's
    /// count is given back. A code tried while its delivery was at the
    /// provider (a wrong try, or a right one that used it) keeps its send
    /// in the phone's windows: else each failed send would give a guesser
    /// a fresh code's tries on the phone, forgotten with the code.
    async fn deliver_or_undo(
        &self,
        req: &SendRequest,
        code: &SmsCode,
        undo: Undo<'_, '_>,
        info: &RequestInfo,
    ) -> Result<(), SmsRefusal> {
        let ttl_secs = code.ttl.as_secs();
        let store = self.ctx.store.as_ref();
        let Err(error) = self.deliver(req, &code.text, ttl_secs, info).await else {
            crate::metrics::sms_delivery(SmsDelivery::Delivered);
            store.code_delivered(&code.key, &code.mac);
            return Ok(());
        };
        // Not the pass's word: a send that names no client, or whose
        // address has no counted window, counts in no address window either.
        let address_counted = undo.reservation.is_some_and(decision::counts_an_address);
        let said = decision::give_back(&error, address_counted);
        // A send counted nowhere (a test rig's) has nothing to keep past a budget.
        let budgeted = error.spends_the_failure_budget() && undo.reservation.is_some();
        let give_back = match info.client_ip() {
            _ if !budgeted => said,
            Some(ip) => {
                self.within_failure_budget(undo.policy, said, ip, address_counted)
                    .await
            }
            None => decision::without_a_budget(&error, said, address_counted),
        };
        crate::metrics::sms_delivery(decision::delivery_outcome(&error, said, give_back));
        // Before the rollback's await: until then a code held locally from
        // an outage would be the one a verify checks, not this one.
        let guessed = if give_back.keeps_the_code() {
            store.code_delivered(&code.key, &code.mac);
            decision::Guessed::No
        } else {
            // Before the rollback: what the code came to decides it.
            let dropped = store.otp_drop(&code.key, &code.mac, code.attempts).await;
            if let Err(e) = &dropped {
                tracing::warn!(request_id = %crate::telemetry::request_id(), error = %e, "could not delete the code of a failed send");
            }
            decision::guessed_at(dropped.ok())
        };
        if let Some(reservation) = undo.reservation {
            let kept = |kind| decision::keeps_windows_of(give_back, guessed, kind);
            reservation.roll_back_keeping(store, kept).await;
        }
        Err(error.into())
    }

    /// Offer the send to the store. A captcha token goes to the provider
    /// only when the answer hangs on it: the first offer is refused by a
    /// captcha alone (a phone's, IP's or network's tier, the country's challenge), no
    /// window's rate limit and no pumping block; then, if the token passes,
    /// the send is offered again with the gate open (the first offer
    /// recorded nothing). A challenge the first offer started stays, and
    /// is audited before the provider is asked: a send dropped while it
    /// thinks (a shutdown past `server.shutdown_timeout`) keeps the row.
    /// So a send that needs no captcha, or that a limit refuses, never
    /// costs a provider call, and an address whose tokens the provider
    /// refused `captcha.failed_token_limit` times is refused 429 unasked. A
    /// caller's own word (`captcha.kind = "none"`) costs none and is taken at
    /// once, and so is a token in shadow mode, where the first offer already
    /// records.
    async fn reserve_send<'p>(
        &self,
        policy: &'p Policy,
        req: &SendRequest,
        scope: Scope<'_>,
        info: &RequestInfo,
    ) -> Result<Reserved<'p>, SmsRefusal> {
        let store = self.ctx.store.as_ref();
        // An allow-listed address is past every captcha tier: the gate is open.
        let no_captcha = matches!(scope, Scope::AllButTheAsker(_));
        let ask_later =
            !no_captcha && policy.captcha.asks_provider(&req.captcha) && !policy.sms.shadow;
        let passed_now = no_captcha
            || (!ask_later
                && req.captcha.offered()
                // Boxed, as below: the rare captcha path stays out of every
                // send's future (moved whole into its task).
                && Box::pin(self.ctx.captcha_passed_now(policy, &req.captcha, info, Action::SmsSend))
                    .await?);
        let member = crate::guard::event_member();
        let offer = |gate_open| {
            let hits = self.subject_hits(policy, &req.phone, info);
            let (hits, conversions, code) = match scope {
                Scope::Whole(code) => (
                    hits,
                    pumping::subjects(policy, &self.ctx.keys, &req.phone),
                    Some(code.to_store()),
                ),
                Scope::Asker => {
                    let asker = |hit: &SubjectHit<'_>| hit.subject.kind.is_callers_own();
                    (hits.into_iter().filter(asker).collect(), Vec::new(), None)
                }
                Scope::PhoneAndAsker => {
                    let kept = |hit: &SubjectHit<'_>| {
                        hit.subject.kind.is_callers_own() || hit.subject.kind == SubjectKind::Phone
                    };
                    (hits.into_iter().filter(kept).collect(), Vec::new(), None)
                }
                Scope::AllButTheAsker(code) => {
                    let others = |hit: &SubjectHit<'_>| !hit.subject.kind.is_callers_own();
                    (
                        hits.into_iter().filter(others).collect(),
                        pumping::subjects(policy, &self.ctx.keys, &req.phone),
                        Some(code.to_store()),
                    )
                }
            };
            Offer {
                hits,
                conversions,
                member: member.clone(),
                gate_open,
                force: policy.sms.shadow,
                code,
            }
        };
        let first = reserve(store, offer(passed_now)).await?;
        if !(ask_later && first.only_captcha_refuses()) {
            return Ok(Reserved::new(first));
        }
        for row in decision::started_challenges(&first) {
            self.ctx.audit(info, row);
        }
        let check = self
            .ctx
            .check_captcha(policy, &req.captcha, Action::SmsSend, info.client_ip());
        let check = Box::pin(check).await?;
        if matches!(check, ProofCheck::NotPassed) {
            return Ok(Reserved {
                reservation: first,
                challenge_audited: true,
            });
        }
        if let ProofCheck::Throttled(throttle) = check {
            // Refused here, not by the decision: its rules were met all the same.
            first.count_rule_hits(policy.sms.shadow);
            self.ctx.audit(info, throttle.audit_row(Action::SmsSend));
            return Err(SmsRefusal::RateLimited {
                rule: throttle.rule_name(),
                retry_after_ms: throttle.retry_after_ms(),
            });
        }
        Ok(Reserved::new(reserve(store, offer(true)).await?))
    }

    /// The subjects a send counts against, the phone first: its IP, an
    /// IPv6 client's network, its number prefix and the global count, each
    /// with the windows the rulebook gives its kind, where it has any.
    fn subject_hits<'p>(
        &self,
        policy: &'p Policy,
        number: &PhoneNumber,
        info: &RequestInfo,
    ) -> Vec<SubjectHit<'p>> {
        let sms = &policy.sms.settings;
        let prefix_digits = sms.prefix_digits as usize;
        let subjects = [
            Some(Subject::new(SubjectKind::Phone, number.e164())),
            info.client_ip()
                .map(|ip| Subject::new(SubjectKind::Ip, ip.subject_id())),
            info.client_ip()
                .and_then(|ip| ip.network_id(sms.network_bits))
                .map(|id| Subject::new(SubjectKind::Network, id)),
            Some(Subject::new(
                SubjectKind::Prefix,
                number.prefix(prefix_digits),
            )),
            Some(Subject::new(SubjectKind::Global, Action::SmsSend.as_str())),
        ];
        let mut hits = Vec::with_capacity(subjects.len());
        for subject in subjects.into_iter().flatten() {
            // The phone counts even without windows: it carries the code.
            let carries_code = subject.kind == SubjectKind::Phone;
            hits.extend(self.hit(policy, Action::SmsSend, subject, carries_code));
        }
        hits
    }

    /// Render the code's text in the asked locale and hand it to the provider.
    async fn deliver(
        &self,
        req: &SendRequest,
        code: &str,
        ttl_secs: u64,
        info: &RequestInfo,
    ) -> Result<(), DeliveryError> {
        let (locale, body) = self.templates.current().render_sms(
            req.locale.as_ref().map(Locale::as_str),
            code,
            ttl_secs,
        )?;
        let message = SmsMessage {
            to: req.phone.e164().to_string(),
            to_masked: req.phone.masked(),
            body,
            locale,
            request_id: info.request_id.clone(),
        };
        let sender = self.sender.current();
        sender.send(&message).await
    }
}
