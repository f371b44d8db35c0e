//! The step graph laid out by hand, as a plain function over plain data:
//! arcs that close a cycle are marked as back arcs (found by a depth-first
//! walk from the entry step), every step gets a layer (the longest path to
//! it over the forward arcs, so each arc goes to a later layer), and the
//! steps of a layer are ordered by where their predecessors are (two
//! barycentre sweeps, ties kept in workflow order).

/// Where one step goes: its column (`layer`) and its row in it (`order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// 0 for the entry step and for steps no forward arc reaches.
    pub layer: usize,
    /// Position within the layer, from 0.
    pub order: usize,
}

/// The layout of a graph of `n` steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// One per step, in the order the steps were given.
    pub steps: Vec<Placed>,
    /// One per arc, in the order the arcs were given: true when the arc
    /// closes a cycle (it is drawn apart and ignored for layering).
    pub back: Vec<bool>,
    /// How many layers there are.
    pub layers: usize,
}

/// Lay out `n` steps joined by `arcs` (`(from, to)` step indices), walking
/// from `entry` first. Arcs naming a step out of range are ignored (and
/// not marked back).
pub fn layout(n: usize, entry: usize, arcs: &[(usize, usize)]) -> Layout {
    let arcs_in: Vec<(usize, usize)> = arcs
        .iter()
        .map(|&(a, b)| {
            if a < n && b < n {
                (a, b)
            } else {
                (usize::MAX, usize::MAX)
            }
        })
        .collect();
    let back = back_arcs(n, entry, &arcs_in);
    let forward: Vec<(usize, usize)> = arcs_in
        .iter()
        .zip(&back)
        .filter(|(&(a, _), &b)| a != usize::MAX && !b)
        .map(|(&e, _)| e)
        .collect();
    let layer = layers(n, &forward);
    let layers = layer.iter().map(|l| l + 1).max().unwrap_or(0);
    let order = orders(&layer, layers, &forward);
    Layout {
        steps: layer
            .iter()
            .zip(&order)
            .map(|(&layer, &order)| Placed { layer, order })
            .collect(),
        back,
        layers,
    }
}

/// The arcs that reach a step still on the depth-first walk's stack (a
/// self-arc among them). The walk starts at `entry`, then at every step
/// not yet reached, in order; each step's arcs are followed in order.
fn back_arcs(n: usize, entry: usize, arcs: &[(usize, usize)]) -> Vec<bool> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    let mut out_arcs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, &(a, _)) in arcs.iter().enumerate() {
        if a < n {
            out_arcs[a].push(i);
        }
    }
    let mut back = vec![false; arcs.len()];
    let mut mark = vec![Mark::New; n];
    let roots = std::iter::once(entry).filter(|&e| e < n).chain(0..n);
    for root in roots {
        if mark[root] != Mark::New {
            continue;
        }
        // (step, next arc of it to follow)
        let mut stack = vec![(root, 0usize)];
        mark[root] = Mark::OnStack;
        while let Some((step, next)) = stack.last_mut() {
            let (step, i) = (*step, *next);
            if i == out_arcs[step].len() {
                mark[step] = Mark::Done;
                stack.pop();
                continue;
            }
            *next += 1;
            let arc = out_arcs[step][i];
            let to = arcs[arc].1;
            match mark[to] {
                Mark::OnStack => back[arc] = true,
                Mark::New => {
                    mark[to] = Mark::OnStack;
                    stack.push((to, 0));
                }
                Mark::Done => {}
            }
        }
    }
    back
}

/// Each step's layer: the longest forward path to it (the forward arcs
/// make no cycle, so a topological order exists).
fn layers(n: usize, forward: &[(usize, usize)]) -> Vec<usize> {
    let mut indegree = vec![0usize; n];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in forward {
        indegree[b] += 1;
        succ[a].push(b);
    }
    let mut layer = vec![0usize; n];
    let mut ready: std::collections::VecDeque<usize> =
        (0..n).filter(|&s| indegree[s] == 0).collect();
    while let Some(s) = ready.pop_front() {
        for &t in &succ[s] {
            layer[t] = layer[t].max(layer[s] + 1);
            indegree[t] -= 1;
            if indegree[t] == 0 {
                ready.push_back(t);
            }
        }
    }
    layer
}

/// Each step's row in its layer: workflow order first, then two sweeps
/// that sort each layer by the mean row of the step's predecessors (a
/// step without one keeps its row as its key).
fn orders(layer: &[usize], layers: usize, forward: &[(usize, usize)]) -> Vec<usize> {
    let n = layer.len();
    let mut order = vec![0usize; n];
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); layers];
    for s in 0..n {
        order[s] = members[layer[s]].len();
        members[layer[s]].push(s);
    }
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in forward {
        preds[b].push(a);
    }
    for _ in 0..2 {
        for row in members.iter_mut().skip(1) {
            let key = |s: usize| -> f64 {
                if preds[s].is_empty() {
                    order[s] as f64
                } else {
                    preds[s].iter().map(|&p| order[p] as f64).sum::<f64>() / preds[s].len() as f64
                }
            };
            let mut keyed: Vec<(f64, usize, usize)> =
                row.iter().map(|&s| (key(s), order[s], s)).collect();
            keyed.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
            *row = keyed.iter().map(|k| k.2).collect();
            for (i, &s) in row.iter().enumerate() {
                order[s] = i;
            }
        }
    }
    order
}

#[cfg(test)]
mod tests;
