//! The layering rule of docs/architecture.md, checked on the source: every `crate::<module>` path
//! in `src/` is an edge from the file's top-level module to that module. No pass (or one-off
//! command) uses another; the framework (`pass`) and the shared modules use no pass; only the
//! registry (and `cli`, which takes its subcommands from it) names passes; nothing but `main`
//! uses `cli` or dispatches through the registry; and the modules form no cycle. Runs without
//! servers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Edges = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to: `src/schema/plan.rs` and `src/schema.rs` are `schema`;
/// `src/lib.rs` and `src/main.rs` are the crate root, `""`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src/");
    let first = rel
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or_default();
    match first.strip_suffix(".rs") {
        Some("lib" | "main") => String::new(),
        Some(m) => m.to_string(),
        None => first.to_string(),
    }
}

/// The modules a file's code names as `crate::<m>` (and, in `main.rs`, `kbind::<m>`), with
/// line comments taken out first so a doc comment citing a module is no edge.
fn named_modules(text: &str, root_crate: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for prefix in ["crate::", "kbind::"] {
            if prefix == "kbind::" && !root_crate {
                continue;
            }
            for (at, _) in code.match_indices(prefix) {
                // `foo_crate::x` is not `crate::x`.
                let before = code[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let name: String = code[at + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

fn edges() -> (Edges, BTreeSet<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules = BTreeSet::new();
    let mut edges = Edges::new();
    for f in &files {
        let from = module_of(&src, f);
        modules.insert(from.clone());
        let text = std::fs::read_to_string(f).expect("read source");
        let root = f.ends_with("main.rs");
        for to in named_modules(&text, root) {
            if to != from {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    // Root items (`crate::set_command`, `crate::user_agent`) are functions, not modules.
    for to in edges.values_mut() {
        to.retain(|m| modules.contains(m));
    }
    (edges, modules)
}

/// Every pass and one-off command, from the registry.
fn jobs() -> BTreeSet<String> {
    kbind::registry::JOBS
        .iter()
        .map(|d| d.name.to_string())
        .collect()
}

fn uses<'a>(edges: &'a Edges, from: &str) -> impl Iterator<Item = &'a String> {
    edges.get(from).into_iter().flatten()
}

#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn the_parser_sees_the_edges_it_must() {
    let (edges, modules) = edges();
    for m in [
        "api",
        "pass",
        "registry",
        "schema",
        "resync",
        "cli",
        "uninstall",
    ] {
        assert!(
            modules.contains(m),
            "no module {m} found in src/: {modules:?}"
        );
    }
    for (from, to) in [
        ("registry", "schema"),
        ("registry", "relsync"),
        ("schema", "pass"),
        ("resync", "api"),
        ("", "cli"),
    ] {
        assert!(
            uses(&edges, from).any(|m| m == to),
            "the parser missed `{from}` -> `{to}`: {:?}",
            edges.get(from)
        );
    }
    // A doc comment naming a module is no edge.
    assert!(named_modules("/// see crate::schema\nlet x = 1;", false).is_empty());
    assert_eq!(
        named_modules("use crate::pass::{x}; my_crate::y; crate::api::Z", false),
        BTreeSet::from(["api".to_string(), "pass".to_string()])
    );
}

#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn no_pass_uses_another_pass_and_the_framework_uses_none() {
    let (edges, _) = edges();
    let jobs = jobs();
    let mut wrong = Vec::new();
    for (from, to) in edges
        .iter()
        .flat_map(|(f, t)| t.iter().map(move |t| (f, t)))
    {
        if jobs.contains(to) && !matches!(from.as_str(), "registry" | "cli") {
            wrong.push(format!("{from} -> {to}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "only src/registry.rs (and cli, for the subcommands it takes from there) may name a \
         pass; move what is shared into pass/ or a shared module (docs/architecture.md): {wrong:?}"
    );
    let framework: Vec<&String> = uses(&edges, "pass")
        .filter(|m| {
            jobs.contains(*m) || ["registry", "cli", "status", "uninstall"].contains(&m.as_str())
        })
        .collect();
    assert!(framework.is_empty(), "the framework uses {framework:?}");
}

#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn only_main_uses_cli_and_the_registry_dispatch() {
    let (edges, _) = edges();
    for (from, to) in edges
        .iter()
        .flat_map(|(f, t)| t.iter().map(move |t| (f, t)))
    {
        match to.as_str() {
            "cli" => assert!(from.is_empty(), "{from} uses cli"),
            "registry" => assert!(
                from.is_empty() || from == "cli",
                "{from} uses the registry: it gets the descriptors it needs as an argument"
            ),
            _ => {}
        }
    }
}

#[test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
fn the_modules_form_no_cycle() {
    let (edges, modules) = edges();
    // Depth-first search for a back edge, reporting the cycle's path.
    fn visit(
        m: &str,
        edges: &Edges,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(m) {
            Some(2) => return None,
            Some(1) => {
                let at = path.iter().position(|p| p == m).unwrap_or(0);
                let mut cycle = path[at..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for to in edges.get(m).into_iter().flatten() {
            if let Some(c) = visit(to, edges, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    // The crate root declares every module; what it uses is the binary's entry point only.
    let mut without_root = edges.clone();
    without_root.remove("");
    for m in modules.iter().filter(|m| !m.is_empty()) {
        let cycle = visit(m, &without_root, &mut state, &mut Vec::new());
        assert!(
            cycle.is_none(),
            "modules use each other in a cycle: {cycle:?}"
        );
    }
}

/// No file in `src/` over 500 lines, tests included: each reads in one sitting
/// (docs/architecture.md "Layout"). Functions are held to 80 lines by clippy (clippy.toml).
#[test]
fn no_source_file_is_over_500_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 100, "found the sources: {}", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).expect("read").lines().count();
            (n > 500).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
}
