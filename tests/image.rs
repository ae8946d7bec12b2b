//! The image hack/image.sh builds (target/image/kbind.tar, a docker-archive) against what the
//! Dockerfile's final stage declares, the source of truth for what the image contains
//! (docs/operations.md, "The image"): its labels (with the build arguments hack/image.sh used),
//! environment, user and entrypoint; the files the stage copies in (the static binary, the CA
//! bundle, passwd/group with the user it runs as, tzdata); the user the shipped manifests run as;
//! and the binary from the image printing the crate's version.
//!
//! hack/test.sh builds the archive first (hack/image.sh). With the feature `servers` a missing
//! archive fails these tests; without it they are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path))
        .unwrap_or_else(|e| panic!("read {path}: {e}: run hack/image.sh (hack/test.sh does)"))
}

/// What the Dockerfile's last stage declares, build arguments substituted.
#[derive(Debug, Default)]
struct Stage {
    name: String,
    labels: BTreeMap<String, String>,
    env: BTreeMap<String, String>,
    user: String,
    entrypoint: Vec<String>,
    /// `COPY --from=<stage> <src> <dest>`
    copies: Vec<(String, String, String)>,
}

/// The Dockerfile's instructions: comment lines dropped, continued lines joined.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in dockerfile.lines() {
        if line.trim_start().starts_with('#') || (cur.is_empty() && line.trim().is_empty()) {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(part) => cur.push_str(part),
            None => {
                cur.push_str(line);
                out.push(cur.trim().to_string());
                cur.clear();
            }
        }
    }
    out
}

/// `k="v w" k2=v2` as pairs (double quotes, with `\"` inside).
fn pairs(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|&c| c != '=')).collect();
        if key.is_empty() {
            return out;
        }
        assert_eq!(chars.next(), Some('='), "no = after {key} in {text}");
        let mut value = String::new();
        if chars.next_if_eq(&'"').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => value.extend(chars.next()),
                    Some('"') => break,
                    Some(c) => value.push(c),
                    None => panic!("unterminated quote in {text}"),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())).collect();
        }
        out.push((key.trim().to_string(), value));
    }
}

/// `$NAME` and `${NAME}` replaced by the build arguments' values.
fn substitute(value: &str, args: &BTreeMap<String, String>) -> String {
    let mut out = value.to_string();
    for (k, v) in args {
        out = out
            .replace(&format!("${{{k}}}"), v)
            .replace(&format!("${k}"), v);
    }
    assert!(!out.contains('$'), "unknown build argument in {value}");
    out
}

/// The last stage of the Dockerfile, with the ARG defaults overridden by `build_args`.
fn final_stage(dockerfile: &str, build_args: &BTreeMap<String, String>) -> Stage {
    let all = instructions(dockerfile);
    let start = all
        .iter()
        .rposition(|i| i.to_uppercase().starts_with("FROM "))
        .expect("a FROM in the Dockerfile");
    let mut stage = Stage::default();
    let mut args = BTreeMap::new();
    for (i, ins) in all[start..].iter().enumerate() {
        let (word, rest) = ins.split_once(char::is_whitespace).unwrap_or((ins, ""));
        let rest = rest.trim();
        match word.to_uppercase().as_str() {
            "FROM" if i == 0 => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                assert_eq!(words[0], "scratch", "the image starts FROM scratch: {ins}");
                stage.name = words.get(2).expect("FROM scratch AS <name>").to_string();
            }
            "ARG" => {
                let (k, v) = rest.split_once('=').unwrap_or((rest, ""));
                let v = build_args.get(k).map_or(v, String::as_str);
                args.insert(k.to_string(), v.to_string());
            }
            "LABEL" => {
                for (k, v) in pairs(rest) {
                    stage.labels.insert(k, substitute(&v, &args));
                }
            }
            "ENV" => {
                for (k, v) in pairs(rest) {
                    stage.env.insert(k, substitute(&v, &args));
                }
            }
            "USER" => stage.user = substitute(rest, &args),
            "ENTRYPOINT" => {
                stage.entrypoint = serde_json::from_str(rest).expect("ENTRYPOINT in exec form");
            }
            "COPY" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let from = words[0]
                    .strip_prefix("--from=")
                    .unwrap_or_else(|| panic!("the image only copies from stages: {ins}"));
                assert_eq!(words.len(), 3, "COPY --from=<stage> <src> <dest>: {ins}");
                stage
                    .copies
                    .push((from.to_string(), words[1].to_string(), words[2].to_string()));
            }
            other => panic!("{other} in the final stage: tests/image.rs does not know it"),
        }
    }
    stage
}

/// One file of the image, the layers applied in order.
#[derive(Debug, Clone)]
struct File {
    kind: tar::EntryType,
    mode: u32,
    uid: u64,
    gid: u64,
    link: Option<String>,
    data: Vec<u8>,
}

/// The image in target/image/kbind.tar: its repository tags, its config and its files.
struct Image {
    tags: Vec<String>,
    config: Value,
    files: BTreeMap<String, File>,
}

fn entries(bytes: &[u8]) -> Vec<(String, File)> {
    let mut archive = tar::Archive::new(bytes);
    let mut out = Vec::new();
    for e in archive.entries().expect("tar entries") {
        let mut e = e.expect("tar entry");
        let path = e.path().expect("entry path").to_string_lossy().into_owned();
        let path = path.trim_start_matches("./").trim_matches('/').to_string();
        let h = e.header().clone();
        let link = e
            .link_name()
            .expect("link name")
            .map(|l| l.to_string_lossy().into_owned());
        let mut data = Vec::new();
        e.read_to_end(&mut data).expect("entry data");
        let file = File {
            kind: h.entry_type(),
            mode: h.mode().expect("mode"),
            uid: h.uid().expect("uid"),
            gid: h.gid().expect("gid"),
            link,
            data,
        };
        out.push((path, file));
    }
    out
}

fn load() -> Image {
    let path = repo("target/image/kbind.tar");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: build the image with hack/image.sh (hack/test.sh does)",
            path.display()
        )
    });
    let outer: BTreeMap<String, File> = entries(&bytes).into_iter().collect();
    let member = |name: &str| {
        &outer
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing from the docker-archive"))
            .data
    };
    let manifest: Value = serde_json::from_slice(member("manifest.json")).expect("manifest.json");
    let [image] = manifest
        .as_array()
        .expect("manifest.json: a list")
        .as_slice()
    else {
        panic!("one image in the archive: {manifest}");
    };
    let config: Value = serde_json::from_slice(member(image["Config"].as_str().expect("Config")))
        .expect("config JSON");
    let mut files = BTreeMap::new();
    for layer in image["Layers"].as_array().expect("Layers") {
        for (path, file) in entries(member(layer.as_str().expect("layer name"))) {
            let (dir, base) = path.rsplit_once('/').unwrap_or(("", &path));
            if let Some(gone) = base.strip_prefix(".wh.") {
                let gone = if dir.is_empty() {
                    gone.to_string()
                } else {
                    format!("{dir}/{gone}")
                };
                files.retain(|p: &String, _| p != &gone && !p.starts_with(&format!("{gone}/")));
            } else if !path.is_empty() {
                files.insert(path, file);
            }
        }
    }
    let tags = image["RepoTags"]
        .as_array()
        .expect("RepoTags")
        .iter()
        .map(|t| t.as_str().expect("tag").to_string())
        .collect();
    Image {
        tags,
        config,
        files,
    }
}

/// The build arguments hack/image.sh passed (target/image/build-args, `NAME=value` lines).
fn build_args() -> BTreeMap<String, String> {
    read("target/image/build-args")
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn stage() -> Stage {
    final_stage(&read("Dockerfile"), &build_args())
}

impl Image {
    fn file(&self, path: &str) -> &File {
        self.files
            .get(path.trim_start_matches('/'))
            .unwrap_or_else(|| panic!("{path} is not in the image"))
    }

    /// The file a path names, symbolic links followed inside the image.
    fn resolve(&self, path: &str) -> Option<&File> {
        let mut path = path.trim_start_matches('/').to_string();
        for _ in 0..16 {
            let f = self.files.get(&path)?;
            let Some(link) = f.link.as_ref().filter(|_| f.kind.is_symlink()) else {
                return Some(f);
            };
            let base = match link.strip_prefix('/') {
                Some(abs) => abs.to_string(),
                None => match path.rsplit_once('/') {
                    Some((dir, _)) => format!("{dir}/{link}"),
                    None => link.clone(),
                },
            };
            let mut parts: Vec<&str> = Vec::new();
            for p in base.split('/') {
                match p {
                    "" | "." => {}
                    ".." => {
                        parts.pop();
                    }
                    p => parts.push(p),
                }
            }
            path = parts.join("/");
        }
        None
    }
}

/// The user and group every shipped job definition runs as (`runAsUser`, `runAsGroup`).
fn manifests_user() -> String {
    let (mut users, mut groups) = (BTreeSet::new(), BTreeSet::new());
    for pass in std::fs::read_dir(repo("jobs")).expect("jobs/") {
        let pass = pass.expect("entry").path();
        if !pass.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&pass).expect("jobs/<pass>") {
            let text = std::fs::read_to_string(f.expect("entry").path()).expect("read");
            for line in text.lines().map(str::trim) {
                if let Some(v) = line.strip_prefix("runAsUser:") {
                    users.insert(v.trim().to_string());
                }
                if let Some(v) = line.strip_prefix("runAsGroup:") {
                    groups.insert(v.trim().to_string());
                }
            }
        }
    }
    let one = |set: BTreeSet<String>, what: &str| -> String {
        assert_eq!(set.len(), 1, "one {what} in all job definitions: {set:?}");
        set.into_iter().next().expect("one")
    };
    format!("{}:{}", one(users, "runAsUser"), one(groups, "runAsGroup"))
}

#[test]
#[cfg_attr(not(feature = "servers"), ignore = "needs the image: run hack/test.sh")]
fn config_is_what_the_dockerfile_declares() {
    let image = load();
    let stage = stage();
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(image.tags, [format!("ghcr.io/kbind/kbind:{version}")]);
    let config = &image.config["config"];

    assert_eq!(config["User"], stage.user.as_str(), "USER");
    assert_eq!(
        stage.user,
        manifests_user(),
        "the user the manifests run as"
    );
    assert_eq!(config["Entrypoint"], serde_json::json!(stage.entrypoint));
    assert_eq!(stage.entrypoint, ["/kbind"]);

    let labels: BTreeMap<String, String> =
        serde_json::from_value(config["Labels"].clone()).expect("Labels");
    assert_eq!(
        labels, stage.labels,
        "the image has exactly the Dockerfile's labels"
    );
    assert_eq!(labels["org.opencontainers.image.version"], version);

    let env: Vec<&str> = config["Env"]
        .as_array()
        .expect("Env")
        .iter()
        .map(|e| e.as_str().expect("Env entry"))
        .collect();
    for (k, v) in &stage.env {
        assert!(
            env.contains(&format!("{k}={v}").as_str()),
            "{k}={v} in {env:?}"
        );
    }
    assert_eq!(image.config["os"], "linux");
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!(image.config["architecture"], arch);
}

/// The ELF program header types of a 64-bit little-endian executable.
fn program_headers(elf: &[u8]) -> Vec<u32> {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    assert_eq!((elf[4], elf[5]), (2, 1), "64-bit little-endian");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().expect("4 bytes"));
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().expect("8 bytes")) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).map(|i| u32_at(phoff + i * size)).collect()
}

/// The static check can fail: this test binary (linked against the machine's libc) has an
/// interpreter.
#[test]
fn a_dynamic_executable_has_an_interpreter() {
    let me = std::fs::read(std::env::current_exe().expect("test binary")).expect("read it");
    assert!(
        program_headers(&me).contains(&3),
        "no PT_INTERP in a dynamic test binary"
    );
}

#[test]
#[cfg_attr(not(feature = "servers"), ignore = "needs the image: run hack/test.sh")]
fn files_are_what_the_final_stage_copies() {
    let image = load();
    let stage = stage();
    // What hack/image.sh hands in as the stages `builder` and `rootfs`.
    let from: Vec<(&str, &str, &str)> = stage
        .copies
        .iter()
        .map(|(f, s, d)| (f.as_str(), s.as_str(), d.as_str()))
        .collect();
    assert_eq!(
        from,
        [("rootfs", "/", "/"), ("builder", "/kbind", "/kbind")]
    );

    // The binary: executable, static (no ELF interpreter: nothing to load from the image).
    let kbind = image.file(&stage.entrypoint[0]);
    assert!(
        kbind.kind.is_file() && kbind.mode & 0o111 == 0o111,
        "{kbind:?}"
    );
    assert!(
        !program_headers(&kbind.data).contains(&3),
        "/kbind has an ELF interpreter (PT_INTERP): not a static binary"
    );

    // The CA bundle SSL_CERT_FILE names: Debian's, without this machine's own additions.
    let bundle = image.file(
        stage
            .env
            .get("SSL_CERT_FILE")
            .expect("the Dockerfile sets SSL_CERT_FILE"),
    );
    let bundle = String::from_utf8(bundle.data.clone()).expect("PEM");
    let certs = bundle.matches("-----BEGIN CERTIFICATE-----").count();
    assert!(certs >= 100, "{certs} certificates in the bundle");
    let body = |pem: &str| -> String { pem.lines().filter(|l| !l.starts_with("-----")).collect() };
    let bundle_body = body(&bundle);
    let local = Path::new("/usr/local/share/ca-certificates");
    for e in std::fs::read_dir(local).into_iter().flatten() {
        let path = e.expect("entry").path();
        let Ok(pem) = std::fs::read_to_string(&path) else {
            continue;
        };
        let b = body(&pem);
        assert!(
            b.is_empty() || !bundle_body.contains(&b),
            "the image's CA bundle holds this machine's own {}",
            path.display()
        );
    }

    // The user: its passwd and group entries, its home owned by it; a world-writable /tmp.
    let (uid, gid) = stage.user.split_once(':').expect("USER uid:gid");
    let passwd = String::from_utf8(image.file("/etc/passwd").data.clone()).expect("passwd");
    let entry: Vec<&str> = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.get(2) == Some(&uid))
        .unwrap_or_else(|| panic!("no passwd entry for {uid}: {passwd}"));
    assert_eq!(
        (entry[0], entry[3], entry[5]),
        ("nonroot", gid, "/home/nonroot")
    );
    assert!(passwd.lines().any(|l| l.starts_with("root:x:0:0:")));
    let group = String::from_utf8(image.file("/etc/group").data.clone()).expect("group");
    assert!(group.lines().any(|l| l == format!("nonroot:x:{gid}:")));
    let home = image.file("/home/nonroot");
    assert!(home.kind.is_dir());
    assert_eq!(
        (home.uid.to_string(), home.gid.to_string()),
        (uid.into(), gid.into())
    );
    let tmp = image.file("/tmp");
    assert!(tmp.kind.is_dir() && tmp.mode & 0o7777 == 0o1777, "{tmp:?}");

    // tzdata.
    for zone in ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo"] {
        let f = image
            .resolve(&format!("usr/share/zoneinfo/{zone}"))
            .unwrap_or_else(|| panic!("no time zone {zone}"));
        assert!(f.data.starts_with(b"TZif"), "{zone} is not TZif data");
    }
    // Every symbolic link leads to a file in the image.
    for (path, f) in &image.files {
        if f.kind.is_symlink() {
            assert!(
                image.resolve(path).is_some(),
                "{path} -> {:?} dangles",
                f.link
            );
        }
    }
    // Everything belongs to root but the user's home.
    for (path, f) in &image.files {
        if path != "home/nonroot" {
            assert_eq!((f.uid, f.gid), (0, 0), "{path}");
        }
    }
}

#[test]
#[cfg_attr(not(feature = "servers"), ignore = "needs the image: run hack/test.sh")]
fn binary_from_the_image_prints_the_version() {
    let image = load();
    let kbind = image.file("/kbind");
    let dir = std::env::temp_dir().join(format!("kbind-image-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("kbind");
    std::fs::write(&path, &kbind.data).expect("write /kbind");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    // No environment: nothing from this machine but the kernel.
    let out = Command::new(&path)
        .arg("version")
        .env_clear()
        .output()
        .expect("run the image's /kbind");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("kbind {}", env!("CARGO_PKG_VERSION"))
    );
}
