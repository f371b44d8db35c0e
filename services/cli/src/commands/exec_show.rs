//! `noetl exec show ID [--at SEQ|TIME]`: an execution as a tree of steps,
//! their runs, loop counts and tasks, built from its events
//! ([`super::tree`]). With `--at`, as it stood at that event (the header
//! folded from the events up to it); an execution whose KV state was
//! compacted (`noetl admin compact`) is shown from its events alone.

use std::process::ExitCode;
use std::time::Duration;

use noetl_mesh::{
    fold::Folded,
    replay::{LogReader, Until},
    state::{shown_status, ExecStatus},
    Mesh,
};

use super::common::{exit_code, MeshArgs};
use super::exec_replay::parse_event_position;
use super::exec_shared::no_execution;
use super::exit::Exit;
use super::tree::TreeFold;

/// Arguments of `noetl exec show`.
#[derive(clap::Args)]
pub struct ShowArgs {
    /// Execution id.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: String,
    /// Print the tree as JSON.
    #[arg(long)]
    pub json: bool,
    /// Redraw every second until the execution ends.
    #[arg(long, conflicts_with_all = ["json", "at"])]
    pub watch: bool,
    /// Show the execution as it stood at this event: a stream sequence
    /// number (`seq` of `events tail --json`) or an RFC 3339 time.
    #[arg(long, value_name = "SEQ|TIME")]
    pub at: Option<String>,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// `noetl exec show`.
pub async fn run(a: ShowArgs) -> anyhow::Result<ExitCode> {
    let at = match a
        .at
        .as_deref()
        .map(|s| parse_event_position("--at", s))
        .transpose()
    {
        Ok(at) => at,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Usage.into());
        }
    };
    let mesh = a.mesh.attach().await?;
    let clear = a.watch && std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let stored = match at {
            Some(_) => None,
            None => mesh.exec_header(&a.id).await?,
        };
        let (tree, folded) = read(&mesh, &a.id, at.unwrap_or_default(), stored.is_none()).await?;
        let (header, from_log) = match (stored, folded) {
            (Some(h), _) => (h, None),
            (
                None,
                Some(Folded {
                    header: Some(h),
                    last_seq,
                    events,
                    ..
                }),
            ) => (h, Some((last_seq, events))),
            (None, _) => return Ok(no_execution(&mesh, &a.id).await),
        };
        let mut tree = tree.finish();
        tree.problems.name_missing_of(&mesh, &a.id).await;
        // What holds a running execution back, as `exec why` says (only
        // for its present state: the log does not keep it).
        let live = header.status == ExecStatus::Running && from_log.is_none();
        let paused = match live {
            true => mesh.pause_record(&a.id).await?,
            false => None,
        };
        let queued = live && mesh.is_queued(&a.id).await?;
        if live {
            tree.status = shown_status(header.status, paused.is_some(), queued).into();
        }
        if a.json {
            println!("{}", serde_json::to_string_pretty(&tree)?);
        } else {
            if clear {
                print!("\x1b[2J\x1b[H");
            }
            if let Some((seq, n)) = from_log {
                match at {
                    Some(_) => println!("as of seq {seq} ({n} events)"),
                    None => println!(
                        "from its {n} events (its KV state was compacted; up to seq {seq})"
                    ),
                }
            }
            print!("{}", tree.render());
            if let Some(p) = &paused {
                println!("{}", super::common::paused_line(&a.id, p));
            } else if queued {
                println!("{}", super::common::queued_line(&a.id));
            }
            if !header.live.is_empty() {
                let live: Vec<String> = header
                    .live
                    .iter()
                    .map(|t| format!("{} ({})", t.step, t.token_id))
                    .collect();
                println!("live tokens: {}", live.join(", "));
            }
        }
        if !a.watch || header.status != ExecStatus::Running {
            return Ok(if header.status == ExecStatus::Running || at.is_some() {
                ExitCode::SUCCESS
            } else {
                exit_code(header.status)
            });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if !clear {
            println!();
        }
    }
}

/// Execution `id`'s log up to `until`, read a chunk at a time and never
/// held (a loop of 100,000 iterations is 300,000 events): its tree, and
/// with `fold` (KV keeps no header: as of `--at`, or compacted) the
/// records the events give.
async fn read(
    mesh: &Mesh,
    id: &str,
    until: Until,
    fold: bool,
) -> anyhow::Result<(TreeFold, Option<Folded>)> {
    let mut tree = TreeFold::new(id);
    let mut folded = fold.then(Folded::default);
    let mut log = LogReader::of(mesh, id);
    while let Some(l) = log.next().await? {
        if !until.keeps(&l) {
            continue;
        }
        tree.apply(&l.event);
        if let Some(f) = &mut folded {
            f.apply(l.seq, &l.event)?;
        }
    }
    Ok((tree, folded))
}

#[cfg(test)]
mod tests {
    #[test]
    fn at_takes_what_replay_until_takes() {
        use noetl_mesh::replay::Until;
        assert_eq!(
            super::parse_event_position("--at", "3").unwrap(),
            Until::Seq(3)
        );
        let e = super::parse_event_position("--at", "soon").unwrap_err();
        assert!(e.to_string().starts_with("--at \"soon\""), "{e}");
    }
}
