//! Server-Sent Events delivery latency: the bench publishes marker events
//! (type `bench.marker`, an execution id of their own that no service
//! consumes) on the event stream, one every few ms, and times each from
//! just before its publish to its arrival at a client following
//! `GET /api/events?follow=true&type=bench.marker`. The floor: the same
//! markers' arrival at a plain JetStream ordered consumer of the events
//! stream, following them at the same time.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{self, DeliverPolicy};
use futures::StreamExt;
use noetl_mesh::Mesh;
use noetl_wire::Event;
use tokio::sync::mpsc;

use noetl_integration::api::Api;

const MARKER: &str = "bench.marker";
/// Between two markers: latency, not throughput, is measured.
const GAP: Duration = Duration::from_millis(5);

/// Each marker's latency in ms, through the API and on the floor.
pub struct SseLatency {
    pub api_ms: Vec<f64>,
    pub floor_ms: Vec<f64>,
}

/// Publish `n` markers (after warm-up ones, until both followers see
/// them) and time their arrival at both followers.
pub async fn run(mesh: &Mesh, api: &Api, n: usize) -> SseLatency {
    let (api_tx, mut api_rx) = mpsc::unbounded_channel();
    let (floor_tx, mut floor_rx) = mpsc::unbounded_channel();
    let url = format!("{}/api/events?follow=true&type={MARKER}", api.base);
    let r = reqwest::get(url).await.expect("follow the events");
    assert_eq!(r.status().as_u16(), 200, "GET /api/events");
    let sse = tokio::spawn(follow_sse(r, api_tx));
    let floor = tokio::spawn(follow_js(mesh.clone(), floor_tx));
    let eid = noetl_mesh::ids::new_execution_id();
    // Warm-up: the API's consumer starts with new events only, once its
    // response is open; wait until a marker reaches both.
    let mut w = 0;
    let (mut api_up, mut floor_up) = (false, false);
    while !(api_up && floor_up) {
        assert!(w < 2000, "the markers never reached the followers");
        publish(mesh, &eid, &format!("warm-{w}")).await;
        w += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
        while api_rx.try_recv().is_ok() {
            api_up = true;
        }
        while floor_rx.try_recv().is_ok() {
            floor_up = true;
        }
    }
    let mut sent = HashMap::with_capacity(n);
    for i in 0..n {
        let id = format!("mark-{i}");
        sent.insert(id.clone(), Instant::now());
        publish(mesh, &eid, &id).await;
        tokio::time::sleep(GAP).await;
    }
    let api_ms = arrivals(&mut api_rx, &sent, n, "the API's event stream").await;
    let floor_ms = arrivals(&mut floor_rx, &sent, n, "the ordered consumer").await;
    sse.abort();
    floor.abort();
    SseLatency { api_ms, floor_ms }
}

async fn publish(mesh: &Mesh, eid: &str, id: &str) {
    let ev = Event {
        event_id: id.to_string(),
        event_type: MARKER.into(),
        execution_id: eid.to_string(),
        payload_json: b"{}".to_vec(),
        ..Default::default()
    };
    let ack = mesh.emit(&ev).await.expect("publish a marker");
    ack.wait().await.expect("marker acked");
}

/// The latency in ms of each of the `n` markers in `sent`, as they arrive
/// on `rx` (warm-up markers skipped).
async fn arrivals(
    rx: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    sent: &HashMap<String, Instant>,
    n: usize,
    what: &str,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await;
        let (id, at) = next
            .unwrap_or_else(|_| panic!("{what}: {} of {n} markers arrived", out.len()))
            .unwrap_or_else(|| panic!("{what} ended"));
        if let Some(t0) = sent.get(&id) {
            out.push((at - *t0).as_secs_f64() * 1000.0);
        }
    }
    out
}

/// Read the SSE response, sending each event's `event_id` and arrival.
async fn follow_sse(mut r: reqwest::Response, tx: mpsc::UnboundedSender<(String, Instant)>) {
    let mut buf = String::new();
    while let Ok(Some(chunk)) = r.chunk().await {
        let at = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            for line in block.lines() {
                if let Some(data) = line.strip_prefix("data:") {
                    let v: serde_json::Value =
                        serde_json::from_str(data.trim()).expect("event JSON");
                    if let Some(id) = v["event_id"].as_str() {
                        let _ = tx.send((id.to_string(), at));
                    }
                }
            }
        }
    }
}

/// Follow the markers on an ordered consumer, sending each one's
/// `event_id` and arrival.
async fn follow_js(mesh: Mesh, tx: mpsc::UnboundedSender<(String, Instant)>) {
    let stream = mesh
        .js()
        .get_stream(mesh.subjects().events_stream())
        .await
        .expect("the events stream");
    let c = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: mesh.subjects().events_of_type(MARKER),
            deliver_policy: DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .expect("an ordered consumer");
    let mut messages = c.messages().await.expect("its messages");
    while let Some(Ok(m)) = messages.next().await {
        let at = Instant::now();
        let ev = noetl_mesh::events::decode(&m).expect("a marker event");
        let _ = tx.send((ev.event_id, at));
    }
}
