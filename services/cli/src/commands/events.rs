//! `noetl events tail`: follow the event stream.

use crate::commands::exit::Exit;
use noetl_mesh::MeshError;
use std::ops::ControlFlow;
use std::process::ExitCode;

use anyhow::Context;
use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures::StreamExt;
use noetl_mesh::{codec, event_type::EventType, events, state::ExecStatus};
use noetl_wire::Event;
use serde_json::{json, Value};

use super::common::MeshArgs;
use super::tail_filter::{parse_since, type_filter, Since};

/// `noetl events ...`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Follow events as they happen.
    Tail(Box<TailArgs>),
    /// Print raw event messages read on stdin: one message (protobuf or
    /// JSON, e.g. `nats stream get NOETL_EVENTS 42 --raw`), or JSON events
    /// one per line (`nats sub --raw` when events are published as JSON).
    Decode(DecodeArgs),
    /// Write an execution's events (or every event since a time) as JSON
    /// Lines, for `noetl exec replay --from FILE`.
    Export(Box<super::events_export::ExportArgs>),
}

/// Arguments of `noetl events decode`.
#[derive(clap::Args)]
pub struct DecodeArgs {
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// The message's subject: a protobuf event is stored without its
    /// execution id and type, which its subject names (docs/architecture.md
    /// "Events as stored").
    #[arg(long)]
    pub subject: Option<String>,
}

/// Arguments of `noetl events tail`.
#[derive(clap::Args)]
pub struct TailArgs {
    /// Only this execution.
    #[arg(long, value_parser = super::exec_shared::execution_id)]
    pub execution: Option<String>,
    /// Only event types matching this glob (`step.*`, `loop.done`); the
    /// server filters by subject where the glob allows it.
    #[arg(long = "type")]
    pub event_type: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Start from the oldest stored event instead of new ones.
    #[arg(long, conflicts_with_all = ["since", "from_seq"])]
    pub from_start: bool,
    /// Start this long ago (`30s`, `10m`, `2h`, `1d`) or at this RFC 3339
    /// time (`2026-11-23T10:00:00Z`).
    #[arg(long, conflicts_with = "from_seq")]
    pub since: Option<String>,
    /// Start at this stream sequence number.
    #[arg(long)]
    pub from_seq: Option<u64>,
    /// Stop after printing this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop when the execution ends (needs `--execution`; its events are
    /// read from its start) and exit with its status: 0 completed, 1
    /// failed or cancelled.
    #[arg(long, requires = "execution")]
    pub until_done: bool,
    /// Stop once every stored event has been printed instead of following.
    #[arg(long)]
    pub no_follow: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Dispatch.
pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Tail(a) => tail(*a).await,
        Command::Decode(a) => decode_stdin(&a),
        Command::Export(a) => super::events_export::run(*a).await,
    }
}

/// An `--type` pattern: `*` matches any run of characters (dots too).
pub fn type_pattern(pattern: &str) -> anyhow::Result<globset::GlobMatcher> {
    let glob = globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .build()
        .with_context(|| format!("--type {pattern:?} is not a pattern"))?;
    Ok(glob.compile_matcher())
}

fn summary(p: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(Value::Object(m)) = Some(p) {
        for key in [
            "status", "error", "result", "total", "index", "counts", "arcs", "reason", "action",
            "attempt",
        ] {
            if let Some(v) = m.get(key) {
                if v.is_null() {
                    continue;
                }
                let mut s = match v {
                    Value::String(s) => s.clone(),
                    Value::Object(o) if key == "error" => o
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    other => other.to_string(),
                };
                if s.len() > 80 {
                    s.truncate(77);
                    s.push_str("...");
                }
                parts.push(format!("{key}={s}"));
            }
        }
    }
    parts.join(" ")
}

fn decode_stdin(a: &DecodeArgs) -> anyhow::Result<ExitCode> {
    use std::io::Read;
    let mut data = Vec::new();
    std::io::stdin().read_to_end(&mut data)?;
    let (events, errors) = decode_messages(&data, a.subject.as_deref().unwrap_or(""));
    for e in &errors {
        eprintln!("{e}");
    }
    for ev in &events {
        print_event(ev, 0, a.json);
    }
    Ok(if events.is_empty() || !errors.is_empty() {
        Exit::Usage.into()
    } else {
        ExitCode::SUCCESS
    })
}

/// The events in `data`: the whole of it as one message (published on
/// `subject`, when known), else one JSON event per line; each line that is
/// not an event is an error naming it.
fn decode_messages(data: &[u8], subject: &str) -> (Vec<Event>, Vec<String>) {
    let trimmed = data.strip_suffix(b"\n").unwrap_or(data);
    if let Ok(ev) = noetl_mesh::events::decode_message(subject, None, trimmed) {
        return (noetl_mesh::events::unfold(ev).collect(), Vec::new());
    }
    let mut events = Vec::new();
    let mut errors = Vec::new();
    for (n, line) in data.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match codec::decode_event(line) {
            Ok(ev) => events.extend(noetl_mesh::events::unfold(ev)),
            Err(e) => errors.push(format!("stdin line {}: {e}", n + 1)),
        }
    }
    (events, errors)
}

/// Where a tail starts reading, as `--from-start`, `--since` and
/// `--from-seq` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// The oldest stored event.
    All,
    /// Only events stored after the tail began.
    New,
    /// This stream sequence number.
    Seq(u64),
    /// Events stored at or after this Unix time, in nanoseconds.
    Since(i128),
}

fn start(a: &TailArgs) -> anyhow::Result<Start> {
    if let Some(seq) = a.from_seq {
        return Ok(Start::Seq(seq));
    }
    if let Some(since) = &a.since {
        let nanos = match parse_since(since).map_err(anyhow::Error::msg)? {
            Since::At(t) => async_nats::datetime::parse_rfc3339(&t)
                .map_err(|e| anyhow::anyhow!("--since {t:?}: not an RFC 3339 time: {e}"))?
                .unix_timestamp_nanos(),
            Since::Ago(d) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                now.saturating_sub(d).as_nanos() as i128
            }
        };
        return Ok(Start::Since(nanos));
    }
    // Waiting for an execution's end reads it from its start: it may have
    // ended already.
    Ok(if a.from_start || a.until_done {
        Start::All
    } else {
        Start::New
    })
}

/// A followed tail's consumer start.
fn deliver_policy(start: Start, since: Option<&str>) -> anyhow::Result<DeliverPolicy> {
    Ok(match start {
        Start::All => DeliverPolicy::All,
        Start::New => DeliverPolicy::New,
        Start::Seq(seq) => DeliverPolicy::ByStartSequence {
            start_sequence: seq,
        },
        Start::Since(nanos) => DeliverPolicy::ByStartTime {
            start_time: async_nats::datetime::from_nanos(nanos)
                .map_err(|e| anyhow::anyhow!("--since {:?}: {e}", since.unwrap_or("")))?,
        },
    })
}

/// Where a `--no-follow` read of what is stored starts; `None` when it
/// reads nothing (only new events were asked for).
fn read_from(start: Start) -> Option<events::ReadFrom> {
    match start {
        Start::All => Some(events::ReadFrom::Start),
        Start::New => None,
        Start::Seq(seq) => Some(events::ReadFrom::AfterSeq(seq.saturating_sub(1))),
        Start::Since(nanos) => Some(events::ReadFrom::SinceMs(
            u64::try_from(nanos.max(0) / 1_000_000).unwrap_or(u64::MAX),
        )),
    }
}

/// What a tail prints, and when it stops.
struct Printer<'a> {
    a: &'a TailArgs,
    pattern: Option<globset::GlobMatcher>,
    spec: Option<&'static noetl_mesh::event_type::SpecName>,
    printed: u64,
    unfolder: events::Unfolder,
}

impl Printer<'_> {
    /// Print what the stored event at `seq` holds that the tail wants;
    /// `Break` with the exit code once the tail is to stop (`--count`
    /// printed, or with `--until-done` the execution's end seen).
    fn take(&mut self, seq: u64, stored: Event) -> ControlFlow<ExitCode> {
        let batch = EventType::of(&stored)
            .filter(|t| t.is_batch())
            .map(EventType::wire_name);
        for ev in self.unfolder.unfold(stored) {
            if wanted(&ev, batch, self.pattern.as_ref(), self.spec) {
                print_event(&ev, seq, self.a.json);
                self.printed += 1;
            }
            if self.a.until_done {
                if let Some(status) = terminal(&ev) {
                    return ControlFlow::Break(super::common::exit_code(status));
                }
            }
        }
        if self.a.count.is_some_and(|n| self.printed >= n) {
            return ControlFlow::Break(ExitCode::SUCCESS);
        }
        ControlFlow::Continue(())
    }
}

fn undecodable(subject: &str, e: &dyn std::fmt::Display) {
    eprintln!("skipping undecodable message on {subject}: {e}");
}

/// The terminal status an event announces, if it ends its execution.
fn terminal(ev: &Event) -> Option<ExecStatus> {
    match EventType::of(ev) {
        Some(EventType::ExecutionCompleted) => Some(ExecStatus::Completed),
        Some(EventType::ExecutionFailed) => Some(ExecStatus::Failed),
        Some(EventType::ExecutionCancelled) => Some(ExecStatus::Cancelled),
        _ => None,
    }
}

/// Whether `ev` (read from a stored event, of type `batch` when that was
/// a batch, which is read as its iterations: a type filter that names the
/// batch shows them) passes `--type`: a glob, or a name of the spec's.
fn wanted(
    ev: &Event,
    batch: Option<&str>,
    pattern: Option<&globset::GlobMatcher>,
    spec: Option<&noetl_mesh::event_type::SpecName>,
) -> bool {
    let names = |t: &str| ev.event_type == t || batch == Some(t);
    match (pattern, spec) {
        (_, Some(s)) => s.ours.iter().any(|t| names(t.wire_name())),
        // (an exact subject filter too: a step's end is read with the
        // `task.done` it carries)
        (Some(g), None) => g.is_match(&ev.event_type) || batch.is_some_and(|b| g.is_match(b)),
        _ => true,
    }
}

async fn tail(a: TailArgs) -> anyhow::Result<ExitCode> {
    // A name of the spec's that is not ours follows ours (docs/dsl.md
    // "The spec's names"); the client picks them out.
    let spec = a
        .event_type
        .as_deref()
        .and_then(noetl_mesh::event_type::spec_name);
    if let Some(s) = spec.filter(|s| s.ours.is_empty()) {
        eprintln!(
            "error: --type {}: this engine emits no such event ({}; docs/dsl.md \"The spec's names\")",
            a.event_type.as_deref().unwrap_or(s.name),
            s.why
        );
        return Ok(super::exit::Exit::Usage.into());
    }
    let mesh = a.mesh.attach().await?;
    let pattern = a.event_type.as_deref().map(type_pattern).transpose()?;
    // `--until-done` must see the terminal event whatever `--type` says,
    // and a `task.done` may be stored inside its step's end, an
    // iteration's start and end inside its batch's (docs/architecture.md
    // "Events as stored"): then the client alone filters by type.
    let in_ends = pattern.as_ref().is_some_and(|g| {
        noetl_mesh::events::CARRIED
            .iter()
            .any(|t| g.is_match(t.wire_name()))
    });
    let types = match (&a.event_type, a.until_done, spec) {
        (Some(g), false, None) if !in_ends => type_filter(g),
        _ => type_filter("*"),
    };
    let filter = mesh
        .subjects()
        .events_matching(a.execution.as_deref(), &types);
    let start = start(&a)?;
    let mut printer = Printer {
        a: &a,
        pattern,
        spec,
        printed: 0,
        unfolder: events::Unfolder::bounded(events::FOLLOWED_ITERATIONS),
    };
    if a.no_follow {
        return print_stored(&mesh, &filter, start, printer).await;
    }
    let stream_name = mesh.subjects().events_stream();
    // NATS failures past joining are the mesh's (exit 5), named by what failed.
    let setup = |e: &dyn std::fmt::Display| MeshError::Setup {
        what: format!("an ordered consumer on stream {stream_name}"),
        message: e.to_string(),
    };
    let consume = |e: &dyn std::fmt::Display| MeshError::Consume {
        consumer: format!("events tail on {stream_name}"),
        message: e.to_string(),
    };
    let stream = mesh
        .js()
        .get_stream(&stream_name)
        .await
        .map_err(|e| setup(&e))?;
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: filter,
            deliver_policy: deliver_policy(start, a.since.as_deref())?,
            ..Default::default()
        })
        .await
        .map_err(|e| setup(&e))?;
    let mut messages = consumer.messages().await.map_err(|e| consume(&e))?;
    while let Some(m) = messages.next().await {
        let m = m.map_err(|e| consume(&e))?;
        let stored: Event = match noetl_mesh::events::decode(&m) {
            Ok(e) => e,
            Err(e) => {
                undecodable(&m.subject, &e);
                continue;
            }
        };
        let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
        if let ControlFlow::Break(code) = printer.take(seq, stored) {
            return Ok(code);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--no-follow`: print what is stored under `filter` from `start`,
/// through what the stream's leader holds now: the consumer may land on a
/// replica that lags (docs/architecture.md "Reading the log").
async fn print_stored(
    mesh: &noetl_mesh::Mesh,
    filter: &str,
    start: Start,
    mut printer: Printer<'_>,
) -> anyhow::Result<ExitCode> {
    let Some(from) = read_from(start) else {
        return Ok(ExitCode::SUCCESS);
    };
    let mut code = ExitCode::SUCCESS;
    mesh.visit_stored_events(filter, from, |seq, stored| match stored {
        Ok(stored) => printer.take(seq, stored).map_break(|c| code = c),
        Err(e) => {
            undecodable(&format!("{filter} (stream sequence {seq})"), &e);
            ControlFlow::Continue(())
        }
    })
    .await?;
    Ok(code)
}

/// One event: a line for people, or a JSON object with its stream
/// sequence (`seq`, what `--from-seq` takes).
fn print_event(ev: &Event, seq: u64, json: bool) {
    let payload = events::payload(ev);
    let ts = codec::event_time(ev);
    if json {
        println!(
            "{}",
            json!({
                "seq": seq, "event_id": ev.event_id, "event_type": ev.event_type, "ts": ts,
                "execution_id": ev.execution_id, "step": ev.step, "task": ev.task,
                "step_run_id": ev.step_run_id, "task_run_id": ev.task_run_id,
                "trace_id": ev.trace_id, "parent_id": ev.parent_id, "payload": payload,
            })
        );
    } else {
        let time = ts.get(11..23).unwrap_or(&ts);
        let short: String = ev.execution_id.chars().take(12).collect();
        let place = if ev.task.is_empty() {
            ev.step.clone()
        } else {
            format!("{}/{}", ev.step, ev.task)
        };
        println!(
            "{time}  {short:<12}  {:<22}  {place:<24}  {}",
            ev.event_type,
            summary(&payload)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{decode_messages, type_pattern};
    use noetl_mesh::codec;
    use noetl_wire::Event;

    fn event(id: &str) -> Event {
        Event {
            event_id: id.into(),
            event_type: "step.done".into(),
            execution_id: "e1".into(),
            payload_json: br#"{"status":"ok"}"#.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn stdin_holds_one_raw_message_or_json_lines() {
        let (evs, errors) = decode_messages(&codec::encode(&event("a")), "");
        assert_eq!((evs.len(), errors.len()), (1, 0));
        let mut lines = codec::event_json(&event("a")).unwrap();
        lines.push(b'\n');
        lines.extend(codec::event_json(&event("b")).unwrap());
        lines.extend(b"\nnot an event\n");
        let (evs, errors) = decode_messages(&lines, "");
        let ids: Vec<&str> = evs.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("stdin line 3:"), "{}", errors[0]);
        // An event as stored: its type and execution come from --subject.
        let stored = codec::encode(&noetl_mesh::events::stored_form(&event("c")));
        let (evs, _) = decode_messages(&stored, "noetl.evt.e1.step.done");
        assert_eq!(evs.len(), 1);
        assert_eq!(
            (evs[0].event_type.as_str(), evs[0].execution_id.as_str()),
            ("step.done", "e1")
        );
    }

    #[test]
    fn a_no_follow_read_starts_where_the_followed_tail_would() {
        use super::{read_from, Start};
        use noetl_mesh::events::ReadFrom;
        assert_eq!(read_from(Start::All), Some(ReadFrom::Start));
        // `--from-seq 5` prints 5: the read is of what comes after 4.
        assert_eq!(read_from(Start::Seq(5)), Some(ReadFrom::AfterSeq(4)));
        assert_eq!(read_from(Start::Seq(0)), Some(ReadFrom::AfterSeq(0)));
        assert_eq!(
            read_from(Start::Since(1_700_000_000_123_456_789)),
            Some(ReadFrom::SinceMs(1_700_000_000_123))
        );
        // Only new events, and nothing is followed: nothing to read.
        assert_eq!(read_from(Start::New), None);
    }

    #[test]
    fn globs() {
        let glob = |p: &str, t: &str| type_pattern(p).unwrap().is_match(t);
        assert!(glob("step.*", "step.done"));
        assert!(glob("loop.done", "loop.done"));
        assert!(!glob("loop.done", "loop.iteration.done"));
        assert!(glob("*.done", "loop.iteration.done"));
        assert!(!glob("step.*", "task.done"));
    }
}
