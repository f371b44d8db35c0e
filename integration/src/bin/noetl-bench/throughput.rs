//! The throughput floor (issue 37): how many messages a second this
//! machine's nats-server stores and acknowledges when nothing else is
//! asked of it, and the CPU each costs. Raw JetStream publishes, each with
//! its ack awaited, pipelined with a bounded window of acks outstanding, to
//! a stream of its own with the settings the mesh gives its streams
//! (file storage, the mesh's replicas and de-duplication window, limits
//! retention, no age limit: `crates/mesh/src/topology.rs`), each message
//! the size of an event and carrying a `Nats-Msg-Id` derived as the
//! engine derives its ids. Every throughput goal of issue 37 is a ratio to
//! it ([`goals`]).

use std::collections::VecDeque;
use std::future::Future;
use std::time::Instant;

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use noetl_mesh::Mesh;

use crate::cpu::Cpu;

/// Publishes awaiting their ack at most. Tried on the 2-core machine
/// (`--only floor --window N`, docs/performance.md "The throughput
/// floor"): the rate grows up to about 1,024 (64: 99,000 msgs/s, 256:
/// 126,000, 1,024: 138,000, 4,096: 141,000, within the noise of 1,024).
pub const WINDOW: usize = 1024;

/// The body of every message: the size of an average event body of a
/// loop iteration (bytes.rs: 144–297 bytes, 225 on average, plus the
/// payload of a small result), so a message stores about as many bytes as
/// an event (subject, `Nats-Msg-Id` header and body: about 370).
pub const BODY_BYTES: usize = 256;

/// The stream the floor publishes to (deleted before and after).
const STREAM: &str = "BENCH_FLOOR";

/// What one measurement found.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Messages stored and acknowledged per second.
    pub msgs_per_s: f64,
    /// CPU per message, this process and nats-server, µs.
    pub cpu_us_per_msg: f64,
    /// nats-server's part of it, µs.
    pub nats_us_per_msg: f64,
    /// Bytes the stream held per message (subject, headers, body, and the
    /// store's record).
    pub stored_bytes_per_msg: f64,
}

/// Publish `messages` messages with at most `window` acks outstanding and
/// time them, on a fresh stream with the mesh's settings.
pub async fn run(mesh: &Mesh, nats_pids: &[u32], messages: usize, window: usize) -> Floor {
    let js = jetstream::new(mesh.client().clone());
    let _ = js.delete_stream(STREAM).await;
    let config = mesh.config();
    let mut stream = js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["bench_floor.evt.>".into()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            duplicate_window: config.duplicate_window,
            max_age: std::time::Duration::ZERO,
            num_replicas: config.replicas,
            ..Default::default()
        })
        .await
        .expect("the floor's stream");
    // One execution's events: `<prefix>.evt.<execution>.<type>`.
    let execution = noetl_mesh::ids::new_execution_id();
    let subject = format!("bench_floor.evt.{execution}.task.done");
    let body = Bytes::from(vec![b'x'; BODY_BYTES]);
    let before = Cpu::now(nats_pids);
    let t0 = Instant::now();
    pipelined(messages, window, |i| {
        let js = &js;
        let msg = jetstream::message::PublishMessage::build()
            .payload(body.clone())
            .message_id(noetl_mesh::ids::derive_id(&[
                "floor",
                &execution,
                &i.to_string(),
            ]));
        let subject = subject.clone();
        async move {
            js.send_publish(subject, msg)
                .await
                .map(|ack| async move { ack.await.map(|_| ()).map_err(|e| e.to_string()) })
                .map_err(|e| e.to_string())
        }
    })
    .await
    .expect("the floor's publishes");
    let took = t0.elapsed();
    let spent = Cpu::now(nats_pids).since(before);
    let info = stream.info().await.expect("the floor's stream info");
    assert_eq!(
        info.state.messages, messages as u64,
        "every floor message stored once"
    );
    let stored_bytes_per_msg = info.state.bytes as f64 / messages as f64;
    let _ = js.delete_stream(STREAM).await;
    let n = messages as f64;
    Floor {
        msgs_per_s: n / took.as_secs_f64(),
        cpu_us_per_msg: spent.total().as_secs_f64() * 1e6 / n,
        nats_us_per_msg: spent.nats.as_secs_f64() * 1e6 / n,
        stored_bytes_per_msg,
    }
}

/// Send messages `0..total` through `send`, which resolves once the
/// message is handed to the connection and yields its ack; keep at most
/// `window` (at least 1) acks outstanding, awaiting the oldest first (a
/// stream acknowledges in order), and return once every ack arrived.
/// The first error ends it.
pub async fn pipelined<S, SF, A, B, E>(total: usize, window: usize, mut send: S) -> Result<(), E>
where
    S: FnMut(usize) -> SF,
    SF: Future<Output = Result<A, E>>,
    A: Future<Output = Result<B, E>>,
{
    let window = window.max(1);
    let mut acks = VecDeque::with_capacity(window.min(total));
    for i in 0..total {
        if acks.len() == window {
            if let Some(oldest) = acks.pop_front() {
                oldest.await?;
            }
        }
        acks.push_back(send(i).await?);
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

/// One of issue 37's goals as a ratio measured in one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// Key in `results.json`.
    pub key: &'static str,
    /// What is compared with what, for the printout.
    pub label: &'static str,
    /// The ratio measured.
    pub ratio: f64,
    /// The goal's bound.
    pub bound: f64,
    /// Whether the ratio must be at least (`true`) or at most the bound.
    pub at_least: bool,
}

impl Goal {
    /// True when the measured ratio meets the goal.
    pub fn met(&self) -> bool {
        if self.at_least {
            self.ratio >= self.bound
        } else {
            self.ratio <= self.bound
        }
    }
}

/// The figures of one run that issue 37's goals compare.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    pub throughput_floor_msgs_per_s: f64,
    pub cpu_us_per_floor_msg: f64,
    pub loop_tasks_per_s: f64,
    pub loop_python_tasks_per_s: f64,
    pub exec_per_s: f64,
    pub cpu_us_per_iteration: f64,
    pub seq_step_ms: f64,
    pub floor_step_ms: f64,
}

/// Issue 37's goals, each a ratio of a figure to a floor of the same run.
/// A goal whose floor was not measured (zero) is left out.
pub fn goals(m: &Measured) -> Vec<Goal> {
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    let tput = m.throughput_floor_msgs_per_s;
    [
        (
            "loop_ratio_to_throughput_floor",
            "parallel noop loop / throughput floor",
            ratio(m.loop_tasks_per_s, tput),
            0.30,
            true,
        ),
        (
            "loop_python_ratio_to_throughput_floor",
            "python loop / throughput floor",
            ratio(m.loop_python_tasks_per_s, tput),
            0.12,
            true,
        ),
        (
            "exec_ratio_to_throughput_floor",
            "five-step executions/s / throughput floor",
            ratio(m.exec_per_s, tput),
            0.015,
            true,
        ),
        (
            "cpu_iteration_ratio_to_floor_msg",
            "CPU per loop iteration / CPU per floor message",
            ratio(m.cpu_us_per_iteration, m.cpu_us_per_floor_msg),
            3.0,
            false,
        ),
        (
            "seq_step_ratio_to_floor",
            "sequential noop step / latency floor",
            ratio(m.seq_step_ms, m.floor_step_ms),
            1.2,
            false,
        ),
    ]
    .into_iter()
    .filter_map(|(key, label, ratio, bound, at_least)| {
        ratio.map(|ratio| Goal {
            key,
            label,
            ratio,
            bound,
            at_least,
        })
    })
    .collect()
}

/// Print the goals, one line each.
pub fn print_goals(goals: &[Goal]) {
    println!("\nIssue 37's goals, as ratios to the floors of this run:");
    for g in goals {
        println!(
            "  {:<48} {:>8.3}  (goal {} {}: {})",
            g.label,
            g.ratio,
            if g.at_least { ">=" } else { "<=" },
            g.bound,
            if g.met() { "met" } else { "NOT met" }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Runs a future that never waits (the fakes below), on this thread.
    fn block_on<F: Future>(f: F) -> F::Output {
        futures::executor::block_on(f)
    }

    #[test]
    fn the_window_bounds_the_acks_outstanding_and_every_ack_is_awaited() {
        for (total, window) in [(0, 4), (1, 4), (10, 1), (10, 3), (10, 10), (10, 64), (5, 0)] {
            let outstanding = Cell::new(0usize);
            let most = Cell::new(0usize);
            let acked = Cell::new(0usize);
            let sent = Cell::new(Vec::new());
            let r: Result<(), ()> = block_on(pipelined(total, window, |i| {
                let (outstanding, most, acked, sent) = (&outstanding, &most, &acked, &sent);
                async move {
                    let mut s = sent.take();
                    s.push(i);
                    sent.set(s);
                    outstanding.set(outstanding.get() + 1);
                    most.set(most.get().max(outstanding.get()));
                    Ok(async move {
                        outstanding.set(outstanding.get() - 1);
                        acked.set(acked.get() + 1);
                        Ok::<_, ()>(())
                    })
                }
            }));
            assert_eq!(r, Ok(()));
            assert_eq!(sent.take(), (0..total).collect::<Vec<_>>(), "in order");
            assert_eq!(acked.get(), total, "every ack awaited");
            assert_eq!(outstanding.get(), 0);
            assert_eq!(
                most.get(),
                total.min(window.max(1)),
                "{total} messages, window {window}"
            );
        }
    }

    #[test]
    fn a_failed_ack_ends_the_run() {
        let sent = Cell::new(0usize);
        let r = block_on(pipelined(100, 4, |i| {
            let sent = &sent;
            async move {
                sent.set(sent.get() + 1);
                Ok(async move {
                    if i == 2 {
                        Err(format!("no ack for {i}"))
                    } else {
                        Ok(())
                    }
                })
            }
        }));
        assert_eq!(r, Err("no ack for 2".to_string()));
        assert_eq!(sent.get(), 6, "message 2's ack is awaited when 6 is due");
    }

    #[test]
    fn goals_are_ratios_to_the_floors_of_the_run() {
        let m = Measured {
            throughput_floor_msgs_per_s: 60_000.0,
            cpu_us_per_floor_msg: 40.0,
            loop_tasks_per_s: 4_800.0,
            loop_python_tasks_per_s: 9_000.0,
            exec_per_s: 300.0,
            cpu_us_per_iteration: 100.0,
            seq_step_ms: 1.25,
            floor_step_ms: 1.0,
        };
        let g = goals(&m);
        let by = |k: &str| g.iter().find(|g| g.key == k).expect(k).clone();
        let lp = by("loop_ratio_to_throughput_floor");
        assert!((lp.ratio - 0.08).abs() < 1e-12 && !lp.met());
        assert!(
            by("loop_python_ratio_to_throughput_floor").met(),
            "0.15 >= 0.12"
        );
        let ex = by("exec_ratio_to_throughput_floor");
        assert!((ex.ratio - 0.005).abs() < 1e-12 && !ex.met());
        let cpu = by("cpu_iteration_ratio_to_floor_msg");
        assert!((cpu.ratio - 2.5).abs() < 1e-12 && cpu.met(), "at most 3x");
        let seq = by("seq_step_ratio_to_floor");
        assert!(
            (seq.ratio - 1.25).abs() < 1e-12 && !seq.met(),
            "at most 1.2x"
        );
        let none = goals(&Measured {
            loop_tasks_per_s: 1.0,
            ..Default::default()
        });
        assert!(none.is_empty(), "no floor measured, no ratio");
    }
}
