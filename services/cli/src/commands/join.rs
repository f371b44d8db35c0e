//! What every `noetl serve` process does around its service: drain on
//! the first SIGINT or SIGTERM, and join the mesh waiting for NATS.

use std::time::Duration;

use noetl_mesh::{connect::display_urls, Mesh};
use tokio_util::sync::CancellationToken;

use super::common::MeshArgs;

/// A token cancelled by the first SIGINT or SIGTERM (logged: the drain
/// starts).
pub fn on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received: draining");
        signal.cancel();
    });
    shutdown
}

/// Join the mesh, waiting for NATS: a service started before its server,
/// or while it restarts, retries with backoff (logging each failure)
/// instead of exiting; a configuration error ends it at once. `None`
/// when a signal came first.
pub async fn join_waiting(
    args: &MeshArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Mesh>> {
    let config = args.server_config()?;
    let url = display_urls(&config.nats_url);
    let mut attempt = 0u32;
    loop {
        match Mesh::connect(config.clone()).await {
            Ok(mesh) => return Ok(Some(mesh)),
            // Only what trying again can mend is retried (a credentials
            // outage, NATS restarting): a configuration error ends it.
            Err(e) if e.kind() == noetl_mesh::error::ErrorKind::Config => {
                return Err(anyhow::Error::new(e).context(format!("joining the mesh at {url}")))
            }
            Err(e) => {
                let wait = join_backoff(attempt);
                tracing::warn!(nats = %url, attempt = attempt + 1, retry_in_ms = wait.as_millis() as u64,
                    error = %e, "cannot join the mesh yet; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(wait) => {}
                }
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

/// Delay before the next attempt to join: 250 ms doubling to 5 s.
fn join_backoff(attempt: u32) -> Duration {
    noetl_mesh::backoff::Backoff {
        first: Duration::from_millis(250),
        max: Duration::from_secs(5),
    }
    .delay(attempt.saturating_add(1))
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joining_backs_off_from_a_quarter_second_to_five_seconds() {
        let waits: Vec<u64> = (0..8).map(|a| join_backoff(a).as_millis() as u64).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        assert_eq!(join_backoff(u32::MAX), Duration::from_secs(5));
    }
}
