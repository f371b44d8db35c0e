//! The batches a loop run's window goes out in (docs/architecture.md "Loop
//! windows in batches"): cut once, in the write that puts their
//! iterations in flight, and kept in the run (`LoopRun::batches`) while
//! one of their iterations is in flight. A window sent again (a report
//! found counted already: the write that counted it may have been
//! followed by a crash before its iterations went out) goes out in the
//! same batches, with the same ids, so JetStream drops what did go out.
//! Cut again from what is still in flight, it would be other batches: an
//! executor would run iterations another batch is running, and their ends
//! would be stored twice, once in each batch's report. Pure.
//!
//! A batch is a range of consecutive indices, `[first, end)`: the
//! iterations that enter a window together are consecutive (the next
//! indices, or the next of a resumed run's sorted `redo`), and a cut never
//! spans a gap.

use super::LoopRun;

/// Record the batches of `newly` (the indices a write put in flight, in
/// dispatch order): runs of consecutive indices, at most `size` each.
/// Nothing is recorded when `size` is 1 (every iteration goes alone).
pub(crate) fn cut(r: &mut LoopRun, newly: &[u64], size: usize) {
    if size <= 1 || newly.is_empty() {
        return;
    }
    let sorted = r.batches.last().is_none_or(|b| b[1] <= newly[0]);
    let mut start = 0;
    for k in 1..=newly.len() {
        let ends = k == newly.len() || newly[k] != newly[k - 1] + 1 || k - start >= size;
        if ends {
            r.batches.push([newly[start], newly[k - 1] + 1]);
            start = k;
        }
    }
    if !sorted {
        r.batches.sort_unstable_by_key(|b| b[0]);
    }
}

/// Record the batches of `newly` ([`cut`]) and forget those none of whose
/// iterations is in flight any more ([`prune`]): what every write that
/// puts iterations in flight does.
pub(crate) fn record(r: &mut LoopRun, newly: &[u64], size: usize) {
    cut(r, newly, size);
    prune(r);
}

/// Forget the batches none of whose iterations is in flight any more.
pub(crate) fn prune(r: &mut LoopRun) {
    if r.batches.is_empty() {
        return;
    }
    // The window is in dispatch order, which is index order: sorted
    // already but for a run of an older loop-supervisor.
    let copy;
    let live = if r.in_flight.is_sorted() {
        &r.in_flight
    } else {
        let mut sorted = r.in_flight.clone();
        sorted.sort_unstable();
        copy = sorted;
        &copy
    };
    r.batches.retain(|b| {
        let k = live.partition_point(|i| *i < b[0]);
        k < live.len() && live[k] < b[1]
    });
}

/// The recorded batch `[first, end)` iteration `index` went out in, if any.
pub(crate) fn batch_of(r: &LoopRun, index: u64) -> Option<[u64; 2]> {
    let k = r.batches.partition_point(|b| b[0] <= index);
    r.batches[..k].last().filter(|b| index < b[1]).copied()
}

/// How iterations go out ([`to_send`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sending {
    /// The iterations a write just put in flight: each batch goes out with
    /// the iterations that start it (another report's handler counted in
    /// the same write sends a batch that starts with its own), so a batch
    /// is published once.
    New,
    /// Iterations in flight, sent again: each in its whole batch, as it
    /// went out first (its iterations counted since are skipped by the
    /// executor that runs it).
    Again,
}

/// The indices to publish for `indices`: each that went out (or goes out)
/// in a recorded batch replaced by that whole batch, once, at its first
/// place, as `how` says; one recorded in none as it is.
pub(crate) fn to_send(r: &LoopRun, indices: &[u64], how: Sending) -> Vec<u64> {
    if r.batches.is_empty() {
        return indices.to_vec();
    }
    let mut out = Vec::with_capacity(indices.len());
    let mut sent: Vec<[u64; 2]> = Vec::new();
    for &i in indices {
        match batch_of(r, i) {
            Some(b) if how == Sending::New && b[0] != i => {}
            Some(b) if sent.contains(&b) => {}
            Some(b) => {
                sent.push(b);
                out.extend(b[0]..b[1]);
            }
            None => out.push(i),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(in_flight: &[u64]) -> LoopRun {
        let cmd = noetl_wire::LoopCommand::default();
        let mut r = super::super::new_run(&cmd, "lp", 100, 16, serde_json::Value::Null);
        r.in_flight = in_flight.to_vec();
        r
    }

    #[test]
    fn a_window_is_cut_into_runs_of_consecutive_indices_at_most_size_long() {
        let mut r = run(&[]);
        cut(&mut r, &[0, 1, 2, 3, 4, 5, 6], 3);
        assert_eq!(r.batches, vec![[0, 3], [3, 6], [6, 7]]);
        // A gap (a resumed run's redo) ends a batch.
        cut(&mut r, &[9, 10, 12, 13], 3);
        assert_eq!(r.batches, vec![[0, 3], [3, 6], [6, 7], [9, 11], [12, 14]]);
        // One at a time: nothing recorded.
        let mut alone = run(&[]);
        cut(&mut alone, &[0, 1, 2], 1);
        assert!(alone.batches.is_empty());
    }

    #[test]
    fn a_batch_is_kept_while_one_of_its_iterations_is_in_flight() {
        let mut r = run(&[4, 1, 7]);
        r.batches = vec![[0, 3], [3, 6], [6, 8], [8, 10]];
        prune(&mut r);
        assert_eq!(r.batches, vec![[0, 3], [3, 6], [6, 8]]);
        r.in_flight.clear();
        prune(&mut r);
        assert!(r.batches.is_empty());
    }

    #[test]
    fn a_window_sent_again_goes_out_in_the_batches_it_went_out_in_first() {
        // Batches [18, 21) and [21, 24) went out; 20, 22 and 23 were
        // counted since (20 after a retry of its own), [24, 26) went out
        // when they were.
        let mut r = run(&[18, 19, 21, 24, 25]);
        r.batches = vec![[18, 21], [21, 24], [24, 26]];
        assert_eq!(batch_of(&r, 19), Some([18, 21]));
        assert_eq!(batch_of(&r, 21), Some([21, 24]));
        assert_eq!(batch_of(&r, 26), None);
        assert_eq!(
            to_send(&r, &r.in_flight, Sending::Again),
            vec![18, 19, 20, 21, 22, 23, 24, 25]
        );
        // Not in a recorded batch (one at a time, or a run rebuilt from
        // its events): as it is.
        assert_eq!(to_send(&r, &[30, 18], Sending::Again), vec![30, 18, 19, 20]);
        // Put in flight by one write for two reports, 24 and 25 for one,
        // 26 and 27 for the other, cut as [24, 27) and [27, 28): each
        // batch goes out once, with the report whose iterations start it.
        r.batches = vec![[24, 27], [27, 28]];
        assert_eq!(to_send(&r, &[24, 25], Sending::New), vec![24, 25, 26]);
        assert_eq!(to_send(&r, &[26, 27], Sending::New), vec![27]);
    }
}
