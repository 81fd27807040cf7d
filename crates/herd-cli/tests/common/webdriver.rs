//! A minimal WebDriver client over plain HTTP (ureq + serde_json, both already test
//! dependencies) driving Debian's headless Chromium through `chromedriver`: enough to load a
//! page, run a script, resize the window, read the console and take screenshots. Every call
//! has a time bound; dropping the browser ends the session and stops chromedriver.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long one WebDriver call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A headless Chromium session.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless session at `width`×`height`.
    pub fn start(width: u32, height: u32) -> Browser {
        let port = herd_testkit::free_port_block(1);
        // Its own process group: a failed test still stops every browser process it started.
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("starting chromedriver: {e} (scripts/install-deps installs chromium and chromium-driver)")
            });
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while ureq::get(&format!("{}/status", browser.base))
            .timeout(Duration::from_secs(2))
            .call()
            .is_err()
        {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--hide-scrollbars",
                         "--disable-crash-reporter", "--disable-breakpad",
                         format!("--window-size={width},{height}")],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        }}});
        // A failure here panics with `browser` alive: its drop stops chromedriver's group.
        let answer = browser.call("POST", "/session", Some(caps));
        browser.session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        browser
    }

    /// One WebDriver command on the session (`path` after `/session/{id}`), its `value`.
    pub fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.call(method, &path, body)["value"].clone()
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let request = ureq::request(method, &url).timeout(CALL_TIMEOUT);
        let result = match body {
            Some(b) => request.send_json(b),
            None => request.call(),
        };
        match result {
            Ok(r) => r.into_json().unwrap_or(Value::Null),
            Err(ureq::Error::Status(code, r)) => {
                panic!(
                    "{method} {path}: {code} {}",
                    r.into_string().unwrap_or_default()
                )
            }
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    /// Opens `url`.
    pub fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body; `return` gives the value) in the page.
    pub fn eval(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Polls `script` until `done` accepts its value, panicking after `timeout`; the value.
    pub fn wait_for(
        &self,
        timeout: Duration,
        what: &str,
        script: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(script);
            if done(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; last value: {v}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Resizes the window (outer size).
    pub fn resize(&self, width: u32, height: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({ "width": width, "height": height })),
        );
    }

    /// The browser console's entries since the last call (`{level, message}` objects).
    pub fn console(&self) -> Vec<Value> {
        let v = self.cmd("POST", "/se/log", Some(json!({ "type": "browser" })));
        v.as_array().cloned().unwrap_or_default()
    }

    /// A PNG screenshot of the viewport, written to `path`.
    pub fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine;
        let v = self.cmd("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("screenshot data"))
            .expect("base64 screenshot");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::write(path, png).expect("writing the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let url = format!("{}/session/{}", self.base, self.session);
            let _ = ureq::delete(&url).timeout(Duration::from_secs(10)).call();
        }
        if let Ok(pid) = i32::try_from(self.driver.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.driver.wait();
    }
}

/// Debian's Chromium (`chromium`), else whatever `chromium` is on the PATH.
fn chromium() -> String {
    ["/usr/bin/chromium", "/usr/lib/chromium/chromium"]
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .map_or_else(|| "chromium".to_string(), |p| p.to_string())
}
