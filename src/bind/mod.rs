//! `kbind bind`: bind a consumer cluster to a provider in one command (docs/binding-flow.md).
//! A one-off command, not a pass: no Lease, no budget. It reads, plans (pure, `plan`), then
//! writes:
//!
//! 1. **Observe the provider** (`provider.rs`) with the given kubeconfig, after it passed the
//!    very rules `kbind schema` applies to a Connection's Secret (src/connection/): its identity, what it
//!    exports (src/discovery/, the discovery `kbind schema` uses), the Export named by
//!    `--export`, the Grant's issued Secret named by `--grant-secret` (or, by default, by the
//!    `iam.kbind.io/grant` extension of a kubeconfig `kbind issue` wrote).
//! 2. **Plan**: the APIs (each exported), the consumer Secret (the kubeconfig under the key
//!    Connections read; with a Grant's Secret, the annotations rotation by pull needs), the
//!    Connection, and a ClusterBinding (or, with `--namespace`, a Binding).
//! 3. **Observe the consumer** (`consumer.rs`) and decide per object: create, update, or leave
//!    alone (a second run with the same arguments writes nothing). An object of that name `kbind bind` did not
//!    write (no `kbind-bind` entry in its managedFields) is refused unless `--force`.
//! 4. **Apply** by server-side apply, field manager `kbind-bind`, Secret first.
//!
//! `--dry-run` stops after 2 and prints the manifests (the Secret's data redacted unless
//! `--include-secret`); it never contacts the consumer cluster.
//!
//! Exit codes: 0 done, 1 a cluster could not be reached or a write failed, 2 bad input or a
//! refusal (each message names the problem).

pub mod args;
mod consumer;
pub mod plan;
mod provider;

use std::collections::BTreeMap;
use std::io::IsTerminal;

use serde::Serialize;
use serde_json::Value;

use crate::connection::{CredentialError, IdentityError};
use crate::discovery::DiscoveryError;
use crate::pass::{CommonArgs, OutputFormat, PassError};

pub use args::BindArgs;
use plan::{Action, Chosen, Desired, Inputs, Kind};

/// The Secret key Connections read by default (and the key a Grant's issued Secret uses).
pub use crate::api::keys::KUBECONFIG_KEY;

/// The subcommand, and the name in the User-Agent of the clients it builds.
pub const COMMAND: &str = "bind";

/// Why `kbind bind` stopped. Every variant names the file, object or API at fault.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{0}")]
    Usage(String),
    #[error("--provider-kubeconfig {path}: cannot read it: {source}")]
    KubeconfigFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("--provider-kubeconfig {path} would be refused by kbind schema: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: CredentialError,
    },
    #[error("the provider refused the credential of --provider-kubeconfig {path}: {source}")]
    CredentialRejected {
        path: String,
        #[source]
        source: IdentityError,
    },
    #[error(
        "the provider identity of --provider-kubeconfig {path} may not read the cluster identity \
         (get Namespace kube-system), which kbind schema needs: {source}"
    )]
    IdentityForbidden {
        path: String,
        #[source]
        source: IdentityError,
    },
    #[error("the provider could not be reached: {source}")]
    ProviderUnreachable {
        #[source]
        source: IdentityError,
    },
    #[error("listing what the provider exports: {0}")]
    Discovery(#[source] DiscoveryError),
    #[error(
        "Export {export} not found on the provider (is catalog.kbind.io installed there, and the name right?)"
    )]
    ExportNotFound { export: String },
    #[error("reading Export {export} on the provider: {source}")]
    ExportUnreadable {
        export: String,
        #[source]
        source: kube::Error,
    },
    #[error("Export {export} lists no APIs (spec.apis is empty)")]
    ExportEmpty { export: String },
    #[error(
        "name the APIs to bind with --apis or --export; the provider exports: {}",
        list_or_none(.exported)
    )]
    NothingChosen { exported: Vec<String> },
    #[error(
        "not exported by the provider: {}{}; it exports: {}",
        .missing.join(", "),
        .export.as_ref().map(|e| format!(" (listed by Export {e})")).unwrap_or_default(),
        list_or_none(.exported)
    )]
    NotExported {
        missing: Vec<String>,
        export: Option<String>,
        exported: Vec<String>,
    },
    #[error(
        "a Binding (--namespace {namespace}) cannot bind cluster-scoped APIs: {}; bind them without --namespace (a ClusterBinding)",
        .apis.join(", ")
    )]
    ClusterScopedInBinding {
        namespace: String,
        apis: Vec<String>,
    },
    #[error("--grant-secret {secret}: {why}")]
    GrantSecret { secret: String, why: String },
    /// The kubeconfig names its Grant's Secret (`kbind issue` writes it), but not readably.
    #[error("{path}: {why}")]
    GrantExtension { path: String, why: String },
    #[error(
        "{object} exists and was not written by kbind bind; refusing to overwrite it (--force overwrites it, or choose another --name)"
    )]
    Foreign { object: String },
    #[error(
        "Connection {connection} uses Secret {has}, not {wants}; its kubeconfigSecretRef is immutable (choose another --name, or the same --credential-namespace)"
    )]
    SecretRefImmutable {
        connection: String,
        has: String,
        wants: String,
    },
    #[error(
        "Connection {connection} is pinned to provider {pinned}, but --provider-kubeconfig reaches provider {provider}; a new provider needs a new Connection (choose another --name)"
    )]
    IdentityMismatch {
        connection: String,
        pinned: String,
        provider: String,
    },
    #[error("namespace {namespace} does not exist on the consumer cluster ({what})")]
    NamespaceMissing { namespace: String, what: String },
    #[error(transparent)]
    Consumer(#[from] PassError),
    #[error("{what}: {source}")]
    ConsumerRequest {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("rendering the manifests as JSON: {0}")]
    RenderJson(#[source] serde_json::Error),
    #[error("rendering the manifests as YAML: {0}")]
    RenderYaml(#[source] serde_saphyr::ser::Error),
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

impl BindError {
    /// 2: bad input or a refusal; 1: a cluster could not be reached, or a write failed.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::ProviderUnreachable { .. }
            | Self::ConsumerRequest { .. }
            | Self::RenderJson(_)
            | Self::RenderYaml(_) => 1,
            Self::Discovery(d) if !d.forbidden() => 1,
            Self::ExportUnreadable { source, .. } if !is_client_error(source) => 1,
            Self::Consumer(e) => e.exit_code(),
            _ => 2,
        }
    }
}

fn is_client_error(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if (400..500).contains(&s.code))
}

/// One object's outcome.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReport {
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub action: Action,
}

/// What `kbind bind` did (the summary line).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub command: &'static str,
    pub provider: String,
    pub apis: Vec<String>,
    pub objects: Vec<ObjectReport>,
    /// Objects created or updated: 0 on a repeated run.
    pub writes: usize,
}

/// Run and print; returns the exit code.
pub async fn run(common: CommonArgs, args: BindArgs) -> i32 {
    crate::set_command(COMMAND);
    crate::install_crypto_provider();
    match bind(&common, &args).await {
        Ok(Output::Report(r)) => {
            println!("{}", render_report(&r, common.output));
            0
        }
        Ok(Output::Manifests(text)) => {
            print!("{text}");
            0
        }
        Err(e) => {
            crate::logging::print_error("bind", &e);
            e.exit_code()
        }
    }
}

enum Output {
    Report(Report),
    Manifests(String),
}

/// What the command line asks for, checked before anything is read.
struct Request {
    path: String,
    chosen: Chosen,
    grant_secret: Option<(String, String)>,
    labels: BTreeMap<String, String>,
}

fn request(args: &BindArgs) -> Result<Request, BindError> {
    let usage = |m: String| Err(BindError::Usage(m));
    let dns = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if !dns(&args.name) {
        return usage(format!(
            "--name {:?} is not a valid object name (lower-case letters, digits, '-' and '.')",
            args.name
        ));
    }
    for (flag, ns) in [
        ("--credential-namespace", Some(&args.credential_namespace)),
        ("--namespace", args.namespace.as_ref()),
    ] {
        if let Some(ns) = ns
            && (!dns(ns) || ns.contains('.') || ns.len() > 63)
        {
            return usage(format!("{flag} {ns:?} is not a valid namespace name"));
        }
    }
    let grant_secret = match &args.grant_secret {
        None => None,
        Some(s) => match s.split_once('/') {
            Some((ns, n)) if dns(ns) && dns(n) && !n.contains('/') => {
                Some((ns.to_string(), n.to_string()))
            }
            _ => return usage(format!("--grant-secret {s:?} is not <namespace>/<name>")),
        },
    };
    let mut labels = BTreeMap::new();
    for l in &args.labels {
        match l.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                labels.insert(k.to_string(), v.to_string());
            }
            _ => return usage(format!("--label {l:?} is not KEY=VALUE")),
        }
    }
    let chosen = match (&args.export, args.apis.is_empty()) {
        (Some(e), _) => Chosen::Export {
            name: e.clone(),
            apis: Vec::new(),
        },
        (None, false) => Chosen::Apis(args.apis.clone()),
        (None, true) => Chosen::Nothing,
    };
    Ok(Request {
        path: args.provider_kubeconfig.display().to_string(),
        chosen,
        grant_secret,
        labels,
    })
}

async fn bind(common: &CommonArgs, args: &BindArgs) -> Result<Output, BindError> {
    let mut req = request(args)?;
    if args.include_secret && !common.dry_run {
        return Err(BindError::Usage(
            "--include-secret only goes with --dry-run".into(),
        ));
    }
    let path = req.path.clone();
    let bytes =
        std::fs::read(&args.provider_kubeconfig).map_err(|source| BindError::KubeconfigFile {
            path: path.clone(),
            source,
        })?;
    let seen = provider::observe(common, args, &mut req, &bytes).await?;
    let inputs = Inputs {
        name: &args.name,
        credential_namespace: &args.credential_namespace,
        binding_namespace: args.namespace.as_deref(),
        key: KUBECONFIG_KEY,
        kubeconfig: &bytes,
        chosen: &req.chosen,
        exports: &seen.exports,
        grant: seen.grant.as_ref(),
        labels: &req.labels,
    };
    let apis = plan::choose_apis(&inputs)?;
    let desired = plan::desired(&inputs, &apis);
    if common.dry_run {
        return render_manifests(&desired, common.output, args.include_secret)
            .map(Output::Manifests);
    }

    let objects = consumer::write(common, args, &desired, &seen.uid).await?;
    Ok(Output::Report(Report {
        command: "bind",
        provider: seen.uid,
        writes: objects
            .iter()
            .filter(|o| o.action != Action::Unchanged)
            .count(),
        apis,
        objects,
    }))
}

/// Placeholder for the Secret's data in a dry run without `--include-secret`.
pub const REDACTED: &str =
    "REDACTED: rerun with --include-secret, or create this Secret out of band";

/// The manifests of a dry run: YAML documents, or with `-o json` a JSON `List`. The Secret's
/// data is redacted unless `include_secret` (stderr says which).
fn render_manifests(
    desired: &[Desired],
    output: Option<OutputFormat>,
    include_secret: bool,
) -> Result<String, BindError> {
    let mut items = Vec::new();
    for d in desired {
        let mut body = d.body.clone();
        if d.kind == Kind::Secret && !include_secret {
            let keys: Vec<String> = body["data"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            if let Some(m) = body.as_object_mut() {
                m.remove("data");
            }
            body["stringData"] = keys
                .into_iter()
                .map(|k| (k, Value::String(REDACTED.into())))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        items.push(body);
    }
    let secret = desired
        .iter()
        .find(|d| d.kind == Kind::Secret)
        .map(Desired::key)
        .unwrap_or_default();
    if include_secret {
        eprintln!(
            "kbind bind: the output holds a credential ({secret}): keep it out of Git unless encrypted"
        );
    } else {
        eprintln!(
            "kbind bind: {secret}'s data is redacted; --include-secret prints the kubeconfig (a credential)"
        );
    }
    match output {
        Some(OutputFormat::Json) => {
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
            serde_json::to_string_pretty(&list).map_err(BindError::RenderJson)
        }
        _ => {
            let mut out = String::new();
            for i in &items {
                out.push_str("---\n");
                out.push_str(&serde_saphyr::to_string(i).map_err(BindError::RenderYaml)?);
            }
            Ok(out)
        }
    }
}

/// The summary: a line per object and the write count on a terminal (or `-o text`), else JSON.
fn render_report(r: &Report, output: Option<OutputFormat>) -> String {
    let text = match output {
        Some(OutputFormat::Text) => true,
        Some(_) => false,
        None => std::io::stdout().is_terminal(),
    };
    match output {
        _ if text => {
            let mut out = String::new();
            for o in &r.objects {
                let key = match &o.namespace {
                    Some(ns) => format!("{} {ns}/{}", o.kind, o.name),
                    None => format!("{} {}", o.kind, o.name),
                };
                out.push_str(&format!("{key}: {}\n", o.action.as_str()));
            }
            out.push_str(&format!(
                "bound {} to provider {} ({} writes)",
                r.apis.join(", "),
                r.provider,
                r.writes
            ));
            out
        }
        Some(OutputFormat::Yaml) => serde_saphyr::to_string(r).unwrap_or_default(),
        _ => serde_json::to_string(r).unwrap_or_default(),
    }
}
