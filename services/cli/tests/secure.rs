//! A mesh on a secured NATS, and a mesh that is not there.
//!
//! - A nats-server that requires TLS (certificates made here with `rcgen`)
//!   and authenticates users by password or nkey runs the mesh as separate
//!   `noetl serve` processes; clients without credentials, or without the
//!   CA, are refused, and no password shows up in what they print.
//! - Read-only commands never create streams or buckets: they fail naming
//!   the prefix; `noetl admin init` creates them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

mod support;
use support::{free_port, wait_until, Procs};

const PASSWORD: &str = "pw-d7f3e1c9a2b4";

const PLAYBOOK: &str = r#"
apiVersion: noetl.io/v2
kind: Playbook
metadata: { name: secure_hello }
workflow:
  - step: start
    tool:
      - name: one
        kind: noop
        result: 41
        spec:
          policy:
            rules:
              - else:
                  then: { do: continue, set_ctx: { answer: "{{ outcome.result + 1 }}" } }
"#;

/// `noetl` with no NATS settings inherited from the caller's shell.
fn noetl(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_noetl"));
    c.env("NOETL_HOME", home);
    for k in [
        "NOETL_NATS_URL",
        "NATS_URL",
        "NOETL_NATS_USER",
        "NOETL_NATS_PASSWORD",
        "NOETL_NATS_CA",
        "NOETL_NATS_CREDS",
        "NOETL_NATS_NKEY",
        "NOETL_NATS_TOKEN",
        "NOETL_REPLICAS",
        "NOETL_PREFIX",
    ] {
        c.env_remove(k);
    }
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn read_only_commands_never_create_the_mesh_and_admin_init_does() {
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();

    for args in [
        vec!["exec", "status", "nope"],
        vec!["events", "tail", "--from-start"],
        vec!["credential", "list"],
        vec!["playbook", "list"],
    ] {
        let out = noetl(home)
            .args(&args)
            .args(["--nats", &url])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no NoETL mesh with prefix `noetl`") && err.contains("noetl admin init"),
            "{args:?}: {}",
            text(&out)
        );
    }
    let out = noetl(home)
        .args([
            "exec", "status", "nope", "--prefix", "noetI", "--nats", &url,
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("prefix `noetI`"),
        "{}",
        text(&out)
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let streams = || -> Vec<String> {
        rt.block_on(async {
            use futures::TryStreamExt;
            let js = async_nats::jetstream::new(server.client().await);
            let mut names: Vec<String> = js.stream_names().try_collect().await.unwrap();
            names.sort();
            names
        })
    };
    assert_eq!(
        streams(),
        Vec::<String>::new(),
        "a read-only command created topology"
    );

    // A single server cannot hold 3 replicas: said plainly, nothing made.
    let out = noetl(home)
        .args(["admin", "init", "--replicas", "3", "--nats", &url])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cluster of at least 3 servers"),
        "{}",
        text(&out)
    );

    let init = |expect: &str| {
        let out = noetl(home)
            .args(["admin", "init", "--json", "--nats", &url])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 11, "{}", text(&out));
        for l in &lines {
            assert_eq!(l["action"], expect, "{l}");
            assert_eq!(l["replicas"], 1, "{l}");
        }
    };
    init("created");
    init("exists");
    assert_eq!(
        streams(),
        [
            "KV_noetl_catalog",
            "KV_noetl_credentials",
            "KV_noetl_ctx",
            "KV_noetl_exec",
            "KV_noetl_gates",
            "KV_noetl_loop",
            "KV_noetl_schedules",
            "KV_noetl_tokens",
            "NOETL_DLQ",
            "NOETL_EVENTS",
            "NOETL_WORK"
        ]
    );
    // Now the mesh is there: the same read-only command answers.
    let out = noetl(home)
        .args(["exec", "status", "nope", "--nats", &url])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no execution \"nope\""),
        "{}",
        text(&out)
    );
}

/// Certificates of a private CA for `localhost` / 127.0.0.1.
struct Pki {
    ca: PathBuf,
    other_ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

fn make_pki(dir: &Path) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        (Issuer::new(params, key), cert.pem())
    };
    let (issuer, ca_pem) = ca("noetl test CA");
    let (_, other_pem) = ca("some other CA");
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(DnType::CommonName, "noetl-service");
    let client = client_params.signed_by(&client_key, &issuer).unwrap();
    let pki = Pki {
        ca: dir.join("ca.pem"),
        other_ca: dir.join("other-ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
    };
    std::fs::write(&pki.client_cert, client.pem()).unwrap();
    std::fs::write(&pki.client_key, client_key.serialize_pem()).unwrap();
    std::fs::write(&pki.ca, ca_pem).unwrap();
    std::fs::write(&pki.other_ca, other_pem).unwrap();
    std::fs::write(&pki.cert, cert.pem()).unwrap();
    std::fs::write(&pki.key, key.serialize_pem()).unwrap();
    pki
}

/// A nats-server started from `conf` (its `listen` is `127.0.0.1:port`),
/// killed with `procs`.
fn start_nats(dir: &Path, conf: &str, port: u16, procs: &mut Procs) -> String {
    let path = dir.join(format!("nats-{port}.conf"));
    std::fs::write(&path, conf).unwrap();
    let binary = noetl_mesh::server::find_binary(None).unwrap_or_else(|e| panic!("{e}"));
    procs.0.push(
        Command::new(binary)
            .arg("-c")
            .arg(&path)
            .arg("-l")
            .arg(dir.join(format!("nats-{port}.log")))
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("nats-server to listen", Duration::from_secs(15), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    format!("nats://127.0.0.1:{port}")
}

#[test]
fn a_mesh_on_tls_with_auth_runs_and_strangers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let pki = make_pki(dir.path());
    let nkey = nkeys::KeyPair::new_user();
    let seed_file = dir.path().join("executor.nk");
    std::fs::write(&seed_file, nkey.seed().unwrap()).unwrap();

    let port = free_port();
    let mut procs = Procs(Vec::new());
    let url = start_nats(
        dir.path(),
        &format!(
            r#"
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{store}" }}
tls {{
  cert_file: "{cert}"
  key_file: "{key}"
  timeout: 5
}}
authorization {{
  users: [
    {{ user: "svc", password: "{PASSWORD}" }}
    {{ nkey: "{nkey}" }}
  ]
}}
"#,
            store = dir.path().join("js").display(),
            cert = pki.cert.display(),
            key = pki.key.display(),
            nkey = nkey.public_key(),
        ),
        port,
        &mut procs,
    );

    // Services: user/password from the environment, the CA as a flag; the
    // executor authenticates with an nkey seed instead.
    let with_password = |c: &mut Command| {
        c.env("NOETL_NATS_USER", "svc")
            .env("NOETL_NATS_PASSWORD", PASSWORD)
            .env("NOETL_NATS_URL", &url)
            .args(["--nats-ca"])
            .arg(&pki.ca);
    };
    for service in ["router", "scheduler", "loop-supervisor"] {
        let mut c = noetl(&home);
        c.args(["serve", service]);
        with_password(&mut c);
        procs.0.push(
            c.stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    procs.0.push(
        noetl(&home)
            .args(["serve", "executor", "--kind", "noop", "--nats", &url])
            .arg("--nats-nkey")
            .arg(&seed_file)
            .env("NATS_CA", &pki.ca)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    let playbook = dir.path().join("p.yaml");
    std::fs::write(&playbook, PLAYBOOK).unwrap();
    // The first services create the mesh; until then a client finds none.
    let mut id = String::new();
    wait_until(
        "the mesh to accept a request",
        Duration::from_secs(60),
        || {
            let mut c = noetl(&home);
            c.args(["exec", "start"]).arg(&playbook).arg("--json");
            with_password(&mut c);
            let out = c.output().unwrap();
            if out.status.success() {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                id = v["execution_id"].as_str().unwrap().to_string();
            }
            out.status.success()
        },
    );
    let mut c = noetl(&home);
    c.args(["exec", "status", &id, "--wait", "--json"]);
    with_password(&mut c);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "completed", "{summary}");
    assert_eq!(summary["ctx"]["answer"], 42, "{summary}");

    // Strangers: no credentials; a wrong password; credentials but not the
    // CA that signed the server's certificate.
    let refused = |what: &str, env: &[(&str, &str)], ca: &Path, expect: &[&str]| {
        let out = noetl(&home)
            .args(["exec", "status", &id, "--nats", &url, "--nats-ca"])
            .arg(ca)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{what}: {}", text(&out));
        let all = text(&out).to_lowercase();
        assert!(
            expect.iter().any(|e| all.contains(e)),
            "{what}: expected one of {expect:?}: {all}"
        );
        assert!(
            !all.contains(&PASSWORD.to_lowercase()),
            "{what} leaked the password"
        );
    };
    refused("no credentials", &[], &pki.ca, &["authorization"]);
    refused(
        "wrong password",
        &[
            ("NOETL_NATS_USER", "svc"),
            ("NOETL_NATS_PASSWORD", "not-it"),
        ],
        &pki.ca,
        &["authorization"],
    );
    refused(
        "unknown CA",
        &[
            ("NOETL_NATS_USER", "svc"),
            ("NOETL_NATS_PASSWORD", PASSWORD),
        ],
        &pki.other_ca,
        &["certificate", "tls", "unknownissuer"],
    );
}

#[test]
fn mutual_tls_admits_only_a_client_with_a_certificate_of_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let pki = make_pki(dir.path());
    let port = free_port();
    let mut procs = Procs(Vec::new());
    let url = start_nats(
        dir.path(),
        &format!(
            r#"
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{store}" }}
tls {{
  cert_file: "{cert}"
  key_file: "{key}"
  ca_file: "{ca}"
  verify: true
  timeout: 5
}}
"#,
            store = dir.path().join("js").display(),
            cert = pki.cert.display(),
            key = pki.key.display(),
            ca = pki.ca.display(),
        ),
        port,
        &mut procs,
    );
    let init = |client: bool| {
        let mut c = noetl(&home);
        c.args(["admin", "init", "--nats", &url, "--nats-ca"])
            .arg(&pki.ca);
        if client {
            c.arg("--nats-cert")
                .arg(&pki.client_cert)
                .arg("--nats-key")
                .arg(&pki.client_key);
        }
        c.output().unwrap()
    };
    let out = init(false);
    assert!(!out.status.success(), "{}", text(&out));
    let out = init(true);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 11);
}
