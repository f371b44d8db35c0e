//! Sealed secrets, end to end with the real `noetl` binary: a python task
//! that dumps `os.environ` finds neither the credentials' secret key nor
//! cloud or NATS credentials set in the executor's environment, under
//! `noetl run` and under `noetl serve` (nor in the executor's own
//! environment through /proc); and a bearer token the task
//! transforms (upper case, base64, hex, percent-encoding...) is redacted
//! in every form from the result, `ctx`, events and KV.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

mod support;
use support::Procs;

/// The credentials' secret key (64 hex digits).
const SECRET_KEY: &str = "c0ffee5eed0123456789abcdef0123456789abcdef0123456789abcdef012345";
const AWS_SECRET: &str = "aws-SealedSecret-5521/Qx";
const NATS_PASSWORD: &str = "nats-SealedPw-7730";
const TOKEN: &str = "tok-Sealed/8841 ~?>x";

/// The token as the task transforms it, written out as Python produces it.
const TRANSFORMED: &[(&str, &str)] = &[
    ("upper", "TOK-SEALED/8841 ~?>X"),
    ("lower", "tok-sealed/8841 ~?>x"),
    ("b64", "dG9rLVNlYWxlZC84ODQxIH4/Png="),
    ("b64url", "dG9rLVNlYWxlZC84ODQxIH4_Png="),
    ("b64url_nopad", "dG9rLVNlYWxlZC84ODQxIH4_Png"),
    ("hex", "746f6b2d5365616c65642f38383431207e3f3e78"),
    ("hex_upper", "746F6B2D5365616C65642F38383431207E3F3E78"),
    ("quoted", "tok-Sealed%2F8841%20~%3F%3Ex"),
    ("quoted_plus", "tok-Sealed%2F8841+~%3F%3Ex"),
];

const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: sealed }
keychain:
  - name: api_token
    kind: bearer
workflow:
  - step: start
    tool:
      - name: dump
        kind: python
        args: { token: "{{ keychain.api_token.token }}" }
        code: |
          import base64, os, urllib.parse
          t = token
          print("environment:", dict(os.environ))
          try:
              parent = open("/proc/%d/environ" % os.getppid(), "rb").read().decode("latin-1")
          except OSError as e:
              parent = "refused: " + type(e).__name__
          result = {
              "parent_env": parent,
              "env": dict(os.environ),
              "len": len(t),
              "upper": t.upper(),
              "lower": t.lower(),
              "b64": base64.b64encode(t.encode()).decode(),
              "b64url": base64.urlsafe_b64encode(t.encode()).decode(),
              "b64url_nopad": base64.urlsafe_b64encode(t.encode()).decode().rstrip("="),
              "hex": t.encode().hex(),
              "hex_upper": t.encode().hex().upper(),
              "quoted": urllib.parse.quote(t, safe=""),
              "quoted_plus": urllib.parse.quote_plus(t),
              "basic": base64.b64encode(("app:" + t).encode()).decode(),
          }
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { dump: "{{ outcome.result }}" } }
"#;

/// `noetl` with the secrets in its environment, and no NATS settings or
/// secret-key file inherited from the caller's shell.
fn noetl(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_noetl"));
    c.env("NOETL_HOME", home)
        .env("NOETL_SECRET_KEY", SECRET_KEY)
        .env("AWS_ACCESS_KEY_ID", "AKIASEALEDTEST01")
        .env("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
        .env("NOETL_NATS_USER", "app")
        .env("NOETL_NATS_PASSWORD", NATS_PASSWORD)
        .env("RUST_LOG", "debug");
    for k in [
        "NOETL_SECRET_KEY_FILE",
        "NOETL_NATS_URL",
        "NATS_URL",
        "NOETL_NATS_CREDS",
        "NATS_CREDS",
        "NOETL_NATS_NKEY",
        "NOETL_NATS_TOKEN",
        "NOETL_PYTHON_ENV",
        "NOETL_PREFIX",
    ] {
        c.env_remove(k);
    }
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn put_token(home: &Path, nats: &[&str]) {
    let f = home.join("token.json");
    std::fs::create_dir_all(home).unwrap();
    std::fs::write(&f, serde_json::json!({ "token": TOKEN }).to_string()).unwrap();
    let out = noetl(home)
        .args([
            "credential",
            "put",
            "api_token",
            "--kind",
            "bearer",
            "--from-file",
        ])
        .arg(&f)
        .args(nats)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    std::fs::remove_file(&f).unwrap();
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn files_under(dir: &Path) -> String {
    let mut s = String::new();
    for f in walk(dir) {
        s.push_str(&String::from_utf8_lossy(&std::fs::read(f).unwrap()));
    }
    s
}

/// What the task saw and returned, as `ctx.dump`, and everything the run
/// left behind, checked: the environment was sealed and every form of the
/// token was redacted.
fn check(dump: &Value, haystack: &str) {
    // The task ran with the token (its length came back)...
    assert_eq!(dump["len"], TOKEN.len(), "{dump}");
    // ...in an environment with the allow-list only...
    let env = dump["env"].as_object().expect("env is an object");
    assert!(env.contains_key("PATH"), "{dump}");
    for name in env.keys() {
        assert!(
            !name.starts_with("NOETL_") && !name.starts_with("AWS_") && !name.starts_with("NATS"),
            "{name} reached the task: {dump}"
        );
    }
    // The executor's own environment, as /proc shows it: unreadable (a
    // non-dumpable process, to a task of the same user), or — to root —
    // with the secrets' values wiped (checked with the haystack below).
    let parent = dump["parent_env"].as_str().unwrap();
    assert!(
        parent == "refused: PermissionError" || parent.contains("NOETL_SECRET_KEY=\0"),
        "{parent:?}"
    );
    // ...and every transformed form of the token came back redacted.
    for (field, form) in TRANSFORMED {
        assert_eq!(dump[field], "[redacted]", "{field} ({form}): {dump}");
    }
    assert!(
        dump["basic"].as_str().unwrap().contains("[redacted]"),
        "{dump}"
    );
    for (what, secret) in [
        ("the secret key", SECRET_KEY),
        ("the AWS secret", AWS_SECRET),
        ("the NATS password", NATS_PASSWORD),
        ("the token", TOKEN),
    ]
    .into_iter()
    .chain(TRANSFORMED.iter().copied())
    {
        if let Some(at) = haystack.find(secret) {
            let from = haystack[..at]
                .char_indices()
                .rev()
                .nth(200)
                .map_or(0, |(i, _)| i);
            panic!(
                "{what} ({secret}) leaked: ...{}",
                &haystack[from..(at + secret.len() + 100).min(haystack.len())]
            );
        }
    }
}

#[test]
fn a_task_under_noetl_run_sees_no_secret_and_every_encoding_is_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    put_token(&home, &[]);
    let playbook = dir.path().join("sealed.yaml");
    std::fs::write(&playbook, PLAYBOOK).unwrap();
    let out = noetl(&home)
        .args(["run", "--json", "--timeout", "120"])
        .arg(&playbook)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let s: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(s["status"], "completed", "{s}");
    // The printed summary, the logs at debug level, and every byte of the
    // local JetStream store (events, KV, the credentials bucket).
    let haystack = format!("{}{}", text(&out), files_under(&home));
    check(&s["ctx"]["dump"], &haystack);
}

/// Services killed when the test ends, however it ends.
#[test]
fn a_task_under_noetl_serve_sees_no_secret_and_every_encoding_is_redacted() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let nats = ["--nats", url.as_str()];
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let init = noetl(&home)
        .args(["admin", "init"])
        .args(nats)
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", text(&init));
    put_token(&home, &nats);
    let playbook = dir.path().join("sealed.yaml");
    std::fs::write(&playbook, PLAYBOOK).unwrap();

    let mut procs = Procs(Vec::new());
    let mut logs = Vec::new();
    for service in ["router", "scheduler", "loop-supervisor", "executor"] {
        let log = dir.path().join(format!("{service}.log"));
        procs.0.push(
            noetl(&home)
                .args(["serve", service])
                .args(nats)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        logs.push(log);
    }
    let out = noetl(&home)
        .args(["exec", "start"])
        .arg(&playbook)
        .arg("--json")
        .args(nats)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let started: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = started["execution_id"].as_str().unwrap().to_string();
    let status = noetl(&home)
        .args(["exec", "status", &id, "--wait", "--json", "--timeout", "90"])
        .args(nats)
        .output()
        .unwrap();
    let s: Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("exec status: {e}: {}", text(&status)));
    assert_eq!(s["status"], "completed", "{s}");

    let mut tail = noetl(&home)
        .args([
            "events",
            "tail",
            "--execution",
            &id,
            "--from-start",
            "--json",
        ])
        .args(nats)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let _ = tail.kill();
    let events = tail.wait_with_output().unwrap();
    let events_text = String::from_utf8_lossy(&events.stdout).to_string();
    assert!(events_text.contains("task.done"), "{}", text(&events));
    drop(procs);

    // What the client printed, every event, every service's log at debug
    // level, and every byte of the server's JetStream store.
    let mut haystack = format!("{}{}{events_text}", text(&out), text(&status));
    for log in &logs {
        haystack.push_str(&std::fs::read_to_string(log).unwrap_or_default());
    }
    haystack.push_str(&files_under(server.store_dir()));
    check(&s["ctx"]["dump"], &haystack);
}

/// Characters of the token a bound on output leaves at its cut: enough
/// to be redacted (at least 4), too few to be the token.
const CUT_LEFT: usize = 10;

/// Two python tasks whose output the tool bounds (4,096 characters) right
/// inside a secret: one prints padding and then the token, so that the
/// kept head ends in its first [`CUT_LEFT`] characters; one raises with the token followed by padding, so that
/// the traceback's kept tail begins with the token's last [`CUT_LEFT`].
const CUT_PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: sealed_cuts }
keychain:
  - name: api_token
    kind: bearer
workflow:
  - step: start
    tool:
      - name: head
        kind: python
        args: { token: "{{ keychain.api_token.token }}", left: CUT_LEFT }
        code: |
          print("x" * (4096 - left) + token)
          result = {"len": len(token)}
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { head: "{{ outcome.py.stdout }}" } }
      - name: tail
        kind: python
        args: { token: "{{ keychain.api_token.token }}", left: CUT_LEFT }
        code: |
          raise ValueError(token + "z" * (4096 - 1 - left))
        spec:
          policy:
            rules:
              - when: "{{ outcome.status == 'error' }}"
                then: { do: continue, set_ctx: { tail: "{{ outcome.py.traceback }}" } }
"#;

/// A secret the python tool's bounds cut in two comes back redacted at
/// the cut, in the head it keeps of the output and in the tail it keeps
/// of a traceback, and nowhere else in what the run leaves.
#[test]
fn a_secret_cut_by_the_bound_on_a_task_s_output_is_redacted_at_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    put_token(&home, &[]);
    let playbook = dir.path().join("cuts.yaml");
    let left = CUT_LEFT.to_string();
    std::fs::write(&playbook, CUT_PLAYBOOK.replace("CUT_LEFT", &left)).unwrap();
    let out = noetl(&home)
        .args(["run", "--json", "--timeout", "120"])
        .arg(&playbook)
        .output()
        .unwrap();
    let s: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    assert_eq!(s["status"], "completed", "{s}");
    let (head_of, tail_of) = (&TOKEN[..CUT_LEFT], &TOKEN[TOKEN.len() - CUT_LEFT..]);

    // The kept head of stdout: its first 4,096 characters, which end in
    // the token's first characters, redacted, then the cut's note.
    let head = s["ctx"]["head"].as_str().unwrap_or_else(|| panic!("{s}"));
    let pad = "x".repeat(4096 - CUT_LEFT);
    assert!(
        head.starts_with(&format!("{pad}[redacted]\n...[truncated ")),
        "{}",
        &head[head.len().saturating_sub(200)..]
    );

    // The kept tail of the traceback: its note, then the token's last
    // characters, redacted, then the padding.
    let tail = s["ctx"]["tail"].as_str().unwrap_or_else(|| panic!("{s}"));
    assert!(
        tail.starts_with("...[truncated]\n[redacted]zzz"),
        "{}",
        &tail[..tail.len().min(200)]
    );

    // Neither part is anywhere in what the run printed or stored.
    let haystack = format!("{}{}", text(&out), files_under(&home));
    for (what, part) in [
        ("the head's part of the token", format!("x{head_of}")),
        ("the tail's part of the token", format!("{tail_of}zzz")),
        ("the whole token", TOKEN.to_string()),
    ] {
        assert!(!haystack.contains(&part), "{what} ({part}) leaked");
    }
}
