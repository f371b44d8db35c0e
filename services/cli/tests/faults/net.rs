//! Three nats-server nodes, each in a network namespace of its own, joined
//! by veth pairs to a bridge in the root namespace (where the services
//! run), and the faults of [`plan`](crate::plan) applied to them.
//!
//! Everything is named `nf<pid>…`: namespaces `nf<pid>-n1..3`, the bridge
//! `nf<pid>br`, the root ends of the veths `nf<pid>v1..3` (their peers
//! `nf<pid>p1..3` live in the namespaces). The subnet is
//! `10.213.<x>.0/24`: the bridge is `.1`, node `i` is `.11 + i`. Nothing
//! else of the machine is touched: no firewall rules (partitions are
//! permanent neighbour entries to a MAC nobody has, inside the node
//! namespaces: frames to the peer go nowhere and are silently lost), no
//! route outside the bridge's own subnet. [`Net`] removes all of it on
//! drop (a panic included), and [`Net::start`] first removes the `nf*`
//! leftovers of runs whose process is gone.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use noetl_testkit::cluster::{monitor_get, stream_leader_in, JSZ_STREAMS};

/// Why the harness cannot run here (printed by a test that skips).
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces need CAP_NET_ADMIN".into());
    }
    match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("no `ip` command (iproute2): {e}")),
    }
}

/// Run `ip <args>`; panic with its stderr when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Run `ip <args>`, ignoring failure (cleanup, healing what may be gone).
fn ip_quiet(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Run `tc <args>` (in namespace `ns` when given); whether it worked.
fn tc(ns: Option<&str>, args: &[&str]) -> bool {
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tc"]);
            c
        }
        None => Command::new("tc"),
    };
    c.args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in an `nf<pid>…` name.
fn owner(name: &str) -> Option<u32> {
    let digits: String = name
        .strip_prefix("nf")?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Remove the namespaces and links of earlier runs whose process is gone
/// (a run killed with SIGKILL runs no Drop); the processes still inside
/// such a namespace are killed first.
pub fn remove_stale() {
    let me = std::process::id();
    let list = Command::new("ip")
        .args(["-o", "netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = owner(ns) else { continue };
        if pid == me || alive(pid) || !ns.contains("-n") {
            continue;
        }
        let pids = Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        for p in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) with a pid read from the namespace.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
        ip_quiet(&["netns", "del", ns]);
        eprintln!("faults: removed stale namespace {ns}");
    }
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    for line in links.lines() {
        // "12: nf123br: <...>" or "13: nf123v1@if2: <...>"
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        let Some(pid) = owner(name) else { continue };
        if pid != me && !alive(pid) {
            ip_quiet(&["link", "del", name]);
            eprintln!("faults: removed stale link {name}");
        }
    }
}

/// How a degraded link was made (the kernel may lack netem).
pub fn degrade_qdisc(netem: bool) -> &'static str {
    if netem {
        "netem delay 150ms 50ms loss 10%"
    } else {
        "tbf rate 256kbit burst 8kb latency 200ms"
    }
}

/// One node: its namespace, address, config and process.
struct Node {
    ns: String,
    veth: String,
    peer: String,
    addr: Ipv4Addr,
    config: PathBuf,
    store: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// Isolations in force (the link is up again when the last heals).
    isolated: u32,
}

/// The namespaces, the bridge and the three nodes of a run.
pub struct Net {
    bridge: String,
    nodes: Vec<Node>,
    /// Whether `tc netem` exists here (else a token bucket degrades).
    pub netem: bool,
    binary: PathBuf,
    /// Permanent neighbour entries standing for partitions: (node, peer).
    cut: Vec<(usize, usize)>,
    sync: Sync,
}

/// The JetStream settings of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sync {
    /// nats-server's default `sync_interval` (2 minutes).
    Default,
    /// `sync_interval: always`.
    Always,
}

impl Sync {
    /// From `NOETL_FAULT_SYNC` (`always`, else the default).
    pub fn from_env() -> Self {
        match std::env::var("NOETL_FAULT_SYNC").as_deref() {
            Ok("always") => Sync::Always,
            _ => Sync::Default,
        }
    }

    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Sync::Default => "sync_interval default (2 min)",
            Sync::Always => "sync_interval: always",
        }
    }
}

impl Net {
    /// Make the bridge, namespaces and veths, write the config of each of
    /// `nodes` nodes under `dir`, and start them; wait until JetStream is
    /// healthy on all.
    pub fn start(dir: &Path, sync: Sync, nodes: usize) -> Self {
        remove_stale();
        let pid = std::process::id();
        let prefix = format!("nf{pid}");
        // A /24 of 10.213/16 nobody here routes yet.
        let routes = Command::new("ip")
            .args(["-4", "route", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        let x = (0..200u32)
            .map(|k| (pid + k) % 200 + 20)
            .find(|x| !routes.contains(&format!("10.213.{x}.")))
            .expect("a free 10.213.x.0/24");
        let bridge = format!("{prefix}br");
        let binary = std::env::var_os("NOETL_NATS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| "nats-server".into());
        let mut net = Self {
            bridge: bridge.clone(),
            nodes: Vec::new(),
            netem: false,
            binary,
            cut: Vec::new(),
            sync,
        };
        // From here on, Drop removes whatever was made.
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("10.213.{x}.1/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let addrs: Vec<Ipv4Addr> = (0..nodes)
            .map(|i| Ipv4Addr::new(10, 213, x as u8, 11 + i as u8))
            .collect();
        let routes: Vec<String> = addrs
            .iter()
            .map(|a| format!("nats-route://{a}:6222"))
            .collect();
        for (i, addr) in addrs.iter().enumerate() {
            let n = i + 1;
            let ns = format!("{prefix}-n{n}");
            let veth = format!("{prefix}v{n}");
            let peer = format!("{prefix}p{n}");
            let node_dir = dir.join(format!("n{n}"));
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let store = node_dir.join("store");
            let config = node_dir.join("nats.conf");
            let log = node_dir.join("nats-server.log");
            net.nodes.push(Node {
                ns: ns.clone(),
                veth: veth.clone(),
                peer: peer.clone(),
                addr: *addr,
                config: config.clone(),
                store: store.clone(),
                log,
                child: None,
                paused: false,
                isolated: 0,
            });
            ip(&["netns", "add", &ns]);
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer]);
            ip(&["link", "set", &peer, "netns", &ns]);
            ip(&["link", "set", &veth, "master", &bridge]);
            ip(&["link", "set", &veth, "up"]);
            let inside = |args: &[&str]| {
                let mut a = vec!["netns", "exec", &ns, "ip"];
                a.extend_from_slice(args);
                ip(&a);
            };
            inside(&["addr", "add", &format!("{addr}/24"), "dev", &peer]);
            inside(&["link", "set", &peer, "up"]);
            inside(&["link", "set", "lo", "up"]);
            let sync_line = match sync {
                Sync::Default => "",
                Sync::Always => "  sync_interval: always\n",
            };
            let text = format!(
                "server_name: n{n}\n\
                 listen: {addr}:4222\n\
                 http: {addr}:8222\n\
                 jetstream {{\n  store_dir: \"{store}\"\n{sync_line}}}\n\
                 cluster {{\n  name: noetl-faults\n  listen: {addr}:6222\n  routes: [{routes}]\n}}\n",
                store = store.display(),
                routes = routes.join(", "),
            );
            std::fs::write(&config, text).expect("node config");
        }
        net.netem = tc(
            None,
            &[
                "qdisc",
                "add",
                &net.nodes[0].veth,
                "root",
                "netem",
                "delay",
                "1ms",
            ],
        );
        if net.netem {
            tc(None, &["qdisc", "del", "dev", &net.nodes[0].veth, "root"]);
        }
        for i in 0..nodes {
            net.spawn(i);
        }
        net.wait_healthy(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("the cluster did not start: {e}"));
        net
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Every node's client URL, comma-separated (`--nats` form).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://{}:4222", n.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        // `ip netns exec` execs the server: the child's pid is the
        // server's, so SIGSTOP and SIGKILL reach it.
        let child = Command::new("ip")
            .args(["netns", "exec", &n.ns])
            .arg(&self.binary)
            .arg("-c")
            .arg(&n.config)
            .arg("-l")
            .arg(&n.log)
            .env_clear()
            .envs(std::env::vars_os().filter(|(k, _)| k == "PATH"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start node n{}: {e}", i + 1));
        n.child = Some(child);
        n.paused = false;
    }

    fn monitor(&self, i: usize, path: &str) -> Option<serde_json::Value> {
        monitor_get(SocketAddr::from((self.nodes[i].addr, 8222)), path)
    }

    /// Wait until every running node answers `/healthz` ok.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        for i in 0..self.nodes.len() {
            if self.nodes[i].child.is_none() {
                continue;
            }
            loop {
                let last = match self.monitor(i, "/healthz") {
                    Some(v) if v["status"] == "ok" => break,
                    Some(v) => v.to_string(),
                    None => "no answer".into(),
                };
                if t0.elapsed() > timeout {
                    return Err(format!(
                        "n{} not healthy after {:?}: {last}",
                        i + 1,
                        t0.elapsed()
                    ));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(())
    }

    /// The node leading `stream`, as the first node that answers sees it.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        (0..self.nodes.len())
            .filter_map(|i| self.monitor(i, JSZ_STREAMS))
            .find_map(|v| stream_leader_in(&v, stream))
            .and_then(|name| name.strip_prefix('n')?.parse::<usize>().ok())
            .map(|n| n - 1)
    }

    /// Per node, `(stream, messages, last_seq)` of every stream it holds.
    pub fn stream_states(&self, i: usize) -> Option<Vec<(String, u64, u64)>> {
        let v = self.monitor(i, JSZ_STREAMS)?;
        v["account_details"].as_array()?;
        let streams = noetl_mesh::jsz::streams(&v).into_iter();
        Some(streams.map(|(s, h)| (s, h.messages, h.last_seq)).collect())
    }

    /// Take node `i`'s link down: its peers and the services lose it. The
    /// link is on the root side, so the node stays isolated across a crash
    /// and restart.
    pub fn isolate(&mut self, i: usize) {
        ip(&["link", "set", &self.nodes[i].veth, "down"]);
        self.nodes[i].isolated += 1;
    }

    /// Heal one isolation of node `i`: its link comes up when no other
    /// isolation of it is in force.
    pub fn unisolate(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.isolated = n.isolated.saturating_sub(1);
        if n.isolated == 0 {
            ip_quiet(&["link", "set", &n.veth, "up"]);
        }
    }

    /// Cut the pair (`a`, `b`) both ways: in each one's namespace the
    /// other's address resolves to a MAC nobody has.
    pub fn cut(&mut self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let (ns, dev) = (&self.nodes[from].ns, &self.nodes[from].peer);
            let to_addr = self.nodes[to].addr.to_string();
            ip(&[
                "netns",
                "exec",
                ns,
                "ip",
                "neigh",
                "replace",
                &to_addr,
                "lladdr",
                "02:00:00:00:0d:ad",
                "dev",
                dev,
                "nud",
                "permanent",
            ]);
            self.cut.push((from, to));
        }
    }

    /// Undo one [`Net::cut`] of the pair (`a`, `b`): a direction's
    /// neighbour entry goes, ARP resolving the real address again, unless
    /// another cut in force holds the same direction. The entries live in
    /// the namespaces, so a node crashed and restarted while cut stays cut.
    pub fn uncut(&mut self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            if let Some(k) = self.cut.iter().position(|c| *c == (from, to)) {
                self.cut.remove(k);
            }
            if !self.cut.contains(&(from, to)) {
                self.forget_neighbour(from, to);
            }
        }
    }

    /// Undo every [`Net::cut`]: the neighbour entries go, ARP resolves the
    /// real addresses again.
    pub fn heal_cuts(&mut self) {
        for (from, to) in std::mem::take(&mut self.cut) {
            self.forget_neighbour(from, to);
        }
    }

    /// Drop the neighbour entry that cuts `from` off from `to`: ARP
    /// resolves the real address again.
    fn forget_neighbour(&self, from: usize, to: usize) {
        let (ns, dev) = (&self.nodes[from].ns, &self.nodes[from].peer);
        let to_addr = self.nodes[to].addr.to_string();
        ip_quiet(&[
            "netns", "exec", ns, "ip", "neigh", "del", &to_addr, "dev", dev,
        ]);
    }

    /// Degrade node `i`'s link both ways ([`degrade_qdisc`]).
    pub fn degrade(&mut self, i: usize) {
        let q: Vec<&str> = degrade_qdisc(self.netem).split(' ').collect();
        let n = &self.nodes[i];
        let mut a = vec!["qdisc", "replace", "dev", &n.veth, "root"];
        a.extend_from_slice(&q);
        assert!(tc(None, &a), "tc {}", a.join(" "));
        let mut b = vec!["qdisc", "replace", "dev", &n.peer, "root"];
        b.extend_from_slice(&q);
        assert!(tc(Some(&n.ns), &b), "tc in {}: {}", n.ns, b.join(" "));
    }

    /// Remove node `i`'s degradation.
    pub fn undegrade(&mut self, i: usize) {
        let n = &self.nodes[i];
        tc(None, &["qdisc", "del", "dev", &n.veth, "root"]);
        tc(Some(&n.ns), &["qdisc", "del", "dev", &n.peer, "root"]);
    }

    fn signal(&self, i: usize, sig: i32) {
        if let Some(c) = &self.nodes[i].child {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(c.id() as i32, sig);
            }
        }
    }

    /// SIGSTOP node `i`.
    pub fn pause(&mut self, i: usize) {
        self.signal(i, libc::SIGSTOP);
        self.nodes[i].paused = true;
    }

    /// SIGCONT node `i`.
    pub fn resume(&mut self, i: usize) {
        self.signal(i, libc::SIGCONT);
        self.nodes[i].paused = false;
    }

    /// SIGKILL node `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start node `i` again on its store (if it is down).
    pub fn restart(&mut self, i: usize) {
        if self.nodes[i].child.is_none() {
            self.spawn(i);
        }
    }

    fn snapshot_dir(&self, i: usize) -> PathBuf {
        self.nodes[i].store.with_extension("synced")
    }

    /// Copy the stores of `nodes` as they are now, all of them stopped
    /// while they are copied (so the copies are one instant's files): what
    /// the disks hold if this instant is the nodes' last fsync. A node
    /// paused by a fault stays paused.
    pub fn snapshot(&mut self, nodes: &[usize]) {
        for &i in nodes {
            self.signal(i, libc::SIGSTOP);
        }
        for &i in nodes {
            let snap = self.snapshot_dir(i);
            let _ = std::fs::remove_dir_all(&snap);
            let ok = Command::new("cp")
                .arg("-a")
                .arg(&self.nodes[i].store)
                .arg(&snap)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "copy the store of n{}", i + 1);
        }
        for &i in nodes.iter().filter(|i| !self.nodes[**i].paused) {
            self.signal(i, libc::SIGCONT);
        }
    }

    /// `nodes` crash as an OS crash would leave them: SIGKILL, then each
    /// store replaced by its last [`Net::snapshot`]. With `sync_interval:
    /// always` every acknowledged write was on disk at the crash, so the
    /// store is kept as it is (the fault is a kill).
    pub fn crash_losing_unsynced(&mut self, nodes: &[usize]) {
        for &i in nodes {
            self.kill(i);
        }
        for &i in nodes {
            let store = self.nodes[i].store.clone();
            let snap = self.snapshot_dir(i);
            if self.sync == Sync::Always {
                let _ = std::fs::remove_dir_all(&snap);
                continue;
            }
            std::fs::remove_dir_all(&store).expect("drop the store");
            std::fs::rename(&snap, &store).expect("restore the synced store");
        }
    }

    /// Node `i` crashes with a damaged disk: SIGKILL, then one of its
    /// streams' message block files (`<store>/jetstream/<account>/streams/
    /// <stream>/msgs/<n>.blk`, chosen by `pick` among them in name order)
    /// cut short at an offset, or one bit of it flipped, both chosen by
    /// `pick`. Returns what was done, for the history (`": …"`).
    pub fn corrupt(&mut self, i: usize, pick: u64) -> String {
        self.kill(i);
        let mut blocks = Vec::new();
        collect_blocks(&self.nodes[i].store, &mut blocks);
        blocks.sort();
        if blocks.is_empty() {
            return ": no block file to damage".into();
        }
        let path = &blocks[(pick % blocks.len() as u64) as usize];
        let mut bytes = std::fs::read(path).expect("read the block file");
        let len = bytes.len() as u64;
        let shown = path
            .strip_prefix(&self.nodes[i].store)
            .unwrap_or(path)
            .display()
            .to_string();
        let at = (pick >> 8) % len;
        let done = if pick & 0x80 == 0 {
            bytes.truncate(at as usize);
            format!(": {shown} cut from {len} to {at} bytes")
        } else {
            let bit = (pick >> 4) & 7;
            bytes[at as usize] ^= 1 << bit;
            format!(": {shown} bit {bit} of byte {at} of {len} flipped")
        };
        std::fs::write(path, bytes).expect("write the block file");
        done
    }

    /// Heal everything: links up, cuts undone, links clean, nodes running
    /// and resumed.
    pub fn heal(&mut self) {
        self.heal_cuts();
        for i in 0..self.nodes.len() {
            self.nodes[i].isolated = 0;
            self.unisolate(i);
            self.undegrade(i);
            if self.nodes[i].paused {
                self.resume(i);
            }
            self.restart(i);
        }
    }

    /// The last lines of node `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default();
        let all: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains("Healthcheck failed"))
            .collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused {
                self.resume(i);
            }
            self.kill(i);
        }
        for n in &self.nodes {
            ip_quiet(&["link", "del", &n.veth]);
            ip_quiet(&["netns", "del", &n.ns]);
        }
        ip_quiet(&["link", "del", &self.bridge]);
    }
}

/// Every stream message block file (`…/streams/<stream>/msgs/*.blk`)
/// under `dir` that holds something (an empty one damages nothing).
fn collect_blocks(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            collect_blocks(&path, out);
        } else if path.extension().is_some_and(|x| x == "blk")
            && path.to_string_lossy().contains("/streams/")
            && path.parent().is_some_and(|p| p.ends_with("msgs"))
            && e.metadata().is_ok_and(|m| m.len() > 0)
        {
            out.push(path);
        }
    }
}
