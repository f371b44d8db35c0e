//! `noetl serve timer` against a real nats-server with the whole mesh in
//! process: each tick starts exactly one execution with two replicas and a
//! crash; catch-up after a downtime; overlap `skip`; backfill; pause,
//! unpause and remove.

mod support;

use std::time::Duration;

use chrono::Utc;
use noetl_mesh::state::ExecStatus;
use noetl_timer::cron::tick_text;
use noetl_timer::policy::{CatchUp, Overlap};
use noetl_timer::start::{backfill, Backfill};
use noetl_timer::TimerError;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_start_exactly_one_execution_per_tick_through_a_crash() {
    let c = cluster().await;
    let s = schedules(&c);
    let mut r = record("every_second", "* * * * * *");
    r.overlap = Overlap::Allow;
    r.catch_up = CatchUp::Last(100);
    s.add(&r).await.unwrap();
    let a = Timer::start(&c).await;
    let b = Timer::start(&c).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // One replica crashes (nothing drained); the other carries on.
    a.task.abort();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    b.stop().await;

    let stored = s.get("every_second").await.unwrap();
    let last = stored.state.last_tick.clone().expect("ticks fired");
    let spec = stored.spec().unwrap();
    let created = at(&r.created_at);
    let expected: Vec<String> = spec
        .ticks_in(created + chrono::Duration::seconds(1), at(&last), 100)
        .unwrap()
        .into_iter()
        .map(tick_text)
        .filter(|t| at(t) > created)
        .collect();
    assert!(expected.len() >= 4, "ticks over 5 s: {expected:?}");
    let runs = wait_runs(&c.mesh, "every_second", "every tick ran", |runs| {
        runs.len() >= expected.len()
    })
    .await;
    let ticks: Vec<&String> = runs.keys().collect();
    assert_eq!(
        ticks,
        expected.iter().collect::<Vec<_>>(),
        "one run per tick, none missed"
    );
    assert_eq!(stored.state.started as usize, expected.len());
    // No other execution exists: no tick started twice under another id.
    assert_eq!(headers(&c.mesh).await.len(), expected.len());
    c.stop().await;
}

/// A schedule whose timer stopped 10 minutes ago (its last tick then):
/// restarted, it starts the `catch_up` most recent missed ticks.
async fn caught_up_after_downtime(catch_up: CatchUp) -> Vec<String> {
    // Keep clear of a minute boundary: the last tick is then missed,
    // not on time.
    let sec = Utc::now().timestamp() % 60;
    if !(3..=55).contains(&sec) {
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    let c = cluster().await;
    let s = schedules(&c);
    let now = Utc::now();
    let mut r = record("every_minute", "* * * * *");
    r.overlap = Overlap::Allow;
    r.catch_up = catch_up;
    r.created_at = tick_text(now - chrono::Duration::minutes(30));
    let spec = r.spec().unwrap();
    let down_at = spec
        .last_at_or_before(now - chrono::Duration::minutes(10))
        .unwrap();
    r.state.last_tick = Some(tick_text(down_at));
    s.add(&r).await.unwrap();
    let t = Timer::start(&c).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    t.stop().await;
    let want = catch_up.limit();
    let runs = wait_runs(&c.mesh, "every_minute", "caught up", |runs| {
        runs.len() >= want
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs_of(&c.mesh, "every_minute").await.len(), runs.len());
    let stored = s.get("every_minute").await.unwrap();
    let newest = spec.last_at_or_before(now).unwrap();
    assert_eq!(stored.state.last_tick, Some(tick_text(newest)));
    c.stop().await;
    runs.into_keys().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_downtime_the_n_most_recent_missed_ticks_start() {
    let ran = caught_up_after_downtime(CatchUp::Last(2)).await;
    assert_eq!(ran.len(), 2, "{ran:?}");
    let gap = at(&ran[1]) - at(&ran[0]);
    assert_eq!(
        gap,
        chrono::Duration::minutes(1),
        "the two most recent: {ran:?}"
    );
    let age = Utc::now() - at(&ran[1]);
    assert!(age < chrono::Duration::seconds(70), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_downtime_catch_up_none_starts_no_missed_tick() {
    let ran = caught_up_after_downtime(CatchUp::None).await;
    assert!(ran.is_empty(), "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlap_skip_starts_nothing_while_the_previous_run_runs() {
    let c = cluster().await;
    let s = schedules(&c);
    let mut r = record("slow", "* * * * * *");
    r.playbook = "tests/slow".into();
    r.workload.insert("seconds".into(), serde_json::json!(2.5));
    s.add(&r).await.unwrap();
    let t = Timer::start(&c).await;
    tokio::time::sleep(Duration::from_millis(5500)).await;
    t.stop().await;
    let stored = s.get("slow").await.unwrap();
    assert!(stored.state.skipped >= 2, "{:?}", stored.state);
    let runs = wait_runs(&c.mesh, "slow", "runs ended", |runs| {
        runs.len() as u64 == stored.state.started
            && runs.values().all(|h| h.status != ExecStatus::Running)
    })
    .await;
    assert!((1..=3).contains(&runs.len()), "{:?}", runs.keys());
    let mut spans: Vec<(String, String)> = runs
        .values()
        .map(|h| (h.started_at.clone(), h.ended_at.clone().unwrap()))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "runs overlap: {spans:?}");
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backfill_starts_one_run_per_tick_once() {
    let c = cluster().await;
    let s = schedules(&c);
    let mut r = record("hourly", "0 * * * *");
    r.tz = "Europe/Paris".into();
    r.paused = true;
    s.add(&r).await.unwrap();
    let fill = || async {
        backfill(Backfill {
            mesh: &c.mesh,
            record: &r,
            from: at("2026-01-01T00:00:00Z"),
            to: at("2026-01-01T03:00:00Z"),
        })
        .await
        .unwrap()
    };
    let first = fill().await;
    let ticks: Vec<&str> = first.iter().map(|b| b.tick.as_str()).collect();
    assert_eq!(
        ticks,
        [
            "2026-01-01T00:00:00Z",
            "2026-01-01T01:00:00Z",
            "2026-01-01T02:00:00Z",
            "2026-01-01T03:00:00Z"
        ]
    );
    assert!(first.iter().all(|b| !b.existed));
    let runs = wait_runs(&c.mesh, "hourly", "backfilled", |runs| {
        runs.len() == 4 && runs.values().all(|h| h.status == ExecStatus::Completed)
    })
    .await;
    assert_eq!(runs.keys().map(String::as_str).collect::<Vec<_>>(), ticks);
    let again = fill().await;
    assert!(again.iter().all(|b| b.existed), "{again:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(headers(&c.mesh).await.len(), 4, "nothing new");
    let bad = backfill(Backfill {
        mesh: &c.mesh,
        record: &r,
        from: at("2026-01-02T00:00:00Z"),
        to: at("2026-01-01T00:00:00Z"),
    })
    .await
    .unwrap_err();
    assert!(matches!(bad, TimerError::Range { .. }), "{bad}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_stops_firing_unpause_resumes_remove_deletes() {
    let c = cluster().await;
    let s = schedules(&c);
    let mut r = record("toggled", "* * * * * *");
    r.overlap = Overlap::Allow;
    s.add(&r).await.unwrap();
    let t = Timer::start(&c).await;
    wait_runs(&c.mesh, "toggled", "first run", |runs| !runs.is_empty()).await;

    s.set_paused("toggled", true, Utc::now()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let paused = runs_of(&c.mesh, "toggled").await.len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        runs_of(&c.mesh, "toggled").await.len(),
        paused,
        "paused fires nothing"
    );

    let resumed = s.set_paused("toggled", false, Utc::now()).await.unwrap();
    let resumed_at = at(resumed.resumed_at.as_deref().unwrap());
    let runs = wait_runs(&c.mesh, "toggled", "firing again", |runs| {
        runs.len() >= paused + 2
    })
    .await;
    // Ticks missed while paused were not caught up.
    let late: Vec<&String> = runs.keys().skip(paused).collect();
    assert!(
        late.iter().all(|t| at(t) > resumed_at),
        "{late:?} vs {resumed_at}"
    );

    s.remove("toggled").await.unwrap();
    assert!(matches!(
        s.get("toggled").await,
        Err(TimerError::NotFound { .. })
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    let removed = runs_of(&c.mesh, "toggled").await.len();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(
        runs_of(&c.mesh, "toggled").await.len(),
        removed,
        "removed fires nothing"
    );
    assert!(s.list().await.unwrap().is_empty());
    t.stop().await;
    c.stop().await;
}
