use super::*;

fn placed(l: &Layout) -> Vec<(usize, usize)> {
    l.steps.iter().map(|p| (p.layer, p.order)).collect()
}

#[test]
fn a_chain_is_one_step_per_layer() {
    let l = layout(3, 0, &[(0, 1), (1, 2)]);
    assert_eq!(placed(&l), vec![(0, 0), (1, 0), (2, 0)]);
    assert_eq!(l.back, vec![false, false]);
    assert_eq!(l.layers, 3);
}

#[test]
fn a_fan_out_shares_a_layer_and_the_join_comes_after_both() {
    // start -> a, start -> b, a -> join, b -> join
    let l = layout(4, 0, &[(0, 1), (0, 2), (1, 3), (2, 3)]);
    assert_eq!(placed(&l), vec![(0, 0), (1, 0), (1, 1), (2, 0)]);
    assert_eq!(l.layers, 3);
}

#[test]
fn an_arc_back_to_an_earlier_step_is_marked_and_does_not_push_layers() {
    // start -> work -> check; check -> work (a retry loop); check -> end
    let l = layout(4, 0, &[(0, 1), (1, 2), (2, 1), (2, 3)]);
    assert_eq!(l.back, vec![false, false, true, false]);
    assert_eq!(placed(&l), vec![(0, 0), (1, 0), (2, 0), (3, 0)]);
    let self_arc = layout(1, 0, &[(0, 0)]);
    assert_eq!(self_arc.back, vec![true]);
    assert_eq!(self_arc.layers, 1);
}

#[test]
fn a_step_goes_after_its_longest_path() {
    // start -> a -> b -> end, and start -> end directly.
    let l = layout(4, 0, &[(0, 1), (1, 2), (2, 3), (0, 3)]);
    assert_eq!(l.steps[3].layer, 3);
    assert!(l.back.iter().all(|b| !b));
}

#[test]
fn the_walk_starts_at_the_entry_step_wherever_it_is() {
    // Steps [b, start]: start -> b, b -> start. From `start` the arc
    // b -> start is the one back; start is layer 0.
    let l = layout(2, 1, &[(1, 0), (0, 1)]);
    assert_eq!(l.back, vec![false, true]);
    assert_eq!(placed(&l), vec![(1, 0), (0, 0)]);
}

#[test]
fn unreachable_steps_start_a_layer_of_their_own_and_bad_arcs_are_ignored() {
    let l = layout(3, 0, &[(0, 1), (5, 1), (1, 9)]);
    assert_eq!(placed(&l), vec![(0, 0), (1, 0), (0, 1)]);
    assert_eq!(l.back, vec![false, false, false]);
    assert_eq!(layout(0, 0, &[]).layers, 0);
}

#[test]
fn a_layer_is_ordered_by_where_its_predecessors_are() {
    // start -> p, start -> q; q -> r, p -> s. Workflow order puts r before
    // s, but s hangs off p (row 0), so s comes first.
    let l = layout(5, 0, &[(0, 1), (0, 2), (2, 3), (1, 4)]);
    assert_eq!((l.steps[1].order, l.steps[2].order), (0, 1));
    assert_eq!((l.steps[4].order, l.steps[3].order), (0, 1));
}
