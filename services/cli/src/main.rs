//! `noetl`: validate, run and watch NoETL playbooks; serve mesh services.

mod commands;

/// mimalloc instead of glibc's malloc: fewer locks between the runtime's
/// threads and less work per allocation (docs/performance.md "The
/// allocator, and the loop-supervisor's chunk cache").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// NoETL mesh: a declarative workflow engine on NATS JetStream.
#[derive(Parser)]
#[command(name = "noetl", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check playbooks and print diagnostics (exit 1 on any error).
    Validate(commands::validate::Args),
    /// Rewrite legacy NoETL playbooks into canonical v10 (docs/migrate.md, docs/noetl-compat.md).
    Migrate(commands::migrate::Args),
    /// Print the JSON Schema of the playbook document (for editors).
    Schema(commands::schema::Args),
    /// Run a playbook and wait for its end (embedded nats-server by default).
    Run(commands::run::Args),
    /// Run one mesh service against a shared NATS.
    Serve(commands::serve::Args),
    /// Start executions and read their status.
    #[command(subcommand)]
    Exec(commands::exec::Command),
    /// Watch the event stream.
    #[command(subcommand)]
    Events(commands::events::Command),
    /// Store, list and delete encrypted credentials (the keychain).
    #[command(subcommand)]
    Credential(commands::credential::Command),
    /// Register, list and show playbooks in the catalog.
    #[command(subcommand)]
    Playbook(commands::playbook::Command),
    /// Cron schedules of catalog playbooks, fired by `noetl serve timer`.
    #[command(subcommand)]
    Schedule(commands::schedule::Command),
    /// Operate a mesh: create its streams and buckets; API tokens.
    #[command(subcommand)]
    Admin(commands::admin::Command),
    /// Print a shell completion script (`noetl completions bash > /etc/bash_completion.d/noetl`).
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// A command that only prints (`events tail | head`) ends quietly, as
/// `cat` does, when what reads its output goes away: SIGPIPE gets its
/// default action back (Rust ignores it, and `println!` then panics on the
/// closed pipe). Not for `run` and `serve`: they write to their tasks'
/// pipes, where a dead reader must be an error, not the end of the
/// process. A private nats-server such a command started dies with it
/// (`PR_SET_PDEATHSIG`).
fn quiet_on_closed_pipe() {
    // SAFETY: called once at start, before any thread exists; `signal`
    // with SIG_DFL installs no handler code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    // Every noetl process may hold NATS credentials, cloud credentials or
    // the credentials' secret key in its environment: wiped from the bytes
    // /proc/<pid>/environ shows (DuckDB runs in this process and reads
    // files), and non-dumpable, so python tasks running as the same user
    // cannot read this process's memory either (docs/security.md).
    noetl_tool_python::env::scrub_environ();
    noetl_tool_python::env::seal_process();
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Run(_) | Command::Serve(_)) {
        quiet_on_closed_pipe();
    }
    let result = match cli.command {
        Command::Validate(a) => commands::validate::run(a),
        Command::Schema(a) => commands::schema::run(a),
        Command::Migrate(a) => commands::migrate::run(a),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "noetl", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        other => match tokio::runtime::Runtime::new() {
            Ok(rt) => rt.block_on(async move {
                match other {
                    Command::Run(a) => commands::run::run(a).await,
                    Command::Serve(a) => commands::serve::run(a).await,
                    Command::Exec(c) => commands::exec::run(c).await,
                    Command::Events(c) => commands::events::run(c).await,
                    Command::Credential(c) => commands::credential::run(c).await,
                    Command::Playbook(c) => commands::playbook::run(c).await,
                    Command::Admin(c) => commands::admin::run(c).await,
                    Command::Schedule(c) => commands::schedule::run(c).await,
                    Command::Validate(_)
                    | Command::Schema(_)
                    | Command::Migrate(_)
                    | Command::Completions { .. } => {
                        unreachable!("handled above")
                    }
                }
            }),
            Err(e) => Err(e.into()),
        },
    };
    // The private server a `--local` client command started stops now,
    // after every connection to it closed.
    commands::local::release();
    match result {
        Ok(code) => code,
        Err(e) => {
            match commands::exit::unreachable(&e) {
                Some(line) => eprintln!("{line}"),
                None => eprintln!("error: {e:#}"),
            }
            commands::exit::of_error(&e).into()
        }
    }
}
