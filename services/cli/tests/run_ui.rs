//! `noetl run --ui` as a user runs it: the embedded mesh's HTTP API and web
//! console on loopback, its URL printed, the execution readable through
//! the API, and the console kept up after the run until Ctrl-C.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use serde_json::Value;

mod support;
use support::{noetl, signal_and_wait, Procs};

/// The line of `stderr` that starts with `prefix`, read until it comes.
fn line_starting(lines: &mut impl Iterator<Item = String>, prefix: &str) -> String {
    for line in lines.by_ref() {
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.trim().to_string();
        }
    }
    panic!("noetl run --ui never printed a line starting {prefix:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_ui_serves_the_console_and_the_api_until_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let playbook = noetl_integration::repo_root().join("playbooks/hello.yaml");
    let mut child = noetl(&dir.path().join("home"))
        .args(["run", "--ui"])
        .arg(&playbook)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The URL is on stdout, apart from the logs (issue 40).
    let stdout = child.stdout.take().unwrap();
    let mut procs = Procs(vec![child]);
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);

    let url = line_starting(&mut lines, "console: ");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    // After the run, the console stays and names the execution.
    let stays = line_starting(&mut lines, "the console stays at ");
    let eid = stays
        .split("#/executions/")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the execution's page")
        .to_string();

    let http = reqwest::Client::new();
    let status: Value = http
        .get(format!("{url}api/executions/{eid}/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["status"], "COMPLETED", "{status}");
    let page = http.get(&url).send().await.unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert!(page.text().await.unwrap().contains("<html"));

    // Ctrl-C stops it, cleanly.
    let status = signal_and_wait(&mut procs.0[0], "INT", "noetl run --ui to exit");
    assert!(status.success(), "exit after Ctrl-C: {status:?}");
    assert!(
        http.get(&url).send().await.is_err(),
        "the console still answers after the run stopped"
    );
}
