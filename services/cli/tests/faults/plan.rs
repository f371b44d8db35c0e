//! The fault schedule of one run: a pure function of the run's seed, so a
//! failing run replays with the same faults on the same nodes at the same
//! offsets. Faults never overlap: each heals before the next begins, and
//! the last heals before the run settles.

use std::fmt;

pub use noetl_integration::seeded::{run_seed, Rng};

/// Nodes of the cluster unless `NOETL_FAULT_NODES` says 5.
pub const NODES: usize = 3;

/// The nodes of the runs: `NOETL_FAULT_NODES` (3 or 5; R3 or R5), else
/// [`NODES`].
pub fn nodes_from_env() -> usize {
    match std::env::var("NOETL_FAULT_NODES").ok().as_deref() {
        None | Some("") | Some("3") => NODES,
        Some("5") => 5,
        Some(other) => panic!("NOETL_FAULT_NODES={other}: 3 or 5"),
    }
}

/// A class of fault (docs/reliability.md, "The fault harness").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// The node's link down: cut from its peers and from the services.
    Isolate,
    /// [`Kind::Isolate`] of the node leading the events stream at the time.
    IsolateLeader,
    /// The node cut from its two peers (a minority of one), the services
    /// still reaching all three.
    Split,
    /// The two other nodes cut from each other; the node sees both (a
    /// bridge), the services see all three.
    Bridge,
    /// The node SIGSTOPped, then SIGCONTed.
    Pause,
    /// Latency and loss on the node's link (`tc netem`; where the kernel
    /// has no netem, a 256 kbit/s token bucket with tail drop).
    Degrade,
    /// The node SIGKILLed and started again on its store.
    Kill,
    /// The node SIGKILLed, its store replaced by the copy taken
    /// `snap_ms` earlier (what an OS crash leaves when nothing was
    /// fsynced since), started again.
    LostWrites,
    /// The node SIGKILLed and one of its streams' message block files
    /// damaged — cut short at a seeded offset or one seeded bit flipped —
    /// then started again (a minority's corrupt disk).
    Corrupt,
    /// [`Kind::LostWrites`] on all three nodes at once, from copies taken
    /// at the same instant: a coordinated power failure. Drawn only when
    /// [`PlanParams::power_loss`] is set.
    PowerLoss,
}

impl Kind {
    /// Every class, in the order of the report's columns.
    pub const ALL: [Kind; 10] = [
        Kind::Isolate,
        Kind::IsolateLeader,
        Kind::Split,
        Kind::Bridge,
        Kind::Pause,
        Kind::Degrade,
        Kind::Kill,
        Kind::LostWrites,
        Kind::Corrupt,
        Kind::PowerLoss,
    ];

    /// Whether the node's store is copied before it (a later crash drops
    /// what came after the copy).
    pub fn loses_writes(self) -> bool {
        matches!(self, Kind::LostWrites | Kind::PowerLoss)
    }

    /// Short name (report columns, history lines).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Isolate => "isolate",
            Kind::IsolateLeader => "leader",
            Kind::Split => "split",
            Kind::Bridge => "bridge",
            Kind::Pause => "pause",
            Kind::Degrade => "degrade",
            Kind::Kill => "kill",
            Kind::LostWrites => "lost",
            Kind::Corrupt => "corrupt",
            Kind::PowerLoss => "power",
        }
    }

    /// How long the fault lasts, drawn from this range (ms).
    fn duration(self) -> (u64, u64) {
        match self {
            Kind::Isolate | Kind::IsolateLeader | Kind::Split | Kind::Bridge => (2_000, 6_000),
            Kind::Pause => (1_000, 5_000),
            Kind::Degrade => (2_000, 5_000),
            Kind::Kill | Kind::LostWrites | Kind::Corrupt | Kind::PowerLoss => (500, 3_000),
        }
    }
}

/// One fault and its healing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Milliseconds after the run's first submission.
    pub at_ms: u64,
    /// What is done.
    pub kind: Kind,
    /// The node it hits (0-based; for [`Kind::IsolateLeader`] the node
    /// used when no leader can be read; for [`Kind::Bridge`] the middle).
    pub node: usize,
    /// How long until it heals (a killed node: until it is started again).
    pub dur_ms: u64,
    /// [`Kind::LostWrites`], [`Kind::PowerLoss`]: the store copy is taken
    /// this long before the crash (0 for the other kinds).
    pub snap_ms: u64,
    /// [`Kind::Corrupt`]: picks the file, the damage and where (0 for the
    /// other kinds).
    pub pick: u64,
    /// A service process SIGKILLed while the fault lasts (half the faults,
    /// when the plan has services): the Jepsen combinations of a node
    /// fault and a client crash.
    pub service_kill: Option<ServiceKill>,
}

/// A service killed during a node fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceKill {
    /// Which service process (an index into the run's services).
    pub service: usize,
    /// How long after the fault began.
    pub after_ms: u64,
    /// How long until it is started again.
    pub down_ms: u64,
}

impl Fault {
    /// When it has healed.
    pub fn healed_ms(&self) -> u64 {
        self.at_ms + self.dur_ms
    }
}

/// The shape of a schedule.
#[derive(Debug, Clone)]
pub struct PlanParams {
    /// The run's seed.
    pub seed: u64,
    /// Faults start within `0..window_ms`.
    pub window_ms: u64,
    /// Quiet time between one fault's healing and the next one, drawn
    /// from this range.
    pub gap_ms: (u64, u64),
    /// Every class once, in a seeded order (the short test), instead of
    /// classes drawn at random until the window is full.
    pub every_class_once: bool,
    /// Whether [`Kind::PowerLoss`] is among the classes: with nats-server's
    /// default `sync_interval` it loses acknowledged writes on every
    /// replica by construction (docs/reliability.md), so a campaign of the
    /// default settings leaves it out and measures it apart.
    pub power_loss: bool,
    /// Service processes a fault may kill one of (0: none).
    pub services: usize,
    /// Nodes of the cluster (3 or 5).
    pub nodes: usize,
}

/// The schedule of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The seed it came from.
    pub seed: u64,
    /// Nodes of the cluster it is for.
    pub nodes: usize,
    /// Faults in time order, none overlapping.
    pub faults: Vec<Fault>,
}

impl Plan {
    /// When the last fault has healed.
    pub fn healed_ms(&self) -> u64 {
        self.faults.iter().map(Fault::healed_ms).max().unwrap_or(0)
    }

    /// How many faults killed a service too.
    pub fn service_kills(&self) -> usize {
        self.faults
            .iter()
            .filter(|f| f.service_kill.is_some())
            .count()
    }

    /// How many faults of `kind`.
    pub fn count(&self, kind: Kind) -> usize {
        self.faults.iter().filter(|f| f.kind == kind).count()
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}ms {} n{} for {}ms",
            self.at_ms,
            self.kind.name(),
            self.node + 1,
            self.dur_ms
        )?;
        if self.kind.loses_writes() {
            write!(f, " (store copied {}ms before)", self.snap_ms)?;
        }
        if self.kind == Kind::Corrupt {
            write!(f, " (damage {:#x})", self.pick)?;
        }
        if let Some(k) = self.service_kill {
            write!(
                f,
                " + service {} killed at +{}ms for {}ms",
                k.service, k.after_ms, k.down_ms
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {:#x}:", self.seed)?;
        for x in &self.faults {
            write!(f, " [{x}]")?;
        }
        Ok(())
    }
}

/// Draw the schedule of a run from its seed.
pub fn plan(p: &PlanParams) -> Plan {
    let mut rng = Rng::new(p.seed);
    let classes: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| p.power_loss || *k != Kind::PowerLoss)
        .collect();
    let mut order = classes.clone();
    // Fisher-Yates: the short run's order differs by seed.
    for i in (1..order.len()).rev() {
        order.swap(i, rng.range(0, i as u64) as usize);
    }
    let mut faults = Vec::new();
    let mut at = rng.range(p.gap_ms.0, p.gap_ms.1);
    let mut next = 0;
    loop {
        let kind = if p.every_class_once {
            match order.get(next) {
                Some(k) => *k,
                None => break,
            }
        } else {
            if at >= p.window_ms {
                break;
            }
            classes[rng.range(0, classes.len() as u64 - 1) as usize]
        };
        next += 1;
        let (lo, hi) = kind.duration();
        let dur_ms = rng.range(lo, hi);
        let snap_ms = if kind.loses_writes() {
            rng.range(500, 3_000)
        } else {
            0
        };
        // The copy is taken after the previous fault healed.
        let at_ms = at + snap_ms;
        let node = rng.range(0, p.nodes as u64 - 1) as usize;
        let pick = match kind {
            Kind::Corrupt => rng.next_u64(),
            _ => 0,
        };
        let service_kill = (p.services > 0 && rng.chance(50)).then(|| ServiceKill {
            service: rng.range(0, p.services as u64 - 1) as usize,
            after_ms: rng.range(0, dur_ms),
            down_ms: rng.range(100, 1_200),
        });
        faults.push(Fault {
            at_ms,
            kind,
            node,
            dur_ms,
            snap_ms,
            pick,
            service_kill,
        });
        at = at_ms + dur_ms + rng.range(p.gap_ms.0, p.gap_ms.1);
    }
    Plan {
        seed: p.seed,
        nodes: p.nodes,
        faults,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(seed: u64, every_class_once: bool) -> PlanParams {
        PlanParams {
            seed,
            window_ms: 30_000,
            gap_ms: (1_000, 3_000),
            every_class_once,
            power_loss: false,
            services: 10,
            nodes: NODES,
        }
    }

    #[test]
    fn power_loss_is_drawn_only_when_asked_for() {
        let with = |seed| {
            plan(&PlanParams {
                power_loss: true,
                ..params(seed, true)
            })
        };
        for seed in 0..50 {
            assert_eq!(with(seed).count(Kind::PowerLoss), 1);
            assert_eq!(with(seed).faults.len(), Kind::ALL.len());
            assert_eq!(plan(&params(seed, true)).count(Kind::PowerLoss), 0);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        assert_eq!(plan(&params(7, false)), plan(&params(7, false)));
        assert_ne!(plan(&params(7, false)), plan(&params(8, false)));
        assert_eq!(plan(&params(7, true)), plan(&params(7, true)));
    }

    #[test]
    fn faults_never_overlap_and_stay_in_their_ranges() {
        for seed in 0..500 {
            for once in [false, true] {
                let p = plan(&params(seed, once));
                for w in p.faults.windows(2) {
                    // The next fault (and a lost-writes copy before it)
                    // starts at least a gap after the previous healed.
                    assert!(w[0].healed_ms() + 1_000 <= w[1].at_ms - w[1].snap_ms, "{p}");
                }
                for f in &p.faults {
                    assert!(f.node < NODES);
                    let (lo, hi) = f.kind.duration();
                    assert!((lo..=hi).contains(&f.dur_ms), "{p}");
                    assert_eq!(f.snap_ms > 0, f.kind.loses_writes(), "{p}");
                    assert_eq!(f.pick != 0, f.kind == Kind::Corrupt, "{p}");
                    if let Some(k) = f.service_kill {
                        assert!(k.service < 10 && k.after_ms <= f.dur_ms, "{p}");
                        assert!((100..=1_200).contains(&k.down_ms), "{p}");
                    }
                    assert!(f.kind != Kind::PowerLoss, "{p}");
                    if !once {
                        assert!(f.at_ms - f.snap_ms < 30_000, "{p}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_short_run_has_every_class_once() {
        for seed in 0..100 {
            let p = plan(&params(seed, true));
            assert_eq!(p.faults.len(), Kind::ALL.len() - 1);
            for k in Kind::ALL.into_iter().filter(|k| *k != Kind::PowerLoss) {
                assert_eq!(p.count(k), 1, "{p}");
            }
        }
    }

    #[test]
    fn a_campaign_hits_every_class_on_every_node() {
        let plans: Vec<Plan> = (0..50)
            .map(|i| plan(&params(run_seed(1, i), false)))
            .collect();
        for k in Kind::ALL.into_iter().filter(|k| *k != Kind::PowerLoss) {
            let n: usize = plans.iter().map(|p| p.count(k)).sum();
            assert!(n >= 10, "{n} faults of {k:?} in 50 runs");
            for node in 0..NODES {
                assert!(plans
                    .iter()
                    .flat_map(|p| &p.faults)
                    .any(|f| f.kind == k && f.node == node));
            }
        }
    }

    #[test]
    fn about_half_the_faults_kill_a_service_too_and_none_without_services() {
        let plans: Vec<Plan> = (0..50)
            .map(|i| plan(&params(run_seed(2, i), false)))
            .collect();
        let faults: usize = plans.iter().map(|p| p.faults.len()).sum();
        let kills: usize = plans.iter().map(Plan::service_kills).sum();
        assert!(
            kills * 3 > faults && kills * 3 < faults * 2,
            "{kills} of {faults}"
        );
        let none = plan(&PlanParams {
            services: 0,
            ..params(3, false)
        });
        assert_eq!(none.service_kills(), 0);
    }

    #[test]
    fn five_nodes_are_all_hit() {
        let plans: Vec<Plan> = (0..50)
            .map(|i| {
                plan(&PlanParams {
                    nodes: 5,
                    ..params(run_seed(4, i), false)
                })
            })
            .collect();
        for node in 0..5 {
            assert!(plans.iter().flat_map(|p| &p.faults).any(|f| f.node == node));
        }
        assert!(plans.iter().flat_map(|p| &p.faults).all(|f| f.node < 5));
    }
}
