//! `noetl admin compact --older-than DUR`: remove the KV state (header,
//! plan, step records, `ctx`, loop runs, and leftover `held.*`, `paused`,
//! `wait.*` keys) of executions that ended at least that long ago, with
//! no execution of their tree still running. Their events stay: `noetl
//! exec show` and `exec replay --until` still show them, from the log
//! (docs/operations.md "Compact").

use std::process::ExitCode;

use noetl_mesh::{cleanup::cleanable, events::now_ms, state::ExecHeader};
use serde::Serialize;

use super::common::MeshArgs;
use super::exit::Exit;
use super::tail_filter::{parse_since, Since};

/// Arguments of `noetl admin compact`.
#[derive(clap::Args)]
pub struct CompactArgs {
    /// Executions that ended at least this long ago (`30m`, `12h`, `7d`).
    #[arg(long, value_name = "DUR")]
    pub older_than: String,
    /// Only say which executions would be compacted.
    #[arg(long)]
    pub dry_run: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// What `noetl admin compact --json` prints.
#[derive(Debug, Serialize)]
struct Compacted {
    dry_run: bool,
    older_than_s: u64,
    executions: Vec<String>,
}

/// `noetl admin compact`.
pub async fn run(a: CompactArgs) -> anyhow::Result<ExitCode> {
    let older_than = match parse_since(&a.older_than) {
        Ok(Since::Ago(d)) => d,
        Ok(Since::At(_)) | Err(_) => {
            eprintln!(
                "error: --older-than {:?}: expected a duration such as 30m, 12h or 7d",
                a.older_than
            );
            return Ok(Exit::Usage.into());
        }
    };
    let mesh = a.mesh.attach().await?;
    let mut headers: Vec<ExecHeader> = Vec::new();
    for (key, h) in mesh.executions().await? {
        match h {
            Ok(h) => headers.push(h),
            Err(e) => eprintln!("warning: execution header {key} does not decode: {e}"),
        }
    }
    let ids = cleanable(&headers, now_ms(), older_than.as_millis() as u64);
    if !a.dry_run {
        for id in &ids {
            mesh.forget_execution(id).await?;
        }
    }
    if a.json {
        let out = Compacted {
            dry_run: a.dry_run,
            older_than_s: older_than.as_secs(),
            executions: ids,
        };
        println!("{}", serde_json::to_string(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if a.dry_run {
        "would compact"
    } else {
        "compacted"
    };
    println!(
        "{verb} {} execution(s) that ended over {} ago; their events stay",
        ids.len(),
        a.older_than
    );
    for id in &ids {
        println!("  {id}");
    }
    Ok(ExitCode::SUCCESS)
}
