//! `noetl events tail`: follow the event stream.

use std::process::ExitCode;

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures::StreamExt;
use noetl_mesh::{codec, events};
use noetl_wire::Event;
use serde_json::{json, Value};

use super::common::MeshArgs;

/// `noetl events ...`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Follow events as they happen.
    Tail(TailArgs),
}

/// Arguments of `noetl events tail`.
#[derive(clap::Args)]
pub struct TailArgs {
    /// Only this execution.
    #[arg(long)]
    pub execution: Option<String>,
    /// Only event types matching this glob (`step.*`, `loop.done`).
    #[arg(long = "type")]
    pub event_type: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Start from the oldest stored event instead of new ones.
    #[arg(long)]
    pub from_start: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Dispatch.
pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Tail(a) => tail(a).await,
    }
}

/// `*` matches any run of characters.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            if !rest.starts_with(part) {
                return false;
            }
            rest = &rest[part.len()..];
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else if let Some(pos) = rest.find(part) {
            rest = &rest[pos + part.len()..];
        } else {
            return false;
        }
    }
    true
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

async fn tail(a: TailArgs) -> anyhow::Result<ExitCode> {
    let mesh = a.mesh.attach().await?;
    let filter = match &a.execution {
        Some(id) => mesh.subjects().events_of(id),
        None => mesh.subjects().events_all(),
    };
    let stream = mesh
        .js()
        .get_stream(mesh.subjects().events_stream())
        .await?;
    let mut messages = stream
        .create_consumer(OrderedConfig {
            filter_subject: filter,
            deliver_policy: if a.from_start {
                DeliverPolicy::All
            } else {
                DeliverPolicy::New
            },
            ..Default::default()
        })
        .await?
        .messages()
        .await?;
    while let Some(m) = messages.next().await {
        let m = m?;
        let ev: Event = match codec::decode("event", &m.payload) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("skipping undecodable message on {}: {e}", m.subject);
                continue;
            }
        };
        if let Some(g) = &a.event_type {
            if !glob(g, &ev.event_type) {
                continue;
            }
        }
        let payload = events::payload(&ev);
        if a.json {
            println!(
                "{}",
                json!({
                    "event_id": ev.event_id, "event_type": ev.event_type, "ts": ev.ts,
                    "execution_id": ev.execution_id, "step": ev.step, "task": ev.task,
                    "step_run_id": ev.step_run_id, "task_run_id": ev.task_run_id,
                    "trace_id": ev.trace_id, "parent_id": ev.parent_id, "payload": payload,
                })
            );
        } else {
            let time = ev.ts.get(11..23).unwrap_or(&ev.ts);
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
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs() {
        assert!(glob("step.*", "step.done"));
        assert!(glob("loop.done", "loop.done"));
        assert!(!glob("loop.done", "loop.iteration.done"));
        assert!(glob("*.done", "loop.iteration.done"));
        assert!(!glob("step.*", "task.done"));
    }
}
