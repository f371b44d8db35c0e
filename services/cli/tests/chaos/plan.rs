//! The kill schedule of one chaos run: a pure function of the run's seed,
//! so a failing run replays with the same kills at the same offsets.

use std::fmt;

pub use noetl_integration::seeded::{run_seed, Rng};

/// What a kill hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A `noetl serve` process: index into the run's service list.
    Service(usize),
    /// The nats-server itself (restarted on the same port and store).
    NatsServer,
}

/// One SIGKILL and the restart that follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kill {
    /// Milliseconds after the run's first submission.
    pub at_ms: u64,
    /// What is killed.
    pub target: Target,
    /// How long it stays down before it is started again.
    pub down_ms: u64,
}

/// The shape of a schedule.
#[derive(Debug, Clone)]
pub struct PlanParams {
    /// The run's seed.
    pub seed: u64,
    /// How many service processes the run has.
    pub services: usize,
    /// Kills happen within `0..window_ms`.
    pub window_ms: u64,
    /// Gap between two kills, drawn from this range.
    pub gap_ms: (u64, u64),
    /// Downtime of a killed service, drawn from this range.
    pub down_ms: (u64, u64),
    /// Percent of runs that also kill the nats-server (once).
    pub nats_percent: u64,
    /// Downtime of a killed nats-server.
    pub nats_down_ms: (u64, u64),
}

/// The schedule of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The seed it came from.
    pub seed: u64,
    /// Kills in time order.
    pub kills: Vec<Kill>,
}

impl Plan {
    /// How many kills hit the nats-server.
    pub fn nats_kills(&self) -> usize {
        self.kills
            .iter()
            .filter(|k| k.target == Target::NatsServer)
            .count()
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {:#x}:", self.seed)?;
        for k in &self.kills {
            match k.target {
                Target::Service(i) => write!(f, " {}ms:svc{i}/{}ms", k.at_ms, k.down_ms)?,
                Target::NatsServer => write!(f, " {}ms:nats/{}ms", k.at_ms, k.down_ms)?,
            }
        }
        Ok(())
    }
}

/// Draw the schedule of a run from its seed. Service kills are spaced by
/// `gap_ms`; at most one nats-server kill, in the middle half of the
/// window, in `nats_percent` of the seeds.
pub fn plan(p: &PlanParams) -> Plan {
    assert!(p.services > 0, "a run needs services to kill");
    let mut rng = Rng::new(p.seed);
    let mut kills = Vec::new();
    let mut at = rng.range(p.gap_ms.0 / 2, p.gap_ms.1);
    while at < p.window_ms {
        kills.push(Kill {
            at_ms: at,
            target: Target::Service(rng.range(0, p.services as u64 - 1) as usize),
            down_ms: rng.range(p.down_ms.0, p.down_ms.1),
        });
        at += rng.range(p.gap_ms.0, p.gap_ms.1);
    }
    if rng.chance(p.nats_percent) {
        kills.push(Kill {
            at_ms: rng.range(p.window_ms / 4, p.window_ms * 3 / 4),
            target: Target::NatsServer,
            down_ms: rng.range(p.nats_down_ms.0, p.nats_down_ms.1),
        });
        kills.sort_by_key(|k| k.at_ms);
    }
    Plan {
        seed: p.seed,
        kills,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64) -> PlanParams {
        PlanParams {
            seed,
            services: 8,
            window_ms: 10_000,
            gap_ms: (800, 2_000),
            down_ms: (100, 900),
            nats_percent: 30,
            nats_down_ms: (500, 1_500),
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        assert_eq!(plan(&params(7)), plan(&params(7)));
        assert_ne!(plan(&params(7)), plan(&params(8)));
    }

    #[test]
    fn kills_stay_in_the_window_in_order_and_in_their_ranges() {
        for seed in 0..500 {
            let p = plan(&params(seed));
            assert!(p.kills.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
            assert!(p.nats_kills() <= 1);
            for k in &p.kills {
                assert!(k.at_ms < 10_000, "{p}");
                match k.target {
                    Target::Service(i) => {
                        assert!(i < 8);
                        assert!((100..=900).contains(&k.down_ms));
                    }
                    Target::NatsServer => {
                        assert!((2_500..=7_500).contains(&k.at_ms));
                        assert!((500..=1_500).contains(&k.down_ms));
                    }
                }
            }
        }
    }

    #[test]
    fn a_campaign_kills_enough_every_service_and_sometimes_the_server() {
        let plans: Vec<Plan> = (0..100).map(|i| plan(&params(run_seed(1, i)))).collect();
        let kills: usize = plans.iter().map(|p| p.kills.len()).sum();
        assert!(kills >= 500, "{kills} kills in 100 runs");
        let nats = plans.iter().filter(|p| p.nats_kills() > 0).count();
        assert!((15..=45).contains(&nats), "{nats} runs kill the server");
        for svc in 0..8 {
            assert!(plans
                .iter()
                .flat_map(|p| &p.kills)
                .any(|k| k.target == Target::Service(svc)));
        }
    }
}
