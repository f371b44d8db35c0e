//! The postgres tool's `sslmode` / `sslrootcert` against a real PostgreSQL
//! that this test starts with TLS on and plain TCP refused
//! (`hostnossl ... reject`), its certificate issued for `localhost` and
//! 127.0.0.1 by a CA the test makes with rcgen.
//!
//! PostgreSQL's binaries are taken from `NOETL_PG_BIN` (a directory), else
//! the newest `/usr/lib/postgresql/*/bin`, else `PATH`. PostgreSQL refuses
//! to run as root: as root, the server runs as the `postgres` user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use noetl_core::tool::{AuthCredential, Tool, ToolCall};
use noetl_core::Outcome;
use noetl_tool_postgres::PostgresTool;
use serde_json::{json, Value};

const PASSWORD: &str = "tls-test-password-not-real";

/// A TLS-only PostgreSQL in a temporary directory; stopped and removed on
/// drop.
struct TlsPostgres {
    bin: PathBuf,
    data: PathBuf,
    run_as: Option<(u32, u32)>,
    port: u16,
    ca_pem: String,
    ca_file: PathBuf,
    other_ca_file: PathBuf,
    // Last: removed after the server is stopped.
    dir: tempfile::TempDir,
}

fn pg_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("NOETL_PG_BIN") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("initdb").is_file(),
            "NOETL_PG_BIN={} has no initdb",
            dir.display()
        );
        return dir;
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return bin;
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "no PostgreSQL server binaries: none in /usr/lib/postgresql/*/bin or PATH \
                 (install the postgresql package, or set NOETL_PG_BIN to the directory with initdb)"
            )
        })
}

/// `(uid, gid)` to run PostgreSQL as when this process is root.
fn run_as() -> Option<(u32, u32)> {
    let me = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    if me != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
    let ids = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"postgres") && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    });
    Some(ids.unwrap_or_else(|| {
        panic!(
            "the test runs as root and PostgreSQL refuses to; there is no `postgres` user \
             in /etc/passwd to run it as: create one (useradd --system postgres) or run \
             the tests as a non-root user"
        )
    }))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// CA certificate PEM, and the issuer for signing.
fn ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), rcgen::Issuer::new(params, key))
}

impl TlsPostgres {
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        c.env("LC_ALL", "C").env_remove("PGDATA");
        if let Some((uid, gid)) = self.run_as {
            c.uid(uid).gid(gid);
        }
        c
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        out
    }

    fn start() -> Self {
        let bin = pg_bin();
        let run_as = run_as();
        let dir = tempfile::Builder::new()
            .prefix("noetl-pgtls-")
            .tempdir()
            .expect("temp dir");
        let chown = |p: &Path| {
            if let Some((uid, gid)) = run_as {
                std::os::unix::fs::chown(p, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
            }
        };
        chown(dir.path());
        let data = dir.path().join("data");
        let (ca_pem, issuer) = ca("noetl test CA");
        let (other_ca_pem, _) = ca("some other CA");
        let pg = Self {
            bin,
            data,
            run_as,
            port: free_port(),
            ca_pem,
            ca_file: dir.path().join("ca.pem"),
            other_ca_file: dir.path().join("other-ca.pem"),
            dir,
        };
        std::fs::write(&pg.ca_file, &pg.ca_pem).unwrap();
        std::fs::write(&pg.other_ca_file, other_ca_pem).unwrap();

        let data = pg.data.to_str().unwrap().to_string();
        let out = pg.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
        );
        assert!(
            out.status.success(),
            "initdb failed ({}): {}{}",
            pg.bin.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );

        // Server certificate for the names the test connects to.
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .unwrap();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        let files = [
            ("server.crt", cert.pem(), 0o644),
            ("server.key", key.serialize_pem(), 0o600),
            (
                "pg_hba.conf",
                "local all all trust\n\
                 hostssl all all 127.0.0.0/8 trust\n\
                 hostnossl all all 127.0.0.0/8 reject\n"
                    .to_string(),
                0o600,
            ),
        ];
        for (name, text, mode) in files {
            let p = pg.data.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            chown(&p);
        }
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1,127.0.0.2'\nport = {}\n\
             unix_socket_directories = '{}'\nssl = on\n\
             ssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             fsync = off\nmax_connections = 30\n",
            pg.port,
            pg.dir.path().display()
        );
        let conf_path = pg.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).unwrap();
        text.push_str(&conf);
        std::fs::write(&conf_path, text).unwrap();

        let log = pg.dir.path().join("server.log");
        let out = pg.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "20",
                "-s",
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        pg
    }

    fn cred(&self, name: &str, data: Value) -> AuthCredential {
        let mut d = json!({"host": "127.0.0.1", "port": self.port, "user": "postgres",
                           "password": PASSWORD, "database": "postgres"});
        for (k, v) in data.as_object().unwrap() {
            d[k] = v.clone();
        }
        AuthCredential {
            name: name.into(),
            kind: "postgres_credential".into(),
            data: d,
        }
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let data = self.data.to_str().unwrap_or_default().to_string();
        let out = self.run(
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "-w", "-s", "stop"],
        );
        if !out.status.success() {
            eprintln!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

const WHO_AM_I: &str =
    "select s.ssl, current_user as who from pg_stat_ssl s where s.pid = pg_backend_pid()";

async fn select(
    tool: &PostgresTool,
    auth: Option<AuthCredential>,
    connection: Option<String>,
) -> Outcome {
    let mut config = json!({"command": WHO_AM_I});
    if let Some(c) = connection {
        config["connection"] = json!(c);
    }
    let call = ToolCall {
        step: "tls".into(),
        task: "select".into(),
        spec: json!({"timeout": {"connect": 5, "read": 10}}),
        auth,
        ..ToolCall::new("postgres", config.as_object().unwrap().clone())
    };
    let r = tool.call(call).await;
    let text = serde_json::to_string(&r.outcome).unwrap();
    assert!(!text.contains(PASSWORD), "the password leaked: {text}");
    r.outcome
}

/// The query ran over TLS.
fn assert_tls_rows(o: &Outcome, what: &str) {
    assert!(o.is_ok(), "{what}: {:?}", o.error);
    assert_eq!(o.result["rows"][0]["ssl"], true, "{what}: {}", o.result);
    assert_eq!(o.result["rows"][0]["who"], "postgres", "{what}");
}

/// The connection failed with `kind` and a message holding every one of
/// `needles`.
fn assert_fails(o: &Outcome, what: &str, kind: &str, needles: &[&str]) {
    let e = o
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: expected an error, got {}", o.result));
    assert_eq!(e.kind, kind, "{what}: {}", e.message);
    for n in needles {
        assert!(e.message.contains(n), "{what}: no {n:?} in {:?}", e.message);
    }
}

#[tokio::test]
async fn sslmodes_against_a_tls_only_server() {
    let pg = TlsPostgres::start();
    let tool = PostgresTool::new();
    let ca = pg.ca_file.to_str().unwrap();
    let other = pg.other_ca_file.to_str().unwrap();

    // require: encrypted, certificate not checked (the test CA is not in
    // any trust store).
    let o = select(
        &tool,
        Some(pg.cred("pg_req", json!({"sslmode": "require"}))),
        None,
    )
    .await;
    assert_tls_rows(&o, "require");
    // prefer (also the default): TLS when offered.
    let o = select(&tool, Some(pg.cred("pg_pref", json!({}))), None).await;
    assert_tls_rows(&o, "default (prefer)");

    // verify-full with the test CA, by IP and by name, from a file and
    // inline.
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_full",
            json!({"sslmode": "verify-full", "sslrootcert": ca}),
        )),
        None,
    )
    .await;
    assert_tls_rows(&o, "verify-full 127.0.0.1");
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_full_name",
            json!({"host": "localhost", "sslmode": "verify-full", "sslrootcert": pg.ca_pem}),
        )),
        None,
    )
    .await;
    assert_tls_rows(&o, "verify-full localhost, inline CA");

    // verify-full with a CA that did not issue the server certificate.
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_wrong_ca",
            json!({"sslmode": "verify-full", "sslrootcert": other}),
        )),
        None,
    )
    .await;
    assert_fails(
        &o,
        "verify-full, wrong CA",
        "postgres.connect",
        &[
            "`pg_wrong_ca`",
            "127.0.0.1",
            "sslmode verify-full",
            "certificate",
            "UnknownIssuer",
        ],
    );
    // require with a root certificate checks the chain, as libpq.
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_req_ca",
            json!({"sslmode": "require", "sslrootcert": other}),
        )),
        None,
    )
    .await;
    assert_fails(
        &o,
        "require, wrong CA",
        "postgres.connect",
        &["certificate"],
    );

    // 127.0.0.2 is not a name in the certificate: verify-full refuses it,
    // verify-ca (the chain only) accepts it.
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_name",
            json!({"host": "127.0.0.2", "sslmode": "verify-full", "sslrootcert": ca}),
        )),
        None,
    )
    .await;
    assert_fails(
        &o,
        "verify-full, other name",
        "postgres.connect",
        &["`pg_name`", "certificate not valid for name \"127.0.0.2\""],
    );
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_ca",
            json!({"host": "127.0.0.2", "sslmode": "verify-ca", "sslrootcert": ca}),
        )),
        None,
    )
    .await;
    assert_tls_rows(&o, "verify-ca, other name");
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_ca_wrong",
            json!({"sslmode": "verify-ca", "sslrootcert": other}),
        )),
        None,
    )
    .await;
    assert_fails(
        &o,
        "verify-ca, wrong CA",
        "postgres.connect",
        &["UnknownIssuer"],
    );

    // disable: the server's `hostnossl ... reject` refuses plain TCP.
    let o = select(
        &tool,
        Some(pg.cred("pg_plain", json!({"sslmode": "disable"}))),
        None,
    )
    .await;
    assert_fails(
        &o,
        "disable",
        "postgres.connect",
        &[
            "`pg_plain`",
            "sslmode disable",
            "pg_hba.conf",
            "no encryption",
        ],
    );

    // A root certificate file that is not there.
    let missing = pg.dir.path().join("absent.pem");
    let o = select(
        &tool,
        Some(pg.cred(
            "pg_nofile",
            json!({"sslmode": "verify-full", "sslrootcert": missing.to_str().unwrap()}),
        )),
        None,
    )
    .await;
    assert_fails(
        &o,
        "missing sslrootcert",
        "postgres.config",
        &["`pg_nofile`", "absent.pem", "cannot read"],
    );

    // The connection-string forms.
    let url = |q: &str| {
        format!(
            "postgresql://postgres:{PASSWORD}@localhost:{}/postgres?{q}",
            pg.port
        )
    };
    let o = select(
        &tool,
        None,
        Some(url(&format!("sslmode=verify-full&sslrootcert={ca}"))),
    )
    .await;
    assert_tls_rows(&o, "URL verify-full");
    let o = select(
        &tool,
        None,
        Some(url("sslmode=require&application_name=tls-test")),
    )
    .await;
    assert_tls_rows(&o, "URL require");
    let o = select(
        &tool,
        None,
        Some(url(&format!("sslmode=verify-full&sslrootcert={other}"))),
    )
    .await;
    assert_fails(
        &o,
        "URL wrong CA",
        "postgres.connect",
        &["connection (localhost/postgres)", "UnknownIssuer"],
    );
    let o = select(&tool, None, Some(url("sslmode=disable"))).await;
    assert_fails(&o, "URL disable", "postgres.connect", &["no encryption"]);
    let kv = format!(
        "host=127.0.0.2 port={} user=postgres password='{PASSWORD}' dbname=postgres sslmode=verify-ca sslrootcert='{ca}'",
        pg.port
    );
    let o = select(&tool, None, Some(kv)).await;
    assert_tls_rows(&o, "key=value verify-ca");

    // Every distinct setting got its own pool (ten credentials and five
    // connection strings; the missing root file made none); a repeat
    // reuses one.
    let before = tool.pools();
    assert_eq!(before, 15);
    let o = select(
        &tool,
        Some(pg.cred("pg_req", json!({"sslmode": "require"}))),
        None,
    )
    .await;
    assert_tls_rows(&o, "require again");
    assert_eq!(tool.pools(), before);
}
