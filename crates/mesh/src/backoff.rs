//! The one backoff of the mesh and its clients: a first delay doubling on
//! each attempt up to a cap. Consumers retrying a message, services waiting
//! to join the mesh and client commands riding out a failover each pick
//! their own first delay and cap.

use std::time::Duration;

/// A doubling delay: `first`, `2 × first`, … at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay before the second attempt.
    pub first: Duration,
    /// The longest delay.
    pub max: Duration,
}

impl Backoff {
    /// A message that failed transiently: 250 ms doubling to 30 s (ten
    /// deliveries ride out about two minutes of outage).
    pub const MESSAGE: Backoff = Backoff {
        first: Duration::from_millis(250),
        max: Duration::from_secs(30),
    };

    /// A pull request that failed (the server unreachable, the stream
    /// without a leader): 250 ms doubling to 2 s. A request costs next to
    /// nothing, and an executor sleeping through a long backoff after the
    /// outage heals serves nothing meanwhile: its kind looks unserved and
    /// its tasks wait (docs/architecture.md, "A kind no executor serves").
    pub const PULL: Backoff = Backoff {
        first: Duration::from_millis(250),
        max: Duration::from_secs(2),
    };

    /// The delay after `failures` failed attempts (1 or more; 0 counts as 1).
    pub fn delay(self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_the_first_up_to_the_cap() {
        let b = Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let ms: Vec<u128> = (0..8).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(ms, [100, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(Backoff::MESSAGE.delay(u32::MAX), Duration::from_secs(30));
        assert_eq!(Backoff::PULL.delay(u32::MAX), Duration::from_secs(2));
    }
}
