//! The arguments of `noetl exec replay` (a leaf: `exec_replay` and
//! `exec_rejudge`, which it hands `--playbook` to, both read them).

use super::common::MeshArgs;

/// Arguments of `noetl exec replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Execution id (with `--from`: which of the file's executions; may be
    /// left out when the file holds one).
    #[arg(
        required_unless_present_any = ["from", "all"],
        value_parser = super::exec_shared::execution_id
    )]
    pub id: Option<String>,
    /// Take the execution's decisions again with this playbook (admission,
    /// arcs, loop collections) and report the first that differs (exit 2).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["from", "until", "version"])]
    pub playbook: Option<std::path::PathBuf>,
    /// As --playbook, with this catalog version of the execution's
    /// playbook.
    #[arg(long, value_name = "N", conflicts_with_all = ["from", "until", "all"])]
    pub version: Option<u32>,
    /// With --playbook: every execution of that playbook (same catalog
    /// path, else same name) started within --since.
    #[arg(long, requires = "playbook", conflicts_with = "id")]
    pub all: bool,
    /// With --all: how far back (`7d`, `12h`) [default: 7d].
    #[arg(long, value_name = "DUR", requires = "all")]
    pub since: Option<String>,
    /// Fold the events of this export (`noetl events export`) instead of
    /// the stream, and show the state they give (nothing is compared).
    #[arg(long, value_name = "FILE")]
    pub from: Option<std::path::PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Show the state as of this event instead of comparing: a stream
    /// sequence number (`seq` of `events tail --json`) or an RFC 3339 time.
    #[arg(long, value_name = "SEQ|TIME")]
    pub until: Option<String>,
    #[command(flatten)]
    pub mesh: MeshArgs,
}
