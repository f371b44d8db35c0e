//! `make test-heavy`: a 1,000,000-item loop through separate service
//! processes: exact (every item counted once), each service's peak RSS
//! (VmHWM) at most 64 MiB, and each process's peak RSS and CPU printed,
//! the nats-server's beside them; and a 200,000-item loop cancelled and
//! resumed, whose resume reads the log without the services' memory
//! growing with it, then read back whole (the API's time travel, `noetl
//! events export`, `noetl exec show`) without the readers' memory growing
//! with it either.
//!
//! The items are the rows of a table in the machine's PostgreSQL, walked
//! by a cursor loop (docs/dsl.md "Cursor loops") in claims of 1,000: the
//! form whose memory does not grow with the items. A collection (`in:`) of
//! a million elements would be held whole while it is stored in chunks
//! (and the template engine's `range` stops at 100,000 elements).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use noetl_integration::procstat::{cpu_time, peak_rss_kib};

mod support;

/// Items of the loop.
const ITEMS: u64 = 1_000_000;

/// Each service's peak RSS may not pass this.
const SERVICE_PEAK_KIB: u64 = 64 * 1024;

fn noetl(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_noetl"));
    c.env("NOETL_HOME", home)
        .env_remove("NOETL_NATS_URL")
        .env_remove("NOETL_SECRET_KEY")
        .env_remove("NOETL_SECRET_KEY_FILE");
    c
}

/// `psql` running `sql` against the machine's PostgreSQL (database
/// `test`), unquoted and unaligned.
fn psql_command(sql: &str) -> Command {
    let mut c = Command::new("psql");
    c.args([
        "-h",
        "127.0.0.1",
        "-U",
        "postgres",
        "-d",
        "test",
        "-qAt",
        "-c",
        sql,
    ]);
    c
}

/// Run `sql` with [`psql_command`]; its output.
fn psql(sql: &str) -> String {
    let out = psql_command(sql)
        .output()
        .expect("psql (the machine's PostgreSQL client)");
    assert!(
        out.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The processes and the schema a run made; stopped and dropped however
/// it ends.
struct Run {
    procs: Vec<(String, Child)>,
    schema: String,
}

impl Drop for Run {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Best effort: a drop cannot fail the test it ends.
        let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
        let _ = psql_command(&drop).output();
    }
}

fn playbook(schema: &str) -> String {
    format!(
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: big_loop }}
keychain: [{{ name: db, kind: postgres_credential }}]
workflow:
  - step: start
    loop:
      cursor:
        kind: postgres
        auth: db
        claim: |
          WITH c AS (
            SELECT id FROM {schema}.items WHERE status = 'pending'
            ORDER BY id FOR UPDATE SKIP LOCKED LIMIT {{{{ __frame_max_rows }}}}
          )
          UPDATE {schema}.items i SET status = 'claimed', claims = claims + 1
          FROM c WHERE i.id = c.id RETURNING i.id
      iterator: item
      spec:
        mode: cursor
        max_in_flight: 64
        frame: {{ max_rows: 1000, lease_seconds: 600, heartbeat_seconds: 60 }}
        policy:
          reducers: {{ total: sum }}
    tool:
      - name: touch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: {{ set_ctx: {{ total: 1 }} }}
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
    )
}

#[test]
#[ignore = "heavy: run with `make test-heavy`"]
fn a_million_item_loop_completes_exact_in_bounded_memory() {
    let schema = format!("noetl_heavy_{}", std::process::id());
    psql(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
         CREATE TABLE {schema}.items (id int PRIMARY KEY,
             status text NOT NULL DEFAULT 'pending', claims int NOT NULL DEFAULT 0);
         INSERT INTO {schema}.items (id) SELECT generate_series(1, {ITEMS});
         CREATE INDEX ON {schema}.items (id) WHERE status = 'pending';"
    ));
    let mut run = Run {
        procs: Vec::new(),
        schema: schema.clone(),
    };
    // The server has no Go memory limit unless NOETL_NATS_MEMORY_LIMIT
    // sets one (docs/performance.md: at this rate a limit of 192MiB costs
    // the server three times the CPU and the run twice the time).
    let limit = std::env::var("NOETL_NATS_MEMORY_LIMIT").unwrap_or_else(|_| "none".into());
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let home = tempfile::tempdir().unwrap();
    support::admin_init(noetl(home.path()), &url);
    let cred = home.path().join("db.json");
    std::fs::write(
        &cred,
        r#"{"host": "127.0.0.1", "port": 5432, "user": "postgres", "database": "test"}"#,
    )
    .unwrap();
    let put = noetl(home.path())
        .args(["credential", "put", "db", "--kind", "postgres_credential"])
        .args(["--nats", &url, "--from-file"])
        .arg(&cred)
        .output()
        .unwrap();
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    for (name, args) in [
        ("router", vec!["serve", "router", "--concurrency", "32"]),
        ("scheduler", vec!["serve", "scheduler"]),
        (
            "loop-supervisor",
            vec!["serve", "loop-supervisor", "--concurrency", "32"],
        ),
        (
            "executor(noop)",
            vec!["serve", "executor", "--kind", "noop", "--concurrency", "64"],
        ),
        (
            "executor(postgres)",
            vec!["serve", "executor", "--kind", "postgres"],
        ),
    ] {
        let child = noetl(home.path())
            .args(&args)
            .args(["--nats", &url])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        run.procs.push((name.to_string(), child));
    }
    let file = home.path().join("big_loop.yaml");
    std::fs::write(&file, playbook(&schema)).unwrap();
    let t0 = Instant::now();
    let id = support::exec_start(noetl(home.path()), &url, &[&file]);
    let s = support::exec_wait(noetl(home.path()), &url, &id, 3600);
    let took = t0.elapsed();
    assert_eq!(s["status"], "completed", "{s}");
    assert_eq!(s["ctx"]["total"], ITEMS, "every item counted exactly once");
    assert_eq!(
        psql(&format!(
            "SELECT count(*) FILTER (WHERE status = 'claimed' AND claims = 1) FROM {schema}.items"
        )),
        ITEMS.to_string(),
        "every row claimed exactly once"
    );
    println!(
        "{ITEMS} item loop: {:.1} s ({:.0} iterations/s)",
        took.as_secs_f64(),
        ITEMS as f64 / took.as_secs_f64()
    );
    let mut over = Vec::new();
    let pids = run
        .procs
        .iter()
        .map(|(n, c)| (n.as_str(), c.id()))
        .chain(server.pid().map(|p| ("nats-server", p)));
    for (name, pid) in pids {
        let kib = peak_rss_kib(pid);
        let cpu = cpu_time(pid).as_secs_f64();
        let note = if name == "nats-server" {
            format!("   (GOMEMLIMIT {limit})")
        } else {
            String::new()
        };
        println!(
            "peak RSS {name:<18} {:>7.1} MiB   CPU {cpu:>6.1} s ({:>4.0} µs per item){note}",
            kib as f64 / 1024.0,
            cpu * 1e6 / ITEMS as f64
        );
        if name != "nats-server" && kib > SERVICE_PEAK_KIB {
            over.push(format!("{name} peaked at {kib} KiB"));
        }
    }
    assert!(
        over.is_empty(),
        "services over {SERVICE_PEAK_KIB} KiB: {over:?}"
    );
}

/// Items of the loop [`a_long_loop_resumed_and_read_back_holds_its_log_in_bounded_memory`]
/// resumes: a collection of twice `range(100000)` (the template engine's
/// `range` stops at 100,000).
const RESUMED_ITEMS: u64 = 200_000;

/// Iterations ended before that loop is cancelled: a quarter, so the
/// cancel comes well before its end however fast the machine is.
const ENDED_AT_CANCEL: u64 = 50_000;

/// How much the router's peak RSS may grow while a resume reads the log,
/// per iteration that ended before the cancel (2.8–4.2 KB when the log
/// was read unfolded, 0.45–0.8 KB read as stored, 160 bytes folded a chunk
/// at a time; debug builds: docs/reliability.md "Resume of a long loop").
const RESUME_GROWTH_PER_ENDED: u64 = 1536;

/// The same for the loop-supervisor, whose fold of the stopped run holds
/// only the events it looks up and the ids of the iteration events read
/// (90 bytes per iteration ended; 0.45–0.8 KB when it held the run's
/// stored messages: docs/reliability.md "A lost loop run of a long loop").
const SUPERVISOR_GROWTH_PER_ENDED: u64 = 256;

/// A long loop cancelled, resumed, then read back whole: no reader of the
/// log holds it.
#[test]
#[ignore = "heavy: run with `make test-heavy`"]
fn a_long_loop_resumed_and_read_back_holds_its_log_in_bounded_memory() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let home = tempfile::tempdir().unwrap();
    support::admin_init(noetl(home.path()), &url);
    let mut procs = support::Procs(Vec::new());
    for args in [
        &["router", "--concurrency", "32"][..],
        &["scheduler"],
        &["loop-supervisor", "--concurrency", "32"],
        &["executor", "--kind", "noop", "--concurrency", "64"],
    ] {
        procs.0.push(support::serve(noetl(home.path()), &url, args));
    }
    let port = support::free_port();
    let addr = format!("127.0.0.1:{port}");
    procs.0.push(support::serve(
        noetl(home.path()),
        &url,
        &["api", "--http-addr", &addr],
    ));
    let (router, supervisor, api) = (procs.0[0].id(), procs.0[2].id(), procs.0[4].id());
    let file = home.path().join("long_loop.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: long_loop }
workflow:
  - step: start
    loop:
      in: "{{ range(100000) | list + range(100000) | list }}"
      iterator: i
      spec:
        mode: parallel
        max_in_flight: 16
        policy:
          reducers: { total: sum }
    tool:
      - name: touch
        kind: noop
        spec:
          policy:
            rules:
              - else:
                  then: { set_ctx: { total: 1 } }
"#,
    )
    .unwrap();
    let id = support::exec_start(noetl(home.path()), &url, &[&file]);
    let tail = noetl(home.path())
        .args(["events", "tail", "--execution", &id, "--from-start"])
        .args(["--type", "loop.iteration.done", "--count"])
        .arg(ENDED_AT_CANCEL.to_string())
        .args(["--nats", &url])
        .output()
        .unwrap();
    assert!(
        tail.status.success(),
        "{}",
        String::from_utf8_lossy(&tail.stderr)
    );
    let cancel = noetl(home.path())
        .args(["exec", "cancel", &id, "--wait", "--nats", &url])
        .output()
        .unwrap();
    assert!(
        cancel.status.success(),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    // The ends the resume reads (the tail's count was reached before the
    // cancel, so more ended).
    let ends = noetl(home.path())
        .args([
            "events",
            "tail",
            "--execution",
            &id,
            "--from-start",
            "--no-follow",
        ])
        .args(["--type", "loop.iteration.done", "--json", "--nats", &url])
        .output()
        .unwrap();
    let ended = ends
        .stdout
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count() as u64;
    assert!(ended >= ENDED_AT_CANCEL, "{ended} ends read");
    let before = [peak_rss_kib(router), peak_rss_kib(supervisor)];
    let t0 = Instant::now();
    let resume = noetl(home.path())
        .args(["exec", "resume", &id, "--nats", &url])
        .output()
        .unwrap();
    assert!(
        resume.status.success(),
        "{}",
        String::from_utf8_lossy(&resume.stderr)
    );
    let s = support::exec_wait(noetl(home.path()), &url, &id, 600);
    assert_eq!(
        s["ctx"]["total"], RESUMED_ITEMS,
        "every item counted once: {s}"
    );
    println!(
        "{RESUMED_ITEMS} item loop resumed after {ended} ended and its cancel: {:.1} s to its end",
        t0.elapsed().as_secs_f64()
    );
    let mut over = Vec::new();
    for ((name, pid), before) in [("router", router), ("loop-supervisor", supervisor)]
        .into_iter()
        .zip(before)
    {
        let after = peak_rss_kib(pid);
        let per_ended = after.saturating_sub(before) * 1024 / ended;
        println!(
            "peak RSS {name:<16} {:>7.1} MiB before the resume, {:>7.1} MiB after: {per_ended} bytes per iteration ended",
            before as f64 / 1024.0,
            after as f64 / 1024.0
        );
        let bound = match name {
            "loop-supervisor" => SUPERVISOR_GROWTH_PER_ENDED,
            _ => RESUME_GROWTH_PER_ENDED,
        };
        if per_ended > bound {
            over.push(format!("{name} grew from {before} to {after} KiB"));
        }
    }
    assert!(over.is_empty(), "a resume's read of the log: {over:?}");

    // Read back whole (about 600,000 events now): the API's time travel,
    // `events export`, `exec show` and `exec why` read the log a chunk at a
    // time.
    let api_before = peak_rss_kib(api);
    let state = format!("/api/executions/{id}/state");
    let (status, body) =
        support::http_get(port, &state, std::time::Duration::from_secs(600)).unwrap();
    assert_eq!(status, 200, "{}", &body[..body.len().min(500)]);
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["status"], "COMPLETED", "{}", state["error"]);
    assert_eq!(state["ctx"]["total"], RESUMED_ITEMS);
    let events = state["events"].as_u64().unwrap();
    let api_grew = peak_rss_kib(api).saturating_sub(api_before);
    let out = home.path().join("export.jsonl");
    let export = peak_of(
        noetl(home.path())
            .args(["events", "export", &id, "--out"])
            .arg(&out)
            .args(["--nats", &url]),
        &home.path().join("export.err"),
    );
    let exported =
        std::io::BufRead::lines(std::io::BufReader::new(std::fs::File::open(&out).unwrap()))
            .filter(|l| !l.as_ref().unwrap().is_empty())
            .count() as u64;
    assert_eq!(exported, events, "every event exported once");
    let show = peak_of(
        noetl(home.path()).args(["exec", "show", &id, "--json", "--nats", &url]),
        &home.path().join("show.err"),
    );
    let why = peak_of(
        noetl(home.path()).args(["exec", "why", &id, "--json", "--nats", &url]),
        &home.path().join("why.err"),
    );
    // What the same binary takes for a command that reads no log.
    let status = peak_of(
        noetl(home.path()).args(["exec", "status", &id, "--nats", &url]),
        &home.path().join("status.err"),
    );
    println!(
        "read back {events} events: the API's peak RSS grew {:.1} MiB; peak RSS of `events export` {:.1} MiB, `exec show` {:.1} MiB, `exec why` {:.1} MiB, `exec status` {:.1} MiB",
        api_grew as f64 / 1024.0,
        export as f64 / 1024.0,
        show as f64 / 1024.0,
        why as f64 / 1024.0,
        status as f64 / 1024.0
    );
    let mut over = Vec::new();
    if api_grew > READ_BACK_KIB {
        over.push(format!("the API grew {api_grew} KiB"));
    }
    for (what, peak) in [
        ("events export", export),
        ("exec show", show),
        ("exec why", why),
    ] {
        if peak.saturating_sub(status) > READ_BACK_KIB {
            over.push(format!(
                "`{what}` peaked at {peak} KiB, `exec status` at {status}"
            ));
        }
    }
    assert!(over.is_empty(), "a read of the whole log: {over:?}");
}

/// How much a whole read of that loop's log (600,000 events) may cost: the
/// growth of the API's peak RSS, and the peak RSS of `noetl events export`,
/// `noetl exec show` and `noetl exec why` over that of `noetl exec status` (each held the
/// log unfolded before, 545–850 MiB more; 24–44 MiB read a chunk at a
/// time, debug builds: docs/reliability.md "Reading a long log back").
const READ_BACK_KIB: u64 = 64 * 1024;

/// Run `command` to its end, asserting it succeeds (its stderr, kept in
/// `err`, shown when not): its peak RSS in KiB, its VmHWM read every 10 ms
/// while it runs (the kernel's account at `wait4` would count this test's
/// own peak too: a child's starts as its parent's).
fn peak_of(command: &mut Command, err: &Path) -> u64 {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .unwrap();
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        peak = peak.max(peak_rss_kib(child.id()));
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(
        status.success(),
        "{command:?}: {}",
        std::fs::read_to_string(err).unwrap_or_default()
    );
    peak
}
