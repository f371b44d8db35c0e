//! `noetl exec replay ID`: fold an execution's events into the records
//! they determine (header, step records, `ctx`) and compare them with the
//! records kept in KV; with `--until`, show the state as of any event
//! instead (docs/operations.md "Replay").

use std::process::ExitCode;

use anyhow::bail;
use noetl_mesh::{
    fold::Folded,
    replay::{self, Report, Until},
};

use super::exec_shared::no_execution;
use super::exit::Exit;

pub use super::exec_replay_args::ReplayArgs;

/// `--until` as a sequence number or a time.
pub fn parse_until(s: &str) -> anyhow::Result<Until> {
    parse_event_position("--until", s)
}

/// Flag `flag`'s value as an event's sequence number or a time (`--until`,
/// `exec show --at`); the error names the flag.
pub fn parse_event_position(flag: &str, s: &str) -> anyhow::Result<Until> {
    match Until::parse(s) {
        Some(u) => Ok(u),
        None => bail!(
            "{flag} {s:?}: give a sequence number (e.g. 1234) or an RFC 3339 time (e.g. 2026-11-28T10:00:00Z)"
        ),
    }
}

/// `noetl exec replay`.
pub async fn run(a: ReplayArgs) -> anyhow::Result<ExitCode> {
    let until = match a.until.as_deref().map(parse_until).transpose() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Usage.into());
        }
    };
    if let Some(file) = &a.from {
        return from_file(&a, file, until.unwrap_or_default()).await;
    }
    if a.playbook.is_some() || a.version.is_some() {
        return super::exec_rejudge::run(&a).await;
    }
    let id = a.id.clone().expect("clap requires an id without --from");
    let mesh = a.mesh.attach().await?;
    if let Some(until) = until {
        let folded = replay::fold_log(&mesh, &id, until).await?;
        if folded.events == 0 {
            return Ok(no_execution(&mesh, &id).await);
        }
        print_state(&id, &folded, a.json);
        return Ok(ExitCode::SUCCESS);
    }
    let report = replay::check(&mesh, &id).await?;
    if report.events == 0 && mesh.exec_header(&id).await?.is_none() {
        return Ok(no_execution(&mesh, &id).await);
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(if report.equal {
        ExitCode::SUCCESS
    } else {
        Exit::Failed.into()
    })
}

/// `--from FILE`: fold an export's events of one execution and print the
/// state they give. The mesh is joined only when an event carries a value
/// by reference, to read it from the object store.
async fn from_file(
    a: &ReplayArgs,
    file: &std::path::Path,
    until: Until,
) -> anyhow::Result<ExitCode> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: reading {}: {e}", file.display());
            return Ok(Exit::Usage.into());
        }
    };
    let mut logged = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match replay::import_line(line, i + 1) {
            Ok(l) => logged.push(l),
            Err(e) => {
                eprintln!("error: {}: {e}", file.display());
                return Ok(Exit::Usage.into());
            }
        }
    }
    let ids: std::collections::BTreeSet<&str> = logged
        .iter()
        .map(|l| l.event.execution_id.as_str())
        .collect();
    let id = match (&a.id, ids.len()) {
        (Some(id), _) => id.clone(),
        (None, 1) => ids.first().expect("one").to_string(),
        (None, _) => {
            eprintln!(
                "error: {} holds the events of {} executions; name one: {}",
                file.display(),
                ids.len(),
                ids.into_iter().collect::<Vec<_>>().join(", ")
            );
            return Ok(Exit::Usage.into());
        }
    };
    logged.retain(|l| l.event.execution_id == id && until.keeps(l));
    if logged.is_empty() {
        eprintln!(
            "error: {} holds no event of execution {id:?}",
            file.display()
        );
        return Ok(Exit::NotFound.into());
    }
    if logged.iter().any(|l| replay::carries_reference(&l.event)) {
        let mesh = a.mesh.attach().await?;
        for l in &mut logged {
            replay::hydrate(&mesh, &mut l.event).await?;
        }
    }
    let folded = Folded::of(logged.iter().map(|l| (l.seq, &l.event)))?;
    print_state(&id, &folded, a.json);
    Ok(ExitCode::SUCCESS)
}

fn print_report(r: &Report) {
    if r.equal {
        println!(
            "execution {}: equal: {} events (up to seq {}) give every stored record (header, step records, ctx)",
            r.execution_id, r.events, r.last_seq
        );
        return;
    }
    println!(
        "execution {}: {} record(s) differ from what its {} events give",
        r.execution_id,
        r.differences.len(),
        r.events
    );
    for d in &r.differences {
        println!("  {}", d.what);
        println!("    events give: {}", d.from_events);
        println!("    stored:      {}", d.stored);
        match &d.event {
            Some(o) => println!("    should come from {o}"),
            None => println!("    no event produced it"),
        }
    }
}

fn print_state(eid: &str, f: &Folded, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string(f).expect("folded state serialises")
        );
        return;
    }
    println!(
        "execution {eid} as of seq {} ({} events)",
        f.last_seq, f.events
    );
    match &f.header {
        Some(h) => {
            println!(
                "  status: {}",
                serde_json::to_value(h.status).unwrap_or_default()
            );
            for t in &h.live {
                println!("  live token {} -> step {:?}", t.token_id, t.step);
            }
            if let Some(e) = &h.error {
                println!("  error: {e}");
            }
        }
        None => println!("  not started"),
    }
    for (name, r) in &f.steps {
        let status = serde_json::to_value(r.status).unwrap_or_default();
        println!(
            "  step {name:?}: {} (run {})",
            status.as_str().unwrap_or("?"),
            r.last_step_run_id
        );
    }
    println!("  ctx: {}", serde_json::Value::Object(f.ctx.clone()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_is_a_sequence_number_or_a_time_and_anything_else_is_refused() {
        assert_eq!(parse_until("12").unwrap(), Until::Seq(12));
        assert_eq!(
            parse_until("1970-01-01T00:00:01Z").unwrap(),
            Until::TimeMs(1000)
        );
        let e = parse_until("yesterday").unwrap_err().to_string();
        assert!(e.contains("--until \"yesterday\""), "{e}");
    }
}
