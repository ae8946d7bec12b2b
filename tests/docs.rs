//! The docs against what can be checked mechanically: every `kbind <command> --flag` they show
//! exists in that command's `--help`, every flag they name on its own exists in some command's,
//! docs/operations.md covers every pass the registry gives a CronJob, and its paragraph on what a
//! pass's RBAC file grants names every resource that file's rules grant (a stale line once said
//! resync read no cluster identity while its Role granted exactly that), and every test or item
//! they cite as `<file>.rs::<name>` is there.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

/// `kbind <args> --help`, every `--flag` in it.
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kbind"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run kbind --help");
    assert!(out.status.success(), "kbind {args:?} --help");
    flags_in(&String::from_utf8_lossy(&out.stdout))
}

/// Every `--flag` token in `text` (`--name`, `--name=value`).
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before_ok =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'-');
        let mut end = start + 2;
        while end < b.len()
            && (b[end].is_ascii_lowercase() || b[end].is_ascii_digit() || b[end] == b'-')
        {
            end += 1;
        }
        if before_ok && end > start + 2 && b[start + 2].is_ascii_lowercase() {
            flags.insert(text[start..end].trim_end_matches('-').to_string());
        }
        i = end.max(start + 2);
    }
    flags
}

/// The subcommands `kbind --help` lists.
fn subcommands() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kbind"))
        .arg("--help")
        .output()
        .expect("run kbind --help");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.split("Commands:")
        .nth(1)
        .and_then(|s| s.split("Options:").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(String::from)
        .collect()
}

/// The long flags clap hides from `--help` (`#[arg(hide = true)]`), over every command.
fn hidden_flags() -> BTreeSet<String> {
    use clap::CommandFactory;
    let mut out = BTreeSet::new();
    let mut todo = vec![kbind::cli::Cli::command()];
    while let Some(cmd) = todo.pop() {
        for a in cmd.get_arguments().filter(|a| a.is_hide_set()) {
            out.extend(a.get_long().map(|l| format!("--{l}")));
        }
        todo.extend(cmd.get_subcommands().cloned());
    }
    out
}

/// The code of a markdown file: inline `spans` and indented or fenced block lines, each with the
/// paragraph it is in (the text between blank lines, for context).
fn code(markdown: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for para in markdown.split("\n\n") {
        for line in para.lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced || line.starts_with("    ") {
                out.push((line.trim().to_string(), para.to_string()));
                continue;
            }
            let mut parts = line.split('`');
            parts.next();
            while let Some(span) = parts.next() {
                out.push((span.to_string(), para.to_string()));
                parts.next();
            }
        }
    }
    out
}

/// Whether `flag` may appear in `context`: listed by `--help` (`known`), or hidden from it and
/// called hidden there.
fn allowed(flag: &str, known: &BTreeSet<String>, hidden: &BTreeSet<String>, context: &str) -> bool {
    known.contains(flag) || (hidden.contains(flag) && context.contains("hidden"))
}

fn docs() -> Vec<(String, String)> {
    let mut files: Vec<String> = std::fs::read_dir("docs")
        .unwrap()
        .map(|e| e.unwrap().path().to_string_lossy().to_string())
        .filter(|p| p.ends_with(".md"))
        .collect();
    files.push("README.md".into());
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect()
}

/// Every `kbind <command> … --flag` a doc shows, in a code span or block, names a flag that
/// command's `--help` lists (the flags every command takes included).
#[test]
fn every_kbind_command_line_in_the_docs_uses_flags_the_command_has() {
    let commands = subcommands();
    assert!(
        commands.contains("schema") && commands.contains("uninstall"),
        "{commands:?}"
    );
    let hidden = hidden_flags();
    let mut help: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, text) in docs() {
        for (code, context) in code(&text) {
            // Each shell command on the line on its own: `a | b`, `a; b`, `a && b`.
            for cmd in code.split(['|', ';', '&', '#']) {
                let words: Vec<&str> = cmd.split_whitespace().collect();
                let Some(at) = words.iter().position(|w| *w == "kbind") else {
                    continue;
                };
                let Some(sub) = words.get(at + 1).filter(|w| commands.contains(**w)) else {
                    continue;
                };
                let mut key = vec![sub.to_string()];
                if *sub == "claims" && words.get(at + 2) == Some(&"export") {
                    key.push("export".into());
                }
                let known = help.entry(key.clone()).or_insert_with(|| {
                    help_flags(&key.iter().map(String::as_str).collect::<Vec<_>>())
                });
                for flag in flags_in(&words[at..].join(" ")) {
                    checked += 1;
                    if !allowed(&flag, known, &hidden, &context) {
                        wrong.push(format!(
                            "{file}: `kbind {}` has no {flag}: {code}",
                            key.join(" ")
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} flags found: is the parser blind?"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A flag a doc names on its own (a code span holding just `--flag`, `--flag=value` or
/// `--flag value`) exists in some kbind command's `--help` (a flag hidden from it only where the
/// doc calls it hidden), unless its paragraph is about another tool (kubectl, Helm, cargo,
/// podman, a script in hack/, the servers the tests run).
#[test]
fn every_flag_the_docs_name_is_a_flag_of_kbind() {
    let mut all = BTreeSet::new();
    for sub in subcommands() {
        all.extend(help_flags(&[&sub]));
    }
    all.extend(help_flags(&["claims", "export"]));
    let hidden = hidden_flags();
    let others = [
        "kubectl",
        "helm",
        "cargo",
        "podman",
        "docker",
        "ctr ",
        "hack/",
        "spicedb",
        "pushgateway",
        "kustomize",
        "jq ",
        "etcd",
        "apiserver",
        "kube-",
        "nextest",
        "buildx",
    ];
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, text) in docs() {
        for (code, context) in code(&text) {
            let span = code.trim();
            let is_flag_alone = span.starts_with("--")
                && span.split_whitespace().count() <= 2
                && !span.contains("kbind");
            let lower = context.to_lowercase();
            if !is_flag_alone || others.iter().any(|o| lower.contains(o)) {
                continue;
            }
            for flag in flags_in(span) {
                checked += 1;
                if !allowed(&flag, &all, &hidden, &context) {
                    wrong.push(format!("{file}: {flag} is no kbind flag: {context}"));
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} flags found: is the parser blind?"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The paragraph of `text` that starts with `` `start` grants``, up to the next blank line.
fn paragraph<'t>(text: &'t str, start: &str) -> Option<&'t str> {
    let from = text.find(&format!("`{start}` grants"))?;
    let rest = &text[from..];
    Some(rest.split("\n\n").next().unwrap_or(rest))
}

/// What a pass's RBAC file grants on the cluster it runs in: every resource and resource name of
/// its ClusterRoles and Roles, the example roles (to copy per bound API) aside.
fn granted(file: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let mut out = BTreeSet::new();
    for d in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        if d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.contains("example"))
        {
            continue;
        }
        for rule in d["rules"].as_array().into_iter().flatten() {
            for field in ["resources", "resourceNames"] {
                for r in rule[field].as_array().into_iter().flatten() {
                    out.insert(r.as_str().unwrap().to_string());
                }
            }
        }
    }
    out
}

/// docs/operations.md says, per pass of the consumer role, what its RBAC file grants: the
/// paragraph starting with the file's name names (in backticks) every resource and resource name
/// the file grants, so a new rule cannot go undocumented nor a documented one stay after it went.
#[test]
fn operations_md_names_everything_the_consumer_rbac_files_grant() {
    let ops = std::fs::read_to_string("docs/operations.md").unwrap();
    let mut checked = 0;
    for pass in kbind::registry::PASSES
        .iter()
        .filter(|p| p.role == "consumer")
    {
        let file = pass.rbac_file();
        let para = paragraph(&ops, &file)
            .unwrap_or_else(|| panic!("docs/operations.md has no paragraph on `{file}`"));
        let spans: BTreeSet<&str> = para.split('`').skip(1).step_by(2).collect();
        let missing: Vec<String> = granted(&file)
            .into_iter()
            .filter(|r| !spans.contains(r.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{file}: docs/operations.md does not name {missing:?}:\n{para}"
        );
        checked += 1;
    }
    assert_eq!(checked, 2, "schema and resync");
}

/// docs/operations.md covers every pass the registry gives a CronJob: its opening paragraph names
/// each as `kbind <pass>`, and it has a section on each one's schedule or operation.
#[test]
fn operations_md_covers_every_pass_with_a_cronjob() {
    let ops = std::fs::read_to_string("docs/operations.md").unwrap();
    let intro = ops.split("\n## ").next().unwrap();
    for pass in kbind::registry::PASSES
        .iter()
        .filter(|p| p.jobs.first() == Some(&"cronjob.yaml"))
    {
        let name = format!("`kbind {}`", pass.name);
        assert!(
            intro.contains(&name),
            "the opening paragraph lacks {name}:\n{intro}"
        );
        assert!(
            ops.contains(&format!("### {name}")) || ops.contains(&format!("## {name}")),
            "docs/operations.md has no section {name}"
        );
    }
}

/// Every `<file>.rs::<item>` a doc cites (`tests/resync.rs::a_test`,
/// `src/relsync/encode.rs::tests::a_test`) as `(doc, file, item path)`.
fn citations(doc: &str, text: &str) -> Vec<(String, String, String)> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-');
    let mut out = Vec::new();
    for (at, _) in text.match_indices(".rs::") {
        let start = text[..at]
            .rfind(|c: char| !path_char(c))
            .map_or(0, |i| i + 1);
        let file = &text[start..at + 3];
        if !["tests/", "src/", "examples/", "crates/"]
            .iter()
            .any(|p| file.starts_with(p))
        {
            continue;
        }
        let rest = &text[at + 5..];
        let word = |s: &str| {
            let end = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(s.len());
            s[..end].trim_end_matches(':').to_string()
        };
        // `x.rs::{a,b}_suffix` cites `a_suffix` and `b_suffix`.
        let items = match rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
            Some((alternatives, after)) => {
                let suffix = word(after);
                alternatives
                    .split(',')
                    .map(|a| format!("{}{suffix}", a.trim()))
                    .collect()
            }
            None => vec![word(rest)],
        };
        for item in items.into_iter().filter(|i| !i.is_empty()) {
            out.push((doc.to_string(), file.to_string(), item));
        }
    }
    out
}

/// The Rust files `file` stands for: itself and, as a module, the files under its folder
/// (a test module in `tests.rs` beside it, an area's helpers in `tests/model/`).
fn module_files(file: &str) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let path = std::path::PathBuf::from(file);
    if path.is_file() {
        files.push(path.clone());
    }
    let mut dirs = vec![path.with_extension("")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files
}

/// Every test or item the docs cite as `<file>.rs::<name>` exists there: a test that moved or was
/// renamed leaves no doc pointing at nothing (docs/hostile-inputs.md's table cites ~130).
#[test]
fn every_test_and_item_the_docs_cite_exists_where_they_say() {
    let mut docs = docs();
    for extra in [
        "jobs/README.md",
        "deploy/README.md",
        "charts/kbind/README.md",
    ] {
        docs.push((extra.to_string(), std::fs::read_to_string(extra).unwrap()));
    }
    let cited: Vec<_> = docs
        .iter()
        .flat_map(|(doc, text)| citations(doc, text))
        .collect();
    assert!(
        cited.len() > 100,
        "the citations are found: {}",
        cited.len()
    );
    let mut missing = Vec::new();
    for (doc, file, item) in &cited {
        let name = item.rsplit("::").next().unwrap_or(item);
        let found = module_files(file).iter().any(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            [
                "fn", "const", "static", "struct", "enum", "type", "trait", "mod",
            ]
            .iter()
            .any(|kw| {
                text.match_indices(&format!("{kw} {name}")).any(|(i, m)| {
                    !text[i + m.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                })
            })
        });
        if !found {
            missing.push(format!("{doc}: {file}::{item}"));
        }
    }
    assert!(
        missing.is_empty(),
        "cited but not found:\n{}",
        missing.join("\n")
    );
}
