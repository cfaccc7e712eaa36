//! What the in-process store keeps under one subject's lock: its keys, each
//! with a value of one kind and an expiry, read and changed the way Redis
//! would (an expired key is no key; an emptied window is no key).

use std::collections::HashMap;

use super::conversion::Conversion;
use super::expiring::Expiring;
use super::meter::Meters;
use super::window::Window;
use crate::store::StoreError;

/// The keys of one subject (one Redis Cluster hash tag).
#[derive(Default)]
pub(super) struct Subject {
    pub(super) entries: HashMap<String, Entry>,
    /// The store's clock when a call last touched the subject: the memory
    /// limit evicts the least recently touched first.
    pub(super) touched: u64,
    /// What the memory accounting last counted for the subject
    /// ([`Subject::footprint`]), so that a change adds only its difference.
    pub(super) bytes: usize,
}

/// One key's value and expiry.
pub(super) struct Entry {
    pub(super) value: Value,
    /// Gone once `now > expires_at`.
    pub(super) expires_at: Option<u64>,
}

impl Entry {
    pub(super) fn expired(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|at| now > at)
    }
}

/// A code as a send stored it: `left` is the asker's tries,
/// `others_left` everyone else's (otp_check.lua); `counted`: the send was
/// counted by the pumping guard.
pub(super) struct StoredCode {
    pub(super) mac: String,
    pub(super) left: u32,
    pub(super) others_left: u32,
    pub(super) asker: String,
    pub(super) counted: bool,
}

impl StoredCode {
    fn footprint(&self) -> usize {
        self.mac.capacity() + self.asker.capacity()
    }
}

/// A live code that a send replaced, kept beside the new one: should that
/// one's delivery fail, this one comes back as it was, until its own expiry
/// (otp_keep.lua).
pub(super) struct KeptCode {
    pub(super) code: StoredCode,
    pub(super) expires_at: u64,
}

/// What a key holds: the store's twin of a ZSET, a lock hash, a code hash, a string.
pub(super) enum Value {
    Window(Window),
    /// A lock record: `until` and `level` of the enforced lock, and apart
    /// (`s_until`, `s_level` in `login_attempt.lua`) the lock shadow calls
    /// started, what would have been, which no enforcing call reads.
    Lock {
        until: Option<(u64, u32)>,
        shadow: Option<(u64, u32)>,
    },
    /// The code, and the live codes it replaced, newest first, which a
    /// failed delivery puts back (otp_keep.lua).
    Otp {
        code: StoredCode,
        kept: Vec<KeptCode>,
    },
    Text(String),
    Meter(Meters),
    Conversion(Conversion),
    Expiring(Expiring),
}

impl Value {
    /// Heap bytes the value holds beyond its slot (see `footprint` on each).
    fn footprint(&self) -> usize {
        match self {
            Value::Window(w) => w.footprint(),
            Value::Lock { .. } => 0,
            Value::Otp { code, kept } => {
                code.footprint()
                    + kept.capacity() * std::mem::size_of::<KeptCode>()
                    + kept.iter().map(|k| k.code.footprint()).sum::<usize>()
            }
            Value::Text(t) => t.capacity(),
            Value::Meter(m) => m.footprint(),
            Value::Conversion(c) => c.footprint(),
            Value::Expiring(e) => e.footprint(),
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            Value::Window(_) => "window",
            Value::Lock { .. } => "lock",
            Value::Otp { .. } => "otp",
            Value::Text(_) => "text",
            Value::Meter(_) => "meter",
            Value::Conversion(_) => "conversion",
            Value::Expiring(_) => "expiring set",
        }
    }
}

/// The error Redis gives for a command on a key of another type.
pub(super) fn wrong_type(key: &str, found: &Value, wanted: &str) -> StoreError {
    StoreError::Protocol(format!(
        "WRONGTYPE: {key} holds a {}, not a {wanted}",
        found.type_name()
    ))
}

impl Subject {
    /// The bytes this subject costs the process, estimated: its slot in the
    /// store's map (counted twice: a hash table that doubles when 7/8 full
    /// keeps about one spare slot per used one after it grows) with its
    /// name `shard_len` long, its key table's slots, and each key's name and
    /// value. Allocator rounding is not counted; `docs/store.md` gives the
    /// measured ratio to the process's resident memory.
    pub(super) fn footprint(&self, shard_len: usize) -> usize {
        use std::mem::size_of;
        let own = 2 * (size_of::<(String, Subject)>() + 1) + shard_len;
        let slots = self.entries.capacity() * (size_of::<(String, Entry)>() + 1);
        let keys: usize = self
            .entries
            .iter()
            .map(|(key, entry)| key.capacity() + entry.value.footprint())
            .sum();
        own + slots + keys
    }

    /// Whether the memory limit must keep this subject now: it holds a live
    /// lock (evicting it would unlock the account to whoever floods the
    /// store with fresh names), a live pumping escalation, a process secret
    /// (the code key, kept without expiry) or an expiring set (the index of
    /// pumping blocks).
    pub(super) fn pinned(&self, now: u64) -> bool {
        self.entries.values().any(|e| {
            !e.expired(now)
                && match &e.value {
                    // A shadow lock holds no one: not worth keeping.
                    Value::Lock { until, .. } => until.is_some_and(|(u, _)| u > now),
                    Value::Conversion(c) => c.escalated(now),
                    Value::Text(_) | Value::Expiring(_) => true,
                    Value::Window(_) | Value::Otp { .. } | Value::Meter(_) => false,
                }
        })
    }

    /// The live entry at `key`, dropping it first when it has expired.
    pub(super) fn live(&mut self, key: &str, now: u64) -> Option<&mut Entry> {
        if self.entries.get(key).is_some_and(|e| e.expired(now)) {
            self.entries.remove(key);
        }
        self.entries.get_mut(key)
    }

    /// The window at `key`, changed in place by `f`, as Redis would: a missing
    /// key is an empty set, and a set left empty is no key at all. When `f`
    /// answers an expiry too, the key's is set to it (if `f` left events).
    pub(super) fn change_window<T>(
        &mut self,
        key: &str,
        now: u64,
        f: impl FnOnce(&mut Window) -> (T, Option<u64>),
    ) -> Result<T, StoreError> {
        if self.live(key, now).is_none() {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    value: Value::Window(Window::default()),
                    expires_at: None,
                },
            );
        }
        let entry = self.entries.get_mut(key).expect("inserted above");
        let Value::Window(window) = &mut entry.value else {
            return Err(wrong_type(key, &entry.value, "window"));
        };
        let (out, expires_at) = f(window);
        if window.is_empty() {
            self.entries.remove(key);
        } else if expires_at.is_some() {
            entry.expires_at = expires_at;
        }
        Ok(out)
    }

    /// Read the window at `key` (an empty one when absent).
    pub(super) fn read_window<T>(
        &mut self,
        key: &str,
        now: u64,
        f: impl FnOnce(&Window) -> T,
    ) -> Result<T, StoreError> {
        match self.live(key, now) {
            None => Ok(f(&Window::default())),
            Some(Entry {
                value: Value::Window(w),
                ..
            }) => Ok(f(w)),
            Some(e) => Err(wrong_type(key, &e.value, "window")),
        }
    }

    /// A copy of the meters at `key` (none when absent).
    pub(super) fn meters(&mut self, key: &str, now: u64) -> Result<Meters, StoreError> {
        match self.live(key, now) {
            None => Ok(Meters::default()),
            Some(Entry {
                value: Value::Meter(m),
                ..
            }) => Ok(m.clone()),
            Some(e) => Err(wrong_type(key, &e.value, "meter")),
        }
    }

    /// Put `meters` at `key`; `expires_at` when given, else the key's own.
    pub(super) fn put_meters(&mut self, key: &str, meters: Meters, expires_at: Option<u64>) {
        let kept = self.entries.get(key).and_then(|e| e.expires_at);
        self.entries.insert(
            key.to_owned(),
            Entry {
                value: Value::Meter(meters),
                expires_at: expires_at.or(kept),
            },
        );
    }

    /// The conversion at `key`, changed in place by `f` (an empty one when
    /// absent); `f` answers the key's new expiry, if it moves. A conversion
    /// left empty is no key, as an emptied hash is none in Redis.
    pub(super) fn change_conversion<T>(
        &mut self,
        key: &str,
        now: u64,
        f: impl FnOnce(&mut Conversion) -> (T, Option<u64>),
    ) -> Result<T, StoreError> {
        if self.live(key, now).is_none() {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    value: Value::Conversion(Conversion::default()),
                    expires_at: None,
                },
            );
        }
        let entry = self.entries.get_mut(key).expect("inserted above");
        let Value::Conversion(conversion) = &mut entry.value else {
            return Err(wrong_type(key, &entry.value, "conversion"));
        };
        let (out, expires_at) = f(conversion);
        if conversion.is_empty() {
            self.entries.remove(key);
        } else if expires_at.is_some() {
            entry.expires_at = expires_at;
        }
        Ok(out)
    }

    /// The expiring set at `key`, changed in place by `f` (an empty one when
    /// absent); `f` answers the key's new expiry, if it moves.
    pub(super) fn change_expiring<T>(
        &mut self,
        key: &str,
        now: u64,
        f: impl FnOnce(&mut Expiring) -> (T, Option<u64>),
    ) -> Result<T, StoreError> {
        if self.live(key, now).is_none() {
            self.entries.insert(
                key.to_owned(),
                Entry {
                    value: Value::Expiring(Expiring::default()),
                    expires_at: None,
                },
            );
        }
        let entry = self.entries.get_mut(key).expect("inserted above");
        let Value::Expiring(set) = &mut entry.value else {
            return Err(wrong_type(key, &entry.value, "expiring set"));
        };
        let (out, expires_at) = f(set);
        if set.is_empty() {
            self.entries.remove(key);
        } else if expires_at.is_some() {
            entry.expires_at = expires_at;
        }
        Ok(out)
    }

    /// `(until, level)` of the lock record at `key` as a call reads it, as
    /// `login_attempt.lua` does: an enforcing call the enforced lock; a
    /// `shadow` call the enforced lock while it holds, else whichever of
    /// the two ended later (its escalation history).
    pub(super) fn lock(
        &mut self,
        key: &str,
        now: u64,
        shadow: bool,
    ) -> Result<Option<(u64, u32)>, StoreError> {
        match self.live(key, now) {
            None => Ok(None),
            Some(Entry {
                value: Value::Lock { until, shadow: s },
                ..
            }) => Ok(match (shadow, *until, *s) {
                (false, enforced, _) => enforced,
                (true, Some(held), _) if held.0 > now => Some(held),
                // The later end; on a tie the shadow's, as the script reads it.
                (true, enforced, would_be) => {
                    enforced.into_iter().chain(would_be).max_by_key(|l| l.0)
                }
            }),
            Some(e) => Err(wrong_type(key, &e.value, "lock")),
        }
    }
}
