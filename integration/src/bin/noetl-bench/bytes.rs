//! Where an iteration's stored event bytes go: a small noop loop's events
//! read back raw, each split into its subject, headers and body, with the
//! file store's own record overhead, per event type.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use futures::StreamExt;
use noetl_integration::Cluster;
use serde_json::json;

use crate::ends::Ends;
use crate::scenarios as sc;

/// Bytes the file store adds to every message (record header and hash).
pub const STORE_OVERHEAD: usize = 30;

/// Iterations of the loop read back.
const ITEMS: usize = 20;

/// Sizes of the events of one type, summed over the loop.
#[derive(Default)]
struct Sizes {
    count: usize,
    subject: usize,
    headers: usize,
    body: usize,
}

/// Print, per event type written once per iteration or per batch, the
/// average bytes of its subject, headers and body and the store's
/// overhead, and their share of an iteration.
pub async fn breakdown(cluster: &Cluster, ends: &Ends) {
    let yaml = sc::parallel_loop(ITEMS, 256, sc::LOOP_NOOP);
    let eid = cluster.submit(&yaml, "bench_bytes.yaml", json!({})).await;
    ends.wait(&eid, sc::TIMEOUT).await;
    let mesh = &cluster.mesh;
    let stream = mesh
        .js()
        .get_stream(mesh.subjects().events_stream())
        .await
        .expect("the events stream");
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: mesh.subjects().events_of(&eid),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .expect("a reader of the loop's events");
    let mut messages = consumer.messages().await.expect("messages");
    let mut by_type: BTreeMap<String, Sizes> = BTreeMap::new();
    while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(1), messages.next()).await
    {
        let Some((_, event_type)) = noetl_mesh::subjects::event_parts(m.subject.as_str()) else {
            continue;
        };
        let s = by_type.entry(event_type.to_string()).or_default();
        s.count += 1;
        s.subject += m.subject.len();
        s.headers += m.headers.as_ref().map_or(0, header_bytes);
        s.body += m.payload.len();
        if m.info().map(|i| i.pending == 0).unwrap_or(true) {
            break;
        }
    }
    println!(
        "\nbytes stored per event of a loop iteration (average over a {ITEMS}-item loop; store overhead {STORE_OVERHEAD} per message):"
    );
    println!(
        "  {:<24} {:>8} {:>8} {:>6} {:>6}",
        "event", "subject", "headers", "body", "all"
    );
    let mut per_iteration = 0;
    // Per iteration or per batch of iterations: every type the loop writes
    // more than once (its start, end and the step's own events are once).
    for (t, s) in by_type.iter().filter(|(_, s)| s.count >= 2) {
        let avg = |n: usize| n / s.count;
        let all = avg(s.subject) + avg(s.headers) + avg(s.body) + STORE_OVERHEAD;
        per_iteration += all * s.count / ITEMS;
        println!(
            "  {t:<24} {:>8} {:>8} {:>6} {:>6}",
            avg(s.subject),
            avg(s.headers),
            avg(s.body),
            all
        );
    }
    println!("  {:<24} {:>32}", "per iteration", per_iteration);
}

/// Bytes of a header block as the server stores it
/// (`NATS/1.0\r\n`, `Name: value\r\n` each, `\r\n`).
fn header_bytes(h: &async_nats::HeaderMap) -> usize {
    let mut n = "NATS/1.0\r\n".len() + 2;
    for (name, values) in h.iter() {
        let name: &str = name.as_ref();
        for v in values {
            n += name.len() + 2 + v.as_str().len() + 2;
        }
    }
    n
}
