//! `noetl events export`: an execution's events (or every event since a
//! time) as JSON Lines, one `events tail --json` line each, to stdout or a
//! file; `noetl exec replay --from FILE` folds such a file
//! (docs/operations.md "Export").

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use noetl_mesh::replay::{self, LogReader};

use super::common::MeshArgs;
use super::exit::Exit;
use super::tail_filter::{parse_since, Since};

/// Arguments of `noetl events export`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "since"])))]
pub struct ExportArgs {
    /// The execution whose events to export.
    #[arg(value_parser = super::exec_shared::execution_id)]
    pub id: Option<String>,
    /// Every event of every execution since this long ago (`30m`, `7d`) or
    /// this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// Write to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// The start of `--since` in Unix epoch ms.
fn since_ms(s: &str) -> Result<u64, String> {
    let now = noetl_mesh::events::now_ms();
    match parse_since(s)? {
        Since::Ago(d) => Ok(now.saturating_sub(d.as_millis() as u64)),
        Since::At(t) => noetl_mesh::events::parse_rfc3339(&t)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .ok_or_else(|| format!("--since {t:?} is not an RFC 3339 time")),
    }
}

/// `noetl events export`.
pub async fn run(a: ExportArgs) -> anyhow::Result<ExitCode> {
    let since = match a.since.as_deref().map(since_ms).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Usage.into());
        }
    };
    let mesh = a.mesh.attach().await?;
    // Read as it is written, a chunk at a time: a loop of 100,000
    // iterations is 300,000 events, never held at once.
    let mut log = match (&a.id, since) {
        (Some(id), _) => LogReader::of(&mesh, id),
        (None, Some(ms)) => LogReader::since(&mesh, ms),
        (None, None) => unreachable!("clap requires one"),
    };
    let first = log.next().await?;
    if let (Some(id), None) = (&a.id, &first) {
        return Ok(super::exec_shared::no_execution(&mesh, id).await);
    }
    let mut out: Box<dyn Write> = match &a.out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut written = 0u64;
    let mut next = first;
    while let Some(l) = next {
        if let Err(e) = writeln!(out, "{}", replay::export_line(&l)?) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(ExitCode::SUCCESS);
            }
            return Err(e).context("writing the export");
        }
        written += 1;
        next = log.next().await?;
    }
    out.flush().ok();
    if let Some(path) = &a.out {
        eprintln!("{written} events written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_duration_ago_or_a_time() {
        assert_eq!(since_ms("1970-01-01T00:00:02Z"), Ok(2000));
        let ago = since_ms("10m").unwrap();
        let now = noetl_mesh::events::now_ms();
        assert!(now - ago >= 600_000 && now - ago < 660_000);
        assert!(since_ms("soon").is_err());
    }
}
