//! What a journal finds on disk that it did not write: the segments of a
//! run that died beside a running one are adopted without a restart, and a
//! segment with lines this release cannot read is set aside, not deleted.

use std::time::Duration;

use tollgate::audit::journal::read_lines;
use tollgate::audit::Journal;

use crate::audit_journal::{a_refusal, app_with, segment_files};
use crate::support::audit_db::{DbKind, TestDb};
use crate::support::audit_trail::{all_rows, each_once};
use crate::support::wait::eventually;

/// A running journal takes, when asked, the segments of a run that opened
/// after it and died (its lock released), and never its own nor a live
/// run's.
#[test]
fn a_running_journal_adopts_a_run_that_died_after_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let running = Journal::open(dir.path(), 1 << 30).unwrap();
    running.append(&a_refusal("own")).unwrap();
    let live = Journal::open(dir.path(), 1 << 30).unwrap();
    live.append(&a_refusal("live")).unwrap();
    live.rotate(true).unwrap();
    let died = Journal::open(dir.path(), 1 << 30).unwrap();
    let lost = a_refusal("died");
    died.append(&lost).unwrap();
    drop(died);
    assert!(
        running.sealed().is_empty(),
        "nothing adopted before it looks"
    );

    running.adopt();
    let adopted = running.sealed();
    assert_eq!(adopted.len(), 1, "only the dead run's segment: {adopted:?}");
    let events = read_lines(adopted[0].path()).unwrap().events;
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), [lost.id]);
    // Its own segments, sealed or open, stay where they are.
    running.rotate(true).unwrap();
    let own = running.sealed()[0].path().to_path_buf();
    running.adopt();
    let sealed = running.sealed();
    assert_eq!(sealed.len(), 2, "{sealed:?}");
    assert_eq!(sealed[0].path(), own);
    assert!(own.exists());
    let kept = live.sealed();
    assert!(
        kept.len() == 1 && kept[0].path().exists(),
        "the live run keeps its own: {kept:?}"
    );
}

/// While running, the old spool's names (`spool.jsonl`, `replay-*.jsonl`),
/// which no lock guards, are taken only once untouched for a minute: a
/// file being copied in is not cut short. At start-up they are taken at
/// once.
#[test]
fn a_running_journal_takes_an_unlocked_file_only_once_it_is_a_minute_old() {
    let dir = tempfile::tempdir().unwrap();
    let running = Journal::open(dir.path(), 1 << 30).unwrap();
    let path = dir.path().join("replay-copied-in.jsonl");
    let event = a_refusal("copied");
    std::fs::write(
        &path,
        format!("\n{}", serde_json::to_string(&event).unwrap()),
    )
    .unwrap();

    running.adopt();
    assert!(running.sealed().is_empty(), "being written, perhaps: left");
    assert!(path.exists());
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(std::time::SystemTime::now() - Duration::from_secs(61))
        .unwrap();
    drop(file);
    running.adopt();
    let adopted = running.sealed();
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    assert!(!path.exists());
    let events = read_lines(adopted[0].path()).unwrap().events;
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), [event.id]);
}

/// Two instances share a spool directory; one is killed and never comes
/// back: the other replays what it left within seconds, without a restart.
#[tokio::test]
async fn a_survivor_replays_what_a_dead_neighbour_left() {
    let db = TestDb::new(DbKind::Postgres).await;
    let spool = db.spool_dir();
    let _app = app_with(db.url.clone(), spool.clone(), false).await;
    // The neighbour: a journal on the same directory, gone without its
    // database having any of its events (as after a `kill -9`).
    let neighbour = Journal::open(&spool, 1 << 30).unwrap();
    let mut event = a_refusal("neighbour");
    event.request_id = Some("left-by-a-neighbour".to_string());
    neighbour.append(&event).unwrap();
    neighbour.sync().unwrap();
    drop(neighbour);

    let pool = db.connect().await;
    eventually(
        "the neighbour's event replayed",
        Duration::from_secs(30),
        || async { each_once(&all_rows(&pool).await, ["left-by-a-neighbour"]) },
    )
    .await;
    eventually(
        "the neighbour's segment deleted once replayed",
        Duration::from_secs(10),
        || async { segment_files(&spool).is_empty() },
    )
    .await;
}

/// A leftover segment with a whole line this release cannot read (here an
/// action it does not know, as a newer release might write), a torn line
/// and a crash's zeroed tail: its readable events are replayed, and the
/// file is kept as `<name>.unread`, byte for byte, for a release that can
/// read it; counted as `op="parse"`. The torn line and the zeros alone
/// would not keep it (a torn append's request was never answered).
#[tokio::test]
async fn a_segment_with_lines_this_release_cannot_read_is_kept() {
    let db = TestDb::new(DbKind::Postgres).await;
    let spool = db.spool_dir();
    std::fs::create_dir_all(&spool).unwrap();
    let line = |request_id: &str, action: Option<&str>| {
        let mut event = a_refusal(request_id);
        event.request_id = Some(request_id.to_string());
        let mut value = serde_json::to_value(&event).unwrap();
        if let Some(action) = action {
            value["action"] = action.into();
        }
        serde_json::to_string(&value).unwrap()
    };
    let torn = line("torn", None);
    let mut unreadable = format!("\n{}", line("readable", None));
    unreadable.push_str(&format!(
        "\n{}",
        line("from-a-newer-release", Some("teleport"))
    ));
    unreadable.push_str(&format!("\n{}", &torn[..torn.len() / 2]));
    let mut unreadable = unreadable.into_bytes();
    unreadable.extend_from_slice(&[0; 64]);
    let mut only_torn = format!("\n{}", line("beside-a-torn-line", None));
    only_torn.push_str(&format!("\n{}", &torn[..torn.len() / 3]));
    std::fs::write(spool.join("replay-a.jsonl"), &unreadable).unwrap();
    std::fs::write(spool.join("replay-b.jsonl"), only_torn.as_bytes()).unwrap();

    let app = app_with(db.url.clone(), spool.clone(), false).await;
    let pool = db.connect().await;
    eventually(
        "the readable events replayed",
        Duration::from_secs(30),
        || async { each_once(&all_rows(&pool).await, ["readable", "beside-a-torn-line"]) },
    )
    .await;
    let kept = |spool: &std::path::Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(spool)
            .unwrap()
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "unread"))
            .collect()
    };
    eventually("the segment set aside", Duration::from_secs(10), || async {
        kept(&spool).len() == 1 && segment_files(&spool).is_empty()
    })
    .await;
    let kept = kept(&spool);
    assert_eq!(
        std::fs::read(&kept[0]).unwrap(),
        unreadable,
        "kept byte for byte: {kept:?}"
    );
    let lines = read_lines(&kept[0]).unwrap();
    assert_eq!((lines.events.len(), lines.unread), (1, 1));
    let parse = "tollgate_audit_journal_errors_total{op=\"parse\"}";
    assert!(app.metric(parse).await >= 1.0, "counted");
    // Set aside, it is not adopted again, by this process or another: no
    // row twice, none of it lost.
    let another = Journal::open(&spool, 1 << 30).unwrap();
    assert!(another.sealed().is_empty(), "{:?}", another.sealed());
    drop(another);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        crate::support::audit_trail::request_id_counts(&all_rows(&pool).await)["readable"],
        1
    );
    assert_eq!(std::fs::read(&kept[0]).unwrap(), unreadable);
}
