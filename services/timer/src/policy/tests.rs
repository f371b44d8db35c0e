use super::*;
use crate::cron::SpecText;
use crate::record::execution_id;

fn at(s: &str) -> DateTime<Utc> {
    instant(s).unwrap()
}

fn every_minute() -> CronSpec {
    CronSpec::parse(SpecText {
        expr: "* * * * *",
        tz: "UTC",
    })
    .unwrap()
}

fn record(overlap: Overlap, catch_up: CatchUp) -> ScheduleRecord {
    ScheduleRecord {
        name: "s".into(),
        playbook: "p".into(),
        version: None,
        cron: "* * * * *".into(),
        tz: "UTC".into(),
        workload: Default::default(),
        overlap,
        catch_up,
        paused: false,
        created_at: "2026-01-01T00:00:00Z".into(),
        resumed_at: None,
        state: FiringState::default(),
    }
}

fn decide_at(r: &ScheduleRecord, now: &str, previous: Previous) -> Plan {
    decide(&Situation {
        record: r,
        spec: &every_minute(),
        now: at(now),
        grace: Duration::from_secs(5),
        previous,
    })
}

fn started(plan: &Plan) -> Vec<&str> {
    plan.actions
        .iter()
        .filter_map(|a| match a {
            Action::Start { tick } => Some(tick.as_str()),
            Action::Cancel { .. } => None,
        })
        .collect()
}

#[test]
fn policies_parse_and_print_back() {
    for p in ["skip", "queue", "allow", "cancel-running"] {
        assert_eq!(p.parse::<Overlap>().unwrap().to_string(), p);
    }
    assert!("sometimes".parse::<Overlap>().is_err());
    assert_eq!("none".parse::<CatchUp>(), Ok(CatchUp::None));
    assert_eq!("0".parse::<CatchUp>(), Ok(CatchUp::None));
    assert_eq!("3".parse::<CatchUp>(), Ok(CatchUp::Last(3)));
    assert!("-1".parse::<CatchUp>().is_err());
    assert_eq!(CatchUp::default(), CatchUp::Last(1));
    assert_eq!(Overlap::default(), Overlap::Skip);
}

#[test]
fn only_the_n_most_recent_missed_ticks_are_caught_up() {
    let spec = every_minute();
    let after = at("2026-01-01T00:00:00Z");
    // Down from 00:00 to 00:10:02: ticks 00:01..00:10 are due; 00:10 is
    // on time (2 s late), the nine before it were missed.
    let now = at("2026-01-01T00:10:02Z");
    let grace = Duration::from_secs(5);
    let texts = |c| -> Vec<String> {
        due_ticks(&spec, after, now, grace, c)
            .into_iter()
            .map(tick_text)
            .collect()
    };
    assert_eq!(texts(CatchUp::None), ["2026-01-01T00:10:00Z"]);
    assert_eq!(
        texts(CatchUp::Last(2)),
        [
            "2026-01-01T00:08:00Z",
            "2026-01-01T00:09:00Z",
            "2026-01-01T00:10:00Z"
        ]
    );
    assert_eq!(texts(CatchUp::Last(100)).len(), 10);
    // Every due tick late: `none` starts nothing.
    let late = at("2026-01-01T00:10:30Z");
    assert!(due_ticks(&spec, after, late, grace, CatchUp::None).is_empty());
    assert_eq!(
        due_ticks(&spec, after, late, grace, CatchUp::Last(1)),
        [at("2026-01-01T00:10:00Z")]
    );
}

#[test]
fn overlap_outcomes() {
    use Outcome::*;
    use Previous::*;
    let table = [
        (Overlap::Skip, Idle, Start),
        (Overlap::Skip, Running, Skip),
        (Overlap::Queue, Idle, Start),
        (Overlap::Queue, Running, Hold),
        (Overlap::Allow, Running, Start),
        (Overlap::CancelRunning, Idle, Start),
        (Overlap::CancelRunning, Running, CancelThenStart),
    ];
    for (policy, prev, want) in table {
        assert_eq!(overlap_outcome(policy, prev), want, "{policy} {prev:?}");
    }
}

#[test]
fn a_requested_run_without_a_header_counts_as_running_for_a_while() {
    let now = at("2026-01-01T00:10:00Z");
    assert_eq!(previous_of(Some(true), None, now), Previous::Running);
    assert_eq!(previous_of(Some(false), Some(now), now), Previous::Idle);
    assert_eq!(previous_of(None, None, now), Previous::Idle);
    let recent = at("2026-01-01T00:09:30Z");
    assert_eq!(previous_of(None, Some(recent), now), Previous::Running);
    let long_ago = at("2026-01-01T00:08:00Z");
    assert_eq!(previous_of(None, Some(long_ago), now), Previous::Idle);
}

#[test]
fn a_due_tick_starts_and_advances_the_state() {
    let r = record(Overlap::Skip, CatchUp::default());
    let plan = decide_at(&r, "2026-01-01T00:01:01Z", Previous::Idle);
    assert_eq!(started(&plan), ["2026-01-01T00:01:00Z"]);
    let s = &plan.state;
    assert_eq!(s.last_tick.as_deref(), Some("2026-01-01T00:01:00Z"));
    assert_eq!(
        s.last_execution_id,
        Some(execution_id("s", "2026-01-01T00:01:00Z"))
    );
    assert_eq!(s.started, 1);
    // The same instant again, after the write: nothing more.
    let again = ScheduleRecord {
        state: plan.state.clone(),
        ..r
    };
    let plan = decide_at(&again, "2026-01-01T00:01:02Z", Previous::Running);
    assert!(plan.actions.is_empty());
    assert_eq!(plan.state, again.state);
}

#[test]
fn nothing_at_or_before_creation_fires_and_paused_fires_nothing() {
    let mut r = record(Overlap::Allow, CatchUp::Last(10));
    r.created_at = "2026-01-01T00:05:00Z".into();
    let plan = decide_at(&r, "2026-01-01T00:05:30Z", Previous::Idle);
    assert!(plan.actions.is_empty(), "{plan:?}");
    r.paused = true;
    let plan = decide_at(&r, "2026-01-01T00:09:00Z", Previous::Idle);
    assert!(plan.actions.is_empty());
    assert_eq!(plan.state, r.state);
}

#[test]
fn skip_counts_ticks_while_the_previous_run_runs() {
    let r = record(Overlap::Skip, CatchUp::default());
    let plan = decide_at(&r, "2026-01-01T00:01:00Z", Previous::Running);
    assert!(plan.actions.is_empty());
    assert_eq!(plan.state.skipped, 1);
    assert_eq!(
        plan.state.last_skipped_tick.as_deref(),
        Some("2026-01-01T00:01:00Z")
    );
    assert_eq!(
        plan.state.last_tick.as_deref(),
        Some("2026-01-01T00:01:00Z")
    );
    // Caught-up ticks overlap the one just started: only the first starts.
    let r = record(Overlap::Skip, CatchUp::Last(3));
    let plan = decide_at(&r, "2026-01-01T00:10:00Z", Previous::Idle);
    assert_eq!(started(&plan), ["2026-01-01T00:07:00Z"]);
    assert_eq!(plan.state.skipped, 3);
}

#[test]
fn allow_starts_every_due_tick() {
    let r = record(Overlap::Allow, CatchUp::Last(3));
    let plan = decide_at(&r, "2026-01-01T00:10:00Z", Previous::Running);
    assert_eq!(
        started(&plan),
        [
            "2026-01-01T00:07:00Z",
            "2026-01-01T00:08:00Z",
            "2026-01-01T00:09:00Z",
            "2026-01-01T00:10:00Z"
        ]
    );
    assert_eq!(plan.state.started, 4);
}

#[test]
fn queue_holds_one_tick_until_the_previous_run_ends() {
    let r = record(Overlap::Queue, CatchUp::default());
    let plan = decide_at(&r, "2026-01-01T00:01:00Z", Previous::Running);
    assert!(plan.actions.is_empty());
    assert_eq!(
        plan.state.held_tick.as_deref(),
        Some("2026-01-01T00:01:00Z")
    );
    // Another tick while held: skipped, the held one stays.
    let r = ScheduleRecord {
        state: plan.state,
        ..r
    };
    let plan = decide_at(&r, "2026-01-01T00:02:00Z", Previous::Running);
    assert!(plan.actions.is_empty());
    assert_eq!(
        plan.state.held_tick.as_deref(),
        Some("2026-01-01T00:01:00Z")
    );
    assert_eq!(plan.state.skipped, 1);
    // The previous run ended: the held tick starts, between ticks.
    let r = ScheduleRecord {
        state: plan.state,
        ..r
    };
    let plan = decide_at(&r, "2026-01-01T00:02:30Z", Previous::Idle);
    assert_eq!(started(&plan), ["2026-01-01T00:01:00Z"]);
    assert_eq!(plan.state.held_tick, None);
    assert_eq!(
        plan.state.last_tick.as_deref(),
        Some("2026-01-01T00:02:00Z")
    );
}

#[test]
fn cancel_running_cancels_the_previous_run_then_starts() {
    let mut r = record(Overlap::CancelRunning, CatchUp::default());
    r.state.last_tick = Some("2026-01-01T00:01:00Z".into());
    r.state.last_execution_id = Some("prev".into());
    let plan = decide_at(&r, "2026-01-01T00:02:00Z", Previous::Running);
    assert_eq!(
        plan.actions,
        [
            Action::Cancel {
                execution_id: "prev".into()
            },
            Action::Start {
                tick: "2026-01-01T00:02:00Z".into()
            }
        ]
    );
    let plan = decide_at(&r, "2026-01-01T00:02:00Z", Previous::Idle);
    assert_eq!(started(&plan), ["2026-01-01T00:02:00Z"]);
    assert_eq!(plan.actions.len(), 1, "nothing to cancel");
}

#[test]
fn the_next_wake_is_the_next_tick_not_yet_handled() {
    let mut r = record(Overlap::Skip, CatchUp::default());
    let spec = every_minute();
    let now = at("2026-01-01T00:01:30Z");
    assert_eq!(next_wake(&r, &spec, now), Some(at("2026-01-01T00:02:00Z")));
    r.state.last_tick = Some("2026-01-01T00:02:00Z".into());
    let early = at("2026-01-01T00:01:59Z");
    assert_eq!(
        next_wake(&r, &spec, early),
        Some(at("2026-01-01T00:03:00Z"))
    );
    r.paused = true;
    assert_eq!(next_wake(&r, &spec, now), None);
}

#[test]
fn missed_ticks_beyond_the_limit_are_passed_over() {
    let mut r = record(Overlap::Allow, CatchUp::None);
    r.state.last_tick = Some("2026-01-01T00:00:00Z".into());
    let plan = decide_at(&r, "2026-01-01T00:10:30Z", Previous::Idle);
    assert!(plan.actions.is_empty());
    assert_eq!(
        plan.state.last_tick.as_deref(),
        Some("2026-01-01T00:10:00Z")
    );
    // Passed over once: the next pass has nothing to do.
    let r = ScheduleRecord {
        state: plan.state.clone(),
        ..r
    };
    let again = decide_at(&r, "2026-01-01T00:10:40Z", Previous::Idle);
    assert_eq!(again.state, plan.state);
}
