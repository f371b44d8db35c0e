//! The HTTP API (`noetl-api`) served over a mesh on a loopback port,
//! without tokens (the API's no-auth mode on loopback), on its own runtime
//! and NATS connection, as its own process would: the bench's API
//! scenarios, and tests that read through it.

use std::time::{Duration, Instant};

use noetl_api::ApiParams;
use noetl_mesh::Mesh;
use tokio_util::sync::CancellationToken;

/// The API, serving until dropped.
pub struct Api {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    shutdown: CancellationToken,
}

impl Api {
    /// Serve the API over the mesh `mesh` runs on and wait until `/health`
    /// answers. As `noetl serve api` is its own process in a deployment,
    /// it runs here on its own runtime (its own threads) and its own NATS
    /// connection, not on the runtime of the in-process mesh it reads.
    pub async fn serve(mesh: &Mesh) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let shutdown = CancellationToken::new();
        let config = mesh.config().clone();
        let stop = shutdown.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("api")
                .build()
                .expect("the API's runtime");
            rt.block_on(async move {
                let mesh = Mesh::connect(config).await.expect("the API connects");
                noetl_api::serve(ApiParams {
                    mesh,
                    listener,
                    tls: None,
                    bootstrap_token: None,
                    insecure_no_auth: false,
                    extra: axum::Router::new(),
                    shutdown: stop,
                    limits: Default::default(),
                })
                .await
                .expect("the API serves");
            });
        });
        let api = Self {
            base: format!("http://127.0.0.1:{port}"),
            shutdown,
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = http.get(format!("{}/health", api.base)).send().await {
                if r.status().is_success() {
                    return api;
                }
            }
            assert!(Instant::now() < deadline, "the API did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
