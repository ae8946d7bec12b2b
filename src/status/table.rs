//! The `kbind status` table: one block per kind, kubectl-like columns.

use super::*;

pub(super) const MESSAGE_WIDTH: usize = 72;

/// The report as kubectl-like tables, one per kind, headed `Kind.group`.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    for k in &report.kinds {
        if !k.installed {
            out.push_str(&format!(
                "{}.{}: not installed on this cluster (skipped)\n\n",
                k.kind, k.group
            ));
            continue;
        }
        out.push_str(&format!("{}.{}\n", k.kind, k.group));
        if k.items.is_empty() {
            out.push_str("No resources found.\n\n");
            continue;
        }
        let namespaced = k.items.iter().any(|i| i.namespace.is_some());
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut header: Vec<&str> = Vec::new();
        if namespaced {
            header.push("NAMESPACE");
        }
        header.push("NAME");
        let lead_columns = header.len();
        for i in &k.items {
            let mut lead = Vec::new();
            if namespaced {
                lead.push(i.namespace.clone().unwrap_or_default());
            }
            lead.push(i.name.clone());
            let ready = i.ready.clone().unwrap_or_else(|| "-".into());
            let why = reason_cell(i);
            let (cols, cells) = kind_cells(&i.facts, ready, why);
            header_once(&mut header, lead_columns, cols);
            rows.extend(cells.into_iter().map(|c| [lead.clone(), c].concat()));
        }
        let header: Vec<String> = header.into_iter().map(String::from).collect();
        out.push_str(&columns(&header, &rows));
        out.push('\n');
    }
    out.push_str(if report.ready {
        "All kbind resources are Ready.\n"
    } else {
        "Some kbind resources are not Ready (exit code 3).\n"
    });
    out
}

/// A kind's own columns (after NAMESPACE and NAME) and the cells of one object's rows: one row,
/// or one per bound API for a binding.
fn kind_cells(
    facts: &Facts,
    ready: String,
    why: String,
) -> (&'static [&'static str], Vec<Vec<String>>) {
    match facts {
        Facts::Connection {
            connected,
            exported_apis,
        } => (
            &["READY", "CONNECTED", "EXPORTS", "REASON"],
            vec![vec![
                ready,
                connected.clone(),
                exported_apis.to_string(),
                why,
            ]],
        ),
        Facts::Binding { connection, apis } => {
            let cols: &'static [&'static str] = &[
                "CONNECTION",
                "READY",
                "API",
                "IN-SYNC",
                "PENDING",
                "CONFLICTS",
                "ORPHANED",
                "DENIED",
                "REJECTED",
                "REASON",
            ];
            (cols, binding_rows(connection, apis, ready, why))
        }
        Facts::CatalogEntry {
            export,
            bindings_checked,
            bindings_updated,
            missing_on_export,
        } => (
            &["READY", "EXPORT", "CHECKED", "UPDATED", "MISSING", "REASON"],
            vec![vec![
                ready,
                export.clone(),
                bindings_checked.to_string(),
                bindings_updated.to_string(),
                missing_on_export.to_string(),
                why,
            ]],
        ),
        Facts::RelationshipSource { .. } => source_cells(facts, ready, why),
        Facts::Grant {
            workspace,
            provider,
            compositions,
        } => (
            &["WORKSPACE", "PROVIDER", "COMPOSITIONS"],
            vec![vec![
                workspace.clone(),
                provider.clone(),
                compositions.to_string(),
            ]],
        ),
        Facts::Export {
            api_count,
            missing_apis,
        } => (
            &["READY", "APIS", "MISSING", "REASON"],
            vec![vec![
                ready,
                api_count.to_string(),
                missing_apis.len().to_string(),
                why,
            ]],
        ),
        Facts::Collection { exports } => (&["EXPORTS"], vec![vec![exports.join(",")]]),
        Facts::IssuedGrant { .. } => issued_grant_cells(facts, ready, why),
    }
}

/// A RelationshipSource's columns and row ([`kind_cells`]).
fn source_cells(
    facts: &Facts,
    ready: String,
    why: String,
) -> (&'static [&'static str], Vec<Vec<String>>) {
    let Facts::RelationshipSource {
        source_kind,
        last_sync_time,
        enum_complete,
        resume_after,
        scopes_processed,
        scope_errors,
    } = facts
    else {
        return (&[], Vec::new());
    };
    let cycle = if *enum_complete {
        "complete".to_string()
    } else if resume_after.is_empty() {
        "started".to_string()
    } else {
        format!("after {resume_after}")
    };
    (
        &[
            "KIND",
            "READY",
            "LAST-SYNC",
            "CYCLE",
            "SCOPES",
            "ERRORS",
            "REASON",
        ],
        vec![vec![
            source_kind.clone(),
            ready,
            last_sync_time.clone().unwrap_or_else(|| "-".into()),
            cycle,
            scopes_processed.to_string(),
            scope_errors.to_string(),
            why,
        ]],
    )
}

/// An issued Grant's columns and row ([`kind_cells`]).
fn issued_grant_cells(
    facts: &Facts,
    ready: String,
    why: String,
) -> (&'static [&'static str], Vec<Vec<String>>) {
    let Facts::IssuedGrant {
        consumer,
        export,
        collection,
        expires_at,
        consumer_cluster,
    } = facts
    else {
        return (&[], Vec::new());
    };
    let target = match (export, collection) {
        (Some(e), _) => format!("export/{e}"),
        (None, Some(c)) => format!("collection/{c}"),
        (None, None) => "-".into(),
    };
    (
        &[
            "READY",
            "CONSUMER",
            "FOR",
            "EXPIRES",
            "CONSUMER-CLUSTER",
            "REASON",
        ],
        vec![vec![
            ready,
            consumer.clone(),
            target,
            expires_at.clone().unwrap_or_else(|| "-".into()),
            consumer_cluster
                .clone()
                .unwrap_or_else(|| "not-pinned".into()),
            why,
        ]],
    )
}

/// A binding's rows: one per bound API, or one row of dashes when it binds none yet.
fn binding_rows(
    connection: &str,
    apis: &[ApiCounts],
    ready: String,
    why: String,
) -> Vec<Vec<String>> {
    if apis.is_empty() {
        let dash = || "-".to_string();
        let row = [
            vec![connection.to_string(), ready, dash()],
            vec![dash(); 6],
            vec![why],
        ]
        .concat();
        return vec![row];
    }
    apis.iter()
        .map(|a| {
            [
                vec![connection.to_string(), ready.clone(), a.name.clone()],
                [
                    a.in_sync,
                    a.pending,
                    a.conflicts,
                    a.orphaned,
                    a.denied,
                    a.rejected,
                ]
                .iter()
                .map(i64::to_string)
                .collect(),
                vec![why.clone()],
            ]
            .concat()
        })
        .collect()
}

/// The kind's own columns after NAMESPACE and NAME, added by its first row.
fn header_once(header: &mut Vec<&'static str>, lead_columns: usize, cols: &[&'static str]) {
    if header.len() == lead_columns {
        header.extend_from_slice(cols);
    }
}

/// `Reason: message`, on one line and cut to [`MESSAGE_WIDTH`] characters.
pub(super) fn reason_cell(i: &Item) -> String {
    if i.reason.is_empty() && i.message.is_empty() {
        return String::new();
    }
    let one_line = i.message.split_whitespace().collect::<Vec<_>>().join(" ");
    let text = match (i.reason.is_empty(), one_line.is_empty()) {
        (false, false) => format!("{}: {one_line}", i.reason),
        (false, true) => i.reason.clone(),
        _ => one_line,
    };
    if text.chars().count() > MESSAGE_WIDTH {
        let cut: String = text.chars().take(MESSAGE_WIDTH - 1).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// Left-aligned columns three spaces apart, as kubectl prints them; the last column unpadded.
fn columns(header: &[String], rows: &[Vec<String>]) -> String {
    let mut width = vec![0; header.len()];
    for r in std::iter::once(header).chain(rows.iter().map(Vec::as_slice)) {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(header).chain(rows.iter().map(Vec::as_slice)) {
        let last = r.len().saturating_sub(1);
        let mut line = String::new();
        for (i, (cell, w)) in r.iter().zip(&width).enumerate() {
            if i == last {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}   "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
