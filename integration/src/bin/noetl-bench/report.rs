//! The bench's figures: repeats summarised (median, p99, min–max), printed
//! as a table with ratios to the floor, and written as JSON.

use std::collections::BTreeMap;
use std::path::Path;

/// Repeated measurements of one figure.
pub struct Figure {
    /// Key in `results.json`.
    pub key: &'static str,
    /// What it measures, for the table.
    pub label: String,
    /// Unit, for the table (`ms`, `tasks/s`...).
    pub unit: &'static str,
    /// One value per repeat.
    pub samples: Vec<f64>,
    /// A floor to compare with (same unit), when one applies.
    pub floor: Option<f64>,
}

/// Median, p99 and range of a figure's samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

/// Summarise `samples` (at least one). The p99 is nearest-rank.
pub fn stats(samples: &[f64]) -> Stats {
    assert!(!samples.is_empty(), "a figure without samples");
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = |q: f64| s[((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    let median = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    Stats {
        median,
        p99: rank(0.99),
        min: s[0],
        max: s[s.len() - 1],
    }
}

/// Print the table.
pub fn print(figures: &[Figure]) {
    println!(
        "\n{:<52} {:>10} {:>10} {:>21} {:>9}",
        "figure", "median", "p99", "min–max", "vs floor"
    );
    for f in figures {
        let s = stats(&f.samples);
        let ratio = f
            .floor
            .map(|fl| format!("{:.2}x", s.median / fl))
            .unwrap_or_default();
        println!(
            "{:<52} {:>10} {:>10} {:>21} {:>9}",
            format!("{} ({})", f.label, f.unit),
            fmt(s.median),
            fmt(s.p99),
            format!("{}–{}", fmt(s.min), fmt(s.max)),
            ratio
        );
    }
}

fn fmt(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Every figure's median under its key, plus `extra` (ratios, latencies
/// measured inside one run), as pretty JSON in `path`.
pub fn write_json(path: &Path, figures: &[Figure], extra: &[(String, f64)]) {
    let mut out = BTreeMap::new();
    for f in figures {
        out.insert(f.key.to_string(), stats(&f.samples).median);
    }
    for (k, v) in extra {
        out.insert(k.clone(), *v);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create the results directory");
    }
    let text = serde_json::to_string_pretty(&out).expect("results are JSON");
    std::fs::write(path, text).expect("write results.json");
    println!("\nwrote {}", path.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_odd_and_even_samples() {
        let s = stats(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.p99), (2.0, 1.0, 3.0, 3.0));
        let s = stats(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(s.median, 2.5);
        let many: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(stats(&many).p99, 198.0);
    }
}
