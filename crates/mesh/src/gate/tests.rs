use super::*;

fn owner(eid: &str) -> Owner {
    Owner {
        execution_id: eid.into(),
        ..Default::default()
    }
}

/// A task's request: 30 s lease, 15 s place in line.
fn task_ask<'a>(id: &'a str, o: &'a Owner, now_ms: u64) -> Ask<'a> {
    Ask {
        key: "api",
        id,
        owner: o,
        limit: 2,
        now_ms,
        lease_ms: TASK_LEASE_MS,
        wait_ttl_ms: WAIT_TTL_MS,
        queue: true,
        gone: &[],
    }
}

/// An execution's request: no expiry.
fn exec_ask<'a>(id: &'a str, o: &'a Owner, gone: &'a [String]) -> Ask<'a> {
    Ask {
        key: "cust-a",
        id,
        owner: o,
        limit: 2,
        now_ms: 1_000,
        lease_ms: 0,
        wait_ttl_ms: 0,
        queue: true,
        gone,
    }
}

fn ids(v: &[Entry]) -> Vec<&str> {
    v.iter().map(|e| e.id.as_str()).collect()
}

/// Ask in turn, each seeing the record the last wrote.
fn run(rec: &mut Option<ConcRecord>, ask: &Ask<'_>) -> Verdict {
    let d = acquire(rec.as_ref(), ask);
    *rec = Some(d.record);
    d.verdict
}

#[test]
fn slots_go_first_come_then_waiters_queue_in_order_and_say_who_holds() {
    let o = owner("e1");
    let mut rec = None;
    for id in ["a", "b"] {
        assert_eq!(run(&mut rec, &task_ask(id, &o, 0)), Verdict::Acquired);
    }
    for (i, id) in ["c", "d", "e"].iter().enumerate() {
        match run(&mut rec, &task_ask(id, &o, 10)) {
            Verdict::Wait {
                position,
                held_by,
                retry_after_ms,
            } => {
                assert_eq!(position, i + 1);
                assert_eq!(ids(&held_by), ["a", "b"]);
                assert_eq!(retry_after_ms, retry_hint(i + 1));
            }
            v => panic!("{id}: {v:?}"),
        }
    }
    let r = rec.unwrap();
    assert_eq!(ids(&r.waiting), ["c", "d", "e"]);
    assert_eq!(r.key, "api");
}

#[test]
fn asking_again_reuses_the_lease_or_the_place_and_renews_it() {
    let o = owner("e1");
    let mut rec = None;
    run(&mut rec, &task_ask("a", &o, 0));
    run(&mut rec, &task_ask("b", &o, 0));
    run(&mut rec, &task_ask("c", &o, 0));
    // A redelivered holder: still one holder, lease renewed.
    assert_eq!(run(&mut rec, &task_ask("a", &o, 5_000)), Verdict::Acquired);
    let r = rec.clone().unwrap();
    assert_eq!(ids(&r.holders), ["a", "b"]);
    assert_eq!(r.holders[0].until_ms, 5_000 + TASK_LEASE_MS);
    // A waiter asking again keeps its place, its expiry renewed.
    let v = run(&mut rec, &task_ask("c", &o, 6_000));
    assert!(matches!(v, Verdict::Wait { position: 1, .. }), "{v:?}");
    let r = rec.unwrap();
    assert_eq!(ids(&r.waiting), ["c"]);
    assert!(r.waiting[0].until_ms > 6_000 + WAIT_TTL_MS);
}

#[test]
fn a_newcomer_never_overtakes_the_line_when_a_slot_frees() {
    let o = owner("e1");
    let mut rec = None;
    for id in ["a", "b", "c", "d"] {
        run(&mut rec, &task_ask(id, &o, 0));
    }
    // `b` renews its lease and the waiters keep their places; `a`'s
    // executor died and its lease runs out.
    for now in [14_000, 25_000] {
        for id in ["b", "c", "d"] {
            run(&mut rec, &task_ask(id, &o, now));
        }
    }
    let later = TASK_LEASE_MS + 1;
    let v = run(&mut rec, &task_ask("x", &o, later));
    assert!(matches!(v, Verdict::Wait { position: 2, .. }), "{v:?}");
    let r = rec.clone().unwrap();
    assert_eq!(
        ids(&r.holders),
        ["b", "c"],
        "the head of the line was promoted"
    );
    assert_eq!(ids(&r.waiting), ["d", "x"]);
    assert_eq!(run(&mut rec, &task_ask("c", &o, later)), Verdict::Acquired);
}

#[test]
fn expired_holders_and_waiters_are_dropped_on_every_decision() {
    let o = owner("e1");
    let mut rec = None;
    run(&mut rec, &task_ask("a", &o, 0));
    run(&mut rec, &task_ask("b", &o, 0));
    run(&mut rec, &task_ask("w", &o, 0)); // waits, never asks again
    let much_later = TASK_LEASE_MS + WAIT_TTL_MS + 10_000;
    assert_eq!(
        run(&mut rec, &task_ask("n", &o, much_later)),
        Verdict::Acquired
    );
    let r = rec.unwrap();
    assert_eq!(ids(&r.holders), ["n"]);
    assert!(r.waiting.is_empty());
}

#[test]
fn a_release_hands_the_slot_to_the_head_of_the_line_and_is_idempotent() {
    let gone = Vec::new();
    let mut rec = None;
    for id in ["e1", "e2", "e3", "e4"] {
        let o = owner(id);
        run(&mut rec, &exec_ask(id, &o, &gone));
    }
    let r = rec.unwrap();
    let out = release(&r, "e1", 2_000, &[]);
    assert!(out.changed);
    assert_eq!(ids(&out.promoted), ["e3"]);
    assert!(
        out.promoted[0].pending_start,
        "an execution must be started"
    );
    assert_eq!(
        out.promoted[0].until_ms, 0,
        "executions hold until they end"
    );
    assert_eq!(ids(&out.record.holders), ["e2", "e3"]);
    assert_eq!(ids(&out.record.waiting), ["e4"]);
    let again = release(&out.record, "e1", 3_000, &[]);
    assert!(!again.changed && again.promoted.is_empty());
    // A queued execution that ends leaves the line.
    let left = release(&out.record, "e4", 3_000, &[]);
    assert!(left.record.waiting.is_empty() && left.promoted.is_empty());
    let started = mark_started(&out.record, &["e3".to_string()]).unwrap();
    assert!(started.holders.iter().all(|h| !h.pending_start));
    assert_eq!(mark_started(&started, &["e3".to_string()]), None);
}

#[test]
fn ended_executions_are_dropped_and_their_slots_go_to_the_line_first() {
    let none = Vec::new();
    let mut rec = None;
    for id in ["e1", "e2", "e3"] {
        let o = owner(id);
        run(&mut rec, &exec_ask(id, &o, &none));
    }
    let gone = vec!["e1".to_string()];
    let o = owner("e4");
    let d = acquire(rec.as_ref(), &exec_ask("e4", &o, &gone));
    assert_eq!(ids(&d.promoted), ["e3"]);
    assert!(matches!(d.verdict, Verdict::Wait { position: 1, .. }));
    assert_eq!(ids(&d.record.holders), ["e2", "e3"]);
}

#[test]
fn without_queueing_a_full_key_rejects_naming_its_holders() {
    let none = Vec::new();
    let mut rec = None;
    for id in ["e1", "e2"] {
        let o = owner(id);
        run(&mut rec, &exec_ask(id, &o, &none));
    }
    let o = owner("e3");
    let mut ask = exec_ask("e3", &o, &none);
    ask.queue = false;
    match acquire(rec.as_ref(), &ask).verdict {
        Verdict::Rejected { held_by } => assert_eq!(ids(&held_by), ["e1", "e2"]),
        v => panic!("{v:?}"),
    }
}

fn lease<'a>(id: &'a str, o: &'a Owner) -> Lease<'a> {
    Lease {
        key: "k",
        id,
        owner: o,
        limit: 1,
        lease_ms: TASK_LEASE_MS,
    }
}

#[test]
fn a_renewal_extends_a_held_lease_and_claims_a_lost_one_again() {
    let (o, p) = (owner("e1"), owner("e2"));
    let d = acquire(None, &task_ask("a", &o, 0));
    match renew(Some(&d.record), &lease("a", &o), 10_000) {
        Renewed::Held(r) => assert_eq!(r.holders[0].until_ms, 10_000 + TASK_LEASE_MS),
        r => panic!("{r:?}"),
    }
    // Lost with its record (a purge): claimed again, the record made anew.
    match renew(None, &lease("a", &o), 10_000) {
        Renewed::Reclaimed(r) => {
            assert_eq!(ids(&r.holders), ["a"]);
            assert_eq!(
                (r.key.as_str(), r.limit, r.lease_ms),
                ("k", 1, TASK_LEASE_MS)
            );
            assert_eq!(r.holders[0].owner, o);
        }
        r => panic!("{r:?}"),
    }
    // Lost while another came in (and it waited meanwhile): both hold,
    // over the limit, and the next one waits.
    let other = acquire(None, &task_ask("b", &p, 0)).record;
    let mut with_a_waiting = other.clone();
    with_a_waiting.waiting.push(Entry {
        id: "a".into(),
        ..Default::default()
    });
    let Renewed::Reclaimed(r) = renew(Some(&with_a_waiting), &lease("a", &o), 10_000) else {
        panic!("lost")
    };
    assert_eq!(ids(&r.holders), ["b", "a"]);
    assert!(r.waiting.is_empty());
    assert!(matches!(
        acquire(Some(&r), &task_ask("c", &p, 10_000)).verdict,
        Verdict::Wait { .. }
    ));
}

fn rate<'a>(id: &'a str, o: &'a Owner, now_ms: u64) -> RateAsk<'a> {
    RateAsk {
        key: "api",
        id,
        owner: o,
        per_second: 20.0,
        burst: 1,
        now_ms,
        wait_ttl_ms: WAIT_TTL_MS,
    }
}

#[test]
fn a_rate_reserves_one_token_per_interval_in_order() {
    let o = owner("e1");
    let mut rec: Option<RateRecord> = None;
    let mut due = Vec::new();
    for i in 0..4 {
        let (r, v) = take(rec.as_ref(), &rate(&format!("c{i}"), &o, 1_000));
        rec = Some(r);
        match v {
            Verdict::Acquired => due.push(0),
            Verdict::Wait { retry_after_ms, .. } => due.push(retry_after_ms),
            v => panic!("{v:?}"),
        }
    }
    assert_eq!(due, [0, 50, 100, 150], "one token every 50 ms");
    // Too early: wait the rest; on time (or late): go, without a new token.
    let (r, v) = take(rec.as_ref(), &rate("c2", &o, 1_060));
    assert_eq!(
        v,
        Verdict::Wait {
            position: 2,
            retry_after_ms: 40,
            held_by: vec![]
        }
    );
    let (r, v) = take(Some(&r), &rate("c1", &o, 1_070));
    assert_eq!(v, Verdict::Acquired);
    let (r, v) = take(Some(&r), &rate("c2", &o, 1_100));
    assert_eq!(v, Verdict::Acquired);
    assert_eq!(ids(&r.waiting), ["c3"]);
}

#[test]
fn a_rate_refills_up_to_its_burst() {
    let o = owner("e1");
    let mut ask = rate("a", &o, 0);
    ask.burst = 3;
    let (mut r, _) = take(None, &ask);
    for id in ["b", "c"] {
        ask.id = id;
        let (next, v) = take(Some(&r), &ask);
        assert_eq!(v, Verdict::Acquired, "burst of 3");
        r = next;
    }
    ask.id = "d";
    let (_, v) = take(Some(&r), &ask);
    assert!(matches!(v, Verdict::Wait { .. }));
    // After a long quiet time the bucket holds `burst` tokens, not more.
    ask.now_ms = 60_000;
    for id in ["e", "f", "g"] {
        ask.id = id;
        let (next, v) = take(Some(&r), &ask);
        assert_eq!(v, Verdict::Acquired);
        r = next;
    }
    ask.id = "h";
    assert!(matches!(take(Some(&r), &ask).1, Verdict::Wait { .. }));
}

#[test]
fn an_unclaimed_reservation_expires() {
    let o = owner("e1");
    let (r, _) = take(None, &rate("a", &o, 0));
    let (r, v) = take(Some(&r), &rate("b", &o, 0));
    assert!(matches!(v, Verdict::Wait { .. }));
    let (r, _) = take(Some(&r), &rate("c", &o, 50 + WAIT_TTL_MS + 1));
    assert!(r.waiting.iter().all(|w| w.id != "b"), "{r:?}");
}

#[test]
fn entries_are_named_by_execution_and_step() {
    let e = Entry {
        id: "cmd1".into(),
        owner: Owner {
            execution_id: "e1".into(),
            step: "fetch".into(),
            step_run_id: "r".into(),
        },
        ..Default::default()
    };
    assert_eq!(e.label(), "e1 (step fetch)");
    let e = Entry {
        id: "e2".into(),
        owner: owner("e2"),
        ..Default::default()
    };
    assert_eq!(e.label(), "e2");
}

#[test]
fn an_ask_older_than_the_bucket_is_not_due_earlier_than_the_debt_allows() {
    let o = owner("e1");
    let (r, _) = take(None, &rate("a", &o, 1_000));
    let (r, v) = take(Some(&r), &rate("b", &o, 1_030));
    assert_eq!(due_of(&v), 1_050 - 1_030);
    // `c` asked at 1 010 (its write lost to `b`'s): its token is the one
    // after `b`'s, due at 1 100, not 80 ms after its own stale clock.
    let (r, v) = take(Some(&r), &rate("c", &o, 1_010));
    assert_eq!(due_of(&v), 1_100 - 1_010);
    assert_eq!(r.waiting.last().map(|w| w.due_ms), Some(1_100));
}

fn due_of(v: &Verdict) -> u64 {
    match v {
        Verdict::Wait { retry_after_ms, .. } => *retry_after_ms,
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_record_from_the_log_holds_the_started_and_lines_up_the_queued_in_their_order() {
    let logged = |eid: &str, started: bool, seq: u64| Logged {
        execution_id: eid.into(),
        started,
        taken_up: started,
        seq,
        at_ms: seq * 10,
    };
    let rec = from_log(
        "cust-a",
        1,
        &[
            logged("c", false, 9),
            logged("a", true, 3),
            logged("b", false, 7),
            logged("d", true, 8),
        ],
    );
    assert_eq!(rec.key, "cust-a");
    assert_eq!((rec.limit, rec.lease_ms), (1, 0));
    // Two run (one over the limit: both started before the record was
    // lost); the line keeps its order.
    assert_eq!(ids(&rec.holders), ["a", "d"]);
    assert_eq!(ids(&rec.waiting), ["b", "c"]);
    assert_eq!(rec.holders[1].since_ms, 80);
    assert_eq!(rec.waiting[0].owner, owner("b"));
    assert!(rec
        .holders
        .iter()
        .all(|h| h.until_ms == 0 && !h.pending_start));
    // Nobody is promoted while both run; the first release moves nobody
    // either (one still runs), the second starts the head of the line.
    let r = release(&rec, "a", 1_000, &[]);
    assert!(r.promoted.is_empty());
    let r = release(&r.record, "d", 1_000, &[]);
    assert_eq!(ids(&r.promoted), ["b"]);
    assert!(r.promoted[0].pending_start);
}

#[test]
fn a_holder_from_the_log_whose_entry_was_not_taken_up_keeps_its_start_owed() {
    let logged = |eid: &str, taken_up: bool, seq: u64| Logged {
        execution_id: eid.into(),
        started: true,
        taken_up,
        seq,
        at_ms: seq,
    };
    let rec = from_log("k", 2, &[logged("ran", true, 1), logged("cut", false, 2)]);
    assert_eq!(ids(&rec.holders), ["ran", "cut"]);
    assert!(!rec.holders[0].pending_start);
    assert!(rec.holders[1].pending_start, "{:?}", rec.holders[1]);
}

#[test]
fn a_record_from_an_empty_log_is_empty_and_a_waiter_under_the_limit_is_promoted_at_the_next_ask() {
    let rec = from_log("k", 0, &[]);
    assert_eq!(rec.limit, 1);
    assert!(rec.holders.is_empty() && rec.waiting.is_empty());
    let rec = from_log(
        "k",
        2,
        &[Logged {
            execution_id: "w".into(),
            started: false,
            taken_up: false,
            seq: 1,
            at_ms: 5,
        }],
    );
    let o = owner("new");
    let mut ask = exec_ask("new", &o, &[]);
    ask.key = "k";
    let d = acquire(Some(&rec), &ask);
    assert_eq!(ids(&d.promoted), ["w"]);
    assert_eq!(d.verdict, Verdict::Acquired);
    assert_eq!(ids(&d.record.holders), ["w", "new"]);
}
