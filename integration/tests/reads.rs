//! Reads of the event log and scans of KV buckets on a three-node cluster
//! (docs/architecture.md, "Reading the log"): the ordered consumer a read
//! creates lands on any replica of its stream, so a read must not end
//! before it has the last message the stream's leader held when it began,
//! even when its replica lags behind.

use noetl_mesh::{events::EventDraft, kv};
use noetl_testkit::lagging::{backlog, events_round, lagging, BACKLOG};

/// Event `n` of execution `eid`.
fn event(eid: &str, n: u32) -> noetl_wire::Event {
    let d = n.to_string();
    EventDraft {
        execution_id: eid,
        step_run_id: "r1",
        step: "start",
        discriminator: &d,
        ..Default::default()
    }
    .build(&noetl_mesh::payloads::StepStarted::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_placed_on_a_lagging_replica_waits_for_the_leaders_last_event() {
    let l = lagging(|m| m.subjects().events_stream()).await;
    let filter = l.mesh.subjects().events_of("lagging-read");
    let ids: Vec<String> = (0..3).map(|n| event("lagging-read", n).event_id).collect();
    let (answered, misses) = l
        .rounds(
            |mesh, round| async move {
                events_round(&mesh, round, 1, &event("lagging-read", round)).await;
            },
            move |mesh| {
                let filter = filter.clone();
                async move { mesh.stored_events(&filter).await }
            },
            // Round r's reads must have the events of rounds 0..=r.
            |round, events: &Vec<Result<noetl_wire::Event, _>>| {
                let got: Vec<&str> = events
                    .iter()
                    .filter_map(|e| e.as_ref().ok())
                    .map(|e| e.event_id.as_str())
                    .collect();
                ids[..=round as usize]
                    .iter()
                    .all(|id| got.contains(&id.as_str()))
            },
        )
        .await;
    assert!(answered > 0, "no read answered");
    assert_eq!(
        misses, 0,
        "reads that answered without every acknowledged event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_placed_on_a_lagging_replica_waits_for_the_leaders_last_record() {
    let l = lagging(|m| m.exec_kv().stream_name.clone()).await;
    let (answered, misses) = l
        .rounds(
            |mesh, round| async move {
                let at = round * BACKLOG;
                let prefix = mesh.exec_kv().prefix.clone();
                backlog(&mesh, at..at + BACKLOG, |n| format!("{prefix}backlog.{n}")).await;
                kv::put(mesh.exec_kv(), &format!("lagging.{round}"), &round)
                    .await
                    .unwrap();
            },
            |mesh| async move { kv::keys_under(mesh.exec_kv(), "lagging").await },
            // Round r's scans must have the keys of rounds 0..=r.
            |round, keys: &Vec<String>| (0..=round).all(|r| keys.contains(&format!("lagging.{r}"))),
        )
        .await;
    assert!(answered > 0, "no scan answered");
    assert_eq!(
        misses, 0,
        "scans that answered without every acknowledged record"
    );
}

/// Event `n` of execution `eid`, stored as a `step.done`.
fn done(eid: &str, n: u32) -> noetl_wire::Event {
    noetl_wire::Event {
        event_type: "step.done".into(),
        ..event(eid, n)
    }
}

/// `GET /api/events` without `follow` sends what is stored when it is
/// asked, through the last event the stream's leader holds: it used to end
/// where its replica said nothing was pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_page_read_on_a_lagging_replica_ends_at_the_leaders_last_event() {
    let l = lagging(|m| m.subjects().events_stream()).await;
    let api = noetl_integration::api::Api::serve(&l.mesh).await;
    let ids: Vec<String> = (0..3).map(|n| done("lagging-api", n).event_id).collect();
    let http = reqwest::Client::new();
    let (answered, misses) = l
        .rounds(
            |mesh, round| async move {
                // Of another type than the page asks for, which has a
                // subject of its own (not one another event may carry).
                // Larger than the reads' above: a request through HTTP
                // starts its read later.
                events_round(&mesh, round, 4, &done("lagging-api", round)).await;
            },
            move |_| {
                let (http, url) = (
                    http.clone(),
                    format!("{}/api/events?type=step.done", api.base),
                );
                async move {
                    let body = http
                        .get(url)
                        .send()
                        .await
                        .and_then(|r| r.error_for_status())
                        .expect("the page answers")
                        .text()
                        .await
                        .expect("the page's body");
                    if body.contains("event: error") {
                        return Err(noetl_mesh::MeshError::Consume {
                            consumer: "GET /api/events".into(),
                            message: body,
                        });
                    }
                    Ok(body
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
                        .filter_map(|v| v["event_id"].as_str().map(String::from))
                        .collect::<Vec<String>>())
                }
            },
            // Round r's pages must hold the events of rounds 0..=r.
            |round, sent: &Vec<String>| ids[..=round as usize].iter().all(|id| sent.contains(id)),
        )
        .await;
    assert!(answered > 0, "no page answered");
    assert_eq!(misses, 0, "pages that ended before an acknowledged event");
}
