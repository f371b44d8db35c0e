//! What several commands share: mesh connection flags, workload building,
//! summaries (the tool set and in-process services are `noetl-inprocess`).

use crate::commands::exit::Exit;
use std::path::PathBuf;

use anyhow::{bail, Context};
use noetl_mesh::{
    connect::display_urls,
    state::{ExecStatus, ExecSummary},
    Mesh, MeshConfig,
};
use serde_json::{Map, Value};

pub use noetl_inprocess::{all_tools, known_kinds, tool, InProcess};
pub use noetl_mesh::config::DEFAULT_CONCURRENCY;

pub use super::nats_auth::NatsAuthArgs;

/// Flags every client command takes.
#[derive(clap::Args, Clone, Debug)]
pub struct MeshArgs {
    /// NATS servers, comma-separated; the client fails over between them
    /// [env: NOETL_NATS_URL, else NATS_URL; default nats://127.0.0.1:4222].
    #[arg(long, value_name = "URL[,URL...]")]
    pub nats: Option<String>,
    /// Client commands: the local store of `noetl run` (`NOETL_HOME`)
    /// instead of a NATS server, to look at what `noetl run` ran after it
    /// ended (`exec show ID --local`).
    #[arg(long, conflicts_with = "nats")]
    pub local: bool,
    /// Subject / stream / bucket prefix.
    #[arg(long, env = "NOETL_PREFIX", default_value = noetl_mesh::config::DEFAULT_PREFIX)]
    pub prefix: String,
    #[command(flatten)]
    pub auth: NatsAuthArgs,
}

impl MeshArgs {
    /// A service's or `admin`'s mesh: `--local` is for client commands
    /// only (the local store serves `noetl run`).
    pub fn server_config(&self) -> anyhow::Result<MeshConfig> {
        if self.local {
            bail!("--local reads the local store of `noetl run` from a client command; services and `admin` take --nats URL");
        }
        Ok(self.config())
    }

    /// The mesh configuration these flags select: the environment, then
    /// the flags.
    pub fn config(&self) -> MeshConfig {
        let mut config = MeshConfig::from_env();
        config.prefix = self.prefix.clone();
        if let Some(nats) = &self.nats {
            config.nats_url = nats.clone();
        }
        self.auth.apply(&mut config);
        config
    }

    /// Join an existing mesh; never creates streams or buckets (a missing
    /// one is an error naming the prefix). A server that cannot be reached
    /// at all fails at once; what a failover interrupts is tried again for
    /// [`retry::DEFAULT_BUDGET`](super::retry::DEFAULT_BUDGET).
    pub async fn attach(&self) -> anyhow::Result<Mesh> {
        self.attach_until(std::time::Instant::now() + super::retry::DEFAULT_BUDGET)
            .await
    }

    /// [`attach`](Self::attach), trying again until `deadline`.
    pub async fn attach_until(&self, deadline: std::time::Instant) -> anyhow::Result<Mesh> {
        let config = self.config();
        if self.local {
            return super::local::attach_local(config).await;
        }
        let url = display_urls(&config.nats_url);
        // A server never reached is no failover to ride out: a wrong URL or
        // a stopped nats-server is said at once (exit 5).
        match Mesh::attach(config.clone()).await {
            Ok(mesh) => return Ok(mesh),
            Err(e @ noetl_mesh::MeshError::Connect { .. }) => return Err(e.into()),
            Err(_) => {}
        }
        super::retry::ride_out(deadline, "joining the mesh", || async {
            Mesh::attach(config.clone())
                .await
                .with_context(|| format!("joining the mesh at {url}"))
        })
        .await
    }
}

/// Workload overrides: `--workload FILE.json` then `--set key=value`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct WorkloadArgs {
    /// Set a workload value (`a.b=1`; the value is JSON when it parses, else a string). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// A JSON file whose object is merged into the workload before `--set`.
    #[arg(long, value_name = "FILE.json")]
    pub workload: Option<PathBuf>,
}

impl WorkloadArgs {
    /// The overrides as a JSON object.
    pub fn build(&self) -> anyhow::Result<Value> {
        let mut out = Value::Object(Map::new());
        if let Some(path) = &self.workload {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --workload {}", path.display()))?;
            let v: Value = serde_json::from_str(&text)
                .with_context(|| format!("--workload {} is not JSON", path.display()))?;
            if !v.is_object() {
                bail!("--workload {} must hold a JSON object", path.display());
            }
            out = v;
        }
        for item in &self.set {
            let Some((key, raw)) = item.split_once('=') else {
                bail!("--set {item:?}: expected KEY=VALUE");
            };
            if key.is_empty() {
                bail!("--set {item:?}: the key is empty");
            }
            let value =
                serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()));
            let mut cur = &mut out;
            let parts: Vec<&str> = key.split('.').collect();
            for (i, part) in parts.iter().enumerate() {
                let obj = cur.as_object_mut().expect("objects all the way down");
                if i + 1 == parts.len() {
                    obj.insert(part.to_string(), value.clone());
                    break;
                }
                let next = obj
                    .entry(part.to_string())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !next.is_object() {
                    *next = Value::Object(Map::new());
                }
                cur = next;
            }
        }
        Ok(out)
    }
}

/// Print a summary for people.
pub fn print_summary(s: &ExecSummary) {
    print_summary_in_order(s, &[]);
}

/// Print a summary for people, its steps in `order` (the order they ran;
/// those not in it after, by name).
pub fn print_summary_in_order(s: &ExecSummary, order: &[String]) {
    let status = s.shown_status();
    let playbook = match s.ended_before_start() {
        true => "ended before its first step",
        false => &s.playbook,
    };
    println!("execution {}  {status}  ({playbook})", s.execution_id);
    if let Some(p) = &s.paused {
        println!("{}", paused_line(&s.execution_id, p));
    } else if s.queued {
        println!("{}", queued_line(&s.execution_id));
    }
    if let Some(e) = &s.error {
        println!("error: {e}");
    }
    if !s.steps.is_empty() {
        println!("steps:");
        for (name, st) in steps_in_order(s, order) {
            println!("  {st:<8} {name}");
        }
    }
    println!(
        "ctx: {}",
        serde_json::to_string_pretty(&s.ctx).unwrap_or_default()
    );
}

/// What waiting in line means, in one line, and where to read more.
pub fn queued_line(id: &str) -> String {
    format!(
        "queued behind its playbook's concurrency key: its first step starts when a slot frees; `noetl exec why {id}` says who holds the slots and its place in line"
    )
}

/// What a pause means, in one line: who, since when, why, and how to go on.
pub fn paused_line(id: &str, p: &noetl_mesh::pause::PauseRecord) -> String {
    let why = if p.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", p.reason)
    };
    format!(
        "paused by {} since {}{why}; no new step or iteration starts until `noetl exec unpause {id}`",
        p.by, p.at
    )
}

/// The summary's steps in `order`, then the others by name.
pub fn steps_in_order<'a>(s: &'a ExecSummary, order: &[String]) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<(&str, &str)> = order
        .iter()
        .filter_map(|n| s.steps.get_key_value(n))
        .map(|(n, st)| (n.as_str(), st.as_str()))
        .collect();
    for (n, st) in &s.steps {
        if !order.contains(n) {
            out.push((n.as_str(), st.as_str()));
        }
    }
    out
}

/// Exit code for a final status: 0 completed, 1 failed or cancelled.
pub fn exit_code(status: ExecStatus) -> std::process::ExitCode {
    match status {
        ExecStatus::Completed => Exit::Ok.into(),
        _ => Exit::Failed.into(),
    }
}

/// Logging (`RUST_LOG`, default `default_level`; text or JSON) and span
/// export (OpenTelemetry over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is
/// set; docs/observability.md) of a process reporting as `service`. Keep
/// the guard until the process ends: dropping it flushes the spans.
pub fn init_tracing(
    json: bool,
    default_level: &str,
    service: &str,
) -> anyhow::Result<noetl_telemetry::export::Guard> {
    use tracing_subscriber::Layer;
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // The database driver logs statement text and parameters at debug
    // level, and either may carry a credential: keep it at info unless
    // RUST_LOG names it explicitly.
    let explicit = std::env::var("RUST_LOG").is_ok_and(|v| v.contains("tokio_postgres"));
    if !explicit {
        if let Ok(d) = "tokio_postgres=info".parse() {
            filter = filter.add_directive(d);
        }
    }
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let logs = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let guard = noetl_telemetry::export::init(noetl_telemetry::export::Setup {
        service: service.to_string(),
        logs,
    })?;
    Ok(guard)
}
