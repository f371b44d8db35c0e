//! `noetl admin token create|list|revoke`: the bearer tokens of
//! `noetl serve api`. A token is printed once, when it is made; the mesh
//! keeps only its SHA-256 (bucket `<p>_tokens`), with its name and role.

use std::process::ExitCode;

use noetl_api::auth::Role;
use noetl_api::tokens::{TokenError, Tokens};

use super::common::MeshArgs;
use super::exit::Exit;

/// `noetl admin token ...`.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Make a token and print it (once: only its hash is stored).
    Create(CreateArgs),
    /// Names, roles and creation times of the tokens (never the tokens).
    List(ListArgs),
    /// Delete every token of a name.
    Revoke(RevokeArgs),
}

/// Arguments of `noetl admin token create`.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// viewer (read), operator (viewer + start and cancel executions) or
    /// admin (operator + catalog and credentials).
    #[arg(long, value_parser = ["viewer", "operator", "admin"])]
    pub role: String,
    /// A label for logs and audit records (1-64 of [A-Za-z0-9_.@-]).
    #[arg(long)]
    pub name: String,
    /// Print `{"name", "role", "token"}`.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl admin token list`.
#[derive(clap::Args)]
pub struct ListArgs {
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Arguments of `noetl admin token revoke`.
#[derive(clap::Args)]
pub struct RevokeArgs {
    /// The name whose tokens stop working.
    #[arg(long)]
    pub name: String,
    #[command(flatten)]
    pub mesh: MeshArgs,
}

/// Run a token command.
pub async fn run(c: Command) -> anyhow::Result<ExitCode> {
    match c {
        Command::Create(a) => create(a).await,
        Command::List(a) => list(a).await,
        Command::Revoke(a) => revoke(a).await,
    }
}

/// A token error with the mesh's own error first in its chain (its exit
/// code is the mesh's: 5 for an outage).
fn unwrap(e: TokenError) -> anyhow::Error {
    match e {
        TokenError::Mesh(m) => m.into(),
        other => other.into(),
    }
}

async fn tokens(mesh: &MeshArgs) -> anyhow::Result<Tokens> {
    let mesh = mesh.attach().await?;
    Ok(Tokens::new(mesh.tokens_kv().clone()))
}

async fn create(a: CreateArgs) -> anyhow::Result<ExitCode> {
    let role: Role = a.role.parse()?;
    let token = tokens(&a.mesh)
        .await?
        .create(&a.name, role)
        .await
        .map_err(unwrap)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({"name": a.name, "role": role.name(), "token": token})
        );
    } else {
        println!("{token}");
        eprintln!(
            "token `{}` ({}) created: keep it now, it is not shown again",
            a.name,
            role.name()
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(a: ListArgs) -> anyhow::Result<ExitCode> {
    for t in tokens(&a.mesh).await?.list().await.map_err(unwrap)? {
        if a.json {
            println!(
                "{}",
                serde_json::json!({"name": t.name, "role": t.role.name(), "created_at": t.created_at})
            );
        } else {
            println!("{:<32} {:<9} {}", t.name, t.role.name(), t.created_at);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn revoke(a: RevokeArgs) -> anyhow::Result<ExitCode> {
    let n = tokens(&a.mesh)
        .await?
        .revoke(&a.name)
        .await
        .map_err(unwrap)?;
    if n == 0 {
        eprintln!("error: no token named `{}`", a.name);
        return Ok(Exit::NotFound.into());
    }
    println!("revoked {n} token(s) named `{}`", a.name);
    Ok(ExitCode::SUCCESS)
}
