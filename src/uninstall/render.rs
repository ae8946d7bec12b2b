//! What `kbind uninstall` prints: the report as text, JSON or YAML, and the next steps.

use super::*;

pub(super) fn next_steps() -> Vec<String> {
    [
        "kubectl delete cronjobs,jobs -n kbind-system -l app.kubernetes.io/name=kbind",
        "kubectl delete cronjobs,jobs -n kbind-relsync -l app.kubernetes.io/name=kbind",
        "kubectl delete clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings -l app.kubernetes.io/name=kbind",
        "kbind crds | kubectl delete -f -",
        "kubectl delete namespace kbind-system kbind-relsync",
    ]
    .map(String::from)
    .to_vec()
}

/// The report as asked: text on a terminal, one JSON line otherwise (as every pass's summary).
pub fn render(r: &Report, format: Option<OutputFormat>, is_tty: bool) -> String {
    let format = format.unwrap_or(if is_tty {
        OutputFormat::Text
    } else {
        OutputFormat::Json
    });
    match format {
        OutputFormat::Json => serde_json::to_string(r).unwrap_or_default(),
        OutputFormat::Yaml => serde_saphyr::to_string(r).unwrap_or_default(),
        OutputFormat::Text => render_text(r),
    }
}

/// The pass Leases held, or why they could not be checked.
fn leases_text(out: &mut String, r: &Report) {
    for h in &r.leases_held {
        let _ = writeln!(
            out,
            "warning: pass Lease {}/{} is held by {} (renewed {}){}",
            h.namespace,
            h.name,
            h.holder,
            h.renewed.as_deref().unwrap_or("never"),
            if r.dry_run {
                ": --yes refuses until it ends"
            } else {
                ""
            }
        );
    }
    if let Some(e) = &r.lease_check_error {
        let _ = writeln!(out, "warning: the pass Leases could not be checked: {e}");
    }
}

/// One object's line: what happened to its finalizer, and what a Grant left unrevoked.
fn object_text(out: &mut String, dry_run: bool, o: &ObjectReport) {
    let verb = match o.outcome {
        Outcome::WouldRelease => "would release",
        Outcome::Released => "released",
        Outcome::Gone => "gone",
        Outcome::Failed => "FAILED",
    };
    let _ = writeln!(
        out,
        "  {verb} {}{}{}",
        o.key(),
        if o.deleting { " (deleting)" } else { "" },
        o.error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default()
    );
    if let Some(u) = &o.unrevoked
        && o.outcome != Outcome::Gone
    {
        unrevoked_text(out, dry_run || o.outcome == Outcome::Failed, u);
    }
}

fn render_text(r: &Report) -> String {
    let mut out = String::new();
    if r.dry_run {
        out.push_str(
            "kbind uninstall: dry run, nothing changed. With the kbind CronJobs suspended or \
             deleted, run `kbind uninstall --yes` to release.\n",
        );
    }
    leases_text(&mut out, r);
    let synced = |k: &&KindReport| k.finalizer == keys::SYNCER_FINALIZER;
    let quiet = r
        .kinds
        .iter()
        .filter(synced)
        .filter(|k| k.skipped.is_none() && k.objects.is_empty())
        .count();
    let _ = writeln!(
        out,
        "{} kinds kbind manages checked ({quiet} without {})",
        r.kinds.iter().filter(synced).count(),
        keys::SYNCER_FINALIZER
    );
    for k in &r.kinds {
        if synced(&k) && k.skipped.is_none() && k.objects.is_empty() {
            continue;
        }
        if let Some(why) = &k.skipped {
            let _ = writeln!(out, "{} ({}): skipped, {why}", k.kind, k.resource);
            continue;
        }
        let tally = if r.dry_run {
            format!("{} to release", k.found)
        } else {
            format!(
                "{} found, {} released, {} failed",
                k.found, k.released, k.failed
            )
        };
        let _ = writeln!(out, "{} ({}) {}: {tally}", k.kind, k.resource, k.finalizer);
        for o in &k.objects {
            object_text(&mut out, r.dry_run, o);
        }
    }
    if r.dry_run {
        let _ = writeln!(out, "total: {} to release", r.found);
    } else {
        let _ = writeln!(
            out,
            "total: {} found, {} released, {} failed",
            r.found, r.released, r.failed
        );
    }
    out.push_str("Then delete kbind in this order (docs/operations.md, \"Uninstall\"):\n");
    for n in &r.next {
        let _ = writeln!(out, "  {n}");
    }
    out.trim_end().to_string()
}

/// What releasing a Grant's `iam.kbind.io/revoke` leaves behind, and the commands that revoke
/// by hand.
fn unrevoked_text(out: &mut String, not_yet: bool, u: &Unrevoked) {
    let until = u
        .token_expires_at
        .as_deref()
        .map(|t| format!("until {t}"))
        .unwrap_or_else(|| "until it expires".into());
    let _ = writeln!(
        out,
        "    WARNING: {}: its ServiceAccount, Role and RoleBinding (namespace {ns}), \
         ClusterRole, ClusterRoleBinding (with --confinement per-grant, the \
         ValidatingAdmissionPolicy and its binding), and the kubeconfig Secret (namespace {ns}), all named {name}, \
         stay until the cluster's garbage collector removes them once the Grant is gone (each \
         names it as owner; not the policy, nor objects issued before 0.3, nor where no \
         collector runs), and its token keeps working until then, at most {until}. Revoke by hand:",
        if not_yet {
            "releasing skips revocation"
        } else {
            "revocation skipped"
        },
        ns = u.namespace,
        name = u.objects,
    );
    for c in &u.revoke_by_hand {
        let _ = writeln!(out, "      {c}");
    }
}
