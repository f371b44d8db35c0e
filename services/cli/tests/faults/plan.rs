//! The fault schedule of one run: a pure function of the run's seed, so a
//! failing run replays with the same faults on the same nodes at the same
//! offsets. Faults follow each other: each heals before the next begins,
//! and the last heals before the run settles. Some (about a quarter, from
//! the seed) carry an [`Overlap`]: a second node fault that starts while the
//! first lasts and heals before it or with it — Jepsen's combinations, a
//! crash or a pause during a partition, a crash on a degraded link or
//! while a node is paused.

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

    /// The classes of second fault that may overlap a fault of this one
    /// (empty: it is never overlapped). Those of Jepsen's analysis of
    /// NATS 2.12.1: a process crash or an OS crash losing unsynced writes
    /// during a partition, on a degraded link or while a node is paused
    /// (an OS crash with network delays or process pauses is what it
    /// found losing committed writes), a pause during a partition; and two
    /// of one kind at once on two nodes: two partitions (a node isolated
    /// or cut off while another is), two process crashes, two pauses.
    /// Each damages at most the one store it crashes, and the first fault
    /// here damages none, so a majority of stores stay whole and the
    /// cluster can always heal once both end; a loss of quorum while they
    /// overlap lasts at most the second fault (a crash 0.5–3 s, a pause
    /// 1–5 s, a partition 2–6 s), as in Jepsen's runs. A damaged file, a
    /// power loss or an OS crash is never overlapped, nor used as the
    /// second fault except the OS crash.
    pub fn overlapped_by(self) -> &'static [Kind] {
        match self {
            Kind::Isolate | Kind::IsolateLeader | Kind::Split | Kind::Bridge => &[
                Kind::Kill,
                Kind::LostWrites,
                Kind::Pause,
                Kind::Isolate,
                Kind::Split,
            ],
            Kind::Pause => &[Kind::Kill, Kind::LostWrites, Kind::Pause],
            Kind::Degrade => &[Kind::Kill, Kind::LostWrites],
            Kind::Kill => &[Kind::Kill],
            Kind::LostWrites | Kind::Corrupt | Kind::PowerLoss => &[],
        }
    }

    /// A partition: the node's link down, or pairs of nodes cut apart.
    pub fn is_partition(self) -> bool {
        matches!(
            self,
            Kind::Isolate | Kind::IsolateLeader | Kind::Split | Kind::Bridge
        )
    }

    /// Whether a second fault of class `second` during one of this class
    /// must hit another node: two of one kind (a node crashed or paused
    /// twice is crashed or paused once, and the second's healing would end
    /// the first early), or two partitions.
    pub fn needs_another_node(self, second: Kind) -> bool {
        self == second || (self.is_partition() && second.is_partition())
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
    /// A second node fault while this one lasts ([`Kind::overlapped_by`]).
    pub overlap: Option<Overlap>,
}

/// A second node fault that starts while a [`Fault`] lasts and heals
/// before it or with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overlap {
    /// What is done: [`Kind::Kill`], [`Kind::LostWrites`] or
    /// [`Kind::Pause`].
    pub kind: Kind,
    /// The node it hits, as planned (the first fault's [`Fault::node`]
    /// may be another; the same node is a kill of a node that is isolated,
    /// which starts again still isolated). When the first fault hits
    /// another node than planned (the leader, looked up then), this one
    /// moves with it: see [`Overlap::node_for`].
    pub node: usize,
    /// How long after the first fault began.
    pub after_ms: u64,
    /// How long until it heals (`after_ms + dur_ms` is within the first
    /// fault's duration).
    pub dur_ms: u64,
    /// [`Kind::LostWrites`]: the store copy is taken this long before the
    /// crash, while the first fault lasts already (0 for the other kinds).
    pub snap_ms: u64,
}

impl Overlap {
    /// The node it hits when `first`, planned on [`Fault::node`], hit
    /// node `hit` of `nodes`: as far from `hit` as planned from the first
    /// fault's node (the same node stays the same node).
    pub fn node_for(&self, first: &Fault, hit: usize, nodes: usize) -> usize {
        (hit + self.node + nodes - first.node) % nodes
    }

    /// It as a fault of its own on `node` (what the executor injects and
    /// heals), `first` the fault it overlaps.
    pub fn as_fault(&self, first: &Fault, node: usize) -> Fault {
        Fault {
            at_ms: first.at_ms + self.after_ms,
            kind: self.kind,
            node,
            dur_ms: self.dur_ms,
            snap_ms: self.snap_ms,
            pick: 0,
            service_kill: None,
            overlap: None,
        }
    }
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

    /// Its name in the report: the class's, or `second+first` when a
    /// fault overlaps it (`kill+isolate`: a kill during an isolation).
    pub fn name(&self) -> String {
        match self.overlap {
            Some(o) => format!("{}+{}", o.kind.name(), self.kind.name()),
            None => self.kind.name().to_string(),
        }
    }
}

/// The pairs (`a`, `b`) a partition of `kind` cuts apart when it hits node
/// `n` of `nodes` (empty for the other kinds): a [`Kind::Split`] cuts a
/// minority (`n` alone of three, `n` and the next of five) from the
/// majority; a [`Kind::Bridge`] cuts the others in two halves, `n` seeing
/// both. Healing the fault undoes these pairs and no others.
pub fn cuts(kind: Kind, n: usize, nodes: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    match kind {
        Kind::Split => {
            let minority: Vec<usize> = (0..(nodes - 1) / 2).map(|k| (n + k) % nodes).collect();
            for a in &minority {
                for b in (0..nodes).filter(|b| !minority.contains(b)) {
                    out.push((*a, b));
                }
            }
        }
        Kind::Bridge => {
            let others: Vec<usize> = (0..nodes).filter(|p| *p != n).collect();
            let (left, right) = others.split_at(others.len() / 2);
            for a in left {
                for b in right {
                    out.push((*a, *b));
                }
            }
        }
        _ => {}
    }
    out
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
    /// Whether a fault may carry an [`Overlap`] (`NOETL_FAULT_OVERLAP=0`
    /// turns them off). Overlaps are drawn from a generator of their own,
    /// so the rest of a seed's schedule is the same with or without them.
    pub overlaps: bool,
}

/// Of the faults that can be overlapped ([`Kind::overlapped_by`]: 7 of the
/// 9 default classes), this percentage is: about a quarter of all faults.
pub const OVERLAP_PERCENT: u64 = 40;

/// Mixed into the seed for the overlaps' generator.
const OVERLAP_SALT: u64 = 0x0f39_0e71_a9b0_0039;

/// The schedule of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The seed it came from.
    pub seed: u64,
    /// Nodes of the cluster it is for.
    pub nodes: usize,
    /// Faults in time order, each healed before the next begins (a
    /// fault's [`Overlap`] within it).
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

    /// How many faults of `kind` (overlapped or not; an overlap is not
    /// counted under its own class).
    pub fn count(&self, kind: Kind) -> usize {
        self.faults.iter().filter(|f| f.kind == kind).count()
    }

    /// The names of the overlapping pairs, in time order
    /// (`kill+isolate`).
    pub fn overlaps(&self) -> Vec<String> {
        self.faults
            .iter()
            .filter(|f| f.overlap.is_some())
            .map(Fault::name)
            .collect()
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
        if let Some(o) = self.overlap {
            write!(
                f,
                " + {} n{} at +{}ms for {}ms",
                o.kind.name(),
                o.node + 1,
                o.after_ms,
                o.dur_ms
            )?;
            if o.kind.loses_writes() {
                write!(f, " (store copied {}ms before)", o.snap_ms)?;
            }
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
    let mut second = Rng::new(p.seed ^ OVERLAP_SALT);
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
        let overlap = p
            .overlaps
            .then(|| overlap(&mut second, First { kind, node, dur_ms }, p.nodes))
            .flatten();
        faults.push(Fault {
            at_ms,
            kind,
            node,
            dur_ms,
            snap_ms,
            pick,
            service_kill,
            overlap,
        });
        at = at_ms + dur_ms + rng.range(p.gap_ms.0, p.gap_ms.1);
    }
    Plan {
        seed: p.seed,
        nodes: p.nodes,
        faults,
    }
}

/// The fault an [`Overlap`] is drawn for.
struct First {
    kind: Kind,
    node: usize,
    dur_ms: u64,
}

/// Whether `first` on a cluster of `nodes` gets a second fault, and which
/// ([`Kind::overlapped_by`]): it starts at least 250 ms into the first (a
/// lost-writes crash at least 500 ms in, its store copied while the first
/// lasts already), heals before the first or with it, and hits another
/// node where [`Kind::needs_another_node`] says so. A first fault too
/// short for the second class's shortest duration gets none.
fn overlap(rng: &mut Rng, first: First, nodes: usize) -> Option<Overlap> {
    let choices = first.kind.overlapped_by();
    if choices.is_empty() || !rng.chance(OVERLAP_PERCENT) {
        return None;
    }
    let kind = choices[rng.range(0, choices.len() as u64 - 1) as usize];
    let min_after = if kind.loses_writes() { 500 } else { 250 };
    let (lo, hi) = kind.duration();
    let longest = hi.min(first.dur_ms - min_after);
    if longest < lo {
        return None;
    }
    let dur = rng.range(lo, longest);
    let after_ms = rng.range(min_after, first.dur_ms - dur);
    let snap_ms = if kind.loses_writes() {
        rng.range(500, after_ms.min(3_000))
    } else {
        0
    };
    let node = if first.kind.needs_another_node(kind) {
        (first.node + rng.range(1, nodes as u64 - 1) as usize) % nodes
    } else {
        rng.range(0, nodes as u64 - 1) as usize
    };
    Some(Overlap {
        kind,
        node,
        after_ms,
        dur_ms: dur,
        snap_ms,
    })
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
            overlaps: true,
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
    fn faults_follow_each_other_and_stay_in_their_ranges() {
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

    fn all_plans(nodes: usize) -> Vec<Plan> {
        let mut out = Vec::new();
        for seed in 0..500 {
            for once in [false, true] {
                out.push(plan(&PlanParams {
                    nodes,
                    ..params(seed, once)
                }));
            }
        }
        out
    }

    #[test]
    fn overlaps_are_the_jepsen_pairs_within_the_first_fault() {
        for nodes in [3, 5] {
            for p in all_plans(nodes) {
                for f in &p.faults {
                    let Some(o) = f.overlap else { continue };
                    assert!(f.kind.overlapped_by().contains(&o.kind), "{p}");
                    // One store damaged at most: the first fault damages
                    // none, and power losses and damaged files never pair.
                    assert!(!f.kind.loses_writes() && f.kind != Kind::Corrupt, "{p}");
                    assert!(o.kind != Kind::PowerLoss && o.kind != Kind::Corrupt, "{p}");
                    // Starts while the first lasts, heals before it or with it.
                    assert!(o.after_ms >= 250, "{p}");
                    assert!(o.after_ms + o.dur_ms <= f.dur_ms, "{p}");
                    assert!(f.at_ms + o.after_ms + o.dur_ms <= f.healed_ms(), "{p}");
                    let (lo, hi) = o.kind.duration();
                    assert!((lo..=hi).contains(&o.dur_ms), "{p}");
                    // A quorum lost while they overlap comes back within
                    // the second fault: a crash 3 s, a pause 5 s, a
                    // partition 6 s at most.
                    assert!(o.dur_ms <= 6_000, "{p}");
                    // Two of a kind, or two partitions, on two nodes.
                    if f.kind.needs_another_node(o.kind) {
                        assert_ne!(o.node, f.node, "{p}");
                    }
                    // The copy of a lost-writes crash is taken while the
                    // first fault lasts.
                    if o.kind.loses_writes() {
                        assert!((500..=3_000).contains(&o.snap_ms), "{p}");
                        assert!(o.snap_ms <= o.after_ms, "{p}");
                    } else {
                        assert_eq!(o.snap_ms, 0, "{p}");
                    }
                    assert!(o.node < nodes, "{p}");
                    assert!(f.name().ends_with(&format!("+{}", f.kind.name())));
                }
            }
        }
    }

    #[test]
    fn about_a_quarter_of_the_faults_overlap_and_every_pair_is_drawn() {
        let plans: Vec<Plan> = (0..50)
            .map(|i| plan(&params(run_seed(5, i), false)))
            .collect();
        let faults: usize = plans.iter().map(|p| p.faults.len()).sum();
        let overlaps: usize = plans.iter().map(|p| p.overlaps().len()).sum();
        assert!(
            overlaps * 6 > faults && overlaps * 3 < faults,
            "{overlaps} of {faults}"
        );
        let all = all_plans(NODES);
        for first in Kind::ALL {
            for second in first.overlapped_by() {
                let pair = |same: bool| {
                    all.iter().flat_map(|p| &p.faults).any(|f| {
                        f.kind == first
                            && f.overlap
                                .is_some_and(|o| o.kind == *second && (o.node == f.node) == same)
                    })
                };
                assert!(pair(false), "{second:?} during {first:?}");
                assert_eq!(
                    pair(true),
                    !first.needs_another_node(*second),
                    "{second:?} during {first:?} on the same node"
                );
            }
        }
    }

    #[test]
    fn overlaps_leave_the_rest_of_the_schedule_as_it_was() {
        for seed in 0..200 {
            for once in [false, true] {
                let off = plan(&PlanParams {
                    overlaps: false,
                    ..params(seed, once)
                });
                assert!(off.overlaps().is_empty());
                let mut on = plan(&params(seed, once));
                on.faults.iter_mut().for_each(|f| f.overlap = None);
                assert_eq!(on, off);
            }
        }
    }

    #[test]
    fn an_overlap_moves_with_the_node_its_first_fault_hit() {
        let p = plan(&params(0, true));
        let f = Fault {
            node: 1,
            overlap: None,
            ..p.faults[0].clone()
        };
        let same = Overlap {
            kind: Kind::Kill,
            node: 1,
            after_ms: 500,
            dur_ms: 500,
            snap_ms: 0,
        };
        // The leader was n3 when planned on n2: the same node is n3.
        assert_eq!(same.node_for(&f, 1, 3), 1);
        assert_eq!(same.node_for(&f, 2, 3), 2);
        let next = Overlap { node: 2, ..same };
        assert_eq!(next.node_for(&f, 1, 3), 2);
        assert_eq!(next.node_for(&f, 2, 3), 0);
        assert_eq!(next.node_for(&f, 4, 5), 0);
        let g = Fault {
            overlap: Some(next),
            kind: Kind::Isolate,
            ..f
        };
        assert_eq!(g.name(), "kill+isolate");
        assert_eq!(next.as_fault(&g, 0).at_ms, g.at_ms + 500);
    }

    #[test]
    fn partitions_cut_the_pairs_they_name() {
        assert_eq!(cuts(Kind::Split, 1, 3), vec![(1, 0), (1, 2)]);
        assert_eq!(cuts(Kind::Bridge, 1, 3), vec![(0, 2)]);
        assert_eq!(cuts(Kind::Bridge, 0, 3), vec![(1, 2)]);
        // Five nodes: a minority of two; two halves of two.
        assert_eq!(
            cuts(Kind::Split, 4, 5),
            vec![(4, 1), (4, 2), (4, 3), (0, 1), (0, 2), (0, 3)]
        );
        assert_eq!(
            cuts(Kind::Bridge, 0, 5),
            vec![(1, 3), (1, 4), (2, 3), (2, 4)]
        );
        assert!(cuts(Kind::Isolate, 0, 3).is_empty());
    }
}
