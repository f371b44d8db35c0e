//! `noetl exec replay ID --playbook FILE | --version N` and `noetl exec
//! replay --all --since DUR --playbook FILE`: take the decisions of past
//! executions again with a changed playbook ([`noetl_mesh::rejudge`]) and
//! report the first that differs; exit 2 on a divergence
//! (docs/operations.md "Replay against a changed playbook").

use std::process::ExitCode;

use noetl_core::Playbook;
use noetl_mesh::{
    catalog::parse_catalog_id,
    event_type::EventType,
    events::now_ms,
    payloads::PlaybookInitialized,
    rejudge::{self, Rejudged},
    Mesh,
};

use super::exec_replay_args::ReplayArgs;
use super::exec_shared::no_execution;
use super::exit::Exit;
use super::source::{read, Read};
use super::tail_filter::{parse_since, Since};

/// How far back `--all` looks by default.
const DEFAULT_SINCE: &str = "7d";

/// `noetl exec replay ... --playbook FILE | --version N`.
pub async fn run(a: &ReplayArgs) -> anyhow::Result<ExitCode> {
    let since_ms = match a.all.then(|| a.since.as_deref().unwrap_or(DEFAULT_SINCE)) {
        None => None,
        Some(s) => match parse_since(s) {
            Ok(Since::Ago(d)) => Some(now_ms().saturating_sub(d.as_millis() as u64)),
            _ => {
                eprintln!("error: --since {s:?}: expected a duration such as 12h or 7d");
                return Ok(Exit::Usage.into());
            }
        },
    };
    let file_playbook = match &a.playbook {
        None => None,
        Some(path) => match read(Read {
            path,
            migrate: false,
            warnings: false,
        }) {
            Ok(s) => Some(s.loaded.playbook),
            // The loader's diagnostics are printed already.
            Err(_) => return Ok(Exit::Usage.into()),
        },
    };
    let mesh = a.mesh.attach().await?;
    let ids = match (since_ms, &file_playbook) {
        (Some(since), Some(pb)) => {
            let ids = executions_of(&mesh, pb, since).await?;
            if ids.is_empty() && !a.json {
                println!(
                    "no execution of playbook {:?} started since {}",
                    pb.metadata.name,
                    a.since.as_deref().unwrap_or(DEFAULT_SINCE)
                );
            }
            ids
        }
        _ => vec![a.id.clone().expect("clap requires an id without --all")],
    };
    let mut diverged = 0;
    for id in &ids {
        let playbook = match (&file_playbook, a.version) {
            (Some(pb), _) => pb.clone(),
            (None, Some(n)) => match catalog_version(&mesh, id, n).await? {
                Ok(pb) => pb,
                Err(code) => return Ok(code),
            },
            (None, None) => unreachable!("run only with --playbook or --version"),
        };
        let r = rejudge::rejudge(&mesh, id, &playbook).await?;
        if r.events == 0 {
            return Ok(no_execution(&mesh, id).await);
        }
        if r.divergence.is_some() {
            diverged += 1;
        }
        print(&r, a.json);
    }
    if a.all && !a.json {
        println!("{} execution(s) checked, {diverged} diverge", ids.len());
    }
    Ok(if diverged > 0 {
        Exit::Usage.into()
    } else {
        ExitCode::SUCCESS
    })
}

/// Catalog version `n` of the playbook execution `id` ran, loaded; or the
/// exit after saying why not.
async fn catalog_version(
    mesh: &Mesh,
    id: &str,
    n: u32,
) -> anyhow::Result<Result<Playbook, ExitCode>> {
    // Its header, or (its KV state compacted) the one its events give.
    let Some(h) = mesh.run_again_of(id).await?.map(|a| a.header) else {
        return Ok(Err(no_execution(mesh, id).await));
    };
    let Some((path, _)) = parse_catalog_id(&h.source) else {
        eprintln!(
            "error: execution {id} ran {:?}, not a catalog playbook: give the changed playbook with --playbook FILE",
            h.source
        );
        return Ok(Err(Exit::Usage.into()));
    };
    let entry = match mesh.catalog().get(&path, Some(n)).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {path} version {n}: {e}");
            return Ok(Err(Exit::NotFound.into()));
        }
    };
    match noetl_core::load::load_playbook(&entry.yaml, &format!("{path}@v{n}")) {
        Ok(l) => Ok(Ok(l.playbook)),
        Err(e) => {
            eprintln!("{}", e.render_human());
            Ok(Err(Exit::Usage.into()))
        }
    }
}

/// Executions of `pb` (its catalog path when it has one, else its name)
/// started since `since_ms`, in the order they started.
async fn executions_of(mesh: &Mesh, pb: &Playbook, since_ms: u64) -> anyhow::Result<Vec<String>> {
    let filter = mesh
        .subjects()
        .events_matching(None, EventType::PlaybookInitialized.wire_name());
    let mut ids = Vec::new();
    for (_, ev) in mesh.stored_events_from(&filter, Some(since_ms)).await? {
        let Ok(ev) = ev else { continue };
        let Ok(p) = noetl_mesh::payloads::decode_typed::<PlaybookInitialized>(&ev) else {
            continue;
        };
        let same = match (&pb.metadata.path, &p.path) {
            (Some(want), Some(have)) => want == have,
            _ => pb.metadata.name == p.playbook,
        };
        if same && !ids.contains(&ev.execution_id) {
            ids.push(ev.execution_id.clone());
        }
    }
    Ok(ids)
}

fn print(r: &Rejudged, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).expect("a report serialises"));
        return;
    }
    match &r.divergence {
        None => println!(
            "execution {}: the same: {} decision(s) taken again from its {} events",
            r.execution_id, r.decisions, r.events
        ),
        Some(d) => {
            println!(
                "execution {}: diverges at the {} of step {:?} ({} seq {})",
                r.execution_id, d.decision, d.step, d.event.event_type, d.event.seq
            );
            println!("  recorded: {}", d.recorded);
            println!("  now:      {}", d.now);
        }
    }
    for n in &r.notes {
        println!("  note: {n}");
    }
}
