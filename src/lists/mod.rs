//! Allow and block lists: entries from the config file (`[lists]`, reloaded
//! on SIGHUP) and from admins at run time (stored in the audit database,
//! read back by every instance every `lists.refresh_interval`), matched
//! against each request in memory: the hot path never waits for the database.

mod entry;
mod matcher;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use chrono::{SubsecRound, Utc};
use parking_lot::RwLock;
use uuid::Uuid;

pub use entry::{
    checked_note, normalise, EntryKind, EntrySource, ListEntry, ListName, MAX_NOTE_CHARS,
};
pub use matcher::{Listed, Matcher, Request as ListRequest};

/// Stored entries (the API's and the console's) the lists hold at most.
pub const MAX_STORED_ENTRIES: usize = 10_000;

/// A read's bound unless [`Lists::reading_within`] gives one: the
/// default `audit.read_timeout`.
const DEFAULT_READ_BOUND: Duration = Duration::from_secs(10);

/// Past the database's own bound: waiting for a pooled connection, or for
/// another refresh to end.
const READ_GRACE: Duration = Duration::from_secs(1);

/// Why a list change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The value is not of its kind, the row to delete is no entry, or
    /// the lists are full (400 `invalid_request`).
    #[error("{0}")]
    Invalid(String),
    /// No runtime entry has this id (404 `not_found`).
    #[error("no list entry has this id")]
    NotFound,
    /// There is no audit database to keep entries in, or it does not answer
    /// (503 `audit_unavailable`).
    #[error("list entries cannot be stored: {0}")]
    Unavailable(String),
}

/// Where admins' entries are kept (the audit database implements it): the
/// lists only need these three calls, so they do not depend on the audit
/// trail. A failure is `ListError::Unavailable`.
#[async_trait::async_trait]
pub trait ListStore: Send + Sync {
    /// The stored entries, oldest first, the read given up past `bound`
    /// (its lock waits included).
    async fn all(&self, bound: Duration) -> Result<Vec<ListEntry>, ListError>;
    /// Store `entry`, or answer the equal one already stored; given up
    /// past `bound` as a read is.
    async fn insert(&self, entry: &ListEntry, bound: Duration) -> Result<ListEntry, ListError>;
    /// Delete the entry with `id`; the entry, when there was one; given up
    /// past `bound`.
    async fn delete(&self, id: Uuid, bound: Duration) -> Result<Option<ListEntry>, ListError>;
}

/// The lists in force: the config file's entries and the stored ones, and
/// the matcher built from both, swapped whole when either changes.
pub struct Lists {
    db: Option<Arc<dyn ListStore>>,
    config: RwLock<Vec<ListEntry>>,
    stored: RwLock<Vec<ListEntry>>,
    matcher: ArcSwap<Matcher>,
    /// One refresh at a time: a periodic read that started before an
    /// admin's change must not install its older snapshot after it.
    refreshing: tokio::sync::Mutex<()>,
    /// How long one read of the stored entries may take (`audit.read_timeout`).
    read_bound: Duration,
    /// One admin's add at a time here, from the bound's check to the entry
    /// in force: concurrent adds each saw room under the bound and passed
    /// it together.
    adding: tokio::sync::Mutex<()>,
    /// Whether the stored entries were read at least once (or there are
    /// none to read): until then an admin's block entries are not in
    /// force here, and `/readyz` says so.
    read_once: AtomicBool,
    /// The stored rows no version reads, as the last refresh found them:
    /// each is warned of when first found, not at every refresh, and
    /// listed apart for the admins, as none of them is in force.
    unreadable: RwLock<Vec<ListEntry>>,
}

impl Lists {
    /// The config file's `entries` in force; `db` keeps the admins' entries
    /// (none without one).
    pub fn new(entries: Vec<ListEntry>, db: Option<Arc<dyn ListStore>>) -> Self {
        let nothing_stored = db.is_none();
        let lists = Self {
            db,
            config: RwLock::new(entries),
            stored: RwLock::new(Vec::new()),
            matcher: ArcSwap::from_pointee(Matcher::default()),
            refreshing: tokio::sync::Mutex::new(()),
            read_bound: DEFAULT_READ_BOUND,
            adding: tokio::sync::Mutex::new(()),
            read_once: AtomicBool::new(nothing_stored),
            unreadable: RwLock::default(),
        };
        lists.rebuild();
        lists
    }

    /// Each read of the stored entries given up past `bound`
    /// (`audit.read_timeout`): a database that takes the connection but not
    /// the query (a table another instance's migration locks) held the
    /// start-up's first read, no port bound, and later every refresh.
    pub fn reading_within(mut self, bound: Duration) -> Self {
        self.read_bound = bound;
        self
    }

    /// The matcher in force: one `Arc` clone.
    pub fn current(&self) -> Arc<Matcher> {
        self.matcher.load_full()
    }

    /// Whether the entries in force hold the stored ones: false from a
    /// start until the database answered once.
    pub fn read_once(&self) -> bool {
        self.read_once.load(Ordering::Acquire)
    }

    /// Every entry, the config file's first.
    pub fn entries(&self) -> Vec<ListEntry> {
        let mut all = self.config.read().clone();
        all.extend(self.stored.read().iter().cloned());
        all
    }

    /// Put a reloaded config file's entries in force.
    pub fn replace_config(&self, entries: Vec<ListEntry>) {
        *self.config.write() = entries;
        self.rebuild();
    }

    /// Read the stored entries again (every instance does, periodically).
    pub async fn refresh(&self) -> Result<(), ListError> {
        let Some(db) = &self.db else {
            return Ok(());
        };
        let bound = self.read_bound;
        // The database bounds the query itself; this bounds the rest (a
        // connection from a pool all of whose connections are busy).
        let read = async {
            let _one_at_a_time = self.refreshing.lock().await;
            let stored = db.all(bound).await?;
            self.put_in_force(stored);
            crate::metrics::lists_read();
            Ok(())
        };
        tokio::time::timeout(bound + READ_GRACE, read)
            .await
            .unwrap_or_else(|_| {
                Err(ListError::Unavailable(format!(
                    "no answer within {bound:?}"
                )))
            })
    }

    fn put_in_force(&self, stored: Vec<ListEntry>) {
        let (valid, invalid) = in_force(stored);
        for entry in self.replace_unreadable(invalid) {
            tracing::warn!(id = ?entry.id, kind = entry.kind.as_str(), value = %entry.value, "stored list entry has a value no version since reads (a range the translators' change refuses, a row edited by hand); not in force");
        }
        *self.stored.write() = valid;
        self.rebuild();
        self.read_once.store(true, Ordering::Release);
    }

    /// The stored rows the last refresh could not put in force (a value no
    /// version since reads): an admin's entry that looks stored and is not.
    pub fn unreadable(&self) -> Vec<ListEntry> {
        self.unreadable.read().clone()
    }

    /// Keep `invalid` as the unreadable rows; those the last refresh did
    /// not find, to warn of: one line a row, not one every
    /// `refresh_interval`.
    fn replace_unreadable(&self, invalid: Vec<ListEntry>) -> Vec<ListEntry> {
        let mut kept = self.unreadable.write();
        // A set, not a scan of `kept` a row: thousands of rows, refreshed
        // every 100 ms, would hold the lock (and the admins' reads) for
        // their square.
        let known: HashSet<Option<Uuid>> = kept.iter().map(|e| e.id).collect();
        let fresh = invalid
            .iter()
            .filter(|e| !known.contains(&e.id))
            .cloned()
            .collect();
        *kept = invalid;
        // Under the lock: two refreshes' gauges land in the lists' order.
        crate::metrics::list_unreadable_entries(kept.len());
        fresh
    }

    /// Store an entry (an equal one already stored is answered instead),
    /// unless the stored entries number [`MAX_STORED_ENTRIES`] already,
    /// tell `committed` (the caller audits there, before any further wait
    /// that could drop the request), and put it in force here at once.
    pub async fn add(
        &self,
        list: ListName,
        kind: EntryKind,
        value: &str,
        note: &str,
        committed: impl FnOnce(&ListEntry),
    ) -> Result<ListEntry, ListError> {
        let db = self.db()?;
        let value = normalise(kind, value).map_err(ListError::Invalid)?;
        let note = checked_note(note).map_err(ListError::Invalid)?;
        let _one_at_a_time = self.adding.lock().await;
        self.room_for(list, kind, &value)?;
        let entry = ListEntry {
            id: Some(crate::uuid_v7::now()),
            list,
            kind,
            value,
            note,
            source: EntrySource::Admin,
            created_at: Some(Utc::now().trunc_subsecs(3)),
        };
        let stored = db.insert(&entry, self.read_bound).await?;
        committed(&stored);
        let added = stored.clone();
        self.settle(move |entries| {
            if !entries.iter().any(|e| e.id == added.id) {
                entries.push(added);
            }
        })
        .await;
        Ok(stored)
    }

    /// Whether a new entry may be stored: every request on every instance
    /// scans the entries, and every instance reads them all each
    /// `lists.refresh_interval`, so an operator's credential (or a leaked
    /// one) adding them in a loop would slow every decision. As this
    /// instance last read them: others' additions within the refresh
    /// interval may pass it by a little.
    fn room_for(&self, list: ListName, kind: EntryKind, value: &str) -> Result<(), ListError> {
        let stored = self.stored.read();
        let again = || {
            stored
                .iter()
                .any(|e| e.list == list && e.kind == kind && e.value == value)
        };
        if stored.len() >= MAX_STORED_ENTRIES && !again() {
            return Err(ListError::Invalid(format!(
                "the lists hold {MAX_STORED_ENTRIES} stored entries, their most: delete some, or use a range"
            )));
        }
        Ok(())
    }

    /// Delete a stored entry, tell `committed`, and take it out of force
    /// here at once; the entry deleted.
    pub async fn remove(
        &self,
        id: Uuid,
        committed: impl FnOnce(&ListEntry),
    ) -> Result<ListEntry, ListError> {
        let db = self.db()?;
        let removed = db
            .delete(id, self.read_bound)
            .await?
            .ok_or(ListError::NotFound)?;
        committed(&removed);
        self.settle(|entries| {
            entries.retain(|e| e.id != Some(id));
            let mut unreadable = self.unreadable.write();
            unreadable.retain(|e| e.id != Some(id));
            crate::metrics::list_unreadable_entries(unreadable.len());
        })
        .await;
        Ok(removed)
    }

    /// Put a change the database committed in force here: by reading every
    /// entry back, or, when that read fails, by `change` to the entries
    /// read last (the next refresh brings the rest). Either way the change
    /// stands and its caller audits it: answered 503, it would be made
    /// without its audit row.
    async fn settle(&self, change: impl FnOnce(&mut Vec<ListEntry>)) {
        let Err(e) = self.refresh().await else {
            return;
        };
        tracing::warn!(error = %e, "list entries not read back after a change; the change is in force here, the rest at the next refresh");
        let _one_at_a_time = self.refreshing.lock().await;
        change(&mut self.stored.write());
        self.rebuild();
    }

    fn db(&self) -> Result<&dyn ListStore, ListError> {
        self.db
            .as_deref()
            .ok_or_else(|| ListError::Unavailable("no audit database is configured".into()))
    }

    fn rebuild(&self) {
        let config = self.config.read();
        let stored = self.stored.read();
        let matcher = Matcher::new(config.iter().chain(stored.iter()));
        self.matcher.store(Arc::new(matcher));
    }
}

/// Re-read the stored entries every `every`, so that what an admin added on
/// another instance is in force here within that time.
pub fn spawn_refresh(lists: Arc<Lists>, every: std::time::Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = lists.refresh().await {
                tracing::warn!(error = %e, at = %Utc::now(), "list entries not refreshed; the last ones read stay in force");
            }
        }
    })
}

/// The stored entries as this version matches them, and those it cannot.
/// Each value is normalised again: one an earlier version wrote in another
/// form (`64:ff9b::cb00:7107/128`, before translated addresses counted as
/// IPv4) stays in force, listed under its id, as this version reads it
/// (`203.0.113.7/32`); one a new entry could not be now (`0.0.0.0/0`)
/// stays in force as it was taken. A row that is no entry (edited by hand,
/// or a range every version since the translators' refuses) is left out,
/// not allowed to stop every refresh.
fn in_force(stored: Vec<ListEntry>) -> (Vec<ListEntry>, Vec<ListEntry>) {
    let mut valid = Vec::with_capacity(stored.len());
    let mut invalid = Vec::new();
    for mut entry in stored {
        match entry::renormalise(entry.kind, &entry.value) {
            Ok(value) => {
                entry.value = value;
                valid.push(entry);
            }
            Err(_) => invalid.push(entry),
        }
    }
    (valid, invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(kind: EntryKind, value: &str) -> ListEntry {
        ListEntry {
            id: Some(Uuid::nil()),
            list: ListName::Block,
            kind,
            value: value.into(),
            note: String::new(),
            source: EntrySource::Admin,
            created_at: None,
        }
    }

    /// A store that keeps entries but whose read of them fails.
    #[derive(Default)]
    struct UnreadableStore(parking_lot::Mutex<Vec<ListEntry>>);

    #[async_trait::async_trait]
    impl ListStore for UnreadableStore {
        async fn all(&self, _bound: Duration) -> Result<Vec<ListEntry>, ListError> {
            Err(ListError::Unavailable("the read failed".into()))
        }
        async fn insert(
            &self,
            entry: &ListEntry,
            _bound: Duration,
        ) -> Result<ListEntry, ListError> {
            // As a database would: others run while this one waits.
            tokio::task::yield_now().await;
            let mut entries = self.0.lock();
            let equal = |e: &&ListEntry| {
                e.list == entry.list && e.kind == entry.kind && e.value == entry.value
            };
            if let Some(stored) = entries.iter().find(equal) {
                return Ok(stored.clone());
            }
            entries.push(entry.clone());
            Ok(entry.clone())
        }
        async fn delete(&self, id: Uuid, _bound: Duration) -> Result<Option<ListEntry>, ListError> {
            let mut entries = self.0.lock();
            let at = entries.iter().position(|e| e.id == Some(id));
            Ok(at.map(|at| entries.remove(at)))
        }
    }

    /// A change the database committed is answered (and so audited) and in
    /// force here even when reading the entries back fails.
    #[tokio::test]
    async fn a_committed_change_stands_when_the_read_back_fails() {
        let lists = Lists::new(Vec::new(), Some(Arc::new(UnreadableStore::default())));
        let listed = |lists: &Lists| {
            let ip = "198.51.100.7".parse().expect("an address");
            let request = ListRequest {
                ip: Some(ip),
                ..ListRequest::default()
            };
            lists.current().check(request) == Listed::Blocked(EntryKind::Ip)
        };
        // Each change is told once committed, before it is in force here.
        let told = std::cell::Cell::new(0);
        let added_told = |_: &ListEntry| {
            assert!(!listed(&lists), "told before it is settled");
            told.set(told.get() + 1);
        };
        let added = lists
            .add(
                ListName::Block,
                EntryKind::Ip,
                "198.51.100.0/24",
                "",
                added_told,
            )
            .await
            .expect("added");
        assert!(listed(&lists));
        let id = added.id.expect("an id");
        let removed_told = |_: &ListEntry| {
            assert!(listed(&lists), "told before it is settled");
            told.set(told.get() + 1);
        };
        lists.remove(id, removed_told).await.expect("removed");
        assert_eq!(told.get(), 2);
        assert!(!listed(&lists));
        assert!(lists.entries().is_empty());
    }

    /// Past [`MAX_STORED_ENTRIES`] a new entry is refused; an equal one
    /// is still answered, and a deletion makes room.
    #[tokio::test]
    async fn the_stored_entries_are_bounded() {
        let full: Vec<ListEntry> = (0..MAX_STORED_ENTRIES)
            .map(|n| ListEntry {
                id: Some(Uuid::from_u128(n as u128 + 1)),
                ..stored(EntryKind::User, &format!("user{n}"))
            })
            .collect();
        let store = UnreadableStore(parking_lot::Mutex::new(full.clone()));
        let lists = Lists::new(Vec::new(), Some(Arc::new(store)));
        *lists.stored.write() = full;
        let add = |value: &'static str| {
            let lists = &lists;
            async move {
                lists
                    .add(ListName::Block, EntryKind::User, value, "", |_| {})
                    .await
            }
        };
        let Err(ListError::Invalid(why)) = add("one-more").await else {
            panic!("one past the bound is stored");
        };
        assert!(why.contains("10000"), "{why}");
        assert!(add("user7").await.is_ok(), "an equal entry is answered");
        lists
            .remove(Uuid::from_u128(1), |_| {})
            .await
            .expect("removed");
        assert!(add("one-more").await.is_ok(), "room once one is gone");

        // Adds at once each see room under the bound: one at a time here.
        lists
            .remove(Uuid::from_u128(2), |_| {})
            .await
            .expect("removed");
        lists
            .remove(Uuid::from_u128(3), |_| {})
            .await
            .expect("removed");
        let values: Vec<String> = (0..20).map(|n| format!("racer{n}")).collect();
        let racing = values
            .iter()
            .map(|value| lists.add(ListName::Block, EntryKind::User, value, "", |_| {}));
        let added = futures::future::join_all(racing)
            .await
            .into_iter()
            .filter(Result::is_ok)
            .count();
        assert_eq!(added, 2, "two places were free");
        assert_eq!(lists.stored.read().len(), MAX_STORED_ENTRIES);
    }

    #[test]
    fn an_unreadable_row_is_warned_of_when_first_found() {
        let lists = Lists::new(Vec::new(), None);
        let row = stored(EntryKind::Phone, "not a phone");
        let rows = vec![row.clone()];
        let refresh = |found: Vec<ListEntry>| lists.replace_unreadable(found).len();
        assert_eq!(refresh(rows.clone()), 1);
        assert_eq!(refresh(rows.clone()), 0, "not again");
        assert_eq!(lists.unreadable(), rows, "listed for the admins");
        assert_eq!(refresh(Vec::new()), 0);
        assert_eq!(refresh(rows), 1, "back again");
    }

    /// The gauge says how many stored rows are out of force, at every
    /// refresh: what an alert on an admin's entry that blocks no one reads.
    #[test]
    fn the_unreadable_rows_are_counted_in_a_gauge() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let gauge = || {
            let page = handle.render();
            page.lines()
                .find_map(|line| line.strip_prefix("tollgate_list_unreadable_entries "))
                .map(str::to_owned)
        };
        let store = Arc::new(UnreadableStore::default());
        let lists = Lists::new(Vec::new(), Some(store.clone()));
        let mut misread = stored(EntryKind::Phone, "not a phone");
        misread.id = Some(crate::uuid_v7::now());
        store.0.lock().push(misread.clone());
        let rows = vec![misread.clone(), stored(EntryKind::Ip, "64:ff9b::/64")];
        metrics::with_local_recorder(&recorder, || lists.replace_unreadable(rows));
        assert_eq!(gauge().as_deref(), Some("2"));
        // Deleted while the entries cannot be read back: the delete's own
        // fallback takes it off the gauge, not only the next refresh.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let id = misread.id.expect("an id");
        metrics::with_local_recorder(&recorder, || runtime.block_on(lists.remove(id, |_| {})))
            .expect("removed");
        assert_eq!(gauge().as_deref(), Some("1"), "the delete's fallback");
        metrics::with_local_recorder(&recorder, || lists.replace_unreadable(Vec::new()));
        assert_eq!(gauge().as_deref(), Some("0"), "mended: back to 0");
    }

    /// A store that holds no entries and reads them fine.
    struct EmptyStore;

    #[async_trait::async_trait]
    impl ListStore for EmptyStore {
        async fn all(&self, _bound: Duration) -> Result<Vec<ListEntry>, ListError> {
            Ok(Vec::new())
        }
        async fn insert(
            &self,
            entry: &ListEntry,
            _bound: Duration,
        ) -> Result<ListEntry, ListError> {
            Ok(entry.clone())
        }
        async fn delete(
            &self,
            _id: Uuid,
            _bound: Duration,
        ) -> Result<Option<ListEntry>, ListError> {
            Ok(None)
        }
    }

    /// A read stamps the gauge `TollgateListsStale` reads; a failed one
    /// leaves it as it was, so that it ages.
    #[test]
    fn a_read_stamps_the_lists_read_gauge_and_a_failed_one_does_not() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let stamp = || {
            let page = handle.render();
            page.lines()
                .find_map(|line| line.strip_prefix("tollgate_lists_read_timestamp_seconds "))
                .map(|v| v.parse::<f64>().expect("a number"))
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let refresh = |lists: &Lists| {
            metrics::with_local_recorder(&recorder, || runtime.block_on(lists.refresh()))
        };
        let failing = Lists::new(Vec::new(), Some(Arc::new(UnreadableStore::default())));
        assert!(refresh(&failing).is_err());
        assert_eq!(stamp(), None, "no read yet");
        let reading = Lists::new(Vec::new(), Some(Arc::new(EmptyStore)));
        refresh(&reading).expect("read");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let read = stamp().expect("stamped");
        assert!((now - read).abs() < 60.0, "{read} against {now}");
        assert!(refresh(&failing).is_err());
        assert_eq!(stamp(), Some(read), "a failed read leaves it");
    }

    #[test]
    fn stored_entries_of_an_earlier_form_stay_in_force_as_this_version_reads_them() {
        let (valid, invalid) = in_force(vec![
            stored(EntryKind::Ip, "203.0.113.0/24"),
            stored(EntryKind::Ip, "64:ff9b::cb00:7107/128"),
            stored(EntryKind::Ip, "64:ff9b::/64"),
            stored(EntryKind::Phone, "not a phone"),
        ]);
        let values: Vec<&str> = valid.iter().map(|e| e.value.as_str()).collect();
        assert_eq!(values, ["203.0.113.0/24", "203.0.113.7/32"]);
        assert!(valid.iter().all(|e| e.id == Some(Uuid::nil())));
        let left_out: Vec<&str> = invalid.iter().map(|e| e.value.as_str()).collect();
        assert_eq!(left_out, ["64:ff9b::/64", "not a phone"]);
    }
}
