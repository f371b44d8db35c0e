//! A test HTTP server that records how many requests it had in flight at
//! once: the tool side's own view of the engine's concurrency, independent
//! of the engine's counters.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;

/// What the server saw.
#[derive(Default)]
pub struct Gauge {
    now: AtomicUsize,
    max: AtomicUsize,
    total: AtomicUsize,
    hold: Duration,
}

impl Gauge {
    /// The most requests ever in flight at once.
    pub fn max(&self) -> usize {
        self.max.load(SeqCst)
    }

    /// Requests answered.
    pub fn total(&self) -> usize {
        self.total.load(SeqCst)
    }

    /// Start a server on a free loopback port whose `GET /slow` holds each
    /// request for `hold`; returns the gauge and the URL of `/slow`.
    pub async fn serve(hold: Duration) -> (Arc<Gauge>, String) {
        let gauge = Arc::new(Gauge {
            hold,
            ..Default::default()
        });
        let app = axum::Router::new()
            .route("/slow", axum::routing::get(slow))
            .with_state(gauge.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the gauge server");
        let url = format!("http://{}/slow", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("gauge server") });
        (gauge, url)
    }
}

async fn slow(State(g): State<Arc<Gauge>>) -> String {
    let n = g.now.fetch_add(1, SeqCst) + 1;
    g.max.fetch_max(n, SeqCst);
    // A zero sleep still waits for the timer's next tick (up to 1 ms).
    if !g.hold.is_zero() {
        tokio::time::sleep(g.hold).await;
    }
    g.now.fetch_sub(1, SeqCst);
    g.total.fetch_add(1, SeqCst);
    "ok".into()
}
