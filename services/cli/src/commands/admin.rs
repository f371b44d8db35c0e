//! `noetl admin init`: create (or check) a mesh's streams and KV buckets.
//! Services create what is missing when they start; read-only commands
//! never do, so an operator can prepare a mesh, or bring its replica count
//! to `NOETL_REPLICAS`, before any service runs.

use crate::commands::exit::Exit;
use std::process::ExitCode;

use anyhow::Context;
use noetl_mesh::{
    connect::{self, display_urls},
    topology::{self, Action},
    Subjects,
};

use super::common::MeshArgs;

/// `noetl admin` subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Create the streams and KV buckets of a mesh (idempotent), with
    /// NOETL_REPLICAS (or --replicas) replicas; existing ones are scaled
    /// to that count where JetStream allows.
    Init(InitArgs),
    /// Bearer tokens of `noetl serve api` (docs/api.md).
    #[command(subcommand)]
    Token(super::admin_token::Command),
    /// Write an execution's records (header, plan, step records, ctx) back
    /// from its events: one execution, or every running one.
    Rebuild(super::admin_rebuild::RebuildArgs),
    /// Remove the KV state of executions that ended at least --older-than
    /// ago; their events stay, and `exec show` still shows them.
    Compact(super::admin_compact::CompactArgs),
    /// Compare what each server of a cluster holds of every stream (from
    /// its monitoring endpoint) and name the replicas that disagree, with
    /// the remedy (docs/reliability.md, "A damaged block in the middle").
    Replicas(super::admin_replicas::ReplicasArgs),
}

/// Arguments of `noetl admin init`.
#[derive(clap::Args)]
pub struct InitArgs {
    /// Replicas of every stream and bucket [env: NOETL_REPLICAS; default 1].
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Print one JSON object per stream.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Run an admin command.
pub async fn run(c: Command) -> anyhow::Result<ExitCode> {
    match c {
        Command::Init(a) => init(a).await,
        Command::Token(c) => super::admin_token::run(c).await,
        Command::Rebuild(a) => super::admin_rebuild::run(a).await,
        Command::Compact(a) => super::admin_compact::run(a).await,
        Command::Replicas(a) => super::admin_replicas::run(a).await,
    }
}

async fn init(a: InitArgs) -> anyhow::Result<ExitCode> {
    let mut config = a.mesh.server_config()?;
    if let Some(r) = a.replicas {
        config.replicas = r;
    }
    config.validate()?;
    let at = display_urls(&config.nats_url);
    let client = connect::connect(connect::ConnectParams {
        urls: &config.nats_url,
        auth: &config.auth,
        name: "noetl-admin",
    })
    .await?;
    let js = async_nats::jetstream::new(client);
    let subjects = Subjects::new(&config.prefix);
    let ensured = topology::ensure(topology::EnsureParams {
        js: &js,
        subjects: &subjects,
        config: &config,
        mode: topology::Mode::Create,
    })
    .await
    .with_context(|| format!("creating the mesh `{}` at {at}", config.prefix))?;
    let mut kept = 0;
    for r in &ensured.report {
        let (action, note) = match &r.action {
            Action::Created => ("created", String::new()),
            Action::Found => ("exists", String::new()),
            Action::Rescaled { from } => ("rescaled", format!("from {from} replicas")),
            Action::Kept { wanted, reason } => {
                kept += 1;
                ("kept", format!("wanted {wanted} replicas: {reason}"))
            }
        };
        if a.json {
            println!(
                "{}",
                serde_json::json!({"stream": r.name, "replicas": r.replicas, "action": action, "note": note})
            );
        } else {
            println!("{:<24} R{}  {action:<8} {note}", r.name, r.replicas);
        }
    }
    if kept > 0 {
        eprintln!(
            "warning: {kept} stream(s) keep another replica count than {} (see above)",
            config.replicas
        );
        return Ok(Exit::Infrastructure.into());
    }
    Ok(ExitCode::SUCCESS)
}
