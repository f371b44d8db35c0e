//! `noetl run FILE`: the embedded default. Starts a private nats-server (or
//! uses `--nats`), runs every service in-process, shows progress, prints the
//! result and exits 0 (completed), 1 (failed or cancelled; Ctrl-C cancels)
//! or 2 (timed out).

use crate::commands::exit::Exit;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use noetl_mesh::{
    codec, event_type::EventType, events, ids::new_execution_id, replay::LogReader,
    server::NatsServerProcess, Mesh, MeshConfig,
};
use noetl_wire::{Event, ExecutionRequest};

use super::common::{exit_code, init_tracing, print_summary_in_order, InProcess, WorkloadArgs};
use super::problems::ProblemsFold;
use super::{local, source};

/// Arguments of `noetl run`.
#[derive(clap::Args)]
pub struct Args {
    /// The playbook file, or the catalog path of a registered playbook
    /// (`noetl playbook register`).
    pub file: PathBuf,
    /// With a catalog path: run this version instead of the latest.
    #[arg(long)]
    pub version: Option<u32>,
    /// Rewrite a legacy NoETL playbook file with the `noetl migrate`
    /// rewrite in memory first, printing its changes on stderr
    /// (docs/migrate.md, docs/noetl-compat.md).
    #[arg(long)]
    pub migrate: bool,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Use this NATS server instead of a private one. Only this flag picks
    /// a server: `NOETL_NATS_URL` (read by the client commands) does not, so
    /// a shell set up for a cluster still runs `noetl run` locally.
    #[arg(long)]
    pub nats: Option<String>,
    /// With --nats: do not run the services in this process; the ones
    /// already serving that server run the execution.
    #[arg(long, requires = "nats")]
    pub external_services: bool,
    /// Subject / stream / bucket prefix.
    #[arg(long, env = "NOETL_PREFIX", default_value = noetl_mesh::config::DEFAULT_PREFIX)]
    pub prefix: String,
    #[command(flatten)]
    pub auth: super::common::NatsAuthArgs,
    /// Print one JSON summary at the end instead of progress and text.
    #[arg(long)]
    pub json: bool,
    /// How the private nats-server writes to disk: `interval` (its default:
    /// flushed every 2 minutes; a power cut can lose the last writes) or
    /// `always` (every write is on disk before it is acknowledged; slower).
    /// See docs/reliability.md. Not for `--nats`: that server's own
    /// configuration decides.
    #[arg(long, value_enum, default_value_t = Sync::Interval, conflicts_with = "nats")]
    pub sync: Sync,
    /// Give up after this many seconds (exit 4).
    #[arg(long, default_value_t = 3600)]
    pub timeout: u64,
    /// Messages handled at once by each in-process service.
    #[arg(long, default_value_t = super::common::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Serve the HTTP API and web console for this run on loopback
    /// (http://127.0.0.1:8082/, or a free port when that is taken), print
    /// its URL, and keep serving after the execution ends until Ctrl-C
    /// (docs/api.md, docs/console.md).
    #[arg(long)]
    pub ui: bool,
}

/// `--sync`: the private server's JetStream `sync_interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Sync {
    /// Flush on nats-server's interval (default, 2 minutes).
    Interval,
    /// Flush every write before acknowledging it.
    Always,
}

impl From<Sync> for noetl_mesh::server::SyncPolicy {
    fn from(s: Sync) -> Self {
        match s {
            Sync::Interval => Self::Interval,
            Sync::Always => Self::Always,
        }
    }
}

/// Run the playbook: read it, join (or start) the mesh and the services,
/// start the execution, watch it and report.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // One process runs every service: its spans report as `noetl`. The NATS
    // client's own warnings (an ack still queued as the run stops, whose
    // message comes again) are not the user's business.
    let _spans = init_tracing(false, "warn,async_nats=error", "noetl")?;
    // Taken over at once, so an early Ctrl-C (or `kill`, or a closed
    // terminal) cannot kill the process between starting an execution and
    // watching it, leaving it running in the local store.
    let mut interrupt = Interrupts::listen()?;
    let playbook = match what_to_run(&args) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let workload = args.workload.build()?;
    let joined = join(&args).await?;
    let mesh = &joined.mesh;
    let services = if !args.external_services {
        let opts = noetl_inprocess::Options {
            concurrency: args.concurrency,
            ..Default::default()
        };
        Some(InProcess::start(&joined.config, &opts).await?)
    } else {
        None
    };

    let console = match args.ui {
        true => Some(super::serve_api::LocalConsole::start(mesh.clone())?),
        false => None,
    };
    if let Some(c) = &console {
        say(args.json, format!("console: {}", c.url));
    }

    if joined.is_private() && !args.json {
        left_running_note(mesh).await;
    }

    let eid = new_execution_id();
    let req = ExecutionRequest {
        execution_id: eid.clone(),
        playbook_yaml: playbook.yaml,
        path: if playbook.by_path {
            playbook.name.clone()
        } else {
            String::new()
        },
        version: args.version.unwrap_or(0),
        workload_json: codec::json_bytes(&workload),
        source_name: playbook.name,
        ..Default::default()
    };
    let mut follow = start(mesh, &req).await?;

    let bar = (!args.json).then(|| spinner(&eid));
    let timed_out = watch(Watch {
        mesh,
        eid: &eid,
        follow: &mut follow,
        interrupt: &mut interrupt,
        bar: bar.as_ref(),
        timeout: Duration::from_secs(args.timeout),
    })
    .await?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let code = if timed_out {
        eprintln!(
            "error: execution {eid} did not finish within {} s",
            args.timeout
        );
        Exit::Timeout.into()
    } else {
        report(Report {
            mesh,
            eid: &eid,
            json: args.json,
            look: &joined.look_again(&eid),
        })
        .await?
    };
    if let Some(c) = console {
        say(
            args.json,
            format!(
                "the console stays at {}#/executions/{eid} until Ctrl-C",
                c.url
            ),
        );
        let _ = interrupt.recv().await;
        c.stop().await;
    }
    if let Some(s) = services {
        stop(s).await;
    }
    Ok(code)
}

/// Stop the run's services once its execution has ended: what is still in
/// flight is another execution's (one an earlier run left running),
/// delivered again to whichever mesh serves it next, so the user does not
/// wait for it.
async fn stop(services: InProcess) {
    match services.stop_within(STOP_WAIT).await {
        Err(e) if !e.only_draining() => {
            tracing::warn!(error = %e, "services did not stop cleanly")
        }
        _ => {}
    }
}

/// How long `noetl run` waits for its services to finish what is in flight
/// once its execution has ended.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// The signals that cancel the execution `noetl run` watches: Ctrl-C,
/// `kill` (SIGTERM) and a closed terminal (SIGHUP).
struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn listen() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("listening for Ctrl-C")?,
            term: signal(SignalKind::terminate()).context("listening for SIGTERM")?,
            hup: signal(SignalKind::hangup()).context("listening for SIGHUP")?,
        })
    }

    /// The next of them, by its name for the cancellation's reason.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "Ctrl-C",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// Say, before a run on the local store starts, which executions earlier
/// runs left running there (a run killed by SIGKILL, a crash): this run's
/// services go on with them. Nothing is said when the log cannot be read.
async fn left_running_note(mesh: &Mesh) {
    let Ok(left) = noetl_mesh::rebuild::running(mesh).await else {
        return;
    };
    if left.is_empty() {
        return;
    }
    let mut named = Vec::new();
    for eid in left.iter().take(3) {
        let playbook = match mesh.exec_header(eid).await {
            Ok(Some(h)) if !h.playbook.is_empty() => format!(" ({})", h.playbook),
            _ => String::new(),
        };
        named.push(format!("{eid}{playbook}"));
    }
    eprintln!("{}", left_running_line(left.len(), &named));
}

/// The note of [`left_running_note`]: `count` executions, the first ones
/// `named`.
fn left_running_line(count: usize, named: &[String]) -> String {
    let more = match count.saturating_sub(named.len()) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let what = match count {
        1 => "an execution an earlier run left running goes on",
        _ => "executions earlier runs left running go on",
    };
    format!(
        "note: {what} in this run's services: {}{more}; `noetl exec list --local --status running` lists them, `noetl exec cancel ID --local` stops one",
        named.join(", ")
    )
}

/// Print a line the user came for (the console's URL): on stdout, apart
/// from the logs on stderr; on stderr with `--json`, whose stdout is the
/// summary alone.
fn say(json: bool, line: String) {
    match json {
        true => eprintln!("{line}"),
        false => println!("{line}"),
    }
}

/// What `noetl run` sends: a file's text, or a catalog path.
struct Playbook {
    /// The argument as given.
    name: String,
    /// A catalog path the router resolves (the text is then empty).
    by_path: bool,
    /// The file's text.
    yaml: String,
}

/// The playbook to run, or the exit code when it cannot be read.
fn what_to_run(args: &Args) -> Result<Playbook, ExitCode> {
    let name = args.file.display().to_string();
    // A file is sent inline; anything else is a catalog path the router
    // resolves (the local store keeps what `noetl playbook register` put).
    let by_path = !args.file.is_file() && !looks_like_file(&args.file);
    if by_path && args.migrate {
        return Err(migrate_needs_a_file(&name));
    }
    let yaml = if by_path {
        String::new()
    } else {
        match source::read(source::Read {
            path: &args.file,
            migrate: args.migrate,
            warnings: !args.json,
        }) {
            Ok(s) => s.text,
            Err(_) => return Err(Exit::Usage.into()),
        }
    };
    Ok(Playbook {
        name,
        by_path,
        yaml,
    })
}

/// The mesh a run joined, and the private server (if any) that must
/// outlive it.
struct Joined {
    /// The mesh.
    mesh: Mesh,
    /// Its configuration, for the in-process services.
    config: MeshConfig,
    // Field order matters: the connection closes, then the server stops,
    // then the store is released.
    _server: Option<NatsServerProcess>,
    _store: Option<local::StoreGuard>,
}

impl Joined {
    /// Whether the run joined its own server on the local store (not
    /// `--nats`, not a temporary store).
    fn is_private(&self) -> bool {
        matches!(self._store, Some(local::StoreGuard::Locked(_)))
    }

    /// How to look at execution `eid` again after this run: on the local
    /// store with `--local`, on a shared server with `--nats`; a
    /// temporary store is gone with the run.
    fn look_again(&self, eid: &str) -> String {
        match &self._store {
            Some(local::StoreGuard::Locked(_)) => format!(
                "look at it again: noetl exec show {eid} --local  (and exec why {eid} --local: the local store of noetl run keeps it)"
            ),
            Some(local::StoreGuard::Temporary(_)) => format!(
                "execution {eid} ran on a temporary store (another run held the local one) and is gone with this run: run it again when the other run has ended to keep it"
            ),
            None => format!(
                "look at it again: noetl exec show {eid} --nats {}",
                noetl_mesh::connect::display_urls(&self.config.nats_url)
            ),
        }
    }
}

/// Join the mesh at `--nats`, or start a private server and join it.
async fn join(args: &Args) -> anyhow::Result<Joined> {
    let mut config = MeshConfig {
        prefix: args.prefix.clone(),
        ..MeshConfig::from_env()
    };
    args.auth.apply(&mut config);
    // Declared before the server so the store outlives it on drop.
    let mut store: Option<local::StoreGuard> = None;
    let mut server: Option<NatsServerProcess> = None;
    match &args.nats {
        Some(url) => config.nats_url = url.clone(),
        None => {
            let (s, st) = local::start_private_server(local::PrivateServer {
                config: &config,
                fallback: local::Fallback::Temporary,
                sync: args.sync.into(),
            })?;
            config.nats_url = s.url();
            // A private single server: no credentials, one replica,
            // whatever the shell has set up for a cluster.
            config.auth = Default::default();
            config.replicas = 1;
            server = Some(s);
            store = Some(st);
        }
    }
    // With the services elsewhere, the mesh must already be there: this
    // command then only starts and watches an execution.
    let joined = if args.external_services {
        Mesh::attach(config.clone()).await
    } else {
        Mesh::connect(config.clone()).await
    };
    let mesh = joined.with_context(|| {
        format!(
            "joining the mesh at {}",
            noetl_mesh::connect::display_urls(&config.nats_url)
        )
    })?;
    Ok(Joined {
        mesh,
        config,
        _server: server,
        _store: store,
    })
}

/// Follow the execution's events from its first one, then publish its
/// request; the events to watch.
async fn start(
    mesh: &Mesh,
    req: &ExecutionRequest,
) -> anyhow::Result<async_nats::jetstream::consumer::pull::Ordered> {
    let eid = &req.execution_id;
    let stream = mesh
        .js()
        .get_stream(mesh.subjects().events_stream())
        .await?;
    let follow = stream
        .create_consumer(OrderedConfig {
            filter_subject: mesh.subjects().events_of(eid),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await?
        .messages()
        .await?;
    mesh.publish(mesh.subjects().exec_request(), eid, codec::encode(req))
        .await?
        .wait()
        .await?;
    Ok(follow)
}

/// What [`report`] prints.
struct Report<'a> {
    mesh: &'a Mesh,
    eid: &'a str,
    /// `--json`.
    json: bool,
    /// How to look at the execution again once this run has ended.
    look: &'a str,
}

/// Print an ended execution's summary (JSON with `--json`), what went
/// wrong in it (the failing task's error, the first failed iterations,
/// errors a policy rule handled) and, when it did not complete, how to
/// look at it again; its exit code.
async fn report(r: Report<'_>) -> anyhow::Result<ExitCode> {
    let (mesh, eid) = (r.mesh, r.eid);
    let summary = mesh
        .exec_summary(eid)
        .await?
        .with_context(|| format!("execution {eid} has no state"))?;
    // Read a chunk at a time, never held (a loop of 100,000 iterations is
    // 300,000 events); a stored message that does not decode is passed
    // over: the summary shows what the rest tell.
    let mut log = LogReader::of(mesh, eid).lenient();
    let (mut problems, mut order) = (ProblemsFold::default(), Vec::new());
    while let Some(l) = log.next().await? {
        problems.apply(&l.event);
        ran_order(&mut order, &l.event);
    }
    let mut problems = problems.finish();
    problems.name_missing_of(mesh, eid).await;
    if r.json {
        let mut v = serde_json::to_value(&summary)?;
        if !problems.is_empty() {
            v["problems"] = serde_json::to_value(&problems)?;
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_summary_in_order(&summary, &order);
        print!("{}", problems.render());
        if summary.status != noetl_mesh::state::ExecStatus::Completed {
            println!("{}", r.look);
        }
    }
    Ok(exit_code(summary.status))
}

/// The steps in the order they first ran (started, skipped or failed):
/// `ev`'s step added to `order` when it is the first of its step.
fn ran_order(order: &mut Vec<String>, ev: &Event) {
    if !ev.step.is_empty() && !ev.step_run_id.is_empty() && !order.contains(&ev.step) {
        order.push(ev.step.clone());
    }
}

/// `--migrate` with a catalog path: the catalog holds what was registered
/// (migrated when registered with `--migrate`); exit 2.
pub fn migrate_needs_a_file(name: &str) -> ExitCode {
    eprintln!(
        "error: --migrate rewrites a playbook file, and {name} is not one: a catalog path runs what was registered\n  help: register it with `noetl playbook register FILE --migrate`, then run it by path without --migrate"
    );
    Exit::Usage.into()
}

/// The progress spinner of a run.
fn spinner(eid: &str) -> ProgressBar {
    let b = ProgressBar::new_spinner();
    b.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    b.enable_steady_tick(Duration::from_millis(120));
    b.set_message(format!("execution {eid} starting"));
    b
}

/// What [`watch`] follows.
struct Watch<'a> {
    mesh: &'a Mesh,
    eid: &'a str,
    /// The execution's events, from its first.
    follow: &'a mut async_nats::jetstream::consumer::pull::Ordered,
    interrupt: &'a mut Interrupts,
    bar: Option<&'a ProgressBar>,
    timeout: Duration,
}

/// Follow an execution's events until it ends, updating the progress
/// line; Ctrl-C cancels it (once) and the watch goes on until the
/// execution's end. True when it did not end in time.
async fn watch(w: Watch<'_>) -> anyhow::Result<bool> {
    let eid = w.eid;
    let mut progress = Progress::default();
    let deadline = Instant::now() + w.timeout;
    let mut interrupted = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = tokio::select! {
            r = tokio::time::timeout(left, w.follow.next()) => match r {
                Err(_) => return Ok(true),
                Ok(None) => return Ok(false),
                Ok(Some(m)) => m?,
            },
            by = w.interrupt.recv(), if !interrupted => {
                interrupted = true;
                if let Some(b) = w.bar {
                    b.println(format!("  interrupted ({by}): cancelling execution {eid}"));
                }
                w.mesh.request_cancel(eid, &format!("interrupted ({by})")).await?;
                continue;
            }
        };
        let Ok(stored) = noetl_mesh::events::decode(&next) else {
            continue;
        };
        // A batch's iterations and a step's last task are read unfolded.
        let mut terminal = false;
        for ev in noetl_mesh::events::unfold(stored) {
            terminal |= progress.observe(&ev);
            if let Some(b) = w.bar {
                if let Some(done) = retry_of(&ev) {
                    b.println(retry_line(&ev, &done));
                }
                if EventType::of(&ev) == Some(EventType::StepFailed) {
                    let p = events::payload(&ev);
                    b.println(format!(
                        "  step {} failed: {}",
                        ev.step,
                        p["error"]["message"].as_str().unwrap_or("")
                    ));
                }
                b.set_message(progress.line());
            }
        }
        if terminal {
            return Ok(false);
        }
    }
}

/// Live counters for the progress line.
#[derive(Default)]
struct Progress {
    done: usize,
    failed: usize,
    running: BTreeSet<String>,
    loops: BTreeMap<String, (u64, u64)>,
    /// Steps whose task failed and is tried again: the next attempt.
    retrying: BTreeMap<String, u32>,
}

/// The retry `ev` announces, outside a loop's iterations (a loop's
/// retries show in its count): a `task.done` whose policy said `retry`.
fn retry_of(ev: &Event) -> Option<noetl_mesh::payloads::TaskDone> {
    if EventType::of(ev) != Some(EventType::TaskDone)
        || !ev.payload_json.windows(7).any(|w| w == b"\"retry\"")
    {
        return None;
    }
    let done = noetl_mesh::payloads::decode::<noetl_mesh::payloads::TaskDone>(ev).ok()?;
    (done.action == "retry" && done.index.is_none()).then_some(done)
}

/// The line `noetl run` prints when a task is retried: which attempt
/// failed, why, and when the next one runs.
fn retry_line(ev: &Event, done: &noetl_mesh::payloads::TaskDone) -> String {
    const MAX: usize = 200;
    let mut why = done.error.as_ref().map_or_else(
        || "its policy said retry".to_string(),
        |e| format!("{}: {}", e.kind, e.message),
    );
    if why.len() > MAX {
        let cut = (0..=MAX)
            .rev()
            .find(|&i| why.is_char_boundary(i))
            .unwrap_or(0);
        why.truncate(cut);
        why.push('…');
    }
    let next = match &done.retry {
        Some(r) if r.delay_ms > 0 => format!(
            "attempt {} in {:.1}s",
            r.next_attempt,
            r.delay_ms as f64 / 1000.0
        ),
        Some(r) => format!("attempt {} now", r.next_attempt),
        None => "again".to_string(),
    };
    format!(
        "  step {} task {}: attempt {} failed ({why}); retrying, {next}",
        ev.step,
        ev.task,
        done.attempt.max(1)
    )
}

impl Progress {
    /// Update from one event; true when the execution ended.
    fn observe(&mut self, ev: &Event) -> bool {
        match EventType::of(ev) {
            Some(EventType::StepStarted) | Some(EventType::LoopStarted) => {
                self.running.insert(ev.step.clone());
                if EventType::of(ev) == Some(EventType::LoopStarted) {
                    // Progress only: an unreadable count shows as 0.
                    let total =
                        noetl_mesh::payloads::decode::<noetl_mesh::payloads::LoopStarted>(ev)
                            .map_or(0, |l| l.total);
                    self.loops.insert(ev.step.clone(), (0, total));
                }
            }
            Some(EventType::LoopIterationDone) | Some(EventType::LoopIterationFailed) => {
                if let Some(c) = self.loops.get_mut(&ev.step) {
                    c.0 += 1;
                }
            }
            Some(EventType::StepDone)
            | Some(EventType::LoopDone)
            | Some(EventType::StepSkipped) => {
                if self.running.remove(&ev.step) || EventType::of(ev) != Some(EventType::LoopDone) {
                    self.done += 1;
                }
                self.loops.remove(&ev.step);
                self.retrying.remove(&ev.step);
            }
            Some(EventType::StepFailed) => {
                self.running.remove(&ev.step);
                self.loops.remove(&ev.step);
                self.retrying.remove(&ev.step);
                self.failed += 1;
            }
            Some(EventType::TaskDone) => match retry_of(ev) {
                Some(done) => {
                    let next = done.retry.map_or(done.attempt + 1, |r| r.next_attempt);
                    self.retrying.insert(ev.step.clone(), next);
                }
                None => {
                    self.retrying.remove(&ev.step);
                }
            },
            Some(EventType::ExecutionCompleted)
            | Some(EventType::ExecutionFailed)
            | Some(EventType::ExecutionCancelled) => return true,
            _ => {}
        }
        false
    }

    fn line(&self) -> String {
        let mut s = format!("steps done {}", self.done);
        if self.failed > 0 {
            s.push_str(&format!(", failed {}", self.failed));
        }
        if !self.running.is_empty() {
            let names: Vec<String> = self
                .running
                .iter()
                .take(4)
                .map(|n| match (self.loops.get(n), self.retrying.get(n)) {
                    (Some((d, t)), _) => format!("{n} [{d}/{t}]"),
                    (None, Some(a)) => format!("{n} (attempt {a})"),
                    (None, None) => n.clone(),
                })
                .collect();
            s.push_str(&format!(" | running: {}", names.join(", ")));
        }
        s
    }
}

/// A name that is clearly meant as a file (a missing one gets a file error,
/// not a catalog lookup).
fn looks_like_file(p: &std::path::Path) -> bool {
    matches!(
        p.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    ) || p.is_absolute()
        || p.starts_with(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event_type: &str, step: &str, payload: serde_json::Value) -> Event {
        Event {
            event_type: event_type.into(),
            step: step.into(),
            payload_json: codec::json_bytes(&payload),
            ..Default::default()
        }
    }

    #[test]
    fn progress_counts_steps_and_loop_iterations() {
        let mut p = Progress::default();
        let none = serde_json::json!({});
        assert!(!p.observe(&ev(
            EventType::StepStarted.wire_name(),
            "start",
            none.clone()
        )));
        assert!(!p.observe(&ev(EventType::StepDone.wire_name(), "start", none.clone())));
        p.observe(&ev(
            EventType::LoopStarted.wire_name(),
            "each",
            noetl_mesh::payloads::to_value(&noetl_mesh::payloads::LoopStarted {
                total: 3,
                max_in_flight: 1,
                mode: None,
                deadline_ms: 0,
                deadline_of: String::new(),
                collection: serde_json::Value::Null,
                max_rows: 0,
                continues: String::new(),
                continued_events: None,
            }),
        ));
        p.observe(&ev(
            EventType::LoopIterationDone.wire_name(),
            "each",
            none.clone(),
        ));
        p.observe(&ev(
            EventType::LoopIterationFailed.wire_name(),
            "each",
            none.clone(),
        ));
        assert_eq!(p.line(), "steps done 1 | running: each [2/3]");
        p.observe(&ev(EventType::LoopDone.wire_name(), "each", none.clone()));
        p.observe(&ev(EventType::StepStarted.wire_name(), "bad", none.clone()));
        p.observe(&ev(EventType::StepFailed.wire_name(), "bad", none.clone()));
        assert_eq!(p.line(), "steps done 2, failed 1");
        for end in [
            EventType::ExecutionCompleted.wire_name(),
            EventType::ExecutionFailed.wire_name(),
            EventType::ExecutionCancelled.wire_name(),
        ] {
            assert!(p.observe(&ev(end, "", none.clone())), "{end} ends the run");
        }
    }

    #[test]
    fn a_retried_task_is_named_with_its_error_and_next_attempt() {
        let mut p = Progress::default();
        let none = serde_json::json!({});
        p.observe(&ev(
            EventType::StepStarted.wire_name(),
            "fetch",
            none.clone(),
        ));
        let mut retried = ev(
            EventType::TaskDone.wire_name(),
            "fetch",
            serde_json::json!({
                "status": "error",
                "attempt": 1,
                "error": {"kind": "http.connect", "retryable": true, "message": "GET http://x could not connect"},
                "action": "retry",
                "retry": {"delay_ms": 1500, "next_attempt": 2},
            }),
        );
        retried.task = "call".into();
        p.observe(&retried);
        assert_eq!(p.line(), "steps done 0 | running: fetch (attempt 2)");
        let done = retry_of(&retried).expect("a retry");
        assert_eq!(
            retry_line(&retried, &done),
            "  step fetch task call: attempt 1 failed (http.connect: GET http://x could not connect); retrying, attempt 2 in 1.5s"
        );
        // A loop iteration's retry is not announced; the next end clears it.
        let mut in_loop = retried.clone();
        in_loop.payload_json = codec::json_bytes(&serde_json::json!({
            "status": "error", "action": "retry", "index": 3,
            "retry": {"delay_ms": 0, "next_attempt": 2},
        }));
        assert!(retry_of(&in_loop).is_none());
        p.observe(&ev(EventType::TaskDone.wire_name(), "fetch", none.clone()));
        assert_eq!(p.line(), "steps done 0 | running: fetch");
        p.observe(&retried);
        p.observe(&ev(EventType::StepDone.wire_name(), "fetch", none));
        assert_eq!(p.line(), "steps done 1");
    }

    #[test]
    fn the_note_of_executions_left_running_names_the_first_and_counts_the_rest() {
        let one = left_running_line(1, &["e1 (slow)".to_string()]);
        assert_eq!(
            one,
            "note: an execution an earlier run left running goes on in this run's services: e1 (slow); `noetl exec list --local --status running` lists them, `noetl exec cancel ID --local` stops one"
        );
        let named: Vec<String> = ["e1", "e2", "e3"].map(String::from).to_vec();
        let five = left_running_line(5, &named);
        assert!(
            five.starts_with("note: executions earlier runs left running go on in this run's services: e1, e2, e3 and 2 more;"),
            "{five}"
        );
    }
}
