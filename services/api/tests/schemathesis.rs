//! The API under `schemathesis` (pinned in the Makefile, installed into
//! `.venv/` by `make setup`): every check, generated from the OpenAPI
//! document the server serves, against the API over a real mesh, for a
//! bounded time with a fixed seed. Any 5xx or conformance failure fails
//! the test.
//!
//! `schemathesis` is found at `NOETL_SCHEMATHESIS`, else
//! `<workspace>/.venv/bin/schemathesis`; without it the test fails,
//! naming `make setup`.

use std::path::{Path, PathBuf};

use serde_json::json;

mod support;
use support::{Api, FLOW};

/// The fixed seed: a failure replays with the same cases.
const SEED: &str = "36";

/// The time budget of the run, in seconds (`make test` stays in its budget).
const MAX_SECONDS: &str = "150";

/// Schema-valid values the server refuses for what they mean (a playbook
/// that does not load, a path that is not registered, an execution that
/// has ended, `path` and `catalog_id` together) are 422, as NoETL answers
/// them: the schema cannot state those rules, so a 422 counts as a
/// refusal of valid data that was meant.
const CONFIG: &str = r#"
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "422"]
"#;

fn schemathesis() -> PathBuf {
    let bin = std::env::var_os("NOETL_SCHEMATHESIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/schemathesis")
        });
    assert!(
        bin.exists(),
        "schemathesis is not at {} (run `make setup`, or set NOETL_SCHEMATHESIS)",
        bin.display()
    );
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_api_holds_under_schemathesis_with_every_check() {
    let bin = schemathesis();
    let (api, keys) = Api::start().await;
    api.register(Some(&keys.admin), FLOW).await;
    let id = api
        .execute(Some(&keys.admin), "tests/api_flow", json!({}))
        .await;
    api.wait_status(&id, Some(&keys.viewer), "COMPLETED").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("schemathesis.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = tokio::process::Command::new(&bin)
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/api/openapi.json", api.base))
        .args(["--checks", "all", "--seed", SEED, "--max-time", MAX_SECONDS])
        // One worker: schemathesis's threads compiling schemas at once can
        // trip CPython 3.11 ("AST constructor recursion depth mismatch").
        .args(["--workers", "1", "--request-timeout", "20"])
        .args(["--suppress-health-check", "all"])
        // The two event streams (SSE) with `follow` stay open by design;
        // `/api/ehdb/executions/{id}/events` is JSON and is fuzzed.
        .args(["--exclude-path-regex", "^/api/(executions/[^/]+/)?events$"])
        .arg("--header")
        .arg(format!("Authorization: Bearer {}", keys.admin))
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(dir.path())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis found failures:\n{text}");
    // What it covered, for the log (`--nocapture`).
    println!("{text}");
}
