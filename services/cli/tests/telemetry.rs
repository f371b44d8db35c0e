//! OpenTelemetry across separate processes (docs/observability.md): the
//! `noetl serve` processes export their spans over OTLP (HTTP/JSON) to a
//! receiver in this test, and one execution must come out as one trace:
//! every span has the execution's trace id, every parent was exported,
//! the root is the `execution` span, and each service reports under its
//! own `service.name`. An `http` task's server receives the task span's
//! `traceparent`.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use support::Procs;

/// One exported span, as the receiver saw it.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: HashMap<String, String>,
}

/// A minimal HTTP/1.1 server on loopback: each request's headers and
/// body go to `on_request`, which returns the response body (JSON).
fn http_server(
    on_request: impl Fn(&HashMap<String, String>, &[u8]) + Send + Sync + 'static,
) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let on_request = Arc::new(on_request);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let on_request = on_request.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                // Keep-alive: requests one after another on the connection.
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut headers = HashMap::new();
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                        }
                    }
                    let len: usize = headers
                        .get("content-length")
                        .and_then(|l| l.parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0u8; len];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    on_request(&headers, &body);
                    let reply = "{}";
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
                        reply.len()
                    );
                    if conn.write_all(response.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// The string form of an OTLP JSON `AnyValue`.
fn any_value(v: &Value) -> String {
    match v {
        Value::Object(m) => m
            .values()
            .next()
            .map(|inner| match inner {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_default(),
        other => other.to_string(),
    }
}

fn attributes(list: &Value) -> HashMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| Some((kv["key"].as_str()?.to_string(), any_value(&kv["value"]))))
        .collect()
}

/// The spans of one OTLP/JSON `ExportTraceServiceRequest`.
fn spans_of(body: &Value) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in body["resourceSpans"].as_array().into_iter().flatten() {
        let service = attributes(&rs["resource"]["attributes"])
            .remove("service.name")
            .unwrap_or_default();
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            for s in ss["spans"].as_array().into_iter().flatten() {
                out.push(Span {
                    service: service.clone(),
                    trace_id: s["traceId"].as_str().unwrap_or_default().to_string(),
                    span_id: s["spanId"].as_str().unwrap_or_default().to_string(),
                    parent_span_id: s["parentSpanId"].as_str().unwrap_or_default().to_string(),
                    name: s["name"].as_str().unwrap_or_default().to_string(),
                    attributes: attributes(&s["attributes"]),
                });
            }
        }
    }
    out
}

/// What is wrong with the spans of trace `trace` (none when it is one
/// complete tree under an `execution` root reported by every service).
fn tree_problems(spans: &[Span], trace: &str) -> Vec<String> {
    let mine: Vec<&Span> = spans.iter().filter(|s| s.trace_id == trace).collect();
    let ids: HashSet<&str> = mine.iter().map(|s| s.span_id.as_str()).collect();
    let mut problems = Vec::new();
    let roots: Vec<&&Span> = mine
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    if roots.len() != 1 || roots[0].name != "execution" {
        problems.push(format!(
            "roots: {:?}",
            roots
                .iter()
                .map(|s| (&s.name, &s.service))
                .collect::<Vec<_>>()
        ));
    }
    for s in &mine {
        if !s.parent_span_id.is_empty() && !ids.contains(s.parent_span_id.as_str()) {
            problems.push(format!(
                "{} ({}) has an unexported parent",
                s.name, s.service
            ));
        }
    }
    let services: HashSet<&str> = mine.iter().map(|s| s.service.as_str()).collect();
    for want in ["noetl-router", "noetl-scheduler", "noetl-executor"] {
        if !services.contains(want) {
            problems.push(format!("no span from {want} (have {services:?})"));
        }
    }
    problems
}

/// The trace as an indented tree (printed with `--nocapture`).
fn render_tree(spans: &[Span], trace: &str) -> String {
    fn walk(out: &mut String, spans: &[&Span], parent: &str, depth: usize) {
        for s in spans.iter().filter(|s| s.parent_span_id == parent) {
            let what: Vec<String> = ["step", "task", "event"]
                .iter()
                .filter_map(|k| Some(format!("{k}={}", s.attributes.get(*k)?)))
                .collect();
            out.push_str(&format!(
                "{}{} [{}] {}\n",
                "  ".repeat(depth),
                s.name,
                s.service,
                what.join(" ")
            ));
            walk(out, spans, &s.span_id, depth + 1);
        }
    }
    let mine: Vec<&Span> = spans.iter().filter(|s| s.trace_id == trace).collect();
    let mut out = String::new();
    walk(&mut out, &mine, "", 0);
    out
}

#[test]
fn one_execution_is_one_trace_across_separate_services() {
    let exported: Arc<Mutex<Vec<Span>>> = Arc::default();
    let sink = exported.clone();
    let otlp = http_server(move |_, body| {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            sink.lock().unwrap().extend(spans_of(&v));
        }
    });
    let traceparents: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = traceparents.clone();
    let api = http_server(move |headers, _| {
        if let Some(tp) = headers.get("traceparent") {
            seen.lock().unwrap().push(tp.clone());
        }
    });

    let home = tempfile::tempdir().unwrap();
    let traced = || {
        let mut c = support::noetl(home.path());
        c.env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{otlp}"),
        )
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env_remove("OTEL_SDK_DISABLED");
        c
    };
    let server = noetl_testkit::TestServer::start();
    let url = server.url();
    support::admin_init(support::noetl(home.path()), &url);
    let mut children = Vec::new();
    for args in [
        vec!["router"],
        vec!["scheduler"],
        vec!["loop-supervisor"],
        vec![
            "executor", "--kind", "noop", "--kind", "python", "--kind", "http",
        ],
    ] {
        children.push(support::serve(traced(), &url, &args));
    }
    let _services = Procs(children);

    let playbook = home.path().join("traced.yaml");
    std::fs::write(
        &playbook,
        format!(
            r#"apiVersion: noetl.io/v2
kind: Playbook
metadata: {{ name: traced }}
workflow:
  - step: start
    tool:
      - name: call
        kind: http
        url: "http://127.0.0.1:{api}/ping"
    next:
      arcs:
        - step: squares
  - step: squares
    spec:
      policy:
        admit:
          rules:
            - else:
                then: {{ allow: true }}
    loop:
      in: "{{{{ [1, 2, 3] }}}}"
      iterator: n
    tool:
      - name: sq
        kind: python
        args: {{ n: "{{{{ iter.n }}}}" }}
        code: "result = n * n"
    next:
      arcs:
        - step: end
          when: "{{{{ event.name == 'loop.done' }}}}"
  - step: end
"#
        ),
    )
    .unwrap();
    let id = support::exec_start(support::noetl(home.path()), &url, &[&playbook]);
    support::exec_wait(support::noetl(home.path()), &url, &id, 90);

    // The trace is the execution's: the id in its events.
    let trace = noetl_mesh::ids::trace_id_for("", &id);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let spans = exported.lock().unwrap().clone();
        let problems = tree_problems(&spans, &trace);
        if problems.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let names: Vec<_> = spans
                .iter()
                .filter(|s| s.trace_id == trace)
                .map(|s| format!("{}:{}", s.service, s.name))
                .collect();
            panic!("trace {trace}: {problems:?}\nspans: {names:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let spans = exported.lock().unwrap().clone();
    eprintln!("trace {trace}:\n{}", render_tree(&spans, &trace));
    // Nothing of this execution went to another trace.
    for s in &spans {
        if s.attributes.get("execution_id") == Some(&id) {
            assert_eq!(
                s.trace_id, trace,
                "{} ({}) is in another trace",
                s.name, s.service
            );
        }
    }
    // Each hop hangs under the span that published its message, in the
    // process that published it (the `traceparent` crossed NATS), not
    // under the root every service could derive alone.
    let by_id: HashMap<&str, &Span> = spans
        .iter()
        .filter(|s| s.trace_id == trace)
        .map(|s| (s.span_id.as_str(), s))
        .collect();
    let publisher_of = |consumer: &str| -> HashSet<String> {
        spans
            .iter()
            .filter(|s| s.trace_id == trace && s.name == format!("consume {consumer}"))
            .map(|s| {
                let p = by_id[s.parent_span_id.as_str()];
                format!("{}:{}", p.service, p.name)
            })
            .collect()
    };
    // `start` needs no admission: the router starts it with the
    // execution. `squares` has a policy: its token goes to the scheduler.
    assert_eq!(
        publisher_of("executor-http"),
        HashSet::from(["noetl-router:execution.request".to_string()]),
        "the entry's task command is sent by the router's request span"
    );
    assert_eq!(
        publisher_of("scheduler"),
        HashSet::from(["noetl-router:boundary".to_string()]),
        "a token is published by the boundary that fired it"
    );
    assert_eq!(
        publisher_of("loop-commands"),
        HashSet::from(["noetl-scheduler:schedule".to_string()]),
        "a loop command's consumer is the child of the scheduler span that sent it"
    );
    assert!(
        publisher_of("router-events")
            .iter()
            .all(|p| !p.ends_with(":execution")),
        "events carry their publisher's context"
    );
    let root = spans
        .iter()
        .find(|s| s.trace_id == trace && s.name == "execution")
        .unwrap();
    assert_eq!(root.service, "noetl-router");
    assert_eq!(root.attributes["status"], "completed");
    assert_eq!(root.attributes["playbook"], "traced");
    let tasks: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == trace && s.name == "task")
        .collect();
    assert!(
        tasks.len() >= 4,
        "the http task and three loop iterations: {tasks:?}"
    );
    assert!(tasks.iter().all(|t| t.service == "noetl-executor"));

    // The http server got the http task span's context.
    let got = traceparents.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    let parts: Vec<&str> = got[0].split('-').collect();
    assert_eq!(parts.len(), 4, "{}", got[0]);
    assert_eq!(parts[1], trace, "the execution's trace");
    let call = spans
        .iter()
        .find(|s| s.span_id == parts[2])
        .unwrap_or_else(|| panic!("span {} was not exported", parts[2]));
    assert_eq!(call.name, "task");
    assert_eq!(call.attributes["task"], "call");
}
