//! KV keys: the only place they are built and parsed (subjects are in
//! [`crate::subjects`]). The table is in `docs/architecture.md` ("KV
//! buckets"). Step names and step-run ids are encoded with
//! [`key_part`], so any name makes a valid, distinct key.

/// Builds and parses every KV key. Keys of one execution all start with
/// `<eid>.` (or are `<eid>` itself), so purging an execution is one
/// prefix.
pub struct Keys;

impl Keys {
    /// `<eid>` (bucket exec): the execution header.
    pub fn header(eid: &str) -> String {
        eid.to_string()
    }
    /// `<eid>.plan` (bucket exec): the validated plan.
    pub fn plan(eid: &str) -> String {
        format!("{eid}.plan")
    }
    /// `<eid>.step.<step>` (bucket exec): a step's record.
    pub fn step(eid: &str, step: &str) -> String {
        format!("{eid}.step.{}", key_part(step))
    }
    /// `<eid>.step.>` (bucket exec): the pattern of every step record of
    /// an execution.
    pub fn steps_of(eid: &str) -> String {
        format!("{eid}.step.>")
    }
    /// `<eid>.result.<step>` (bucket exec): a step's last result.
    pub fn result(eid: &str, step: &str) -> String {
        format!("{eid}.result.{}", key_part(step))
    }
    /// `<eid>.join.<step>` (bucket exec): arrivals at a join step.
    pub fn join(eid: &str, step: &str) -> String {
        format!("{eid}.join.{}", key_part(step))
    }
    /// `<eid>.paused` (bucket exec): the execution is paused
    /// ([`crate::pause`]).
    pub fn paused(eid: &str) -> String {
        format!("{eid}.paused")
    }
    /// `<eid>.wait.<signal>` (bucket exec): a step-run waiting for a
    /// signal ([`crate::signal`]).
    pub fn wait(eid: &str, signal: &str) -> String {
        format!("{eid}.wait.{}", key_part(signal))
    }
    /// `<eid>.wait.*`: the pattern of every [`Keys::wait`] key of an
    /// execution.
    pub fn waits_of(eid: &str) -> String {
        format!("{eid}.wait.*")
    }
    /// `<eid>.held`: the prefix under which a paused execution's held
    /// messages wait.
    pub fn held_all(eid: &str) -> String {
        format!("{eid}.held")
    }
    /// `<eid>.held.token.<token_id>` (bucket exec): a token held by a pause.
    pub fn held_token(eid: &str, token_id: &str) -> String {
        format!("{eid}.held.token.{}", key_part(token_id))
    }
    /// `<eid>.held.loop.<step_run_id>` (bucket exec): a loop run's window
    /// held by a pause.
    pub fn held_loop(eid: &str, step_run_id: &str) -> String {
        format!("{eid}.held.loop.{}", key_part(step_run_id))
    }
    /// `<eid>.resume` (bucket exec): how a child execution continues its
    /// parent.
    pub fn resume(eid: &str) -> String {
        format!("{eid}.resume")
    }
    /// `<parent>.child.<child>` (bucket exec): the parent's index of its
    /// children.
    pub fn child(parent: &str, child: &str) -> String {
        format!("{parent}.child.{child}")
    }
    /// `<eid>.child`: the prefix under which [`Keys::child`] keys live.
    pub fn children(eid: &str) -> String {
        format!("{eid}.child")
    }
    /// The child execution id of a [`Keys::child`] key of `parent`.
    pub fn child_of<'a>(parent: &str, key: &'a str) -> Option<&'a str> {
        key.strip_prefix(parent)?
            .strip_prefix(".child.")
            .filter(|c| !c.is_empty())
    }
    /// `<eid>.<loop_run>` (bucket loop): a loop run's record.
    pub fn loop_run(eid: &str, loop_run_id: &str) -> String {
        format!("{eid}.{}", key_part(loop_run_id))
    }
    /// `<eid>.<loop_run>.carry` (bucket loop): the run of the same loop step
    /// that a resumed execution's new run continues (written by the router
    /// when it resumes; pruned with the run).
    pub fn loop_carry(eid: &str, loop_run_id: &str) -> String {
        format!("{}.carry", Self::loop_run(eid, loop_run_id))
    }
    /// `<eid>.<loop_run>.items.<chunk>` (bucket loop): one chunk of a loop
    /// run's collection.
    pub fn items(eid: &str, loop_run_id: &str, chunk: usize) -> String {
        format!("{}.items.{chunk}", Self::loop_run(eid, loop_run_id))
    }
    /// `<eid>.<loop_run>.frame.<seq>` (bucket loop): the rows claim `seq`
    /// of a cursor loop run returned (a list, or a reference to one).
    pub fn frame(eid: &str, loop_run_id: &str, seq: u64) -> String {
        format!("{}.frame.{seq}", Self::loop_run(eid, loop_run_id))
    }
    /// `<eid>.<loop_run>.it.<index>` (bucket loop): iteration `index`'s
    /// claim.
    pub fn claim(eid: &str, loop_run_id: &str, index: u64) -> String {
        format!("{}.{index}", Self::claims(eid, loop_run_id))
    }
    /// `<eid>.<loop_run>.it`: the prefix under which a loop run's claims
    /// live.
    pub fn claims(eid: &str, loop_run_id: &str) -> String {
        format!("{}.it", Self::loop_run(eid, loop_run_id))
    }
    /// The index of a [`Keys::claim`] key below `claims` ([`Keys::claims`]).
    pub fn claim_index(claims: &str, key: &str) -> Option<u64> {
        key.strip_prefix(claims)?.strip_prefix('.')?.parse().ok()
    }
    /// `<eid>.<loop_run>.ckpt.<index>` (bucket loop): an iteration's
    /// checkpoint (where its pipeline is).
    pub fn checkpoint(eid: &str, loop_run_id: &str, index: impl std::fmt::Display) -> String {
        format!("{}.ckpt.{index}", Self::loop_run(eid, loop_run_id))
    }
    /// `<eid>.owners.<loop_run>` (bucket ctx): write-once `ctx` key claims
    /// of a parallel loop run.
    pub fn owners(eid: &str, loop_run_id: &str) -> String {
        format!("{eid}.owners.{}", key_part(loop_run_id))
    }
    /// `<path>` as key tokens (bucket catalog): each `/`-separated segment
    /// of a catalog path encoded with [`key_part`]; `None` for what cannot
    /// be a catalog path ([`is_catalog_path`]).
    pub fn catalog_path(path: &str) -> Option<String> {
        if !is_catalog_path(path) {
            return None;
        }
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        Some(
            segs.iter()
                .map(|s| key_part(s))
                .collect::<Vec<_>>()
                .join("."),
        )
    }
    /// `<path>.latest` (bucket catalog): a path's version counter, for a
    /// path already made a key ([`Keys::catalog_path`]).
    pub fn catalog_latest(path_key: &str) -> String {
        format!("{path_key}.latest")
    }
    /// The path key of a [`Keys::catalog_latest`] key.
    pub fn catalog_latest_of(key: &str) -> Option<&str> {
        key.strip_suffix(".latest")
    }
    /// `<path>.v<N>` (bucket catalog): one registered version.
    pub fn catalog_version(path_key: &str, version: u32) -> String {
        format!("{path_key}.v{version}")
    }

    /// `<sha256 hex>` (bucket tokens): an API token's record, under the
    /// SHA-256 of the token (the token itself is never stored).
    pub fn token(sha256_hex: &str) -> String {
        sha256_hex.to_string()
    }

    /// `<name>` (bucket schedules): a cron schedule's record (settings and
    /// firing state). Schedule names are `[A-Za-z0-9_-]`, so the key is
    /// one token (listed with the pattern `*`): the name, hex-encoded by
    /// [`key_part`] only when it starts with `x-`.
    pub fn schedule(name: &str) -> String {
        key_part(name)
    }

    /// `exec.<hash>` (bucket gates): the concurrency record of the
    /// executions of a playbook key (`executor.spec.policy.concurrency`);
    /// the hash is of the rendered key, which the record keeps readable.
    pub fn gate_execution(key: &str) -> String {
        format!("exec.{}", crate::ids::derive_id(&["gate", key]))
    }
    /// `conc.<hash>` (bucket gates): the concurrency record of a step key's
    /// task calls (`step.spec.policy.concurrency`).
    pub fn gate_task(key: &str) -> String {
        format!("conc.{}", crate::ids::derive_id(&["gate", key]))
    }
    /// `rate.<hash>` (bucket gates): the token bucket of a step key's task
    /// calls (`step.spec.policy.rate`).
    pub fn gate_rate(key: &str) -> String {
        format!("rate.{}", crate::ids::derive_id(&["gate", key]))
    }

    /// The object id (below its execution and step in the object store,
    /// `mesh::objects`) of argument `index` of token `token_id`, when it
    /// travels by reference.
    pub fn args_object(token_id: &str, index: usize) -> String {
        format!("{token_id}.args.{index}")
    }
    /// The object id of chunk `chunk` of a loop run's collection, when it
    /// is stored by reference.
    pub fn items_object(loop_run_id: &str, chunk: usize) -> String {
        format!("{}.items.{chunk}", key_part(loop_run_id))
    }
    /// The object id of the list of a loop run's stored chunks, when
    /// `loop.started` carries it by reference.
    pub fn collection_object(loop_run_id: &str) -> String {
        format!("{}.collection", key_part(loop_run_id))
    }
    /// The object id of the rows claim `seq` of a cursor loop run
    /// returned, when they are stored by reference.
    pub fn frame_object(loop_run_id: &str, seq: u64) -> String {
        format!("{loop_run_id}.frame.{seq}")
    }
}

/// Longest catalog path, in characters: its key (each segment at most
/// doubled by [`key_part`]) stays far below what nats-server takes in a
/// subject (a longer one closes the connection that sent it).
pub const MAX_CATALOG_PATH: usize = 256;

/// Longest [`key_part`] output: a longer encoding is replaced by a hash.
pub const MAX_KEY_PART: usize = 200;

/// True for a catalog path: 1-[`MAX_CATALOG_PATH`] characters, no control
/// character, `/`-separated segments none of which is empty (leading and
/// trailing `/` are ignored).
pub fn is_catalog_path(path: &str) -> bool {
    let trimmed = path.trim_matches('/');
    !trimmed.is_empty()
        && path.chars().count() <= MAX_CATALOG_PATH
        && !path.chars().any(char::is_control)
        && trimmed.split('/').all(|s| !s.is_empty())
}

/// Encode an arbitrary name (step names may contain any character) as a KV
/// key segment: kept as is when safe, else `x-` + hex; an encoding over
/// [`MAX_KEY_PART`] characters becomes `x-h` + the SHA-256 of the name in
/// hex (so every key stays bounded; `h` is no hex digit, so the forms never
/// meet).
pub fn key_part(name: &str) -> String {
    let safe = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !name.starts_with("x-");
    let part = if safe {
        name.to_string()
    } else {
        format!("x-{}", hex::encode(name.as_bytes()))
    };
    if part.len() <= MAX_KEY_PART {
        return part;
    }
    use sha2::Digest as _;
    format!("x-h{}", hex::encode(sha2::Sha256::digest(name.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::Keys;

    #[test]
    fn keys_have_their_documented_shapes() {
        let table = [
            (Keys::header("e1"), "e1"),
            (Keys::plan("e1"), "e1.plan"),
            (Keys::step("e1", "fetch"), "e1.step.fetch"),
            (Keys::result("e1", "fetch"), "e1.result.fetch"),
            (Keys::join("e1", "tail"), "e1.join.tail"),
            (Keys::resume("e1"), "e1.resume"),
            (Keys::child("e1", "c9"), "e1.child.c9"),
            (Keys::children("e1"), "e1.child"),
            (Keys::loop_run("e1", "sr1"), "e1.sr1"),
            (Keys::items("e1", "sr1", 3), "e1.sr1.items.3"),
            (Keys::claim("e1", "sr1", 7), "e1.sr1.it.7"),
            (Keys::claims("e1", "sr1"), "e1.sr1.it"),
            (Keys::frame("e1", "sr1", 2), "e1.sr1.frame.2"),
            (Keys::checkpoint("e1", "sr1", 7), "e1.sr1.ckpt.7"),
            (Keys::owners("e1", "sr1"), "e1.owners.sr1"),
        ];
        for (got, want) in table {
            assert_eq!(got, want);
        }
    }

    #[test]
    fn names_with_any_character_stay_one_segment() {
        let k = Keys::step("e1", "a.b c");
        assert_eq!(k.matches('.').count(), 2, "{k}");
        assert_ne!(Keys::step("e1", "a.b"), Keys::step("e1", "a_b"));
    }

    #[test]
    fn catalog_keys_and_object_ids_have_their_documented_shapes() {
        let path = Keys::catalog_path("/examples/hello world/").unwrap();
        assert_eq!(path, format!("examples.{}", super::key_part("hello world")));
        assert_eq!(Keys::catalog_path("a//b"), None);
        assert_eq!(Keys::catalog_latest("a.b"), "a.b.latest");
        assert_eq!(Keys::catalog_latest_of("a.b.latest"), Some("a.b"));
        assert_eq!(Keys::catalog_version("a.b", 3), "a.b.v3");
        assert_eq!(Keys::args_object("t1", 2), "t1.args.2");
        assert_eq!(Keys::items_object("r1", 0), "r1.items.0");
        assert_eq!(Keys::frame_object("r1", 7), "r1.frame.7");
    }

    #[test]
    fn a_name_of_any_length_makes_a_bounded_key_part() {
        let long = "a".repeat(5000);
        let part = super::key_part(&long);
        assert!(part.len() <= super::MAX_KEY_PART, "{}", part.len());
        assert!(part.starts_with("x-h"), "{part}");
        assert_ne!(part, super::key_part(&"a".repeat(5001)));
        assert_eq!(part, super::key_part(&long), "stable");
        let wide = "é".repeat(60);
        assert!(super::key_part(&wide).starts_with("x-h"));
        assert_eq!(super::key_part(&"b".repeat(200)), "b".repeat(200));
    }

    #[test]
    fn catalog_paths_are_bounded_and_printable() {
        let table = [
            ("examples/hello", true),
            ("/examples/hello world/", true),
            ("a//b", false),
            ("", false),
            ("/", false),
            ("a\nb", false),
            ("a\u{97}b", false),
        ];
        for (path, ok) in table {
            assert_eq!(super::is_catalog_path(path), ok, "{path:?}");
        }
        assert!(super::is_catalog_path(&"p".repeat(super::MAX_CATALOG_PATH)));
        assert!(!super::is_catalog_path(
            &"p".repeat(super::MAX_CATALOG_PATH + 1)
        ));
        assert_eq!(Keys::catalog_path(&"p/".repeat(3000)), None);
        assert_eq!(Keys::catalog_path("a\nb"), None);
    }

    #[test]
    fn keys_parse_back() {
        assert_eq!(Keys::child_of("e1", &Keys::child("e1", "c9")), Some("c9"));
        assert_eq!(Keys::child_of("e1", "e1.child."), None);
        assert_eq!(Keys::child_of("e1", "e2.child.c9"), None);
        let claims = Keys::claims("e1", "sr1");
        assert_eq!(
            Keys::claim_index(&claims, &Keys::claim("e1", "sr1", 42)),
            Some(42)
        );
        assert_eq!(Keys::claim_index(&claims, "e1.sr1.items.0"), None);
        assert_eq!(Keys::claim_index(&claims, "e1.sr1.it.x"), None);
    }
}
