//! Leaving a throttling captcha provider alone. A 429 counts against no
//! one's budget of refused tokens (no one's token is at fault), so without
//! a pause one address could keep the provider's throttle on the operator's
//! secret at no cost, and every real user's token would fail meanwhile.
//!
//! One pause per throttle: the calls already out when the first 429 came
//! back answer 429 too, and they are that same throttle, not more of it
//! (six of them once doubled a 1 s pause to 30 s). A pause doubles only
//! after a 429 to a call sent once the last pause had ended; the streak
//! ends with an answer to such a call that is not a 429 nor a 5xx, or ten
//! minutes after the last pause without one (a provider that only timed
//! out meanwhile is not throttling still).
//! Held by the guard, not the provider client, so that a reload of the
//! settings does not forget it; a reload to another secret or address
//! (another account, another provider) does.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest pause, whatever `Retry-After` asks: people wait through it.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);

/// How long after a pause the next 429 still counts as one in a row.
const STREAK_MEMORY: Duration = Duration::from_secs(600);

/// This process's view of the provider's throttle: the newest provider's
/// (first), and the one before it, whose requests may still be out after
/// a reload.
#[derive(Debug, Default)]
pub struct ProviderPause(Mutex<[PauseState; 2]>);

impl ProviderPause {
    fn states(&self) -> std::sync::MutexGuard<'_, [PauseState; 2]> {
        // A panic elsewhere while it was held leaves plain fields.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `provider` (a fingerprint of its address and secret) is to
    /// be left alone now. Every call asks this first, so a provider new
    /// since a reload starts here with no pause of the old one's; a request
    /// still on the settings before the reload reads the old one's and
    /// leaves the new one's as it is.
    pub fn paused(&self, provider: u64) -> bool {
        let mut states = self.states();
        if !states.iter().any(|s| s.provider == provider) {
            states[1] = states[0];
            states[0] = PauseState {
                provider,
                ..PauseState::default()
            };
        }
        states
            .iter()
            .any(|s| s.provider == provider && s.paused(Instant::now()))
    }

    /// A 429 from `provider` to a call sent at `sent`; answers the pause it
    /// set, if any. An answer of a provider replaced twice since says nothing.
    pub fn throttled(
        &self,
        provider: u64,
        sent: Instant,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        let mut states = self.states();
        let state = states.iter_mut().find(|s| s.provider == provider)?;
        state.throttled(sent, Instant::now(), retry_after)
    }

    /// Any other answer of `provider` to a call sent at `sent`, by status.
    pub fn answered(&self, provider: u64, sent: Instant, status: u16) {
        let mut states = self.states();
        if let Some(state) = states.iter_mut().find(|s| s.provider == provider) {
            state.answered(sent, status);
        }
    }
}

/// The pause's bookkeeping; time comes in as arguments.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct PauseState {
    /// The provider it is of.
    provider: u64,
    /// When the last pause began, and when it ends.
    began: Option<Instant>,
    until: Option<Instant>,
    /// Pauses in a row, each twice the last without a `Retry-After`.
    streak: u32,
}

impl PauseState {
    fn paused(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// Whether a call sent at `sent` went out before the last pause began:
    /// it raced that pause's 429 and says nothing new.
    fn raced_the_pause(&self, sent: Instant) -> bool {
        self.began.is_some_and(|began| sent < began)
    }

    fn throttled(
        &mut self,
        sent: Instant,
        now: Instant,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        if self.raced_the_pause(sent) {
            // The same throttle: it may only ask for longer.
            let asked = retry_after?.min(MAX_PAUSE);
            let until = now + asked;
            self.until = self.until.max(Some(until));
            return Some(asked);
        }
        if retry_after == Some(Duration::ZERO) {
            return None;
        }
        if self
            .until
            .is_some_and(|until| now.saturating_duration_since(until) > STREAK_MEMORY)
        {
            self.streak = 0;
        }
        self.streak = self.streak.saturating_add(1);
        let length = pause_length(self.streak, retry_after);
        self.began = Some(now);
        self.until = Some(now + length);
        Some(length)
    }

    fn answered(&mut self, sent: Instant, status: u16) {
        // A 5xx is a provider in trouble, not one that stopped throttling.
        if status != 429 && status < 500 && !self.raced_the_pause(sent) {
            self.streak = 0;
        }
    }
}

/// How long to leave the provider alone after the `streak`th pause in a
/// row: its `Retry-After` if it gave one, else 1 s, 2 s, 4 s, …; at most
/// `MAX_PAUSE` either way.
fn pause_length(streak: u32, retry_after: Option<Duration>) -> Duration {
    let doubling = Duration::from_secs(1u64 << streak.saturating_sub(1).min(5));
    retry_after.unwrap_or(doubling).min(MAX_PAUSE)
}

/// `Retry-After` in whole seconds; too many digits for a number is the
/// longest pause. The HTTP-date form is not read (the doubling applies).
pub fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    let value = response.headers().get(reqwest::header::RETRY_AFTER)?;
    seconds(value.to_str().ok()?)
}

fn seconds(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_secs(text.parse().unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn each_pause_in_a_row_doubles_up_to_the_longest() {
        assert_eq!(pause_length(1, None), secs(1));
        assert_eq!(pause_length(2, None), secs(2));
        assert_eq!(pause_length(3, None), secs(4));
        assert_eq!(pause_length(6, None), secs(30));
        assert_eq!(pause_length(40, None), secs(30));
        assert_eq!(pause_length(1, Some(secs(7))), secs(7));
        assert_eq!(pause_length(3, Some(secs(3600))), MAX_PAUSE);
    }

    #[test]
    fn retry_after_is_whole_seconds_and_a_huge_one_is_the_longest() {
        assert_eq!(seconds("2"), Some(secs(2)));
        assert_eq!(seconds(" 7 "), Some(secs(7)));
        assert_eq!(seconds("99999999999999999999999"), Some(secs(u64::MAX)));
        assert_eq!(
            pause_length(1, seconds("99999999999999999999999")),
            MAX_PAUSE
        );
        for unread in ["", "-1", "1.5", "Wed, 21 Oct 2026 07:28:00 GMT", "+3"] {
            assert_eq!(seconds(unread), None, "{unread}");
        }
    }

    #[test]
    fn the_calls_out_when_a_throttle_began_do_not_lengthen_its_pause() {
        let t0 = Instant::now();
        let mut state = PauseState::default();
        // Six calls sent at once; the first 429 pauses for a second.
        assert_eq!(state.throttled(t0, t0 + secs(1), None), Some(secs(1)));
        for _ in 0..5 {
            assert_eq!(state.throttled(t0, t0 + secs(1), None), None);
        }
        assert_eq!(state.streak, 1);
        assert!(state.paused(t0 + secs(1)));
        assert!(!state.paused(t0 + secs(2)));
        // One of them asks for longer: it may lengthen the pause, not double it.
        assert_eq!(
            state.throttled(t0, t0 + secs(1), Some(secs(5))),
            Some(secs(5))
        );
        assert!(state.paused(t0 + secs(5)));
        assert_eq!(state.streak, 1);
    }

    #[test]
    fn a_429_after_the_pause_doubles_it_and_an_answer_ends_the_streak() {
        let t0 = Instant::now();
        let mut state = PauseState::default();
        state.throttled(t0, t0 + secs(1), None);
        // A late answer to a call sent before the pause changes nothing.
        state.answered(t0, 200);
        assert_eq!(state.streak, 1);
        // A call sent after the pause ended, throttled again: two seconds.
        let t1 = t0 + secs(3);
        assert_eq!(state.throttled(t1, t1, None), Some(secs(2)));
        assert!(state.paused(t1 + Duration::from_millis(1999)));
        // A 5xx or a 429 to a later call does not end the streak; a 200 or 400 does.
        let t2 = t1 + secs(3);
        state.answered(t2, 503);
        assert_eq!(state.streak, 2);
        state.answered(t2, 400);
        assert_eq!(state.streak, 0);
        assert_eq!(state.throttled(t2, t2, None), Some(secs(1)));
    }

    #[test]
    fn a_429_long_after_the_last_pause_starts_a_new_streak() {
        let t0 = Instant::now();
        let mut state = PauseState::default();
        state.throttled(t0, t0, None);
        let t1 = t0 + secs(5);
        assert_eq!(state.throttled(t1, t1, None), Some(secs(2)));
        // Only timeouts and 5xx since: ten minutes on, a 429 is a new throttle.
        let t2 = t1 + secs(2) + STREAK_MEMORY + secs(1);
        assert_eq!(state.throttled(t2, t2, None), Some(secs(1)));
    }

    #[test]
    fn another_provider_has_no_pause_of_its_own_yet() {
        let pause = ProviderPause::default();
        let sent = Instant::now();
        assert!(!pause.paused(1));
        assert_eq!(pause.throttled(1, sent, Some(secs(20))), Some(secs(20)));
        assert!(pause.paused(1));
        assert!(!pause.paused(2), "a new secret or address is asked at once");
        assert_eq!(
            pause.throttled(2, Instant::now(), Some(secs(20))),
            Some(secs(20))
        );
        // Late answers and requests of the old provider (on the settings
        // before the reload) leave the new one's pause alone.
        assert_eq!(
            pause.throttled(1, sent, Some(secs(25))),
            Some(secs(25)),
            "the old one's own pause, asked longer"
        );
        pause.answered(1, Instant::now(), 200);
        assert!(pause.paused(1), "the old one's own pause");
        assert!(pause.paused(2));
        assert_eq!(pause.states()[0].streak, 1);
        // A third provider: the first is forgotten.
        assert!(!pause.paused(3));
        assert!(pause.paused(2));
        assert!(!pause.paused(1), "a provider two reloads back starts anew");
    }

    #[test]
    fn retry_after_zero_asks_for_no_pause_and_starts_no_streak() {
        let t0 = Instant::now();
        let mut state = PauseState::default();
        assert_eq!(state.throttled(t0, t0, Some(Duration::ZERO)), None);
        assert_eq!(state, PauseState::default());
        assert!(!state.paused(t0));
    }
}
