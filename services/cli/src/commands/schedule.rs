//! `noetl schedule add|list|show|pause|unpause|remove|backfill`: cron
//! schedules of catalog playbooks, stored in the `<p>_schedules` bucket
//! and fired by `noetl serve timer` (docs/operations.md, "Schedules").

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use noetl_mesh::Mesh;
use noetl_timer::cron::{parse_instant, tick_text};
use noetl_timer::policy::{self, CatchUp, Overlap};
use noetl_timer::record::{FiringState, RecordError};
use noetl_timer::start::{backfill, Backfill};
use noetl_timer::{ScheduleRecord, Schedules, TimerError};
use serde_json::{json, Value};

use super::common::{MeshArgs, WorkloadArgs};
use super::exit::of_kind;

/// `noetl schedule ...`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Add a schedule: start a catalog playbook at every tick of a cron
    /// expression (`noetl serve timer` fires it).
    Add(AddArgs),
    /// Every schedule: expression, playbook, policies, last and next tick.
    List(ListArgs),
    /// One schedule, its firing state and its next ticks.
    Show(NameArgs),
    /// Stop firing a schedule (ticks missed while paused are not caught up).
    Pause(NameArgs),
    /// Fire a paused schedule again, from its next tick.
    Unpause(NameArgs),
    /// Delete a schedule (its past runs stay).
    Remove(NameArgs),
    /// Start one run per tick of a time range (once per tick: a tick that
    /// already ran is left alone).
    Backfill(BackfillArgs),
}

/// Arguments of `noetl schedule add`.
#[derive(clap::Args)]
pub struct AddArgs {
    /// Schedule name: 1-64 of [A-Za-z0-9_-].
    pub name: String,
    /// Catalog path of the playbook (`noetl playbook register` first).
    pub playbook: String,
    /// Cron expression: 5 fields `min hour day month weekday`, or 6 with a
    /// leading seconds field (`*/10 * * * * *`); or @hourly, @daily...
    #[arg(long)]
    pub cron: String,
    /// IANA time zone the expression is read in.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// Start this catalog version instead of the latest at each tick.
    #[arg(long)]
    pub version: Option<u32>,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// While the previous run still runs: skip the tick, queue it (one
    /// held), allow it, or cancel-running (cancel the previous, start).
    #[arg(long, default_value = "skip", value_parser = ["skip", "queue", "allow", "cancel-running"])]
    pub overlap: String,
    /// After a downtime, start at most this many missed ticks (the most
    /// recent), or `none`.
    #[arg(long, default_value = "1")]
    pub catch_up: String,
    /// Add it paused.
    #[arg(long)]
    pub paused: bool,
    /// Print the stored schedule as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl schedule list`.
#[derive(clap::Args)]
pub struct ListArgs {
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments naming one schedule.
#[derive(clap::Args)]
pub struct NameArgs {
    /// Schedule name.
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl schedule backfill`.
#[derive(clap::Args)]
pub struct BackfillArgs {
    /// Schedule name.
    pub name: String,
    /// First instant (included): RFC 3339 (`2026-01-01T00:00:00Z`), or a
    /// date or local date-time read in the schedule's time zone.
    #[arg(long)]
    pub from: String,
    /// Last instant (included), as `--from`.
    #[arg(long)]
    pub to: String,
    /// One JSON object per tick.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Run a schedule command. Errors of the schedule itself exit by their
/// kind: 2 invalid (name, expression, time zone, policy, range), 3 not
/// found (schedule, catalog playbook), 5 NATS or KV.
pub async fn run(c: Command) -> anyhow::Result<ExitCode> {
    let done = match c {
        Command::Add(a) => add(a).await?,
        Command::List(a) => list(a).await?,
        Command::Show(a) => show(a).await?,
        Command::Pause(a) => pause(a, true).await?,
        Command::Unpause(a) => pause(a, false).await?,
        Command::Remove(a) => remove(a).await?,
        Command::Backfill(a) => run_backfill(a).await?,
    };
    Ok(match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            of_kind(e.kind()).into()
        }
    })
}

/// A command's own outcome; joining the mesh fails through `anyhow`.
type Done = anyhow::Result<Result<(), TimerError>>;

async fn schedules(mesh: &MeshArgs) -> anyhow::Result<(Mesh, Schedules)> {
    let mesh = mesh.attach().await?;
    let s = Schedules::new(mesh.schedules_kv().clone());
    Ok((mesh, s))
}

/// The record `add` stores, checked without the catalog.
fn new_record(
    a: &AddArgs,
    now: DateTime<Utc>,
) -> anyhow::Result<Result<ScheduleRecord, TimerError>> {
    let overlap: Overlap = a.overlap.parse().map_err(anyhow::Error::msg)?;
    let catch_up: CatchUp = a
        .catch_up
        .parse()
        .map_err(|e: String| anyhow::anyhow!("--catch-up: {e}"))?;
    let Value::Object(workload) = a.workload.build()? else {
        return Ok(Err(RecordError::Workload.into()));
    };
    let record = ScheduleRecord {
        name: a.name.clone(),
        playbook: a.playbook.trim_matches('/').to_string(),
        version: a.version,
        cron: a.cron.trim().to_string(),
        tz: a.tz.trim().to_string(),
        workload,
        overlap,
        catch_up,
        paused: a.paused,
        created_at: tick_text(now),
        resumed_at: None,
        state: FiringState::default(),
    };
    Ok(record.check().map(|_| record).map_err(Into::into))
}

async fn add(a: AddArgs) -> Done {
    let record = match new_record(&a, Utc::now())? {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let (mesh, s) = schedules(&a.mesh).await?;
    if let Err(e) = mesh.catalog().get(&record.playbook, record.version).await {
        return Ok(Err(e.into()));
    }
    if let Err(e) = s.add(&record).await {
        return Ok(Err(e));
    }
    if a.json {
        println!("{}", describe(&record, Utc::now()));
    } else {
        let next = next_ticks(&record, Utc::now(), 1);
        println!(
            "schedule {} added: {} ({}) starts {}; next tick {}",
            record.name,
            record.cron,
            record.tz,
            record.playbook,
            next.first().map(String::as_str).unwrap_or("none")
        );
    }
    Ok(Ok(()))
}

/// The next `n` ticks of a schedule after `now` (none when paused).
fn next_ticks(r: &ScheduleRecord, now: DateTime<Utc>, n: usize) -> Vec<String> {
    let Ok(spec) = r.spec() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut at = policy::next_wake(r, &spec, now);
    while let Some(t) = at.filter(|_| out.len() < n) {
        out.push(tick_text(t));
        at = spec.next_after(t);
    }
    out
}

/// A schedule as JSON: the record, plus its next ticks.
fn describe(r: &ScheduleRecord, now: DateTime<Utc>) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    v["next_ticks"] = json!(next_ticks(r, now, 5));
    v
}

async fn list(a: ListArgs) -> Done {
    let (_, s) = schedules(&a.mesh).await?;
    let all = match s.list().await {
        Ok(all) => all,
        Err(e) => return Ok(Err(e)),
    };
    let now = Utc::now();
    for read in all {
        let r = &read.record;
        if a.json {
            println!("{}", describe(r, now));
            continue;
        }
        let next = next_ticks(r, now, 1);
        println!(
            "{:<24} {:<20} {:<14} {:<28} {:<14} {:<7} last {:<20} next {}",
            r.name,
            r.cron,
            r.tz,
            r.playbook,
            r.overlap,
            if r.paused { "paused" } else { "active" },
            r.state.last_tick.as_deref().unwrap_or("-"),
            next.first().map(String::as_str).unwrap_or("-"),
        );
    }
    Ok(Ok(()))
}

async fn show(a: NameArgs) -> Done {
    let (_, s) = schedules(&a.mesh).await?;
    let r = match s.get(&a.name).await {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    if a.json {
        println!("{}", describe(&r, Utc::now()));
    } else {
        print!("{}", show_text(&r, &next_ticks(&r, Utc::now(), 5)));
    }
    Ok(Ok(()))
}

/// `schedule show` for people: one line per setting, the firing state and
/// the next ticks (`--json` has the record as stored).
fn show_text(r: &ScheduleRecord, next: &[String]) -> String {
    let state = if r.paused { "paused" } else { "active" };
    let version = r
        .version
        .map(|v| format!("version {v}"))
        .unwrap_or_else(|| "the latest version".into());
    let mut out = format!("schedule {}  {state}\n", r.name);
    out.push_str(&format!("  playbook   {} ({version})\n", r.playbook));
    out.push_str(&format!("  cron       {}  ({})\n", r.cron, r.tz));
    out.push_str(&format!("  overlap    {}\n", r.overlap));
    out.push_str(&format!("  catch-up   {}\n", r.catch_up));
    if !r.workload.is_empty() {
        out.push_str(&format!(
            "  workload   {}\n",
            Value::Object(r.workload.clone())
        ));
    }
    out.push_str(&format!("  created    {}\n", r.created_at));
    let last = match (&r.state.last_tick, &r.state.last_execution_id) {
        (Some(t), Some(id)) => format!("{t} (execution {id})"),
        (Some(t), None) => t.clone(),
        _ => "-".into(),
    };
    out.push_str(&format!("  last tick  {last}\n"));
    let next = if next.is_empty() {
        "-".to_string()
    } else {
        next.join(", ")
    };
    out.push_str(&format!("  next       {next}\n"));
    out
}

async fn pause(a: NameArgs, paused: bool) -> Done {
    let (_, s) = schedules(&a.mesh).await?;
    let r = match s.set_paused(&a.name, paused, Utc::now()).await {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    if a.json {
        println!("{}", describe(&r, Utc::now()));
    } else {
        let word = if paused { "paused" } else { "active" };
        println!("schedule {} {word}", r.name);
    }
    Ok(Ok(()))
}

async fn remove(a: NameArgs) -> Done {
    let (_, s) = schedules(&a.mesh).await?;
    if let Err(e) = s.remove(&a.name).await {
        return Ok(Err(e));
    }
    if a.json {
        println!("{}", json!({"name": a.name, "removed": true}));
    } else {
        println!("schedule {} removed", a.name);
    }
    Ok(Ok(()))
}

async fn run_backfill(a: BackfillArgs) -> Done {
    let (mesh, s) = schedules(&a.mesh).await?;
    let r = match s.get(&a.name).await {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let tz = match r.spec() {
        Ok(spec) => spec.tz(),
        Err(e) => return Ok(Err(RecordError::from(e).into())),
    };
    let instant = |flag: &str, text: &str| {
        parse_instant(text, tz).ok_or_else(|| TimerError::Range {
            name: a.name.clone(),
            why: format!("{flag} {text:?} is not a date, a date-time or RFC 3339"),
        })
    };
    let range = instant("--from", &a.from).and_then(|f| Ok((f, instant("--to", &a.to)?)));
    let (from, to) = match range {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let done = match backfill(Backfill {
        mesh: &mesh,
        record: &r,
        from,
        to,
    })
    .await
    {
        Ok(d) => d,
        Err(e) => return Ok(Err(e)),
    };
    let started = done.iter().filter(|b| !b.existed).count();
    for b in &done {
        if a.json {
            println!(
                "{}",
                json!({"tick": b.tick, "execution_id": b.execution_id, "started": !b.existed})
            );
        } else {
            let what = if b.existed { "existed" } else { "started" };
            println!("{}  {}  {what}", b.tick, b.execution_id);
        }
    }
    if !a.json {
        eprintln!(
            "{} tick(s) in range: {started} started, {} already ran",
            done.len(),
            done.len() - started
        );
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_prints_settings_state_and_next_ticks_as_text_not_json() {
        let r = ScheduleRecord {
            name: "nightly".into(),
            playbook: "etl/load".into(),
            version: None,
            cron: "0 2 * * *".into(),
            tz: "Europe/Paris".into(),
            workload: serde_json::Map::new(),
            overlap: Overlap::default(),
            catch_up: CatchUp::default(),
            paused: true,
            created_at: "2026-01-01T00:00:00Z".into(),
            resumed_at: None,
            state: FiringState::default(),
        };
        let text = show_text(&r, &["2026-01-02T02:00:00+01:00".into()]);
        assert!(text.starts_with("schedule nightly  paused\n"), "{text}");
        assert!(
            text.contains("  playbook   etl/load (the latest version)\n"),
            "{text}"
        );
        assert!(
            text.contains("  cron       0 2 * * *  (Europe/Paris)\n"),
            "{text}"
        );
        assert!(
            text.contains("  next       2026-01-02T02:00:00+01:00\n"),
            "{text}"
        );
        assert!(!text.contains('{'), "no JSON: {text}");
    }
}
