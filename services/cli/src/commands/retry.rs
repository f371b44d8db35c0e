//! Client commands ride out a failover: what a NATS node dying interrupts
//! (a JetStream request timing out, no responders while a stream elects a
//! leader, the connection moving to another server) is tried again with
//! backoff for as long as the command's time allows, and fails (exit 5)
//! only when that budget is spent (docs/reliability.md, "Clients").

use std::future::Future;
use std::time::{Duration, Instant};

use noetl_mesh::error::ErrorKind;
use noetl_mesh::MeshError;

/// How long a command without a `--timeout` of its own keeps trying.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(60);

/// Whether trying again can mend `e`: a mesh error of kind `Transient`
/// anywhere in its chain, or NATS not reachable (refused credentials are
/// not: the command fails at once).
pub fn transient(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<MeshError>()
            .is_some_and(|m| m.kind() == ErrorKind::Transient)
            || cause
                .downcast_ref::<async_nats::ConnectError>()
                .is_some_and(|c| noetl_mesh::error::connect_kind(c.kind()) == ErrorKind::Transient)
    })
}

/// The wait before the next attempt after `attempt` failed ones: 100 ms
/// doubling to 2 s, cut to what is left before `deadline`; `None` when
/// nothing is left.
pub fn delay(attempt: u32, now: Instant, deadline: Instant) -> Option<Duration> {
    let left = deadline
        .checked_duration_since(now)
        .filter(|d| !d.is_zero())?;
    let backoff = noetl_mesh::backoff::Backoff {
        first: Duration::from_millis(100),
        max: Duration::from_secs(2),
    }
    .delay(attempt.saturating_add(1));
    Some(backoff.min(left))
}

/// Run `op` until it succeeds, fails with what trying again cannot mend,
/// or `deadline` passes (the last error is returned). The first retry is
/// said once on stderr, naming `what`.
pub async fn ride_out<T, F, Fut>(deadline: Instant, what: &str, mut op: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let mut attempt = 0u32;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if transient(&e) => {
                let Some(wait) = delay(attempt, Instant::now(), deadline) else {
                    return Err(e);
                };
                if attempt == 0 {
                    eprintln!("note: {what}: {e:#}; retrying while the mesh recovers");
                }
                tokio::time::sleep(wait).await;
                attempt = attempt.saturating_add(1);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_mesh_errors_are_retried_others_are_not() {
        let timeout = anyhow::Error::new(MeshError::Setup {
            what: "stream NOETL_WORK".into(),
            message: "request timed out".into(),
        })
        .context("joining the mesh");
        assert!(transient(&timeout));
        let missing = anyhow::Error::new(MeshError::Config("bad".into()));
        assert!(!transient(&missing));
        assert!(!transient(&anyhow::anyhow!("not a mesh error")));
    }

    #[test]
    fn the_backoff_doubles_to_two_seconds_and_never_passes_the_deadline() {
        let now = Instant::now();
        let far = now + Duration::from_secs(600);
        assert_eq!(delay(0, now, far), Some(Duration::from_millis(100)));
        assert_eq!(delay(1, now, far), Some(Duration::from_millis(200)));
        assert_eq!(delay(9, now, far), Some(Duration::from_secs(2)));
        assert_eq!(
            delay(9, now, now + Duration::from_millis(30)),
            Some(Duration::from_millis(30))
        );
        assert_eq!(delay(0, now, now), None);
    }

    #[tokio::test]
    async fn ride_out_retries_until_success_or_the_deadline() {
        let mut calls = 0;
        let got = ride_out(Instant::now() + Duration::from_secs(5), "reading", || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err(anyhow::Error::new(MeshError::Kv {
                        bucket: "exec".into(),
                        key: "e1".into(),
                        message: "timed out".into(),
                    }))
                } else {
                    Ok(n)
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(got, 3);
        let started = Instant::now();
        let e = ride_out::<(), _, _>(started + Duration::from_millis(300), "reading", || async {
            Err(anyhow::Error::new(MeshError::Kv {
                bucket: "exec".into(),
                key: "e1".into(),
                message: "timed out".into(),
            }))
        })
        .await
        .unwrap_err();
        assert!(transient(&e));
        assert!(started.elapsed() >= Duration::from_millis(300));
    }
}
