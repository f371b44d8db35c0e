//! `noetl admin replicas --monitor URL,...`: compare what each nats-server
//! of a cluster holds of every stream it hosts (the mesh's events, work
//! queue and buckets), and name the replicas that disagree.
//!
//! JetStream does not always repair a replica from its peers: a message
//! block file cut short or damaged in the middle of a stream (a disk fault
//! on one node) leaves that node with fewer messages and the same last
//! sequence, for good, and if it becomes the leader the cluster serves its
//! short copy (docs/reliability.md, "A damaged block in the middle"). No
//! client request shows one replica's contents, so this reads each
//! server's monitoring endpoint (`/jsz`): the operator's check after a
//! disk fault, and the remedy it names (`nats stream cluster peer-remove`,
//! after which JetStream places a new replica that copies the stream whole
//! from the leader).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use noetl_mesh::jsz::{self, Held};

use super::exit::Exit;

/// Arguments of `noetl admin replicas`.
#[derive(clap::Args)]
pub struct ReplicasArgs {
    /// Each server's monitoring address (`http://n1:8222`), comma-separated
    /// or repeated: every server of the cluster.
    #[arg(long, required = true, value_delimiter = ',', value_name = "URL")]
    pub monitor: Vec<String>,
    /// How long replicas may take to agree (writes in flight, a node
    /// catching up) before a difference is reported (`10s`, `2m`).
    #[arg(long, default_value = "10s", value_name = "DUR")]
    pub settle: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// One server's view: every stream it hosts, by name (`None`: it did not
/// answer).
pub type View = Option<BTreeMap<String, Held>>;

/// A stream whose replicas disagree, each server's copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// The stream (a bucket's is `KV_<bucket>`).
    pub stream: String,
    /// Each server hosting it (by its monitoring address) and what it holds.
    pub replicas: Vec<(String, Held)>,
}

/// The streams whose replicas disagree in `views` (server address, its
/// view): two servers hosting a stream hold different message counts or
/// sequences. A stream hosted by one server only has nothing to compare.
pub fn divergences(views: &[(String, View)]) -> Vec<Divergence> {
    let mut by_stream: BTreeMap<&str, Vec<(String, Held)>> = BTreeMap::new();
    for (server, view) in views {
        for (stream, held) in view.iter().flatten() {
            by_stream
                .entry(stream)
                .or_default()
                .push((server.clone(), *held));
        }
    }
    by_stream
        .into_iter()
        .filter(|(_, copies)| copies.windows(2).any(|w| w[0].1 != w[1].1))
        .map(|(stream, replicas)| Divergence {
            stream: stream.to_string(),
            replicas,
        })
        .collect()
}

/// Why one replica holds less: the line printed under a divergence.
fn reading(d: &Divergence) -> String {
    let most = d
        .replicas
        .iter()
        .map(|(_, h)| h.messages)
        .max()
        .unwrap_or(0);
    let last = d
        .replicas
        .iter()
        .map(|(_, h)| h.last_seq)
        .max()
        .unwrap_or(0);
    let short: Vec<&str> = d
        .replicas
        .iter()
        .filter(|(_, h)| h.messages < most && h.last_seq == last)
        .map(|(s, _)| s.as_str())
        .collect();
    if short.is_empty() {
        return "the replicas hold different sequences: one is behind or ahead; if it stays so, \
                remove it as below"
            .into();
    }
    format!(
        "{} hold(s) fewer messages with the same last sequence: messages lost from the middle \
         of the stream (a damaged block file), which JetStream does not copy back from its \
         peers; remove that replica so a new one copies the stream whole: \
         `nats stream cluster peer-remove {} <server name>`",
        short.join(", "),
        d.stream
    )
}

/// Run `noetl admin replicas`.
pub async fn run(a: ReplicasArgs) -> anyhow::Result<ExitCode> {
    let Ok(super::tail_filter::Since::Ago(settle)) = super::tail_filter::parse_since(&a.settle)
    else {
        eprintln!(
            "--settle {:?}: expected a duration such as 10s, 2m",
            a.settle
        );
        return Ok(Exit::Usage.into());
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let deadline = Instant::now() + settle;
    loop {
        let mut views = Vec::new();
        for url in &a.monitor {
            views.push((url.clone(), read_view(&http, url).await));
        }
        let silent: Vec<&str> = views
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(u, _)| u.as_str())
            .collect();
        let found = divergences(&views);
        if (found.is_empty() && silent.is_empty()) || Instant::now() >= deadline {
            return Ok(report(&a, &views, &silent, &found).into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn read_view(http: &reqwest::Client, url: &str) -> View {
    let at = format!(
        "{}/jsz?accounts=true&streams=true",
        url.trim_end_matches('/')
    );
    let answer = http.get(&at).send().await.ok()?.error_for_status().ok()?;
    let jsz: Value = answer.json().await.ok()?;
    Some(jsz::streams(&jsz))
}

fn report(
    a: &ReplicasArgs,
    views: &[(String, View)],
    silent: &[&str],
    found: &[Divergence],
) -> Exit {
    let streams: usize = views
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().map(|(s, _)| s.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if a.json {
        let out = serde_json::json!({
            "servers": views.len(),
            "unanswered": silent,
            "streams": streams,
            "divergent": found,
        });
        println!("{out}");
    } else {
        for url in silent {
            eprintln!("{url}: no answer from its monitoring endpoint (/jsz)");
        }
        for d in found {
            println!("{}: replicas disagree", d.stream);
            for (server, h) in &d.replicas {
                println!(
                    "  {server}: {} messages, sequences {}..{}",
                    h.messages, h.first_seq, h.last_seq
                );
            }
            println!("  {}", reading(d));
        }
        if found.is_empty() && silent.is_empty() {
            println!(
                "{streams} streams on {} servers: every replica holds the same",
                views.len()
            );
        }
    }
    if !found.is_empty() {
        Exit::Failed
    } else if !silent.is_empty() {
        Exit::Infrastructure
    } else {
        Exit::Ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(messages: u64, last_seq: u64) -> Held {
        Held {
            messages,
            first_seq: 1,
            last_seq,
        }
    }

    fn view(streams: &[(&str, Held)]) -> View {
        Some(streams.iter().map(|(s, h)| (s.to_string(), *h)).collect())
    }

    #[test]
    fn a_replica_short_in_the_middle_is_named_with_its_remedy() {
        let views = vec![
            (
                "n1".to_string(),
                view(&[("KV_ctx", held(84, 222)), ("EV", held(9, 9))]),
            ),
            (
                "n2".to_string(),
                view(&[("KV_ctx", held(84, 222)), ("EV", held(9, 9))]),
            ),
            (
                "n3".to_string(),
                view(&[("KV_ctx", held(64, 222)), ("EV", held(9, 9))]),
            ),
        ];
        let found = divergences(&views);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].stream, "KV_ctx");
        assert_eq!(found[0].replicas.len(), 3);
        let why = reading(&found[0]);
        assert!(why.starts_with("n3 hold(s) fewer messages"), "{why}");
        assert!(why.contains("peer-remove KV_ctx"), "{why}");
    }

    #[test]
    fn streams_on_one_server_or_in_agreement_are_not_reported() {
        let views = vec![
            (
                "n1".to_string(),
                view(&[("R1", held(5, 5)), ("R3", held(7, 9))]),
            ),
            ("n2".to_string(), view(&[("R3", held(7, 9))])),
            ("n3".to_string(), None),
        ];
        assert!(divergences(&views).is_empty());
        // Behind, not short: another reading.
        let behind = vec![
            ("n1".to_string(), view(&[("R3", held(7, 9))])),
            ("n2".to_string(), view(&[("R3", held(5, 7))])),
        ];
        let found = divergences(&behind);
        assert!(reading(&found[0]).starts_with("the replicas hold different sequences"));
    }
}
