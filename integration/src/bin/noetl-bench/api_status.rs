//! `GET /api/executions/{id}/status` reads per second while batches of
//! executions run (one started at once, the next when it has ended, for
//! as long as the reads last), from a few concurrent keep-alive clients
//! reading random ids of the batch running. The floor: as many raw KV
//! gets of the same execution headers straight from JetStream, from as
//! many concurrent tasks (one status read costs at least that). The two
//! are measured in alternating slices under the same load, each slice's
//! order swapped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use noetl_integration::Cluster;
use noetl_mesh::keys::Keys;
use noetl_mesh::Mesh;
use serde_json::Value;

use crate::ends::Ends;
use crate::scenarios as sc;
use noetl_integration::api::Api;

/// Concurrent readers (HTTP clients, or KV tasks for the floor).
pub const CLIENTS: usize = 4;
/// Slices each of the API and the floor are measured in.
const SLICES: usize = 10;

/// What the scenario measured.
#[derive(Default)]
pub struct StatusReads {
    /// Status reads per second through the API.
    pub api_per_s: f64,
    /// Raw KV gets of the headers per second.
    pub floor_per_s: f64,
    /// Reads answered per status: `RUNNING`, `COMPLETED`, 404 (the router
    /// had not written the header yet).
    pub running: usize,
    pub completed: usize,
    pub missing: usize,
    /// Batches of executions started.
    pub batches: usize,
}

/// A small xorshift: random ids without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Keep `executions` 5-step noop executions running (a batch started at
/// once, the next when it has ended) and meanwhile read their status
/// `reads` times through the API and as many times as raw KV gets, of
/// random ids of the batch running; check every execution completed.
pub async fn run(
    cluster: &Cluster,
    ends: &Ends,
    api: &Api,
    executions: usize,
    reads: usize,
) -> StatusReads {
    let yaml = sc::chain("bench_status", 5, sc::NOOP);
    let running = RwLock::new(batch(&cluster.mesh, &yaml, executions).await);
    let done = AtomicBool::new(false);
    let load = async {
        let mut batches = 1;
        loop {
            let ids = running.read().expect("ids lock").clone();
            for eid in ids.iter() {
                ends.wait(eid, sc::TIMEOUT).await;
            }
            if done.load(Ordering::SeqCst) {
                return batches;
            }
            let next = batch(&cluster.mesh, &yaml, executions).await;
            *running.write().expect("ids lock") = next;
            batches += 1;
        }
    };
    let reading = async {
        let out = measure(cluster, api, &running, reads).await;
        done.store(true, Ordering::SeqCst);
        out
    };
    let (batches, mut out) = tokio::join!(load, reading);
    out.batches = batches;
    out
}

/// Start a batch of `n` executions of `yaml`: their ids.
async fn batch(mesh: &Mesh, yaml: &str, n: usize) -> Arc<Vec<String>> {
    let started = sc::publish_batch(mesh, yaml, n).await;
    Arc::new(started.into_iter().map(|(eid, _)| eid).collect())
}

/// The reads, in alternating slices of the API and the floor.
async fn measure(
    cluster: &Cluster,
    api: &Api,
    running: &RwLock<Arc<Vec<String>>>,
    reads: usize,
) -> StatusReads {
    let clients: Vec<reqwest::Client> = (0..CLIENTS).map(|_| reqwest::Client::new()).collect();
    // The readers are callers from outside the mesh (a dashboard, a
    // script): they run on a runtime of their own, the API's clients and
    // the floor's tasks alike, not among the in-process mesh's tasks.
    let readers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("readers")
        .enable_all()
        .build()
        .expect("the readers' runtime");
    let rt = readers.handle();
    let per = (reads / SLICES / CLIENTS).max(1);
    let (mut api_took, mut floor_took) = (Duration::ZERO, Duration::ZERO);
    let mut out = StatusReads::default();
    for slice in 0..SLICES {
        let seed = slice as u64 * 7919 + 1;
        let ids = running.read().expect("ids lock").clone();
        if slice % 2 == 0 {
            floor_took += floor_slice(rt, cluster, &ids, per, seed).await;
        }
        let (took, tally) = api_slice(rt, &clients, &api.base, &ids, per, seed).await;
        api_took += took;
        out.running += tally[0];
        out.completed += tally[1];
        out.missing += tally[2];
        if slice % 2 == 1 {
            floor_took += floor_slice(rt, cluster, &ids, per, seed).await;
        }
    }
    readers.shutdown_background();
    let total = (per * CLIENTS * SLICES) as f64;
    out.api_per_s = total / api_took.as_secs_f64();
    out.floor_per_s = total / floor_took.as_secs_f64();
    out
}

/// `per` reads by each client: how long they took, and the answers
/// counted as `[RUNNING, COMPLETED, 404]`.
async fn api_slice(
    rt: &tokio::runtime::Handle,
    clients: &[reqwest::Client],
    base: &str,
    ids: &Arc<Vec<String>>,
    per: usize,
    seed: u64,
) -> (Duration, [usize; 3]) {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (c, http) in clients.iter().enumerate() {
        let (http, ids, base) = (http.clone(), ids.clone(), base.to_string());
        tasks.push(rt.spawn(async move {
            let mut rng = Rng(seed * 31 + c as u64 + 1);
            let mut tally = [0usize; 3];
            for _ in 0..per {
                let eid = &ids[rng.below(ids.len())];
                let url = format!("{base}/api/executions/{eid}/status");
                let r = http.get(url).send().await.expect("status request");
                let code = r.status().as_u16();
                let body = r.bytes().await.expect("status body");
                match code {
                    404 => tally[2] += 1,
                    200 => {
                        let v: Value = serde_json::from_slice(&body).expect("status JSON");
                        match v["status"].as_str() {
                            Some("COMPLETED") => tally[1] += 1,
                            _ => tally[0] += 1,
                        }
                    }
                    other => panic!("status of {eid}: {other} {body:?}"),
                }
            }
            tally
        }));
    }
    let mut tally = [0usize; 3];
    for t in tasks {
        let one = t.await.expect("reader task");
        for (sum, n) in tally.iter_mut().zip(one) {
            *sum += n;
        }
    }
    (t0.elapsed(), tally)
}

/// `per` raw KV gets of random headers by each of [`CLIENTS`] tasks.
async fn floor_slice(
    rt: &tokio::runtime::Handle,
    cluster: &Cluster,
    ids: &Arc<Vec<String>>,
    per: usize,
    seed: u64,
) -> Duration {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (kv, ids) = (cluster.mesh.exec_kv().clone(), ids.clone());
        tasks.push(rt.spawn(async move {
            let mut rng = Rng(seed * 31 + c as u64 + 1);
            for _ in 0..per {
                let eid = &ids[rng.below(ids.len())];
                kv.get(Keys::header(eid)).await.expect("header get");
            }
        }));
    }
    for t in tasks {
        t.await.expect("floor task");
    }
    t0.elapsed()
}
