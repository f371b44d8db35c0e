//! Nothing outlives `noetl run`: killed with SIGKILL mid-execution (kill -9,
//! the OOM killer, a CI timeout), its private nats-server and its python
//! interpreters die with it (docs/reliability.md).

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// `(pid, command name)` of every process whose parent is `parent`.
fn children_of(parent: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let (head, rest) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_string();
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent).then_some((pid, comm))
    })
    .collect()
}

fn alive(pid: u32) -> bool {
    // A zombie (state Z) has died and waits for its new parent to reap it.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
        .is_some_and(|r| !r.starts_with('Z'))
}

#[test]
fn a_killed_run_leaves_no_nats_server_or_interpreter_behind() {
    let home = tempfile::tempdir().unwrap();
    let playbook = home.path().join("sleepy.yaml");
    std::fs::write(
        &playbook,
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: { name: sleepy }\nworkflow:\n  - step: start\n    tool:\n      - name: nap\n        kind: python\n        code: |\n          import time\n          time.sleep(120)\n          result = 1\n",
    )
    .unwrap();
    let mut run = support::noetl(home.path())
        .arg("run")
        .arg(Path::new(&playbook))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = run.id();
    // Its nats-server, and the interpreter busy with the task.
    let mut children = Vec::new();
    support::wait_until(
        "noetl run to start its nats-server and a python interpreter",
        Duration::from_secs(60),
        || {
            children = children_of(pid);
            let has = |name: &str| children.iter().any(|(_, c)| c.contains(name));
            has("nats-server") && has("python")
        },
    );
    run.kill().unwrap(); // SIGKILL: no destructor, no signal handler runs
    run.wait().unwrap();
    support::wait_until(
        "the children of a killed noetl run to die with it",
        Duration::from_secs(10),
        || children.iter().all(|(p, _)| !alive(*p)),
    );
    let left: Vec<_> = children.iter().filter(|(p, _)| alive(*p)).collect();
    assert!(left.is_empty(), "outlived noetl run: {left:?}");
}
