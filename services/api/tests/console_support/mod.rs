//! A real headless Chromium driven over WebDriver (`chromedriver`, Debian's
//! `chromium` and `chromium-driver`; `make setup` installs them) with
//! `fantoccini`: each [`Browser`] starts its own chromedriver on a free
//! loopback port, in its own process group, with a fresh profile, and
//! kills that group when dropped. [`Browser::check`] runs a test body and,
//! when it fails, saves a screenshot under
//! `$CARGO_TARGET_DIR/console-screenshots/` before failing the test.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures::FutureExt;
use serde_json::{json, Value};

/// How long a wait for the page lasts unless told otherwise.
pub const WAIT: Duration = Duration::from_secs(30);

/// A headless Chromium session on a private chromedriver.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    /// The console's origin (`http://127.0.0.1:PORT`).
    pub base: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

/// A program from `env` if set, else the first of `names` found on `PATH`
/// or as a path; a message saying how to install it when there is none.
fn program(env: &str, names: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for name in names {
        let candidate = Path::new(name);
        if candidate.is_absolute() && candidate.exists() {
            return candidate.to_path_buf();
        }
        if let Some(found) = std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.exists())
        {
            return found;
        }
    }
    panic!(
        "the console's browser tests need {} (set {env}, or `make setup`, which runs \
         `apt-get install -y chromium chromium-driver`)",
        names.join(" or ")
    );
}

/// Where failure screenshots go: `$CARGO_TARGET_DIR/console-screenshots`
/// (else next to the test binary's `target/`).
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        })
        .unwrap_or_else(std::env::temp_dir);
    target.join("console-screenshots")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Start chromedriver on `port` in a process group of its own.
fn start_driver(port: u16) -> Child {
    use std::os::unix::process::CommandExt;
    let driver = program(
        "NOETL_CHROMEDRIVER",
        &["chromedriver", "/usr/bin/chromedriver"],
    );
    Command::new(&driver)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver.display()))
}

/// Wait until chromedriver on `port` says it is ready.
async fn driver_ready(port: u16) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = http
            .get(format!("http://127.0.0.1:{port}/status"))
            .send()
            .await;
        if let Ok(r) = ready {
            if let Ok(v) = r.json::<Value>().await {
                if v["value"]["ready"] == true {
                    return;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "chromedriver did not come up on port {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Browser {
    /// A new headless browser for the console at `base`.
    pub async fn start(base: &str) -> Browser {
        let chromium = program(
            "NOETL_CHROMIUM",
            &["chromium", "/usr/bin/chromium", "chromium-browser"],
        );
        let port = free_port();
        let driver = start_driver(port);
        let profile = tempfile::Builder::new()
            .prefix("noetl-console-chromium-")
            .tempdir()
            .expect("a profile dir");
        driver_ready(port).await;
        let mut caps = fantoccini::wd::Capabilities::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1440,1100", "--no-first-run", "--no-default-browser-check",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| panic!("no WebDriver session on chromedriver:{port}: {e}"));
        Browser {
            client,
            base: base.to_string(),
            driver,
            _profile: profile,
        }
    }

    /// Go to the console's `hash` route (`#/catalog`...).
    pub async fn open(&self, hash: &str) {
        self.client
            .goto(&format!("{}/{hash}", self.base))
            .await
            .unwrap_or_else(|e| panic!("cannot open {hash}: {e}"));
    }

    /// The value of a JavaScript function body (`return ...;`).
    pub async fn js(&self, body: &str) -> Value {
        self.client
            .execute(body, vec![])
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{body}"))
    }

    /// Evaluate `expr` until it is truthy: its value, or a panic naming
    /// `what` after `timeout`.
    pub async fn wait_for_within(&self, what: &str, timeout: Duration, expr: &str) -> Value {
        let deadline = Instant::now() + timeout;
        let script = format!("try {{ return ({expr}) || null; }} catch (e) {{ return null; }}");
        loop {
            let v = self.js(&script).await;
            if !v.is_null() && v != json!(false) && v != json!("") && v != json!(0) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what} ({expr})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// [`Browser::wait_for_within`] the default [`WAIT`].
    pub async fn wait_for(&self, what: &str, expr: &str) -> Value {
        self.wait_for_within(what, WAIT, expr).await
    }

    /// Click the element `css` (waiting for it first; found again if the
    /// page redraws it between finding and clicking).
    pub async fn click(&self, css: &str) {
        let mut tries = 0;
        loop {
            let present = format!("document.querySelector({css:?})");
            self.wait_for(&format!("{css} to click"), &present).await;
            let clicked = match self.client.find(Locator::Css(css)).await {
                Ok(el) => el.click().await,
                Err(e) => Err(e),
            };
            match clicked {
                Ok(()) => return,
                Err(e) if tries < 5 && e.to_string().contains("stale element") => tries += 1,
                Err(e) => panic!("cannot click {css}: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Replace the text of the input `css` with `text`, typed.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.wait_for(
            &format!("{css} to type into"),
            &format!("document.querySelector({css:?})"),
        )
        .await;
        let el = self.client.find(Locator::Css(css)).await.expect(css);
        el.clear()
            .await
            .unwrap_or_else(|e| panic!("cannot clear {css}: {e}"));
        el.send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("cannot type into {css}: {e}"));
    }

    /// The page's URL now.
    pub async fn url(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("the current URL")
            .to_string()
    }

    /// Save a PNG of the window to `path`.
    pub async fn screenshot_to(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("a screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("the screenshot dir");
        }
        std::fs::write(path, png).expect("the screenshot written");
    }

    /// Run `body`; if it panics, save a screenshot as `<name>.png` under
    /// [`screenshot_dir`] and fail with the panic.
    pub async fn check<F: Future<Output = ()>>(&self, name: &str, body: F) {
        if let Err(panic) = AssertUnwindSafe(body).catch_unwind().await {
            let path = screenshot_dir().join(format!("{name}.png"));
            match self.client.screenshot().await {
                Ok(png) => {
                    let _ = std::fs::create_dir_all(screenshot_dir());
                    let _ = std::fs::write(&path, png);
                    eprintln!(
                        "console test {name} failed: screenshot at {}",
                        path.display()
                    );
                }
                Err(e) => eprintln!("console test {name} failed; no screenshot: {e}"),
            }
            std::panic::resume_unwind(panic);
        }
    }

    /// End the session (the browser quits), then chromedriver.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: chromedriver and any browser it left behind.
        let _ = Command::new("kill")
            .arg("-KILL")
            .arg("--")
            .arg(format!("-{}", self.driver.id()))
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
