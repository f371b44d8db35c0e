//! Seeded schedules for the chaos suite and the fault harness: a small
//! deterministic generator and the seeds of a campaign's runs, so a
//! failing run replays from the seed it printed.

/// A small deterministic generator (SplitMix64): the same seed gives the
/// same schedule on every machine and toolchain.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "empty range {lo}..={hi}");
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.range(1, 100) <= percent
    }
}

/// The seed of run `i` of a campaign that starts at `base`: every run
/// differs, and the printed seed of a run replays it alone.
pub fn run_seed(base: u64, i: u64) -> u64 {
    Rng::new(base ^ i.wrapping_mul(0xA076_1D64_78BD_642F)).next_u64()
}

/// A number from the environment, decimal or `0x` hex (a seed); panics
/// naming the variable when it does not parse.
pub fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={v:?}: {e}")))
}

/// The base seed of a campaign: `var` if set, else the clock.
pub fn base_seed(var: &str) -> u64 {
    env_u64(var).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_seeds_differ() {
        let seeds: std::collections::BTreeSet<u64> = (0..1000).map(|i| run_seed(42, i)).collect();
        assert_eq!(seeds.len(), 1000);
    }

    #[test]
    fn ranges_are_inclusive_and_bounded() {
        let mut r = Rng::new(3);
        let draws: Vec<u64> = (0..1000).map(|_| r.range(2, 4)).collect();
        assert!(draws.iter().all(|d| (2..=4).contains(d)));
        assert!(draws.contains(&2) && draws.contains(&4));
    }
}
