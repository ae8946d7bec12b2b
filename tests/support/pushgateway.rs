//! A real Prometheus Pushgateway for a test: the binary hack/build-servers.sh builds (hack/testenv.sh
//! exports its path as `KBIND_TEST_PUSHGATEWAY_BIN`), one process per test, killed on drop. A
//! shared one would mix tests: kbind's grouping key is `job=kbind-<pass>`,
//! `instance=<shard or all>` (docs/monitoring.md "Pushgateway"), the same in every test.
//! Metrics are kept in memory only (no `--persistence.file`).
//!
//! [`Pushgateway::spawn`] takes any command that runs it (e.g. under `ip netns exec`) and the URL
//! it answers on; [`args`] is its command line for a listen address. [`Options`] put its routes
//! under a path prefix or behind basic auth (the real Pushgateway's `--web.config.file`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a Pushgateway may take to answer `/-/ready` (a loaded 2-core machine).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The Pushgateway binary (`hack/build-servers.sh --print-pushgateway`).
pub fn bin() -> PathBuf {
    std::env::var_os("KBIND_TEST_PUSHGATEWAY_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "KBIND_TEST_PUSHGATEWAY_BIN is not set: the test servers are not running. Run \
                 the suite with `hack/test.sh` (hack/testenv.sh exports it)"
            )
        })
}

/// The Pushgateway's arguments to listen on `listen` (`host:port`), its routes under
/// `route_prefix` (e.g. `/pg`) when given, metrics in memory only.
pub fn args(listen: &str, route_prefix: Option<&str>) -> Vec<String> {
    let mut args = vec![
        format!("--web.listen-address={listen}"),
        "--log.level=warn".to_string(),
    ];
    if let Some(p) = route_prefix {
        args.push(format!("--web.route-prefix={p}"));
    }
    args
}

/// How a test's Pushgateway differs from a plain one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options<'a> {
    /// Its routes under this path (`--web.route-prefix`), as behind a path prefix.
    pub route_prefix: Option<&'a str>,
    /// Every request needs these credentials.
    pub basic_auth: Option<BasicAuth>,
}

/// A user of the Pushgateway's basic auth: the password a client sends and its bcrypt hash,
/// which the Pushgateway's web configuration holds.
#[derive(Clone, Copy, Debug)]
pub struct BasicAuth {
    pub user: &'static str,
    pub password: &'static str,
    pub bcrypt: &'static str,
}

/// A running Pushgateway; killed when dropped.
pub struct Pushgateway {
    child: Child,
    url: String,
    auth: Option<BasicAuth>,
    /// Its log and web configuration, removed when dropped.
    files: Vec<PathBuf>,
}

impl Drop for Pushgateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

impl Pushgateway {
    /// A plain one on a free loopback port.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// One on a free loopback port. A port taken between choosing and binding it is retried
    /// (bounded).
    pub async fn start_with(options: Options<'_>) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            match Self::start_at(SocketAddr::from(([127, 0, 0, 1], port)), options).await {
                Ok(pg) => return pg,
                Err(e) => last = e,
            }
        }
        panic!("the Pushgateway did not start: {last}")
    }

    /// One listening on `listen`, reached there.
    pub async fn start_at(listen: SocketAddr, options: Options<'_>) -> Result<Self, String> {
        let tag = listen.port().to_string();
        let mut cmd = Command::new(bin());
        cmd.args(args(&listen.to_string(), options.route_prefix));
        let mut web_config = None;
        if let Some(a) = options.basic_auth {
            let path = temp_file(&tag, "web.yml");
            let yaml = format!("basic_auth_users:\n  {}: '{}'\n", a.user, a.bcrypt);
            std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display()))?;
            cmd.arg(format!("--web.config.file={}", path.display()));
            web_config = Some(path);
        }
        let url = format!("http://{listen}{}", options.route_prefix.unwrap_or(""));
        let spawned = Self::spawn(cmd, url, &tag).await;
        let mut pg = match spawned {
            Ok(pg) => pg,
            Err(e) => {
                if let Some(p) = web_config {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        };
        pg.files.extend(web_config);
        pg.auth = options.basic_auth;
        Ok(pg)
    }

    /// Run `cmd` (a Pushgateway command line, e.g. [`args`] under `ip netns exec`) with its output
    /// in a log file named after `tag`, and wait until it answers `<url>/-/ready`. `url` is its
    /// base, route prefix included, as this process reaches it.
    pub async fn spawn(mut cmd: Command, url: String, tag: &str) -> Result<Self, String> {
        let log = temp_file(tag, "log");
        let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawning {cmd:?}: {e}"))?;
        let mut pg = Self {
            child,
            url,
            auth: None,
            files: vec![log],
        };
        pg.wait_ready().await?;
        Ok(pg)
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let client = client();
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited ({status}): {}", self.log_tail()));
            }
            // Up is up: one behind basic auth answers 401 to a request without credentials.
            let ready = client.get(format!("{}/-/ready", self.url)).send().await;
            if ready.is_ok_and(|r| r.status().is_success() || r.status().as_u16() == 401) {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(format!(
                    "not ready after {READY_TIMEOUT:?}: {}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.files[0]).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The base URL to pass as `--pushgateway-url` (route prefix included).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A request to `path` under its URL, with its credentials if it has basic auth.
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = client().request(method, format!("{}{path}", self.url));
        match self.auth {
            Some(a) => r.basic_auth(a.user, Some(a.password)),
            None => r,
        }
    }

    /// `GET /metrics`, as Prometheus scrapes it.
    pub async fn scrape(&self) -> Scrape {
        Scrape::parse(&self.scrape_text().await)
    }

    /// `GET /metrics` as text, for tests that search it.
    pub async fn scrape_text(&self) -> String {
        let resp = self
            .request(reqwest::Method::GET, "/metrics")
            .send()
            .await
            .expect("scrape the Pushgateway");
        assert!(resp.status().is_success(), "scrape: {}", resp.status());
        resp.text().await.expect("scrape body")
    }

    /// Push `body` (text format) to the group `job`/`instance` as another client would; returns
    /// the status and the answer.
    pub async fn push(&self, method: &str, job: &str, instance: &str, body: &str) -> (u16, String) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let resp = self
            .request(method, &format!("/metrics/job/{job}/instance/{instance}"))
            .header("content-type", "text/plain; version=0.0.4")
            .body(body.to_string())
            .send()
            .await
            .expect("push to the Pushgateway");
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    }
}

fn temp_file(tag: &str, ext: &str) -> PathBuf {
    // Unique in the process too: every area's tests share it (docs/testing.md "One test binary").
    std::env::temp_dir().join(format!(
        "{}-{tag}.{ext}",
        super::unique("kbind-pushgateway")
    ))
}

fn client() -> reqwest::Client {
    kbind::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("http client")
}

/// Labels of one sample, sorted.
pub type Labels = BTreeMap<String, String>;

/// One scrape in the text format: each family's `# TYPE` and `# HELP`, and every sample.
#[derive(Debug, Default)]
pub struct Scrape {
    pub types: BTreeMap<String, String>,
    pub help: BTreeMap<String, String>,
    pub samples: Vec<(String, Labels, f64)>,
}

impl Scrape {
    /// Parse the text format (0.0.4) as the Pushgateway writes it; a sample before its family's
    /// `# TYPE`, a malformed line or a duplicate series fails the test.
    pub fn parse(body: &str) -> Self {
        let mut s = Self::default();
        let mut seen = std::collections::BTreeSet::new();
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            if let Some(rest) = line.strip_prefix("# ") {
                let mut parts = rest.splitn(3, ' ');
                let (kw, name, text) = (parts.next(), parts.next(), parts.next());
                match (kw, name) {
                    (Some("TYPE"), Some(name)) => {
                        s.types.insert(name.into(), text.unwrap_or_default().into());
                    }
                    (Some("HELP"), Some(name)) => {
                        s.help.insert(name.into(), text.unwrap_or_default().into());
                    }
                    _ => {}
                }
                continue;
            }
            let (name, labels, value) = parse_sample(line);
            assert!(
                s.types.keys().any(|f| name.starts_with(f.as_str())),
                "sample before its # TYPE: {line}"
            );
            assert!(
                seen.insert(format!("{name}{labels:?}")),
                "duplicate series: {line}"
            );
            s.samples.push((name, labels, value));
        }
        s
    }

    /// The samples of `name` in the group `job`/`instance`, each keyed by its labels other than
    /// the grouping ones.
    pub fn group(&self, name: &str, job: &str, instance: &str) -> BTreeMap<Labels, f64> {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && l.get("job").map(String::as_str) == Some(job)
                    && l.get("instance").map(String::as_str) == Some(instance)
            })
            .map(|(_, l, v)| {
                let mut rest = l.clone();
                rest.remove("job");
                rest.remove("instance");
                (rest, *v)
            })
            .collect()
    }

    /// The one unlabelled (but for the grouping labels) sample of `name` in the group.
    pub fn value(&self, name: &str, job: &str, instance: &str) -> Option<f64> {
        let group = self.group(name, job, instance);
        assert!(group.len() <= 1, "{name} has several series: {group:?}");
        group.get(&Labels::new()).copied()
    }

    /// The samples of every pushed group (those with a `job` label), not the Pushgateway's own.
    pub fn pushed(&self) -> Vec<&(String, Labels, f64)> {
        self.samples
            .iter()
            .filter(|(_, l, _)| l.contains_key("job"))
            .collect()
    }

    /// The push requests (PUT, POST) the Pushgateway answered, by status code, from its own
    /// `pushgateway_http_requests_total`.
    pub fn pushes_answered(&self) -> BTreeMap<String, f64> {
        let mut by_code = BTreeMap::new();
        for (n, l, v) in &self.samples {
            if n == "pushgateway_http_requests_total"
                && l.get("handler").map(String::as_str) == Some("push")
            {
                *by_code.entry(l["code"].clone()).or_default() += v;
            }
        }
        by_code
    }

    /// The names of the families with a sample in the group `job`/`instance`.
    pub fn names_in(&self, job: &str, instance: &str) -> std::collections::BTreeSet<String> {
        self.samples
            .iter()
            .filter(|(_, l, _)| {
                l.get("job").map(String::as_str) == Some(job)
                    && l.get("instance").map(String::as_str) == Some(instance)
            })
            .map(|(n, _, _)| n.clone())
            .collect()
    }
}

/// `name{a="x",b="y"} value [timestamp]`, label values unescaped.
fn parse_sample(line: &str) -> (String, Labels, f64) {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("{line}"));
    let name = &line[..name_end];
    let mut labels = Labels::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            if c == '}' {
                end = Some(i);
                break;
            }
            if c == ',' {
                continue;
            }
            let mut key = String::from(c);
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                key.push(c);
            }
            assert_eq!(chars.next().map(|(_, c)| c), Some('"'), "{line}");
            let mut value = String::new();
            loop {
                match chars
                    .next()
                    .unwrap_or_else(|| panic!("unclosed label: {line}"))
                {
                    (_, '"') => break,
                    (_, '\\') => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(c @ ('\\' | '"')) => value.push(c),
                        other => panic!("bad escape {other:?} in {line}"),
                    },
                    (_, c) => value.push(c),
                }
            }
            assert!(labels.insert(key, value).is_none(), "label twice: {line}");
        }
        let end = end.unwrap_or_else(|| panic!("unclosed labels: {line}"));
        rest = &after[end + 1..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("{line}"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .unwrap_or_else(|_| panic!("value {v:?} in {line}")),
    };
    (name.to_string(), labels, value)
}
